// `tboost optimize`: original vs optimized graph report (see optimize_cmd.cc).
#pragma once

#include <cstdint>
#include <string>

namespace tboost::tools {

struct OptimizeArgs {
  std::string model;  // an .onnx file, or empty with `layer`
  std::string layer;  // "gpt2" or "llama": the op-by-op layer (no file needed)
  int64_t batch = 1, seq = 512;
  int64_t hidden = 768, heads = 12, ffn = 3072, kv_heads = 0;  // --layer shapes
  int threads = 0;
  bool json = false;
  double budget_s = 2.0;   // timing budget per side
  std::string inputs_dir;  // DIR/<input name>.npy for each graph input (else generated)
  std::string reference;   // .npy the first output is compared with (e.g. onnxruntime's)
};

// Prints the report; returns the process exit code. Throws tboost::Error on bad input.
int run_optimize(const OptimizeArgs& a);

}  // namespace tboost::tools
