// Context: what an op needs from its environment to run.
//
// Thread count (default: all cores the process may use), optional pinning of the OpenMP
// threads to cores, the device (CPU for now; CUDA later behind the same interface), a seed,
// a growable scratch workspace, and FTZ/DAZ inside kernels (denormal inputs cost ~100x on x86
// and never matter for transformer numerics). `report()` names the CPU features and the ISA
// that kernels actually dispatch to.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

namespace tboost {

enum class Device { kCPU, kCUDA };
const char* device_name(Device d);

struct ContextOptions {
  int num_threads = 0;  // 0: every core the process may use
  // Bind OpenMP thread i to the i-th core the process started with. Thread 0 is the calling
  // thread; bindings last for the process (OpenMP keeps its pool).
  bool pin_threads = false;
  bool flush_denormals = true;
  uint64_t seed = 0x7b005eedull;
  Device device = Device::kCPU;
};

class Context {
 public:
  explicit Context(const ContextOptions& options = {});
  ~Context();
  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;

  int num_threads() const { return num_threads_; }
  void set_num_threads(int n);
  Device device() const { return options_.device; }
  uint64_t seed() const { return options_.seed; }
  bool flush_denormals() const { return options_.flush_denormals; }

  // Scratch memory owned by the context, valid until the next call with a larger size.
  void* workspace(size_t bytes);
  size_t workspace_capacity() const { return workspace_bytes_; }

  // Multi-line text: CPU features, cache sizes, Highway target dispatched, oneDNN ISA,
  // threads.
  std::string report() const;
  // Name of the Highway target our kernels dispatch to on this machine ("AVX2", "AVX3", ...).
  static std::string kernel_isa();

 private:
  ContextOptions options_;
  int num_threads_ = 1;
  std::shared_ptr<void> workspace_;
  size_t workspace_bytes_ = 0;
};

// Sets FTZ/DAZ on this thread for its lifetime, restoring the previous mode after.
class DenormalGuard {
 public:
  explicit DenormalGuard(bool enable = true);
  ~DenormalGuard();
  DenormalGuard(const DenormalGuard&) = delete;
  DenormalGuard& operator=(const DenormalGuard&) = delete;

 private:
  unsigned saved_ = 0;
  bool active_ = false;
};

// Number of cores the process could run on at first use (sched_getaffinity), at least 1.
int available_cores();

}  // namespace tboost
