// `tboost bench --config NAME | --model DIR`: prefill (pp) and decode (tg) tokens/s of a whole
// model, like llama-bench (see model_bench.cc).
#pragma once

#include <cstdint>
#include <string>

namespace tboost::tools {

struct ModelBenchArgs {
  std::string config;  // built-in config (random weights), or
  std::string model;   // a checkpoint directory
  std::string dtype = "f32";
  int threads = 0;
  int64_t prompt = 512;  // -p: prefill tokens
  int64_t gen = 128;     // -n: decode tokens
  int reps = 5;
  bool json = false;
  bool mmap = false;  // weights mapped instead of read into memory
};

int run_model_bench(const ModelBenchArgs& a);

}  // namespace tboost::tools
