// Float64 reference kernels: the ground truth every CPU (and later CUDA) kernel is tested
// against. Deliberately naive: contiguous row-major std::vector<double> in and out, no
// vectorization, no threading, no fusion. Each output comes with a `scale` per element: the
// sum of the magnitudes of the terms that produced it, so tests can bound the error as
// |out - ref| <= tol * scale and cancellation never fails a correct kernel.
#pragma once

#include <cstdint>
#include <vector>

#include "tboost/ops/activation.h"
#include "tboost/ops/linear.h"
#include "tboost/ops/rope.h"

namespace tboost::kernels::ref {

using Vec = std::vector<double>;

struct RefOut {
  Vec value;
  Vec scale;
};

// Norms over rows of `cols`. res and b may be null. sum gets x + res (PRENORM).
void norm(RefOut* y, RefOut* sum, Vec* mean, Vec* rstd, const Vec& x, const Vec* res, const Vec& w,
          const Vec* b, double eps, int64_t rows, int64_t cols, bool rms, bool plus_one);

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

}  // namespace tboost::kernels::ref
