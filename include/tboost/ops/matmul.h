// MatMul: batched y = alpha · op(a) · op(b) between two activations (the Q·Kᵀ and P·V of an
// unfused attention, or a graph's MatMul node), one oneDNN matmul.
//
// Inputs a (..., M, K) and b (..., K, N); transpose_a / transpose_b take a as (..., K, M) and
// b as (..., N, K). Rank >= 2 each (a rank-1 b is not accepted: reshape it to (K, 1)); the
// batch dims (all but the last two) broadcast numpy-style, so a (B, H, M, K) times b (K, N)
// is allowed. Output y (batch..., M, N) in a's dtype. Dtypes: f32; bf16 where oneDNN has a
// bf16 matmul on this CPU, else bf16 and f16 are converted and computed in f32 (impl_info()
// says which ran). Any strides, as long as each operand's two matrix dims form a strided
// matrix (one of them with stride 1); others are staged contiguous in the workspace.
#pragma once

namespace tboost::ops {

struct MatMulParam {
  bool transpose_a = false;
  bool transpose_b = false;
  float alpha = 1.0f;
  bool operator==(const MatMulParam&) const = default;
};

}  // namespace tboost::ops
