// Float64 reference of Linear: y = act(x · Wᵀ + bias) + residual (or * residual).
//
// scale[i] bounds what a correct f32-accumulating kernel may get wrong at element i. The
// pre-activation z carries an error of at most tol · (Σ_k |x||w| + |bias|); the activation
// passes it on multiplied by |act'(z)| (up to ~1.13 for GELU, ~1.10 for SiLU, 1 for ReLU),
// and |act(z)| <= |z| for every activation here, so rounding the output is covered too.
// Hence scale = (Σ|x||w| + |bias|) · max(1, |act'(z)|) + |residual|.
#include <algorithm>
#include <cmath>
#include <numbers>

#include "src/kernels/ref/reference.h"

namespace tboost::kernels::ref {
namespace {

double act_value(ops::Activation a, double z) {
  switch (a) {
    case ops::Activation::kNone:
      return z;
    case ops::Activation::kRelu:
      return z > 0.0 ? z : 0.0;
    case ops::Activation::kGeluErf:
      return gelu_erf(z);
    case ops::Activation::kGeluTanh:
      return gelu_tanh(z);
    case ops::Activation::kSilu:
      return silu(z);
  }
  return z;
}

double act_derivative(ops::Activation a, double z) {
  switch (a) {
    case ops::Activation::kNone:
      return 1.0;
    case ops::Activation::kRelu:
      return z > 0.0 ? 1.0 : 0.0;
    case ops::Activation::kGeluErf: {
      const double pdf = std::exp(-0.5 * z * z) / std::sqrt(2.0 * std::numbers::pi);
      return 0.5 * (1.0 + std::erf(z / std::numbers::sqrt2)) + z * pdf;
    }
    case ops::Activation::kGeluTanh: {
      const double c = std::sqrt(2.0 / std::numbers::pi);
      const double u = c * (z + 0.044715 * z * z * z);
      const double t = std::tanh(u);
      return 0.5 * (1.0 + t) + 0.5 * z * (1.0 - t * t) * c * (1.0 + 3.0 * 0.044715 * z * z);
    }
    case ops::Activation::kSilu: {
      const double s = 1.0 / (1.0 + std::exp(-z));
      return s * (1.0 + z * (1.0 - s));
    }
  }
  return 1.0;
}

}  // namespace

void linear(RefOut* y, const Vec& x, const Vec& w, const Vec& bias, const Vec& residual, int64_t M,
            int64_t K, int64_t N, ops::Activation act, bool residual_mul) {
  const auto m_ = static_cast<size_t>(M), k_ = static_cast<size_t>(K), n_ = static_cast<size_t>(N);
  y->value.assign(m_ * n_, 0.0);
  y->scale.assign(m_ * n_, 0.0);
  for (size_t m = 0; m < m_; ++m) {
    const double* xr = x.data() + m * k_;
    for (size_t n = 0; n < n_; ++n) {
      const double* wr = w.data() + n * k_;
      double z = 0.0, s = 0.0;
      for (size_t k = 0; k < k_; ++k) {
        z += xr[k] * wr[k];
        s += std::abs(xr[k] * wr[k]);
      }
      if (!bias.empty()) {
        z += bias[n];
        s += std::abs(bias[n]);
      }
      double v = act_value(act, z);
      s *= std::max(1.0, std::abs(act_derivative(act, z)));
      if (!residual.empty()) {
        const double r = residual[m * n_ + n];
        if (residual_mul) {
          v *= r;
          s *= std::abs(r);
        } else {
          v += r;
          s += std::abs(r);
        }
      }
      y->value[m * n_ + n] = v;
      y->scale[m * n_ + n] = s;
    }
  }
}

}  // namespace tboost::kernels::ref
