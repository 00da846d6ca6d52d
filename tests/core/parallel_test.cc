// parallel_for_balanced: every item runs exactly once, whichever thread takes it, including
// when one thread is held up and the other takes items from the back of its range.
#include "src/core/parallel.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <random>
#include <thread>
#include <vector>

namespace tboost {
namespace {

// Runs [0, n) and counts the calls that cover each item (ranges inside [0, n); single items when
// more than one thread takes part).
std::vector<int> RunCounts(int threads, int64_t n, int64_t min_per_thread, int slow_thread,
                           std::atomic<int>* stolen) {
  std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
  for (auto& h : hits) h.store(0);
  const int64_t mid = n / 2;  // with 2 threads, thread 0 owns [0, mid)
  parallel_for_balanced(threads, n, min_per_thread, false, [&](int64_t b, int64_t e) {
    ASSERT_GE(b, 0);
    ASSERT_LT(b, e);
    ASSERT_LE(e, n);
    if (omp_in_parallel()) {
      EXPECT_EQ(e, b + 1);
    }
    for (int64_t i = b; i < e; ++i) hits[static_cast<size_t>(i)].fetch_add(1);
    const int t = omp_get_thread_num();
    if (t == slow_thread) std::this_thread::sleep_for(std::chrono::microseconds(200));
    if (stolen && ((t == 1 && b < mid) || (t == 0 && b >= mid))) stolen->fetch_add(1);
  });
  std::vector<int> out;
  for (auto& h : hits) out.push_back(h.load());
  return out;
}

TEST(ParallelForBalanced, EveryItemOnceAtOddSizes) {
  std::mt19937 rng(std::random_device{}());
  for (int threads : {1, 2, 3, 5}) {
    for (int64_t n : {int64_t{1}, int64_t{2}, int64_t{7}, int64_t{64}, int64_t{1001},
                      static_cast<int64_t>(rng() % 5000 + 1)}) {
      for (int64_t min_per : {int64_t{1}, int64_t{3}, int64_t{10000}}) {
        const auto counts = RunCounts(threads, n, min_per, -1, nullptr);
        for (int64_t i = 0; i < n; ++i)
          ASSERT_EQ(counts[static_cast<size_t>(i)], 1)
              << "item " << i << " of " << n << ", threads " << threads << ", min " << min_per;
      }
    }
  }
  bool called = false;
  parallel_for_balanced(2, 0, 1, false, [&](int64_t, int64_t) { called = true; });
  EXPECT_FALSE(called);
}

TEST(ParallelForBalanced, AHeldUpThreadsItemsAreTakenByTheOther) {
  // Thread 1 sleeps on each of its items, so thread 0 finishes [0, 32) first and takes items
  // from the back of [32, 64). Each item still runs once.
  std::atomic<int> stolen{0};
  const auto counts = RunCounts(2, 64, 1, 1, &stolen);
  for (int c : counts) ASSERT_EQ(c, 1);
  if (omp_get_max_threads() >= 2) {
    EXPECT_GT(stolen.load(), 0);
  }
}

}  // namespace
}  // namespace tboost
