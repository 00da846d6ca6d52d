// Transformer layers written op by op, the way an exporter (torch.onnx) spells them: norms as
// mean / pow / sqrt / div arithmetic, GELU and SiLU as their formulas, attention as
// MatMul / scale / mask add / Softmax / MatMul with transposes around it. They are the input
// the fusion passes are measured on (bench "layer" cases) and tested against.
//
// Graph inputs: x (batch, T, C) f32 with "batch" symbolic; LLaMA also positions (batch·T) i32
// for the rope. Output: the layer's output (batch, T, C). Weights are random, scaled
// 1/sqrt(fan_in), from `seed`. The causal mask is a (T, T) constant, as exports give it.
#pragma once

#include <cstdint>

#include "tboost/graph/graph.h"

namespace tboost::graph {

struct LayerShape {
  int64_t hidden = 768;  // C
  int64_t heads = 12;    // H (the head dim is C / H)
  int64_t kv_heads = 0;  // LLaMA: K/V heads (GQA, written as repeat_kv); 0 = heads
  int64_t ffn = 2048;    // MLP width
  int64_t seq = 128;     // T
  bool causal = true;
  uint64_t seed = 1;
};

// GPT-2 block: LayerNorm (decomposed) -> c_attn (MatMul + bias) -> split q, k, v -> attention
// -> c_proj + bias -> residual; LayerNorm -> fc + bias -> GELU (tanh form, decomposed) ->
// proj + bias -> residual.
Graph gpt2_layer(const LayerShape& s);
// LLaMA block: RmsNorm (decomposed) -> q, k, v projections -> rope on q and k -> [GQA: K and V
// repeated as Hugging Face writes repeat_kv: Reshape, Expand, Reshape] -> attention ->
// o projection -> residual; RmsNorm -> gate and up projections -> x·sigmoid(x) · up -> down
// projection -> residual.
Graph llama_layer(const LayerShape& s);

}  // namespace tboost::graph
