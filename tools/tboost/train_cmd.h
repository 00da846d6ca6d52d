// `tboost train` (training from a text file, with checkpoints and --resume) and
// `tboost bench --train` (step time, tokens/s, memory and the matmul floor of one training step).
#pragma once

#include <cstdint>
#include <string>

namespace tboost::tools {

struct TrainArgs {
  std::string config, model;  // one of them
  std::string data, out;
  std::string dtype = "f32";
  std::string tokens = "auto";  // auto | byte | model
  std::string log;              // JSON lines, one per step
  int64_t steps = 100, batch = 4, seq = 256, micro_batch = 0, save_every = 50, warmup = 10;
  int64_t stop_after = 0;  // stop (with a checkpoint) after this many steps of this run; 0: off
  float lr = 3e-4f, min_lr_ratio = 0.1f, weight_decay = 0.1f, clip = 1.0f;
  bool checkpointing = false, resume = false, loss_scaling = false;
  int threads = 0;
  uint64_t seed = 1;
};
int run_train(const TrainArgs& a);

struct TrainBenchArgs {
  std::string config, model;
  std::string dtype = "f32";
  int threads = 0;
  int64_t batch = 4, seq = 256, micro_batch = 0;
  bool checkpointing = false;
  int reps = 3;
  bool json = false;
};
int run_train_bench(const TrainBenchArgs& a);

}  // namespace tboost::tools
