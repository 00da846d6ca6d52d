// parallel_for: the one way our kernels use threads.
//
// Static, contiguous partition of [0, n) into at most `threads` ranges, so each thread works
// on a fixed slice: results never depend on thread timing (the training issue needs reductions
// that are bitwise repeatable). Each worker sets FTZ/DAZ for the duration of the region, since
// MXCSR is per thread and OpenMP workers do not inherit the caller's mode.
#pragma once

#include <omp.h>

#include <algorithm>
#include <cstdint>

#include "tboost/core/context.h"

namespace tboost {

// fn(begin, end) is called on disjoint ranges covering [0, n). `min_per_thread` keeps tiny
// problems on one thread, where a fork/join (~1-2 us) would cost more than the work.
template <class Fn>
void parallel_for(int threads, int64_t n, int64_t min_per_thread, bool ftz, Fn&& fn) {
  if (n <= 0) return;
  const int64_t by_work = std::max<int64_t>(1, n / std::max<int64_t>(1, min_per_thread));
  const int nt = static_cast<int>(std::min<int64_t>({static_cast<int64_t>(threads), by_work, n}));
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

}  // namespace tboost
