// Float64 reference kernels: the ground truth every CPU (and later CUDA) kernel is tested
// against. Deliberately naive: contiguous row-major std::vector<double> in and out, no
// vectorization, no threading, no fusion. Each output comes with a `scale` per element: the
// sum of the magnitudes of the terms that produced it, so tests can bound the error as
// |out - ref| <= tol * scale and cancellation never fails a correct kernel.
#pragma once

#include <cstdint>
#include <vector>

#include "tboost/ops/activation.h"
#include "tboost/ops/elementwise.h"
#include "tboost/ops/linear.h"
#include "tboost/ops/reduce.h"
#include "tboost/ops/rope.h"

namespace tboost::kernels::ref {

using Vec = std::vector<double>;

struct RefOut {
  Vec value;
  Vec scale;
};

// Shapes of the row-major Vecs below.
using Shape = std::vector<int64_t>;
// Steps a row-major multi-index over `shape`; false once past the last element.
inline bool next_index(Shape& idx, const Shape& shape) {
  for (size_t d = shape.size(); d-- > 0;) {
    if (++idx[d] < shape[d]) return true;
    idx[d] = 0;
  }
  return false;
}
// Flat row-major index, in a tensor of `shape`, of the element that broadcasts (numpy rules:
// right-aligned, size-1 dims repeat) to position idx of the result.
inline int64_t broadcast_index(const Shape& idx, const Shape& shape) {
  int64_t i = 0;
  const size_t off = idx.size() - shape.size();
  for (size_t d = 0; d < shape.size(); ++d) i = i * shape[d] + (shape[d] == 1 ? 0 : idx[d + off]);
  return i;
}
// Numpy broadcast of two shapes (the caller has checked they are compatible).
Shape broadcast_shape(const Shape& a, const Shape& b);

// Norms over rows of `cols`. res and b may be null. sum gets x + res (PRENORM).
void norm(RefOut* y, RefOut* sum, Vec* mean, Vec* rstd, const Vec& x, const Vec* res, const Vec& w,
          const Vec* b, double eps, int64_t rows, int64_t cols, bool rms, bool plus_one);

// Backward of norm (x: what was normalized; statistics recomputed in f64). dw, db may be null;
// dsum (may be null) is added to dx. Gradients are totals over the rows (not accumulated).
void norm_backward(RefOut* dx, RefOut* dw, RefOut* db, const Vec& dy, const Vec& x, const Vec& w,
                   const Vec* dsum, double eps, int64_t rows, int64_t cols, bool rms,
                   bool plus_one);
// Backward of y = x · Wᵀ + b: dx (M, K) = dy · W, dw (N, K) = dyᵀ · x, db (N) = column sums.
void linear_backward(RefOut* dx, RefOut* dw, RefOut* db, const Vec& dy, const Vec& x, const Vec& w,
                     int64_t M, int64_t K, int64_t N);
// Mean cross-entropy of softmax(x · Wᵀ) over rows whose label != ignore_index (label
// smoothing eps), with dx (M, K) and dw (V, K) of that mean. Returns the loss.
double linear_cross_entropy(RefOut* dx, RefOut* dw, const Vec& x, const Vec& w,
                            const std::vector<int64_t>& labels, int64_t M, int64_t K, int64_t V,
                            int64_t ignore_index, double eps);
// One AdamW step (torch.optim.AdamW) in place on p, m, v with gradient g * grad_scale.
void adamw_step(Vec* p, Vec* m, Vec* v, const Vec& g, int64_t step, double lr, double beta1,
                double beta2, double eps, double weight_decay, double grad_scale);
// Backward of activation: plain types dx (rows, F) = dy act'(x); gated types x, dx (rows, 2F).
void activation_backward(RefOut* dx, const Vec& dy, const Vec& x, int64_t rows, int64_t F,
                         ops::ActivationType type, bool gate_first);
// dw (vocab, cols) = sum over tokens t of dy[t] into row ids[t]. (Rope's backward is rope at
// the negated positions: R(a)^T = R(-a).)
void embedding_backward(RefOut* dw, const Vec& dy, const std::vector<int64_t>& ids, int64_t vocab,
                        int64_t cols);

// Rope over rows of head_dim; token_of_row[r] gives the position index of row r.
void rope(RefOut* y, const Vec& x, const Vec& positions_of_row, int64_t rows, int64_t head_dim,
          int64_t rotary_dim, ops::RopeRotation rotation, double theta, double scaling);

// Activation over rows: x (rows, F or 2F), y (rows, F).
void activation(RefOut* y, const Vec& x, int64_t rows, int64_t out_cols, ops::ActivationType type,
                bool gate_first);
double gelu_erf(double x);
double gelu_tanh(double x);
double silu(double x);

void softmax(RefOut* y, const Vec& x, int64_t rows, int64_t cols, double scale);

// y = act(x · W^T + bias) + residual. x (M, K), w (N, K), bias (N) or empty, residual (M, N)
// or empty.
// residual_mul: y = act(...) * residual instead of + residual.
void linear(RefOut* y, const Vec& x, const Vec& w, const Vec& bias, const Vec& residual, int64_t M,
            int64_t K, int64_t N, ops::Activation act, bool residual_mul = false);

// Elementwise. Binary: y = a op b in the broadcast shape of a and b; scale |a| + |b| for
// add/sub (cancellation), |y| otherwise (one rounding of exactly stored inputs). Unary (every
// type but cast; alpha for scale): scale |y|.
void elementwise_binary(RefOut* y, const Vec& a, const Shape& a_shape, const Vec& b,
                        const Shape& b_shape, ops::ElementwiseType type);
void elementwise_unary(RefOut* y, const Vec& x, ops::ElementwiseType type, double alpha);

// y = alpha · op(a) · op(b), batch dims broadcast: a (..., M, K), or (..., K, M) if ta; b
// (..., K, N), or (..., N, K) if tb; y (batch..., M, N) with scale |alpha| · Σ_k |a·b|.
void matmul(RefOut* y, const Vec& a, const Shape& a_shape, const Vec& b, const Shape& b_shape,
            bool ta, bool tb, double alpha);

// x reduced over `axes` (each in 0..rank-1; empty: all). y holds the kept dims in order
// (keepdims only changes the shape). scale: Σ|x| (sum), Σ|x|/n (mean), |y| (max, min). An
// empty reduction gives 0 (sum) and NaN (mean).
void reduce(RefOut* y, const Vec& x, const Shape& shape, const std::vector<int64_t>& axes,
            ops::ReduceType type);

// Layout copies (exact): y.dim(i) = x.dim(perm[i]); inputs joined along axis.
void transpose(Vec* y, const Vec& x, const Shape& shape, const std::vector<int64_t>& perm);
void concat(Vec* y, const std::vector<Vec>& xs, const std::vector<Shape>& shapes, int64_t axis);

}  // namespace tboost::kernels::ref

namespace tboost::kernels::ref {

// Which keys a query sees and what is added to its scores (include/tboost/ops/attention.h):
// query i sits at i + offset on the key axis (offset = Sk - Sq, bottom-right alignment).
struct AttentionMask {
  bool causal = false;
  int64_t window_left = -1, window_right = -1;  // -1: unbounded
  double alibi_slope = 0.0;                     // bias -slope * |i + offset - j|
  const double* mask = nullptr;                 // additive (Sq, Sk) row-major, or null
};

// Naive attention of one (sequence, head): q (Sq, D), k (Sk, D), v (Sk, Dv), row-major.
// o (Sq, Dv) with scale sum_j p_ij |v_jd|; lse (Sq) natural log, -inf for a row that sees no
// key (its o row is 0).
void attention(RefOut* o, Vec* lse, const Vec& q, const Vec& k, const Vec& v, int64_t Sq,
               int64_t Sk, int64_t D, int64_t Dv, double scale, const AttentionMask& m);
// Its gradients for the output gradient dout (Sq, Dv): dq (Sq, D), dk (Sk, D), dv (Sk, Dv),
// through the exact probabilities (dS = P ∘ (dO·Vᵀ - rowsum(dO ∘ O))).
void attention_backward(RefOut* dq, RefOut* dk, RefOut* dv, const Vec& q, const Vec& k,
                        const Vec& v, const Vec& dout, int64_t Sq, int64_t Sk, int64_t D,
                        int64_t Dv, double scale, const AttentionMask& m);

}  // namespace tboost::kernels::ref
