// oneDNN glue shared by the ops that call it (Linear, MatMul): the process-wide CPU engine,
// the OpenMP thread-count guard, dtype mapping, workspace alignment and error text.
#pragma once

#include <omp.h>

#include <algorithm>
#include <cstddef>
#include <dnnl.hpp>
#include <memory>
#include <string>

#include "src/ops/op_base.h"
#include "tboost/core/dtype.h"
#include "tboost/core/tensor.h"

namespace tboost::ops_internal {

// One engine for the process: engines are thread-safe and creating one costs a CPU probe.
inline dnnl::engine& cpu_engine() {
  static dnnl::engine e(dnnl::engine::kind::cpu, 0);
  return e;
}

// oneDNN's OpenMP runtime sizes its team (and, at creation, its scratchpad) from
// omp_get_max_threads(); the Context's count is applied for the duration of a call.
class OmpThreads {
 public:
  explicit OmpThreads(int n) : saved_(omp_get_max_threads()) {
    omp_set_num_threads(std::max(1, n));
  }
  ~OmpThreads() { omp_set_num_threads(saved_); }
  OmpThreads(const OmpThreads&) = delete;
  OmpThreads& operator=(const OmpThreads&) = delete;

 private:
  int saved_;
};

// Every matmul runs with a scratchpad we pass in (scratchpad_mode::user). oneDNN's own mode
// keeps one scratchpad per thread, sized when a primitive is created on that thread, so a
// primitive executed on another thread (the two-stage executor's worker, the parallel tasks
// of the attention backward sharing a cached gemm) may run over a smaller buffer: on AVX-512
// CPUs, whose brgemm matmuls use the scratchpad, that gave wrong and thread-dependent results.
// With the user mode a primitive is safe to run from any thread; each thread passes its own
// grow-only buffer, used by one execution at a time.
inline dnnl::primitive_attr user_scratchpad_attr() {
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  return attr;
}
// The calling thread's scratchpad for a primitive whose descriptor asks for md (grown as
// needed; valid until this thread's next call).
inline dnnl::memory thread_scratchpad(const dnnl::memory::desc& md, const dnnl::engine& eng) {
  thread_local std::shared_ptr<void> buf;
  thread_local size_t size = 0;
  const size_t need = std::max<size_t>(md.get_size(), 1);
  if (size < need) buf = aligned_buffer(need), size = need;
  return dnnl::memory(md, eng, buf.get());
}

inline dnnl::memory::data_type dnnl_type(DType t) {
  switch (t) {
    case DType::kBF16:
      return dnnl::memory::data_type::bf16;
    case DType::kF16:
      return dnnl::memory::data_type::f16;
    default:
      return dnnl::memory::data_type::f32;
  }
}

inline size_t align64(size_t n) { return (n + 63) / 64 * 64; }

// Workspace carved into 64-byte-aligned pieces: take(n) returns the next piece's offset.
struct WorkspaceLayout {
  size_t bytes = 0;
  size_t take(size_t n) {
    const size_t at = bytes;
    bytes = align64(bytes + n);
    return at;
  }
};

// Runs fn; a dnnl::error becomes the op's kInternal tboost::Error, "oneDNN failed <what> the
// matmul (<impl>): <message> (status N)". impl is read after the failure (the build may have
// set it).
template <class Fn>
void with_dnnl_errors(const Checker& chk, const char* what, const std::string& impl, const Fn& fn) {
  try {
    fn();
  } catch (const dnnl::error& e) {
    chk.fail(ErrorCode::kInternal, std::string("oneDNN failed ") + what + " the matmul (" + impl +
                                       "): " + e.what() + " (status " +
                                       std::to_string(static_cast<int>(e.status)) + ")");
  }
}

// What every oneDNN matmul plan holds: the storage dtype, whether oneDNN computes in it (else
// in f32, operands converted through the workspace) and the thread count.
struct PlanBase {
  DType dtype = DType::kF32;
  bool native = true;
  int threads = 1;
  void init(DType t, bool want_native, int nthreads) {
    dtype = t;
    native = want_native || t == DType::kF32;
    threads = std::max(1, nthreads);
  }
  DType compute() const { return native ? dtype : DType::kF32; }
  // "onednn:<impl> bf16", or "onednn:<impl> f32-compute fallback for bf16".
  std::string impl_name(const char* onednn_impl) const {
    return std::string("onednn:") + onednn_impl + " " +
           (native ? std::string(dtype_name(dtype))
                   : std::string("f32-compute fallback for ") + dtype_name(dtype));
  }
  bool operator==(const PlanBase&) const = default;
};

// Which plan the op's primitive was built for. refresh() does nothing while make_plan(true)
// (compute in the storage dtype) returns the plan it last saw; otherwise it builds for that
// plan or, when oneDNN has no such matmul for a 16-bit dtype (no bf16 before AVX-512, no f16
// in oneDNN 2.6 on CPUs), for make_plan(false) (compute in f32). oneDNN's errors become
// kUnsupported tboost::Errors. Plan needs operator==, `threads` and `dtype`.
template <class Plan>
class PlanCache {
 public:
  template <class MakePlan, class Build>
  void refresh(const Checker& chk, const MakePlan& make_plan, const Build& build) {
    const Plan want = make_plan(true);
    if (built_ && want == attempted_) return;
    built_ = false;
    OmpThreads threads(want.threads);
    try {
      build(want);
    } catch (const dnnl::error& e) {
      if (want.dtype == DType::kF32)
        chk.fail(ErrorCode::kUnsupported,
                 "oneDNN has no f32 matmul for this case: " + std::string(e.what()));
      try {
        build(make_plan(false));
      } catch (const dnnl::error& e2) {
        chk.fail(ErrorCode::kUnsupported, std::string("oneDNN has no matmul for ") +
                                              dtype_name(want.dtype) +
                                              " nor its f32 fallback: " + e2.what());
      }
    }
    attempted_ = want;
    built_ = true;
  }

 private:
  Plan attempted_;  // the native plan that led to the built primitive
  bool built_ = false;
};

}  // namespace tboost::ops_internal
