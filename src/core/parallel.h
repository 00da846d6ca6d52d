// parallel_for: how our kernels use threads.
//
// Static, contiguous partition of [0, n) into at most `threads` ranges, so each thread works
// on a fixed slice: results never depend on thread timing (the training issue needs reductions
// that are bitwise repeatable). Each worker sets FTZ/DAZ for the duration of the region, since
// MXCSR is per thread and OpenMP workers do not inherit the caller's mode.
// parallel_for_balanced (below) lets a thread take items from another's slice, for work whose
// every output is written by one item, so results still do not depend on who ran what.
#pragma once

#include <omp.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <memory>

#include "tboost/core/context.h"

namespace tboost {

// Threads for n > 0 items: at most `threads`, and at least `min_per_thread` items each.
inline int ThreadsFor(int threads, int64_t n, int64_t min_per_thread) {
  const int64_t by_work = std::max<int64_t>(1, n / std::max<int64_t>(1, min_per_thread));
  return static_cast<int>(std::min<int64_t>({static_cast<int64_t>(threads), by_work, n}));
}

// fn(begin, end) is called on disjoint ranges covering [0, n). `min_per_thread` keeps tiny
// problems on one thread, where a fork/join (~1-2 us) would cost more than the work.
template <class Fn>
void parallel_for(int threads, int64_t n, int64_t min_per_thread, bool ftz, Fn&& fn) {
  if (n <= 0) return;
  const int nt = ThreadsFor(threads, n, min_per_thread);
  if (nt <= 1) {
    DenormalGuard g(ftz);
    fn(int64_t{0}, n);
    return;
  }
#pragma omp parallel num_threads(nt)
  {
    DenormalGuard g(ftz);
    const int64_t t = omp_get_thread_num();
    const int64_t count = omp_get_num_threads();
    const int64_t begin = n * t / count;
    const int64_t end = n * (t + 1) / count;
    if (begin < end) fn(begin, end);
  }
}

// Like parallel_for, but a thread that finishes its range early takes items from the back of
// another's, one at a time. fn(begin, end) may then run on any thread, so it is only for work
// whose results do not depend on which thread ran which item (each output written by one call,
// as in the decode GEMVs). Each thread still reads its own range front to back, one item per
// claim, so its stream stays sequential; only the last items of the slower thread move.
//
// Why: two threads streaming weights from DRAM do not get equal shares of the bandwidth within
// a call, and with static halves the faster one waited at the join. In a profile of llama-110m
// bf16 decode on Zen 3 the join waits fell from 8.4% of the samples to 1.7%, and the medians of
// alternated runs rose 2% (bench/RESULTS.md, fifteenth session).
template <class Fn>
void parallel_for_balanced(int threads, int64_t n, int64_t min_per_thread, bool ftz, Fn&& fn) {
  if (n <= 0) return;
  const int nt = ThreadsFor(threads, n, min_per_thread);
  if (nt <= 1 || n >= (int64_t{1} << 31)) return parallel_for(threads, n, min_per_thread, ftz, fn);
  // Each thread's unclaimed items [front, back) as one word (front << 32 | back), so that an
  // owner's claim from the front and a thief's from the back are one compare-exchange each.
  // Plain words used through atomic_ref: an array of std::atomic is zeroed on construction (a
  // `rep stos` of 1 KiB per call).
  struct alignas(64) Range {
    uint64_t fb;
  };
  constexpr int kStack = 16;
  Range stack_ranges[kStack];
  std::unique_ptr<Range[]> heap_ranges;
  Range* ranges = stack_ranges;
  if (nt > kStack) {
    heap_ranges.reset(new Range[static_cast<size_t>(nt)]);
    ranges = heap_ranges.get();
  }
  for (int t = 0; t < nt; ++t)
    ranges[t].fb =
        static_cast<uint64_t>(n * t / nt) << 32 | static_cast<uint64_t>(n * (t + 1) / nt);
  // One item of r: from the front (owner) or the back (thief); false when none is left.
  auto claim = [](Range& r, bool front, int64_t* item) {
    std::atomic_ref<uint64_t> fb(r.fb);
    uint64_t s = fb.load(std::memory_order_relaxed);
    for (;;) {
      const uint64_t f = s >> 32, b = s & 0xffffffffu;
      if (f >= b) return false;
      const uint64_t next = front ? (f + 1) << 32 | b : f << 32 | (b - 1);
      if (fb.compare_exchange_weak(s, next, std::memory_order_relaxed)) {
        *item = static_cast<int64_t>(front ? f : b - 1);
        return true;
      }
    }
  };
#pragma omp parallel num_threads(nt)
  {
    DenormalGuard g(ftz);
    // With fewer threads than asked for, the missing ones' ranges are all taken by thieves.
    const int t = omp_get_thread_num();
    int64_t i = 0;
    while (claim(ranges[t], true, &i)) fn(i, i + 1);
    for (int v = 1; v < nt; ++v)
      while (claim(ranges[(t + v) % nt], false, &i)) fn(i, i + 1);
  }
}

}  // namespace tboost
