// A plain read of a buffer on N threads, for the peers' benchmark scripts (bench/peers, through
// ctypes): a peer's decode is then timed against reads taken in turn in its own process, as
// `tboost bench` times ours. The host's memory speed moves by up to 2x within minutes
// (PERF.md), so a read from another process or another minute says little about a given run.
// The buffer comes from here, allocated as tboost's own weights are (aligned_buffer: 2 MiB pages
// where the kernel allows), so a peer's floor and ours are the same read. (A numpy buffer read
// alike in one process: 40.6-43.6 GB/s against 42.0-43.1.)
#include <chrono>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>

#include "bench/bench.h"
#include "tboost/core/tensor.h"

namespace {
std::mutex mu;
std::map<void*, std::shared_ptr<void>> live;
}  // namespace

extern "C" {

// A buffer of `bytes`, every page written (so that no read meets a fault); null on failure.
void* tboost_read_buffer_new(int64_t bytes) {
  try {
    std::shared_ptr<void> b = tboost::aligned_buffer(static_cast<size_t>(bytes));
    std::memset(b.get(), 1, static_cast<size_t>(bytes));
    std::lock_guard<std::mutex> g(mu);
    live[b.get()] = b;
    return b.get();
  } catch (...) {
    return nullptr;
  }
}

void tboost_read_buffer_free(void* p) {
  std::lock_guard<std::mutex> g(mu);
  live.erase(p);
}

double tboost_read_seconds(const void* p, int64_t bytes, int threads) {
  const auto t0 = std::chrono::steady_clock::now();
  tboost::bench::read_kernel(p, bytes, threads);
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // extern "C"
