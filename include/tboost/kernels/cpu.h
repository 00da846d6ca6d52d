// Public CPU kernels as free functions, for code that calls kernels directly (training loops,
// engines with their own scheduling). Contiguous row-major data; outputs first, then inputs,
// then sizes and params; shapes in the trailing comment. These do not validate beyond what
// the signature implies: the Operation interface is the checked path.
#pragma once

#include <cstdint>

#include "tboost/core/dtype.h"
#include "tboost/ops/activation.h"
#include "tboost/ops/rope.h"

namespace tboost::kernels::cpu {

// y = x / rms(x) * w; rstd (rows) may be null.        x, y: (rows, cols)  w: (cols)
void rms_norm_forward(float* y, float* rstd, const float* x, const float* w, float eps,
                      int64_t rows, int64_t cols, int threads = 0);
void rms_norm_forward(bf16_t* y, float* rstd, const bf16_t* x, const bf16_t* w, float eps,
                      int64_t rows, int64_t cols, int threads = 0);
// PRENORM: sum = x + residual; y = sum / rms(sum) * w.   (rows, cols)
void rms_norm_prenorm_forward(float* y, float* sum, float* rstd, const float* x,
                              const float* residual, const float* w, float eps, int64_t rows,
                              int64_t cols, int threads = 0);
// y = (x - mean) / std(x) * w + b; b, mean and rstd may be null.   (rows, cols)
void layer_norm_forward(float* y, float* mean, float* rstd, const float* x, const float* w,
                        const float* b, float eps, int64_t rows, int64_t cols, int threads = 0);

// ---- backward (training) ------------------------------------------------------------------
// Input gradients (dx) are written; parameter gradients (dw, db, the embedding table's)
// ACCUMULATE (+=) in f32, so micro-batches add up. Math in f32 for every storage type.
// Results are bitwise the same for any thread count.

// RmsNorm backward. x: what was normalized (PRENORM: the sum x + residual); rstd from the
// forward; dsum (may be null): the gradient arriving at PRENORM's sum output, added to dx
// (dx is then also the residual's gradient). dw may be null. dx may alias dy or dsum.
//   dx, dy, x, dsum: (rows, cols)   w, dw: (cols)   rstd: (rows)
void rms_norm_backward(float* dx, float* dw, const float* dy, const float* x, const float* w,
                       const float* rstd, const float* dsum, int64_t rows, int64_t cols,
                       int threads = 0);
void rms_norm_backward(bf16_t* dx, float* dw, const bf16_t* dy, const bf16_t* x, const bf16_t* w,
                       const float* rstd, const bf16_t* dsum, int64_t rows, int64_t cols,
                       int threads = 0);
// LayerNorm backward; as above, with mean from the forward and db (may be null).
void layer_norm_backward(float* dx, float* dw, float* db, const float* dy, const float* x,
                         const float* w, const float* mean, const float* rstd, const float* dsum,
                         int64_t rows, int64_t cols, int threads = 0);
void layer_norm_backward(bf16_t* dx, float* dw, float* db, const bf16_t* dy, const bf16_t* x,
                         const bf16_t* w, const float* mean, const float* rstd, const bf16_t* dsum,
                         int64_t rows, int64_t cols, int threads = 0);
// Activation backward. Plain types, y = act(x): dx = dy * act'(x), dx may alias dy; dx, dy, x:
// (rows, F). Gated types (kSwiGlu, kGeGluErf, kGeGluTanh), y = act(gate) * up with x = [gate |
// up] per row ([up | gate] when !gate_first): dx, x: (rows, 2F), dy: (rows, F).
void activation_backward(float* dx, const float* dy, const float* x, ops::ActivationType type,
                         int64_t rows, int64_t F, bool gate_first = true, int threads = 0);
void activation_backward(bf16_t* dx, const bf16_t* dy, const bf16_t* x, ops::ActivationType type,
                         int64_t rows, int64_t F, bool gate_first = true, int threads = 0);
// Rope backward (BSND): dx = R(-angle) dy, the dims beyond rotary_dim pass through. p as in
// the forward (its layout is ignored). dx may alias dy.
//   dx, dy: (tokens, heads, head_dim)   positions: (tokens)
void rope_backward(float* dx, const float* dy, const int32_t* positions, const ops::RopeParam& p,
                   int64_t tokens, int64_t heads, int64_t head_dim, int threads = 0);
void rope_backward(bf16_t* dx, const bf16_t* dy, const int32_t* positions, const ops::RopeParam& p,
                   int64_t tokens, int64_t heads, int64_t head_dim, int threads = 0);
// Linear backward for y = x · Wᵀ (+ b), W (N, K) as stored (the Hugging Face layout):
//   dx (M, K) = dy · W (written), dW (N, K) += dyᵀ · x, db (N) += sum over rows of dy.
// Any of dx, dw, db may be null. Two oneDNN matmuls (bf16 operands widened to f32 where oneDNN
// has no bf16 matmul, as on AVX2); db is our own chunked sum. dW's bits may depend on the thread
// count (oneDNN's GEMM may split the M reduction among threads); db's do not.
//   x: (M, K)   dy: (M, N)   w, dw: (N, K)   db: (N)
void linear_backward(float* dx, float* dw, float* db, const float* dy, const float* x,
                     const float* w, int64_t M, int64_t K, int64_t N, int threads = 0);
void linear_backward(bf16_t* dx, float* dw, float* db, const bf16_t* dy, const bf16_t* x,
                     const bf16_t* w, int64_t M, int64_t K, int64_t N, int threads = 0);
// Fused linear + cross-entropy, forward and backward in one call, in row chunks so the (M, V)
// logits never exist (chunk_rows: the most rows per chunk, 0: ~40 MiB of f32 logits; the rows go
// in the fewest chunks of that size, as even as that count allows). Returns the mean loss over
// the rows whose label is not ignore_index (PyTorch's cross_entropy with reduction="mean",
// label_smoothing eps: target (1 - eps) one_hot + eps / V); writes dx = d loss / d x (may be
// null) and accumulates dw += d loss / d W (may be null). A label outside [0, V) that is not
// ignore_index throws tboost::Error before anything is written. bf16: the logits are f32; on
// CPUs with a bf16 matmul (AVX-512 BF16) their gradient is rounded to bf16 (as under PyTorch's
// autocast) for the dx and dw products, elsewhere it stays f32.
//   x, dx: (M, K)   w, dw: (V, K)   labels: (M)
double linear_cross_entropy(float* dx, float* dw, const float* x, const float* w,
                            const int32_t* labels, int64_t M, int64_t K, int64_t V,
                            int64_t ignore_index = -100, float label_smoothing = 0.0f,
                            int64_t chunk_rows = 0, int threads = 0);
double linear_cross_entropy(bf16_t* dx, float* dw, const bf16_t* x, const bf16_t* w,
                            const int32_t* labels, int64_t M, int64_t K, int64_t V,
                            int64_t ignore_index = -100, float label_smoothing = 0.0f,
                            int64_t chunk_rows = 0, int threads = 0);
// ---- attention (training) ------------------------------------------------------------------
// Layout BSHD: q (batch, sq, heads, D), k (batch, sk, kv_heads, D), v (batch, sk, kv_heads, Dv),
// o and dout (batch, sq, heads, Dv), lse (batch, heads, sq), natural log (-inf for a query that
// sees no key). heads a multiple of kv_heads (GQA). Varlen (cu_seqlens_q/k set, batch + 1
// entries each, sequence b owning tokens [cu[b], cu[b+1])): q (total_q, heads, D), k and v
// (total_k, kv_heads, ·), lse (heads, total_q), and sq / sk are the longest sequence's lengths.
// Key j is visible to query i (at i + sk_b - sq_b on the key axis) per causal / window; ALiBi
// adds -slope_h · distance; mask (batch, sq, sk), additive (not with varlen).
struct AttentionOptions {
  float scale = 0.0f;  // 0: 1 / sqrt(D)
  bool causal = false;
  int64_t window_left = -1, window_right = -1;  // -1: unbounded
  const float* alibi_slopes = nullptr;          // (heads) or null
  const float* mask = nullptr;
  const int32_t* cu_seqlens_q = nullptr;
  const int32_t* cu_seqlens_k = nullptr;
};
// Flash attention forward that also returns the log-sum-exp the backward needs.
void attention_forward(float* o, float* lse, const float* q, const float* k, const float* v,
                       int64_t batch, int64_t sq, int64_t sk, int64_t heads, int64_t kv_heads,
                       int64_t D, int64_t Dv, const AttentionOptions& opt, int threads = 0);
void attention_forward(bf16_t* o, float* lse, const bf16_t* q, const bf16_t* k, const bf16_t* v,
                       int64_t batch, int64_t sq, int64_t sk, int64_t heads, int64_t kv_heads,
                       int64_t D, int64_t Dv, const AttentionOptions& opt, int threads = 0);
// Flash attention backward: dq, dk, dv written whole (GQA: dk, dv summed over each group's
// heads), from the forward's o and lse; scores recomputed in tiles (no T x T buffer). Bitwise
// the same for any thread count.
void attention_backward(float* dq, float* dk, float* dv, const float* dout, const float* q,
                        const float* k, const float* v, const float* o, const float* lse,
                        int64_t batch, int64_t sq, int64_t sk, int64_t heads, int64_t kv_heads,
                        int64_t D, int64_t Dv, const AttentionOptions& opt, int threads = 0);
void attention_backward(bf16_t* dq, bf16_t* dk, bf16_t* dv, const bf16_t* dout, const bf16_t* q,
                        const bf16_t* k, const bf16_t* v, const bf16_t* o, const float* lse,
                        int64_t batch, int64_t sq, int64_t sk, int64_t heads, int64_t kv_heads,
                        int64_t D, int64_t Dv, const AttentionOptions& opt, int threads = 0);

// ---- optimizer --------------------------------------------------------------------------
// Sum of squares of n gradient values, as f64 (inf or NaN when g holds them: the loss scaler's
// overflow check). The global norm for clipping is the sqrt of the sum over every parameter
// tensor. The same bits for any thread count.
double grad_sum_squares(const float* g, int64_t n, int threads = 0);
struct AdamWHyper {
  float lr = 1e-3f, beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f, weight_decay = 0.01f;
};
// One fused AdamW step (torch.optim.AdamW's arithmetic: decoupled weight decay, bias
// corrections) on f32 master weights p with moments m, v, in place. The gradient used is
// g * grad_scale (the clipping factor times 1 / loss scale). step is 1-based. p16 (may be null)
// receives the new weights rounded to bf16, the copy a bf16 forward computes with.
//   p, m, v, g, p16: (n)
void adamw_step(float* p, float* m, float* v, const float* g, bf16_t* p16, int64_t n, int64_t step,
                const AdamWHyper& h, float grad_scale = 1.0f, int threads = 0);
// Embedding backward: dw[ids[t]] += dy[t]; every id must be in [0, vocab) (not checked).
//   dw: (vocab, cols)   dy: (tokens, cols)   ids: (tokens)
void embedding_backward(float* dw, const float* dy, const int32_t* ids, int64_t tokens,
                        int64_t vocab, int64_t cols, int threads = 0);
void embedding_backward(float* dw, const bf16_t* dy, const int32_t* ids, int64_t tokens,
                        int64_t vocab, int64_t cols, int threads = 0);

}  // namespace tboost::kernels::cpu
