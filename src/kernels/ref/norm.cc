// Float64 reference of RmsNorm / LayerNorm (two-pass, textbook formulas).
#include <cmath>

#include "src/kernels/ref/reference.h"

namespace tboost::kernels::ref {

void norm(RefOut* y, RefOut* sum, Vec* mean, Vec* rstd, const Vec& x, const Vec* res, const Vec& w,
          const Vec* b, double eps, int64_t rows, int64_t cols, bool rms, bool plus_one) {
  const auto n = static_cast<size_t>(rows * cols);
  y->value.assign(n, 0.0);
  y->scale.assign(n, 0.0);
  if (sum) {
    sum->value.assign(n, 0.0);
    sum->scale.assign(n, 0.0);
  }
  if (mean) mean->assign(static_cast<size_t>(rows), 0.0);
  if (rstd) rstd->assign(static_cast<size_t>(rows), 0.0);
  Vec s(static_cast<size_t>(cols));
  for (int64_t r = 0; r < rows; ++r) {
    double acc = 0.0;
    for (int64_t c = 0; c < cols; ++c) {
      const auto i = static_cast<size_t>(r * cols + c);
      s[static_cast<size_t>(c)] = x[i] + (res ? (*res)[i] : 0.0);
      if (sum) {
        sum->value[i] = s[static_cast<size_t>(c)];
        sum->scale[i] = std::abs(x[i]) + (res ? std::abs((*res)[i]) : 0.0);
      }
      acc += s[static_cast<size_t>(c)];
    }
    const double mu = rms ? 0.0 : acc / static_cast<double>(cols);
    double var = 0.0;
    for (int64_t c = 0; c < cols; ++c) {
      const double d = s[static_cast<size_t>(c)] - mu;
      var += d * d;
    }
    var /= static_cast<double>(cols);
    const double rs = 1.0 / std::sqrt(var + eps);
    if (mean) (*mean)[static_cast<size_t>(r)] = mu;
    if (rstd) (*rstd)[static_cast<size_t>(r)] = rs;
    for (int64_t c = 0; c < cols; ++c) {
      const auto i = static_cast<size_t>(r * cols + c);
      const double wc = w[static_cast<size_t>(c)] + (plus_one ? 1.0 : 0.0);
      const double bc = b ? (*b)[static_cast<size_t>(c)] : 0.0;
      y->value[i] = (s[static_cast<size_t>(c)] - mu) * rs * wc + bc;
      y->scale[i] =
          (std::abs(s[static_cast<size_t>(c)]) + std::abs(mu)) * rs * std::abs(wc) + std::abs(bc);
    }
  }
}

}  // namespace tboost::kernels::ref
