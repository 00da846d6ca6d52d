// Activation and Softmax operations: validation and dispatch to the CPU kernels.
#include <cmath>

#include "src/kernels/cpu/kernels.h"
#include "src/ops/op_base.h"
#include "src/ops/ops.h"
#include "src/ops/registry.h"

namespace tboost::ops_internal {
namespace {

class ActivationOp : public OpBase<ops::ActivationParam> {
 public:
  using OpBase::OpBase;
  const char* name() const override { return "Activation"; }
  std::string input_role(size_t) const override { return "x"; }
  std::string output_role(size_t) const override { return "y"; }

  std::vector<TensorDesc> do_infer_shape(const std::vector<TensorDesc>& in) const override {
    const Checker chk(name());
    chk.count(in, 1, "x");
    const TensorDesc& x = in[0];
    chk.rank(0, "x", x, 1, kMaxDims);
    chk.dtype_in(0, "x", x, {DType::kF32, DType::kBF16, DType::kF16});
    chk.last_dim_contiguous(0, "x", x);
    Shape s = x.shape();
    if (ops::is_gated(param_.type)) {
      if (s.back() % 2 != 0)
        chk.fail(ErrorCode::kShapeMismatch, std::string("input 0 (x) last dim must be even for ") +
                                                ops::activation_type_name(param_.type) +
                                                " (gate and up halves), got " +
                                                std::to_string(s.back()));
      s.back() /= 2;
    }
    return {TensorDesc::contiguous(x.dtype, s)};
  }

  size_t do_setup(const VariantPack& pack, Context& ctx, const Checker& chk) override {
    chk.last_dim_contiguous(0, "y", pack.outputs[0].desc());
    kernel_ = get_kernel<decltype(kernels::activation_forward)>(name(), ctx.device(),
                                                                pack.inputs[0].dtype(), &impl_);
    return 0;
  }

  void do_execute(const VariantPack& pack, void*, Context& ctx) override {
    kernels::ActivationArgs a;
    a.x = pack.inputs[0].data();
    a.x_rows = row_view(pack.inputs[0].desc());
    a.y = pack.outputs[0].data();
    a.y_rows = row_view(pack.outputs[0].desc());
    a.dtype = pack.inputs[0].dtype();
    a.type = param_.type;
    a.gate_first = param_.gate_first;
    a.threads = ctx.num_threads();
    a.ftz = ctx.flush_denormals();
    kernel_(a);
  }

 private:
  decltype(kernels::activation_forward)* kernel_ = nullptr;
};

class SoftmaxOp : public OpBase<ops::SoftmaxParam> {
 public:
  using OpBase::OpBase;
  const char* name() const override { return "Softmax"; }
  std::string input_role(size_t) const override { return "x"; }
  std::string output_role(size_t) const override { return "y"; }

  void validate_param(const Checker& chk) const override {
    // A scale <= 0 would turn masked (-inf) entries into +inf or NaN.
    chk.param(std::isfinite(param_.scale) && param_.scale > 0.0f,
              "scale must be finite and > 0, got " + std::to_string(param_.scale));
  }

  std::vector<TensorDesc> do_infer_shape(const std::vector<TensorDesc>& in) const override {
    const Checker chk(name());
    chk.count(in, 1, "x");
    const TensorDesc& x = in[0];
    chk.rank(0, "x", x, 1, kMaxDims);
    chk.dtype_in(0, "x", x, {DType::kF32, DType::kBF16, DType::kF16});
    chk.last_dim_contiguous(0, "x", x);
    if (x.dim(-1) == 0) chk.fail(ErrorCode::kShapeMismatch, "input 0 (x) has an empty last dim");
    return {TensorDesc::contiguous(x.dtype, x.shape())};
  }

  size_t do_setup(const VariantPack& pack, Context& ctx, const Checker& chk) override {
    chk.last_dim_contiguous(0, "y", pack.outputs[0].desc());
    kernel_ = get_kernel<decltype(kernels::softmax_forward)>(name(), ctx.device(),
                                                             pack.inputs[0].dtype(), &impl_);
    return 0;
  }

  void do_execute(const VariantPack& pack, void*, Context& ctx) override {
    kernels::SoftmaxArgs a;
    a.x = pack.inputs[0].data();
    a.x_rows = row_view(pack.inputs[0].desc());
    a.y = pack.outputs[0].data();
    a.y_rows = row_view(pack.outputs[0].desc());
    a.dtype = pack.inputs[0].dtype();
    a.scale = param_.scale;
    a.threads = ctx.num_threads();
    a.ftz = ctx.flush_denormals();
    kernel_(a);
  }

 private:
  decltype(kernels::softmax_forward)* kernel_ = nullptr;
};

}  // namespace

std::unique_ptr<Operation> make_activation(const ops::ActivationParam& p) {
  return std::make_unique<ActivationOp>(p);
}
std::unique_ptr<Operation> make_softmax(const ops::SoftmaxParam& p) {
  return std::make_unique<SoftmaxOp>(p);
}

}  // namespace tboost::ops_internal

namespace tboost::ops {
const char* activation_type_name(ActivationType t) {
  switch (t) {
    case ActivationType::kRelu:
      return "relu";
    case ActivationType::kGeluErf:
      return "gelu_erf";
    case ActivationType::kGeluTanh:
      return "gelu_tanh";
    case ActivationType::kSilu:
      return "silu";
    case ActivationType::kSwiGlu:
      return "swiglu";
    case ActivationType::kGeGluErf:
      return "geglu_erf";
    case ActivationType::kGeGluTanh:
      return "geglu_tanh";
  }
  return "?";
}
}  // namespace tboost::ops
