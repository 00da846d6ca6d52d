// `tboost bench --config NAME | --model DIR`: prefill (pp) and decode (tg) tokens/s of a whole
// model, like llama-bench (see model_bench.cc).
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

namespace tboost::tools {

struct ModelBenchArgs {
  std::string config;  // built-in config (random weights), or
  std::string model;   // a checkpoint directory
  std::string dtype = "f32";
  int threads = 0;
  int64_t prompt = 512;  // -p: prefill tokens
  int64_t gen = 128;     // -n: decode tokens
  int64_t depth = 0;     // -d: tokens already in the cache before each pp and tg run
  int reps = 5;
  bool json = false;
  bool mmap = false;        // weights mapped instead of read into memory
  bool pack = false;        // LoadOptions::pack_weights
  std::string cache_dtype;  // "" (the model's dtype), f32 or bf16
};

int run_model_bench(const ModelBenchArgs& a);

// Shared by the benchmark commands: n token ids in [0, V) from a fixed LCG (the same ids for
// the same seed on every machine), wall seconds since t0, and the median of samples (the mean
// of the middle two for an even count; 0 for none).
std::vector<int32_t> random_ids(int64_t n, int64_t V, uint32_t seed);
double seconds_since(std::chrono::steady_clock::time_point t0);
double median(std::vector<double> v);

}  // namespace tboost::tools
