// Registers the CPU kernels under (op, cpu, dtype). The impl string names the path taken.
#include "src/kernels/cpu/kernels.h"
#include "src/ops/registry.h"
#include "tboost/core/context.h"

namespace tboost::kernels::cpu {

void register_cpu_kernels() {
  using ops_internal::register_kernel;
  const std::string hwy = "highway/" + Context::kernel_isa();
  for (DType t : {DType::kF32, DType::kBF16, DType::kF16}) {
    register_kernel("RmsNorm", Device::kCPU, t, &norm_forward, hwy);
    register_kernel("LayerNorm", Device::kCPU, t, &norm_forward, hwy);
    register_kernel("Rope", Device::kCPU, t, &rope_forward, hwy);
    register_kernel("Activation", Device::kCPU, t, &activation_forward, hwy);
    register_kernel("Softmax", Device::kCPU, t, &softmax_forward, hwy);
    register_kernel("Elementwise.binary", Device::kCPU, t, &binary_forward, hwy);
    register_kernel("Elementwise.unary", Device::kCPU, t, &unary_forward, hwy);
    register_kernel("Reduce", Device::kCPU, t, &reduce_forward, hwy);
    register_kernel("SelfAttention", Device::kCPU, t, &attention_forward, hwy);
    register_kernel("PagedAttention", Device::kCPU, t, &attention_forward, hwy);
  }
  // Layout copies move bytes of any dtype: plain C++ (memcpy rows or L1-sized tiles).
  for (DType t : kAllDTypes) {
    register_kernel("Transpose", Device::kCPU, t, &strided_copy, "cpu/strided-copy");
    register_kernel("Concat", Device::kCPU, t, &strided_copy, "cpu/strided-copy");
  }
}

}  // namespace tboost::kernels::cpu
