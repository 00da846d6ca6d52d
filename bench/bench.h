// Benchmark support: timing with alternation, the measured machine limits, and result rows.
//
// Rules (DESIGN.md "Performance method"): warm-up, median of N with the spread, compared
// sides alternate A, B, A, B so host drift hits both, and every floor (copy bandwidth, FMA
// peak) is re-measured in the same run rather than taken from a table.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "tboost/core/tensor.h"

namespace tboost::bench {

struct Timing {
  double median = 0.0;  // seconds
  double min = 0.0;
  double max = 0.0;
  int runs = 0;
};

// Times fn until ~budget_s seconds or max_runs runs, after one warm-up call.
Timing time_fn(const std::function<void()>& fn, double budget_s = 0.4, int max_runs = 50);
// Times fns in turn (f0, f1, ..., f0, f1, ...) with one warm-up each, so that drift on the
// host hits all of them alike.
std::vector<Timing> time_alternating(const std::vector<std::function<void()>>& fns,
                                     double budget_s = 0.8, int max_runs = 50);
// Times a and b alternately (a, b, a, b, ...) with one warm-up each.
std::pair<Timing, Timing> time_pair(const std::function<void()>& a, const std::function<void()>& b,
                                    double budget_s = 0.8, int max_runs = 50);

struct Limits {
  int threads = 1;
  double copy_gbps = 0.0;     // read + write bytes / s, normal stores, 256 MiB buffers
  double copy_nt_gbps = 0.0;  // the same copy with non-temporal stores (no read for ownership)
  double read_gbps = 0.0;     // read-only stream over the same 256 MiB
  double fma_gflops = 0.0;    // f32 FMA peak (vector width of the dispatched target)
  // bf16 dot peak: a vdpbf16ps loop where AVX512_BF16 exists, else the f32 peak.
  double bf16_gflops = 0.0;
  // AMX bf16 tile peak: amx_gemm on L1-resident tiles where AMX is usable, else 0.
  double amx_bf16_gflops = 0.0;
};
Limits measure_limits(int threads, bool quick);

// n values in [lo, hi) from an LCG whose state carries across calls. Benchmark inputs must be
// one stream, never a repeated block: the hosts we run on merge identical memory pages, and a
// tensor made of one block repeated (or of zeros) is then read from cache.
inline void fill_random(float* p, int64_t n, uint32_t* state, float lo = 0.0f, float hi = 1.0f) {
  uint32_t s = *state;
  for (int64_t i = 0; i < n; ++i) {
    s = s * 1664525u + 1013904223u;
    p[i] = lo + (hi - lo) * static_cast<float>(s >> 8) / 16777216.0f;
  }
  *state = s;
}

// A streaming kernel that reads `reads` arrays and writes `writes` arrays of n floats each,
// doing nothing but one add per element: the best-case speed of any kernel with the same
// memory traffic ("copy" baseline).
void stream_kernel(float* const* outs, int writes, const float* const* ins, int reads, int64_t n,
                   int threads);
// Reads `bytes` at `in` on `threads` threads, each a contiguous part read as two streams that
// ask for their lines ahead (a tail shorter than four vectors is skipped; limits.cc says why):
// the read stream behind Limits::read_gbps, also used to read the
// very buffers an op reads, as a floor timed in turn with it.
void read_kernel(const void* in, int64_t bytes, int threads);
// read_kernel over each tensor in turn: the floor of a weight-streaming benchmark (a GEMV chain,
// a whole model's decode), timed in turn with it.
void read_tensors(const std::vector<Tensor>& ts, int threads);

struct Result {
  std::string name;
  std::string dtype;
  int threads = 1;
  double seconds = 0.0;
  double spread = 0.0;  // (max - min) / median
  double bytes = 0.0;   // bytes that must move (each input read once, each output written once)
  double flops = 0.0;
  std::optional<double> gbps, gflops;
  double floor_fraction = 0.0;
  std::string baseline;  // "unfused", "onednn", "f32", "copy" or empty
  std::optional<double> speedup_vs_baseline;
  std::optional<double> bytes_ratio_vs_baseline;
  std::optional<double> working_bytes;  // scratch memory the op needs beyond in/outputs
  std::string note;
};

struct Options {
  int threads = 0;  // 0: all cores
  bool quick = false;
  std::string filter;  // regex on case names
};

// Runs every op benchmark whose name matches the filter. `progress` gets each row as it is
// measured (for streaming output).
std::vector<Result> run_op_benchmarks(const Options& opt,
                                      const std::function<void(const Result&)>& progress = {});

std::string results_json(const std::vector<Result>& rows);
std::string results_table(const std::vector<Result>& rows);

}  // namespace tboost::bench
