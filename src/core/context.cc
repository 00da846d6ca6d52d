// Context: threads, pinning, workspace, FTZ/DAZ, and the dispatch report.
#include "tboost/core/context.h"

#include <omp.h>
#include <sched.h>

#include <algorithm>
#include <dnnl.hpp>
#include <vector>

#include "hwy/highway.h"
#include "hwy/targets.h"
#include "tboost/core/cpu_features.h"
#include "tboost/core/error.h"
#include "tboost/core/tensor.h"

#if defined(__x86_64__) || defined(__i386__)
#include <xmmintrin.h>
#endif

namespace tboost {

const char* device_name(Device d) { return d == Device::kCPU ? "cpu" : "cuda"; }

// Read once, at first use: a pinned Context narrows the calling thread's affinity to one core,
// and later Contexts must still see every core the process was started with.
int available_cores() {
  static const int cores = [] {
    cpu_set_t set;
    CPU_ZERO(&set);
    if (sched_getaffinity(0, sizeof(set), &set) == 0) return std::max(1, CPU_COUNT(&set));
    return std::max(1, omp_get_num_procs());
  }();
  return cores;
}

static std::vector<int> allowed_cpus() {
  static const std::vector<int> initial = [] {
    std::vector<int> v;
    cpu_set_t set;
    CPU_ZERO(&set);
    if (sched_getaffinity(0, sizeof(set), &set) == 0)
      for (int i = 0; i < CPU_SETSIZE; ++i)
        if (CPU_ISSET(i, &set)) v.push_back(i);
    return v;
  }();
  return initial;
}

Context::Context(const ContextOptions& options) : options_(options) {
  (void)available_cores();  // fixes the process-wide core count before any pinning
  TBOOST_CHECK_CODE(options.device == Device::kCPU, ErrorCode::kUnsupported, "device ",
                    device_name(options.device), " is not built into this library (CPU only)");
  set_num_threads(options.num_threads);
  if (options.pin_threads) {
    const std::vector<int> cpus = allowed_cpus();
    // OpenMP keeps its pool threads, so binding them once here sticks for later regions.
#pragma omp parallel num_threads(num_threads_)
    {
      if (!cpus.empty()) {
        cpu_set_t one;
        CPU_ZERO(&one);
        CPU_SET(cpus[static_cast<size_t>(omp_get_thread_num()) % cpus.size()], &one);
        sched_setaffinity(0, sizeof(one), &one);
      }
    }
  }
}

Context::~Context() = default;

void Context::set_num_threads(int n) {
  TBOOST_CHECK(n >= 0, "thread count must be >= 0 (0 = all cores), got ", n);
  num_threads_ = n == 0 ? available_cores() : n;
}

void* Context::workspace(size_t bytes) {
  if (bytes > workspace_bytes_) {
    workspace_ = aligned_buffer(bytes);
    workspace_bytes_ = bytes;
  }
  return workspace_.get();
}

std::string Context::kernel_isa() {
  const int64_t supported = hwy::SupportedTargets() & HWY_TARGETS;
  if (supported == 0) return "none";
  // Highway's targets are ordered best-first by ascending bit value.
  const int64_t best = supported & -supported;
  return hwy::TargetName(best);
}

static const char* onednn_isa_name(dnnl::cpu_isa isa) {
  switch (isa) {
    case dnnl::cpu_isa::sse41:
      return "sse41";
    case dnnl::cpu_isa::avx:
      return "avx";
    case dnnl::cpu_isa::avx2:
      return "avx2";
    case dnnl::cpu_isa::avx2_vnni:
      return "avx2_vnni";
    case dnnl::cpu_isa::avx512_core:
      return "avx512_core";
    case dnnl::cpu_isa::avx512_core_vnni:
      return "avx512_core_vnni";
    case dnnl::cpu_isa::avx512_core_bf16:
      return "avx512_core_bf16";
    case dnnl::cpu_isa::avx512_core_amx:
      return "avx512_core_amx";
    default:
      return "other";
  }
}

std::string Context::report() const {
  std::string s;
  s += "cpu:        " + cpu_features_string() + "\n";
  s += "kernels:    highway target " + kernel_isa() + "\n";
  s += "onednn:     isa " + std::string(onednn_isa_name(dnnl::get_effective_cpu_isa())) + "\n";
  s += "threads:    " + std::to_string(num_threads_) + (options_.pin_threads ? " (pinned)" : "") +
       " of " + std::to_string(available_cores()) + " cores\n";
  s += "denormals:  " + std::string(options_.flush_denormals ? "flushed (FTZ/DAZ)" : "kept") + "\n";
  return s;
}

DenormalGuard::DenormalGuard(bool enable) {
#if defined(__x86_64__) || defined(__i386__)
  if (enable) {
    saved_ = _mm_getcsr();
    _mm_setcsr(saved_ | 0x8040u);  // FTZ (bit 15) | DAZ (bit 6)
    active_ = true;
  }
#else
  (void)enable;
#endif
}

DenormalGuard::~DenormalGuard() {
#if defined(__x86_64__) || defined(__i386__)
  if (active_) _mm_setcsr(saved_);
#endif
}

}  // namespace tboost
