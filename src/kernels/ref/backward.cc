// Float64 references of the backward kernels (textbook derivatives; the tests check these
// against central differences of the forward references). Each output's scale is the sum of
// the magnitudes of the terms that produced it.
#include <algorithm>
#include <cmath>

#include "src/kernels/ref/reference.h"

namespace tboost::kernels::ref {

void norm_backward(RefOut* dx, RefOut* dw, RefOut* db, const Vec& dy, const Vec& x, const Vec& w,
                   const Vec* dsum, double eps, int64_t rows, int64_t cols, bool rms,
                   bool plus_one) {
  const auto n = static_cast<size_t>(rows * cols);
  const auto C = static_cast<size_t>(cols);
  dx->value.assign(n, 0.0);
  dx->scale.assign(n, 0.0);
  for (RefOut* p : {dw, db})
    if (p) {
      p->value.assign(C, 0.0);
      p->scale.assign(C, 0.0);
    }
  Vec xh(C), g(C);
  for (int64_t r = 0; r < rows; ++r) {
    const size_t o = static_cast<size_t>(r) * C;
    double mu = 0.0;
    if (!rms) {
      for (size_t c = 0; c < C; ++c) mu += x[o + c];
      mu /= static_cast<double>(cols);
    }
    double var = 0.0;
    for (size_t c = 0; c < C; ++c) var += (x[o + c] - mu) * (x[o + c] - mu);
    const double rs = 1.0 / std::sqrt(var / static_cast<double>(cols) + eps);
    double m1 = 0.0, m2 = 0.0, a1 = 0.0, a2 = 0.0;
    for (size_t c = 0; c < C; ++c) {
      xh[c] = (x[o + c] - mu) * rs;
      g[c] = dy[o + c] * (w[c] + (plus_one ? 1.0 : 0.0));
      m1 += g[c], a1 += std::abs(g[c]);
      m2 += g[c] * xh[c], a2 += std::abs(g[c] * xh[c]);
      if (dw) {
        dw->value[c] += dy[o + c] * xh[c];
        dw->scale[c] += std::abs(dy[o + c] * xh[c]);
      }
      if (db) {
        db->value[c] += dy[o + c];
        db->scale[c] += std::abs(dy[o + c]);
      }
    }
    if (rms) m1 = a1 = 0.0;
    m1 /= static_cast<double>(cols), a1 /= static_cast<double>(cols);
    m2 /= static_cast<double>(cols), a2 /= static_cast<double>(cols);
    for (size_t c = 0; c < C; ++c) {
      const double ds = dsum ? (*dsum)[o + c] : 0.0;
      dx->value[o + c] = rs * (g[c] - m1 - xh[c] * m2) + ds;
      dx->scale[o + c] = rs * (std::abs(g[c]) + a1 + std::abs(xh[c]) * a2) + std::abs(ds);
    }
  }
}

namespace {
// act(v) and act'(v).
void act_grad(ops::ActivationType type, double v, double* a, double* da) {
  switch (type) {
    case ops::ActivationType::kRelu:
      *a = v > 0 ? v : 0.0;
      *da = v > 0 ? 1.0 : 0.0;
      return;
    case ops::ActivationType::kGeluErf:
    case ops::ActivationType::kGeGluErf: {
      const double cdf = 0.5 * (1.0 + std::erf(v / std::sqrt(2.0)));
      *a = v * cdf;
      *da = cdf + v * std::exp(-0.5 * v * v) / std::sqrt(2.0 * M_PI);
      return;
    }
    case ops::ActivationType::kGeluTanh:
    case ops::ActivationType::kGeGluTanh: {
      const double k = std::sqrt(2.0 / M_PI);
      const double t = std::tanh(k * (v + 0.044715 * v * v * v));
      *a = 0.5 * v * (1.0 + t);
      *da = 0.5 * (1.0 + t) + 0.5 * v * (1.0 - t * t) * k * (1.0 + 3.0 * 0.044715 * v * v);
      return;
    }
    default: {
      const double s = 1.0 / (1.0 + std::exp(-v));
      *a = v * s;
      *da = s * (1.0 + v * (1.0 - s));
      return;
    }
  }
}
}  // namespace

void activation_backward(RefOut* dx, const Vec& dy, const Vec& x, int64_t rows, int64_t F,
                         ops::ActivationType type, bool gate_first) {
  const bool gated = ops::is_gated(type);
  const int64_t xc = gated ? 2 * F : F;
  dx->value.assign(static_cast<size_t>(rows * xc), 0.0);
  dx->scale.assign(dx->value.size(), 0.0);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < F; ++c) {
      const auto gi = static_cast<size_t>(r * xc + (gated && !gate_first ? F : 0) + c);
      const auto ui = static_cast<size_t>(r * xc + (gate_first ? F : 0) + c);
      const double gy = dy[static_cast<size_t>(r * F + c)];
      double a = 0, da = 0;
      act_grad(type, x[gi], &a, &da);
      const double u = gated ? x[ui] : 1.0;
      dx->value[gi] = gy * u * da;
      // act' is a sum of terms as large as |act'| + |v act''|-ish: bound it by |act'| + 1.
      dx->scale[gi] = std::abs(gy * u) * (std::abs(da) + 1.0);
      if (gated) {
        dx->value[ui] = gy * a;
        dx->scale[ui] = std::abs(gy) * (std::abs(a) + std::abs(x[gi]));
      }
    }
}

void embedding_backward(RefOut* dw, const Vec& dy, const std::vector<int64_t>& ids, int64_t vocab,
                        int64_t cols) {
  dw->value.assign(static_cast<size_t>(vocab * cols), 0.0);
  dw->scale.assign(dw->value.size(), 0.0);
  for (size_t t = 0; t < ids.size(); ++t)
    for (int64_t c = 0; c < cols; ++c) {
      const auto i = static_cast<size_t>(ids[t] * cols + c);
      dw->value[i] += dy[t * static_cast<size_t>(cols) + static_cast<size_t>(c)];
      dw->scale[i] += std::abs(dy[t * static_cast<size_t>(cols) + static_cast<size_t>(c)]);
    }
}

void linear_backward(RefOut* dx, RefOut* dw, RefOut* db, const Vec& dy, const Vec& x, const Vec& w,
                     int64_t M, int64_t K, int64_t N) {
  auto at = [](const Vec& v, int64_t r, int64_t c, int64_t ld) {
    return v[static_cast<size_t>(r * ld + c)];
  };
  dx->value.assign(static_cast<size_t>(M * K), 0.0);
  dx->scale.assign(dx->value.size(), 0.0);
  dw->value.assign(static_cast<size_t>(N * K), 0.0);
  dw->scale.assign(dw->value.size(), 0.0);
  db->value.assign(static_cast<size_t>(N), 0.0);
  db->scale.assign(db->value.size(), 0.0);
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < N; ++n) {
      const double g = at(dy, m, n, N);
      db->value[static_cast<size_t>(n)] += g;
      db->scale[static_cast<size_t>(n)] += std::abs(g);
      for (int64_t k = 0; k < K; ++k) {
        const auto xi = static_cast<size_t>(m * K + k), wi = static_cast<size_t>(n * K + k);
        dx->value[xi] += g * w[wi];
        dx->scale[xi] += std::abs(g * w[wi]);
        dw->value[wi] += g * x[xi];
        dw->scale[wi] += std::abs(g * x[xi]);
      }
    }
}

double linear_cross_entropy(RefOut* dx, RefOut* dw, const Vec& x, const Vec& w,
                            const std::vector<int64_t>& labels, int64_t M, int64_t K, int64_t V,
                            int64_t ignore_index, double eps) {
  dx->value.assign(static_cast<size_t>(M * K), 0.0);
  dx->scale.assign(dx->value.size(), 0.0);
  dw->value.assign(static_cast<size_t>(V * K), 0.0);
  dw->scale.assign(dw->value.size(), 0.0);
  int64_t valid = 0;
  for (int64_t y : labels) valid += y != ignore_index;
  if (valid == 0) return 0.0;
  double total = 0.0;
  Vec z(static_cast<size_t>(V)), g(static_cast<size_t>(V));
  for (int64_t m = 0; m < M; ++m) {
    const int64_t y = labels[static_cast<size_t>(m)];
    if (y == ignore_index) continue;
    double mx = -INFINITY, sum_z = 0.0;
    for (int64_t v = 0; v < V; ++v) {
      double s = 0.0;
      for (int64_t k = 0; k < K; ++k)
        s += x[static_cast<size_t>(m * K + k)] * w[static_cast<size_t>(v * K + k)];
      z[static_cast<size_t>(v)] = s;
      mx = std::max(mx, s);
      sum_z += s;
    }
    double se = 0.0;
    for (double v : z) se += std::exp(v - mx);
    const double lse = mx + std::log(se);
    total += (1.0 - eps) * (lse - z[static_cast<size_t>(y)]) +
             eps * (lse - sum_z / static_cast<double>(V));
    for (int64_t v = 0; v < V; ++v)
      g[static_cast<size_t>(v)] = (std::exp(z[static_cast<size_t>(v)] - lse) -
                                   eps / static_cast<double>(V) - (v == y ? 1.0 - eps : 0.0)) /
                                  static_cast<double>(valid);
    for (int64_t v = 0; v < V; ++v)
      for (int64_t k = 0; k < K; ++k) {
        const auto xi = static_cast<size_t>(m * K + k), wi = static_cast<size_t>(v * K + k);
        const double gv = g[static_cast<size_t>(v)];
        dx->value[xi] += gv * w[wi];
        dx->scale[xi] += std::abs(gv * w[wi]);
        dw->value[wi] += gv * x[xi];
        dw->scale[wi] += std::abs(gv * x[xi]);
      }
  }
  return total / static_cast<double>(valid);
}

void adamw_step(Vec* p, Vec* m, Vec* v, const Vec& g, int64_t step, double lr, double beta1,
                double beta2, double eps, double weight_decay, double grad_scale) {
  const double bc1 = 1.0 - std::pow(beta1, static_cast<double>(step));
  const double bc2 = 1.0 - std::pow(beta2, static_cast<double>(step));
  for (size_t i = 0; i < g.size(); ++i) {
    const double gi = g[i] * grad_scale;
    double& pi = (*p)[i];
    double& mi = (*m)[i];
    double& vi = (*v)[i];
    pi *= 1.0 - lr * weight_decay;
    mi = beta1 * mi + (1.0 - beta1) * gi;
    vi = beta2 * vi + (1.0 - beta2) * gi * gi;
    pi -= lr / bc1 * mi / (std::sqrt(vi) / std::sqrt(bc2) + eps);
  }
}

}  // namespace tboost::kernels::ref
