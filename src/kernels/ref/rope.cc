// Float64 reference of Rope: the textbook formula, one std::pow / sin / cos per pair and row.
//
// Scale of an output element: |x_a cos| + |x_b sin|, the magnitudes of the two products that
// were summed (so a near-cancelling pair is judged against the size of its terms). Copied
// features past rotary_dim have scale |x|.
#include <cmath>

#include "src/kernels/ref/reference.h"

namespace tboost::kernels::ref {

void rope(RefOut* y, const Vec& x, const Vec& positions_of_row, int64_t rows, int64_t head_dim,
          int64_t rotary_dim, ops::RopeRotation rotation, double theta, double scaling) {
  const auto n = static_cast<size_t>(rows * head_dim);
  y->value.assign(n, 0.0);
  y->scale.assign(n, 0.0);
  const int64_t r = rotary_dim == 0 ? head_dim : rotary_dim;
  const int64_t half = r / 2;
  for (int64_t row = 0; row < rows; ++row) {
    const auto base = static_cast<size_t>(row * head_dim);
    const double p = positions_of_row[static_cast<size_t>(row)] / scaling;
    for (int64_t i = 0; i < half; ++i) {
      const double angle =
          p * std::pow(theta, -2.0 * static_cast<double>(i) / static_cast<double>(r));
      const double c = std::cos(angle), s = std::sin(angle);
      const int64_t ia = rotation == ops::RopeRotation::kRotateHalf ? i : 2 * i;
      const int64_t ib = rotation == ops::RopeRotation::kRotateHalf ? i + half : 2 * i + 1;
      const size_t ka = base + static_cast<size_t>(ia), kb = base + static_cast<size_t>(ib);
      const double xa = x[ka], xb = x[kb];
      y->value[ka] = xa * c - xb * s;
      y->value[kb] = xb * c + xa * s;
      y->scale[ka] = std::abs(xa * c) + std::abs(xb * s);
      y->scale[kb] = std::abs(xb * c) + std::abs(xa * s);
    }
    for (int64_t j = r; j < head_dim; ++j) {
      const size_t k = base + static_cast<size_t>(j);
      y->value[k] = x[k];
      y->scale[k] = std::abs(x[k]);
    }
  }
}

}  // namespace tboost::kernels::ref
