// A plain read of a buffer on N threads, for the peers' benchmark scripts (bench/peers, through
// ctypes): a peer's decode is then timed against reads taken in turn in its own process, as
// `tboost bench` times ours. The host's memory speed moves by up to 2x within minutes
// (PERF.md), so a read from another process or another minute says little about a given run.
#include <chrono>
#include <cstdint>

#include "bench/bench.h"

extern "C" double tboost_read_seconds(const void* p, int64_t bytes, int threads) {
  const auto t0 = std::chrono::steady_clock::now();
  tboost::bench::read_kernel(p, bytes, threads);
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}
