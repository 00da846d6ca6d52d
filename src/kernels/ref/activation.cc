// Float64 references of the activations and of softmax.
#include <cmath>

#include "src/kernels/ref/reference.h"

namespace tboost::kernels::ref {

double gelu_erf(double x) { return 0.5 * x * (1.0 + std::erf(x / std::sqrt(2.0))); }
double gelu_tanh(double x) {
  const double u = std::sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x);
  return 0.5 * x * (1.0 + std::tanh(u));
}
double silu(double x) { return x / (1.0 + std::exp(-x)); }

static double apply(ops::ActivationType t, double x) {
  using ops::ActivationType;
  switch (t) {
    case ActivationType::kRelu:
      return x > 0 ? x : 0.0;
    case ActivationType::kSilu:
    case ActivationType::kSwiGlu:
      return silu(x);
    case ActivationType::kGeluTanh:
    case ActivationType::kGeGluTanh:
      return gelu_tanh(x);
    case ActivationType::kGeluErf:
    case ActivationType::kGeGluErf:
      return gelu_erf(x);
  }
  return x;
}

void activation(RefOut* y, const Vec& x, int64_t rows, int64_t out_cols, ops::ActivationType type,
                bool gate_first) {
  const bool gated = ops::is_gated(type);
  const int64_t in_cols = gated ? 2 * out_cols : out_cols;
  y->value.assign(static_cast<size_t>(rows * out_cols), 0.0);
  y->scale.assign(y->value.size(), 0.0);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < out_cols; ++c) {
      const auto o = static_cast<size_t>(r * out_cols + c);
      const double g =
          x[static_cast<size_t>(r * in_cols + (gated && !gate_first ? out_cols : 0) + c)];
      const double a = apply(type, g);
      // GELU is 0.5·x + 0.5·x·erf(x/√2): for x < 0 the two terms cancel, and their magnitudes
      // sum to |x|. We bound with |gelu(x)| + 2^-6·|x|, 64x tighter than the sum of terms.
      const bool gelu =
          type == ops::ActivationType::kGeluErf || type == ops::ActivationType::kGeluTanh ||
          type == ops::ActivationType::kGeGluErf || type == ops::ActivationType::kGeGluTanh;
      const double scale = std::abs(a) + (gelu ? std::abs(g) / 64.0 : 0.0);
      if (gated) {
        const double u = x[static_cast<size_t>(r * in_cols + (gate_first ? out_cols : 0) + c)];
        y->value[o] = a * u;
        y->scale[o] = scale * std::abs(u);
      } else {
        y->value[o] = a;
        y->scale[o] = scale;
      }
    }
}

void softmax(RefOut* y, const Vec& x, int64_t rows, int64_t cols, double scale) {
  y->value.assign(x.size(), 0.0);
  y->scale.assign(x.size(), 0.0);
  for (int64_t r = 0; r < rows; ++r) {
    const double* xr = x.data() + r * cols;
    double m = -INFINITY;
    for (int64_t c = 0; c < cols; ++c) m = std::max(m, xr[c] * scale);
    if (m == -INFINITY) continue;  // fully masked: zeros
    double s = 0.0;
    for (int64_t c = 0; c < cols; ++c) s += std::exp(xr[c] * scale - m);
    for (int64_t c = 0; c < cols; ++c) {
      const auto i = static_cast<size_t>(r * cols + c);
      y->value[i] = std::exp(xr[c] * scale - m) / s;
      // exp(z) carries relative error ~|z|·eps from the rounding of z = x·scale - max.
      y->scale[i] =
          std::isinf(xr[c]) ? 0.0 : y->value[i] * (1.0 + std::abs(xr[c] * scale) + std::abs(m));
    }
  }
}

}  // namespace tboost::kernels::ref
