// Linear: y = act(x · Wᵀ + bias) + residual (or * residual), one oneDNN matmul with post-ops.
//
// Inputs, in order: x (..., K) [or (K, M) with transpose_a], weight (N, K) when transpose_b
// (the Hugging Face layout) or (K, N), then bias (N) if has_bias, then residual (..., N) if
// has_residual. Output: y (..., N) in x's dtype. Dtypes: f32, bf16 (f32 accumulation); f16 is
// a storage type computed in f32. Bias may be f32 or x's dtype; residual has y's dtype.
// With constant_weight the weight is re-packed once at setup into oneDNN's blocked layout
// (re-packed again only if the weight pointer changes); set it false for weights that change.
#pragma once

#include <cstdint>

namespace tboost::ops {

enum class Activation { kNone, kRelu, kGeluErf, kGeluTanh, kSilu };
const char* activation_name(Activation a);

struct LinearParam {
  bool transpose_a = false;  // x given as (K, M); only for rank-2 x
  bool transpose_b = true;   // weight given as (N, K)
  bool has_bias = false;
  Activation activation = Activation::kNone;
  bool has_residual = false;
  // With has_residual: y = act(x · Wᵀ + bias) * residual instead of + residual. This is the
  // gated MLP in two GEMMs with no extra pass: up = x · W_upᵀ, then
  // y = Linear{activation = kSilu, has_residual, residual_is_multiplier}(x, W_gate, up) = SwiGLU.
  bool residual_is_multiplier = false;
  bool constant_weight = true;
  bool operator==(const LinearParam&) const = default;
};

}  // namespace tboost::ops
