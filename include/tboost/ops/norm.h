// RmsNorm and LayerNorm over the last axis, with the residual add fused in.
//
// layer = kNorm:     inputs (x, weight[, bias])            -> (y)
// layer = kPreNorm:  inputs (x, residual, weight[, bias])  -> (y, sum)   sum = x + residual,
//                    y = norm(sum); `sum` is the new residual stream (one pass, not two).
// layer = kPostNorm: inputs (x, residual, weight[, bias])  -> (y)        y = norm(x + residual)
// bias only for LayerNorm with has_bias. x, residual, y, sum: (..., C) in f32, bf16 or f16;
// weight and bias: (C) in f32 or x's dtype. weight_plus_one scales by (1 + w) (Gemma-style).
// With output_stats, extra f32 outputs of shape (rows) follow: RmsNorm rstd; LayerNorm mean
// then rstd (kept for the backward pass). Statistics are accumulated in f32.
#pragma once

namespace tboost::ops {

enum class NormLayer { kNorm, kPreNorm, kPostNorm };
const char* norm_layer_name(NormLayer l);

struct RmsNormParam {
  float epsilon = 1e-6f;
  NormLayer layer = NormLayer::kNorm;
  bool weight_plus_one = false;
  bool output_stats = false;
  bool operator==(const RmsNormParam&) const = default;
};

struct LayerNormParam {
  float epsilon = 1e-5f;
  NormLayer layer = NormLayer::kNorm;
  bool has_bias = true;
  bool weight_plus_one = false;
  bool output_stats = false;
  bool operator==(const LayerNormParam&) const = default;
};

}  // namespace tboost::ops
