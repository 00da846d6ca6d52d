// Model configuration: what OptimizedTransformer needs to know about a checkpoint, read from a
// Hugging Face config.json or taken from a built-in name.
//
// Families (ModelConfig::family):
//   kGpt2   GPT-2: learned positions, pre-LayerNorm, fused QKV with bias, GELU (tanh form),
//           tied output embedding. model_type "gpt2".
//   kLlama  LLaMA and look-alikes: rope (theta, linear or llama3 scaling), RMSNorm, SwiGLU,
//           grouped K/V heads, tied or untied output. model_type "llama", "mistral" (without
//           sliding window), "qwen2" (q/k/v bias), "smollm".
//   kBert   BERT encoder: learned positions and token types, post-LayerNorm, GELU (erf form),
//           bidirectional attention; embeddings by mean pooling. model_type "bert".
// Anything else is an error naming the model_type. Every field is checked (positive sizes,
// heads dividing hidden, kv heads dividing heads); errors name the field and the file.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tboost/ops/rope.h"

namespace tboost::model {

enum class Family { kGpt2, kLlama, kBert };
const char* family_name(Family f);

struct ModelConfig {
  Family family = Family::kLlama;
  std::string model_type = "llama";
  int64_t vocab = 0;
  int64_t hidden = 0;
  int64_t layers = 0;
  int64_t heads = 0;
  int64_t kv_heads = 0;
  int64_t head_dim = 0;  // hidden / heads unless the config says otherwise
  int64_t ffn = 0;
  int64_t max_positions = 0;
  int64_t type_vocab = 0;  // BERT token types
  float norm_eps = 1e-5f;
  // Rope (LLaMA family): theta, scaling kind and factors, rotary_dim = head_dim.
  ops::RopeParam rope;
  bool tie_embeddings = false;
  bool qkv_bias = false;  // Qwen2, GPT-2, BERT
  bool o_bias = false;    // GPT-2, BERT
  bool mlp_bias = false;  // GPT-2, BERT
  std::string hidden_act = "silu";
  int64_t bos_id = -1;
  std::vector<int64_t> eos_ids;
  int64_t pad_id = -1;

  bool causal() const { return family != Family::kBert; }
  // Parameters: all, and those outside the embedding tables (tied output counted once).
  int64_t num_params() const;
  int64_t num_params_without_embeddings() const;

  // Parses config.json text; `where` names the file in errors.
  static ModelConfig from_json(const std::string& text, const std::string& where = "config.json");
  static ModelConfig from_file(const std::string& path);
  // Built-in shapes for benchmarks with random weights: "gpt2-small" (124M), "llama-110m"
  // (12 x 768, FFN 2048, vocab 32000, untied: 134M with embeddings), "llama-1b" (16 x 2048,
  // 32 heads, 8 kv heads, FFN 5632), "bert-base"; and tiny ones for tests ("llama-tiny", ...).
  static ModelConfig builtin(const std::string& name);
  static std::vector<std::string> builtin_names();
  // Throws naming the first bad field.
  void validate(const std::string& where) const;
};

}  // namespace tboost::model
