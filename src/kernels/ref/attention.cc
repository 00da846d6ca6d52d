// Float64 reference of attention: the whole score row is formed, then an exact softmax.
#include <algorithm>
#include <cmath>
#include <limits>

#include "src/kernels/ref/reference.h"

namespace tboost::kernels::ref {

void attention(RefOut* o, Vec* lse, const Vec& q, const Vec& k, const Vec& v, int64_t Sq,
               int64_t Sk, int64_t D, int64_t Dv, double scale, const AttentionMask& m) {
  const double inf = std::numeric_limits<double>::infinity();
  const int64_t offset = Sk - Sq;
  o->value.assign(static_cast<size_t>(Sq * Dv), 0.0);
  o->scale.assign(o->value.size(), 0.0);
  lse->assign(static_cast<size_t>(Sq), -inf);
  Vec s(static_cast<size_t>(Sk));
  for (int64_t i = 0; i < Sq; ++i) {
    const int64_t pos = i + offset;
    double mx = -inf;
    for (int64_t j = 0; j < Sk; ++j) {
      const bool visible = (!m.causal || j <= pos) &&
                           (m.window_left < 0 || j >= pos - m.window_left) &&
                           (m.window_right < 0 || j <= pos + m.window_right);
      double x = -inf;
      if (visible) {
        x = 0.0;
        for (int64_t d = 0; d < D; ++d) x += q[i * D + d] * k[j * D + d];
        x = x * scale - m.alibi_slope * static_cast<double>(std::llabs(pos - j));
        if (m.mask) x += m.mask[i * Sk + j];
      }
      s[j] = x;
      mx = std::max(mx, x);
    }
    if (mx == -inf) continue;  // nothing visible: zeros, lse -inf
    double sum = 0.0;
    for (int64_t j = 0; j < Sk; ++j) sum += s[j] == -inf ? 0.0 : std::exp(s[j] - mx);
    (*lse)[i] = mx + std::log(sum);
    for (int64_t j = 0; j < Sk; ++j) {
      if (s[j] == -inf) continue;
      const double p = std::exp(s[j] - mx) / sum;
      for (int64_t d = 0; d < Dv; ++d) {
        o->value[i * Dv + d] += p * v[j * Dv + d];
        o->scale[i * Dv + d] += p * std::abs(v[j * Dv + d]);
      }
    }
  }
}

}  // namespace tboost::kernels::ref

namespace tboost::kernels::ref {

void attention_backward(RefOut* dq, RefOut* dk, RefOut* dv, const Vec& q, const Vec& k,
                        const Vec& v, const Vec& dout, int64_t Sq, int64_t Sk, int64_t D,
                        int64_t Dv, double scale, const AttentionMask& m) {
  // The forward's probabilities, row by row (the reference forward's own scores and lse).
  RefOut o;
  Vec lse;
  attention(&o, &lse, q, k, v, Sq, Sk, D, Dv, scale, m);
  const double inf = std::numeric_limits<double>::infinity();
  const int64_t offset = Sk - Sq;
  for (RefOut* r : {dq, dk, dv}) r->value.clear(), r->scale.clear();
  dq->value.assign(static_cast<size_t>(Sq * D), 0.0);
  dk->value.assign(static_cast<size_t>(Sk * D), 0.0);
  dv->value.assign(static_cast<size_t>(Sk * Dv), 0.0);
  dq->scale = dq->value, dk->scale = dk->value, dv->scale = dv->value;
  Vec p(static_cast<size_t>(Sk)), dp(static_cast<size_t>(Sk)), dpa(static_cast<size_t>(Sk));
  for (int64_t i = 0; i < Sq; ++i) {
    if (lse[i] == -inf) continue;
    const int64_t pos = i + offset;
    for (int64_t j = 0; j < Sk; ++j) {
      const bool visible = (!m.causal || j <= pos) &&
                           (m.window_left < 0 || j >= pos - m.window_left) &&
                           (m.window_right < 0 || j <= pos + m.window_right);
      p[j] = 0.0;
      if (!visible) continue;
      double x = 0.0;
      for (int64_t d = 0; d < D; ++d) x += q[i * D + d] * k[j * D + d];
      x = x * scale - m.alibi_slope * static_cast<double>(std::llabs(pos - j));
      if (m.mask) x += m.mask[i * Sk + j];
      p[j] = std::exp(x - lse[i]);
    }
    // dP = dO·Vᵀ, delta = rowsum(P ∘ dP) = dO·O, dS = P ∘ (dP - delta).
    double delta = 0.0, delta_a = 0.0;
    for (int64_t j = 0; j < Sk; ++j) {
      dp[j] = dpa[j] = 0.0;
      for (int64_t d = 0; d < Dv; ++d) {
        dp[j] += dout[i * Dv + d] * v[j * Dv + d];
        dpa[j] += std::abs(dout[i * Dv + d] * v[j * Dv + d]);
      }
      delta += p[j] * dp[j];
      delta_a += p[j] * dpa[j];
    }
    for (int64_t j = 0; j < Sk; ++j) {
      if (p[j] == 0.0) continue;
      const double ds = p[j] * (dp[j] - delta) * scale;
      const double dsa = p[j] * (dpa[j] + delta_a) * scale;
      for (int64_t d = 0; d < Dv; ++d) {
        dv->value[j * Dv + d] += p[j] * dout[i * Dv + d];
        dv->scale[j * Dv + d] += p[j] * std::abs(dout[i * Dv + d]);
      }
      for (int64_t d = 0; d < D; ++d) {
        dq->value[i * D + d] += ds * k[j * D + d];
        dq->scale[i * D + d] += dsa * std::abs(k[j * D + d]);
        dk->value[j * D + d] += ds * q[i * D + d];
        dk->scale[j * D + d] += dsa * std::abs(q[i * D + d]);
      }
    }
  }
}

}  // namespace tboost::kernels::ref
