// Text generation over an OptimizedTransformer session: sampling and the generate loop.
//
// Sampling, in Hugging Face's order: repetition penalty over the sequence so far (a seen
// token's logit is divided by the penalty when positive, multiplied when negative), then
// temperature, top-k, top-p (the smallest set of most probable tokens whose probability
// reaches top_p). temperature 0 is greedy (argmax; ties go to the lowest id). Each sequence
// draws from its own generator seeded by (seed, its index), so the same seed gives the same
// text whatever else is in the batch.
#pragma once

#include <cstdint>
#include <functional>
#include <random>
#include <vector>

#include "tboost/model/model.h"

namespace tboost::model {

struct SamplingParams {
  float temperature = 0.0f;  // 0: greedy
  int64_t top_k = 0;         // 0: off
  float top_p = 1.0f;        // 1: off
  float repetition_penalty = 1.0f;
  uint64_t seed = 0;
};

class Sampler {
 public:
  Sampler(const SamplingParams& p, uint64_t stream);
  // Picks the next token from f32 logits (V) given the ids so far (prompt and generated).
  int32_t next(const float* logits, int64_t V, const std::vector<int32_t>& history);

 private:
  SamplingParams p_;
  std::mt19937_64 rng_;
  std::vector<float> work_;
  std::vector<int32_t> idx_;
};

struct GenerationConfig {
  int64_t max_new_tokens = 64;
  SamplingParams sampling;
  std::vector<int32_t> stop_ids;  // a sequence ends after emitting one of these
};

struct GenerationStats {
  int64_t prompt_tokens = 0;
  int64_t generated_tokens = 0;
  double prefill_seconds = 0.0;  // prompts through the model (first token's logits)
  double decode_seconds = 0.0;   // every later step
};

// Generates for a batch of prompts of different lengths in one session (prefill together,
// then one decode step for all live sequences at a time). on_token(i, id) is called for
// every new token of prompt i as it is made. Returns the new tokens per prompt.
std::vector<std::vector<int32_t>> generate(
    OptimizedTransformer& model, const std::vector<std::vector<int32_t>>& prompts,
    const GenerationConfig& cfg, const std::function<void(size_t, int32_t)>& on_token = {},
    GenerationStats* stats = nullptr);

}  // namespace tboost::model
