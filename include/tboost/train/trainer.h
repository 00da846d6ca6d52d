// Training of causal LMs (GPT-2 and LLaMA families) on the CPU: explicit layer forward and
// backward through the fused training kernels (no tape), one activation arena sized once per
// micro-batch shape, fused AdamW over f32 master weights, gradient clipping by global norm,
// warmup + cosine schedule, gradient accumulation, gradient checkpointing, bf16 autocast, f16
// storage and dynamic loss scaling.
//
// Parameters live in one flat f32 buffer (master weights) in the Hugging Face names and layouts
// (GPT-2's Conv1D matrices transposed to (out, in) inside, back on save); gradients, AdamW's
// moments and (bf16) the compute copy are flat buffers of the same layout.
//
// Numerics: the loss is the mean cross-entropy over every label of the global batch that is not
// ignore_index (-100), whatever the micro-batching. Our own reductions (norms, attention
// backward, loss, optimizer, embedding and bias gradients) have the same bits for any thread
// count; oneDNN's matmuls may split a reduction by thread count, so runs are bitwise
// reproducible for a given seed and thread count.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "tboost/core/dtype.h"
#include "tboost/model/config.h"

namespace tboost::train {

struct TrainOptions {
  // kF32; kBF16: autocast (bf16 weights copy and activations, f32 master weights, f32
  // accumulation in every kernel and in the gradients); or kF16: f16 storage (activations and
  // their gradients in f16, half of f32's activation memory; every product computed in f32
  // from the f32 master weights, since oneDNN has no f16 matmul on these CPUs). f16's range
  // ends at 65504 and its gradients underflow below ~6e-8: use it with loss_scaling.
  DType compute = DType::kF32;
  int64_t micro_batch = 0;     // sequences per micro-batch; 0: the whole batch at once
  bool checkpointing = false;  // keep each layer's input only; recompute the layer in backward
  float lr = 3e-4f, beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f, weight_decay = 0.1f;
  float clip_norm = 1.0f;  // clip by global gradient norm; 0: off
  int64_t warmup_steps = 0;
  int64_t total_steps = 0;  // cosine decay to min_lr_ratio·lr at total_steps; 0: constant
  float min_lr_ratio = 0.1f;
  // Dynamic loss scaling: start 2^16, x2 after growth_interval clean steps, x0.5 and skip the
  // step on inf/NaN gradients.
  bool loss_scaling = false;
  float initial_loss_scale = 65536.0f;
  int64_t growth_interval = 2000;
  int threads = 0;  // 0: all cores
};

struct StepStats {
  double loss = 0.0;
  double grad_norm = 0.0;  // before clipping (unscaled)
  double lr = 0.0;
  bool skipped = false;  // inf/NaN gradients under loss scaling: no update
  float loss_scale = 1.0f;
  int64_t tokens = 0;  // labels that counted
};

// Dynamic loss scaler (fp16-style): the gradient of the loss is multiplied by scale(); after the
// backward, update(found_nonfinite) halves the scale (the step is skipped) or, after
// growth_interval clean steps in a row, doubles it.
class LossScaler {
 public:
  LossScaler(float initial = 65536.0f, int64_t growth_interval = 2000)
      : scale_(initial), interval_(growth_interval) {}
  float scale() const { return scale_; }
  int64_t clean_steps() const { return clean_; }
  // Returns whether the step may be applied.
  bool update(bool found_nonfinite);
  void restore(float scale, int64_t clean) { scale_ = scale, clean_ = clean; }

 private:
  float scale_;
  int64_t interval_;
  int64_t clean_ = 0;
};

// Learning rate at 1-based step: linear warmup to lr over warmup steps, then cosine to
// min_lr_ratio·lr at total_steps (constant after; constant throughout when total_steps is 0).
double scheduled_lr(const TrainOptions& o, int64_t step);

class Trainer {
 public:
  // A Hugging Face checkpoint directory (config.json + safetensors), or a config with random
  // weights (normal, std 0.02; norm gains 1, biases 0) from seed.
  static std::unique_ptr<Trainer> from_pretrained(const std::string& dir, const TrainOptions& o);
  static std::unique_ptr<Trainer> from_config(const model::ModelConfig& c, const TrainOptions& o,
                                              uint64_t seed = 1);
  ~Trainer();

  const model::ModelConfig& config() const;
  const TrainOptions& options() const;
  void set_options(const TrainOptions& o);  // same compute dtype only

  // ids and labels: (batch, seq) row-major; labels[b, t] is the target of position t (callers
  // shift: labels = ids shifted left, the last -100), ignore_index -100. Forward + backward of
  // every micro-batch (gradients zeroed first, then accumulated), returning the mean loss.
  double forward_backward(const int32_t* ids, const int32_t* labels, int64_t batch, int64_t seq,
                          float grad_scale = 1.0f);
  // Forward only: the mean loss.
  double loss(const int32_t* ids, const int32_t* labels, int64_t batch, int64_t seq);
  // forward_backward, then clipping, the optimizer step and the schedule.
  StepStats step(const int32_t* ids, const int32_t* labels, int64_t batch, int64_t seq);
  int64_t steps_done() const;

  // Parameters by Hugging Face name, in the model's order; shapes as stored in a checkpoint.
  std::vector<std::string> parameter_names() const;
  std::vector<int64_t> parameter_shape(const std::string& name) const;
  // f32 copies in the checkpoint's layout.
  std::vector<float> parameter(const std::string& name) const;
  std::vector<float> gradient(const std::string& name) const;
  int64_t num_parameters() const;
  // Bytes: the activation arena for the last shape (everything but weights, gradients and
  // optimizer state, plus the loss's and attention's scratch), and the parameter state.
  size_t activation_bytes() const;
  size_t state_bytes() const;

  // A checkpoint directory loadable by OptimizedTransformer::from_pretrained (config.json,
  // model.safetensors in f32) plus the optimizer state (optimizer.safetensors,
  // trainer_state.json: step, loss scale, `extra` for the caller, e.g. the data position).
  // extra_files (name -> contents, e.g. a tokenizer) go into the same directory. Written into
  // dir + ".tmp" and swapped into place (the old one moved to dir + ".old" first, removed
  // after): a crash never leaves a partial dir, and one of dir / dir + ".old" is always whole.
  void save(const std::string& dir, const std::string& extra_json = "{}",
            const std::map<std::string, std::string>& extra_files = {}) const;
  // Restores weights, moments, step and loss scale from save()'s dir; returns its extra JSON.
  std::string load_state(const std::string& dir);

  struct Impl;  // implementation detail (src/train/trainer.cc)

 private:
  explicit Trainer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace tboost::train
