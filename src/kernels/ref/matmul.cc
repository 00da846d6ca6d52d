// Float64 reference of MatMul: y = alpha · op(a) · op(b) with numpy batch broadcasting.
#include <cmath>

#include "src/kernels/ref/reference.h"

namespace tboost::kernels::ref {

void matmul(RefOut* y, const Vec& a, const Shape& a_shape, const Vec& b, const Shape& b_shape,
            bool ta, bool tb, double alpha) {
  const size_t ra = a_shape.size(), rb = b_shape.size();
  const int64_t M = ta ? a_shape[ra - 1] : a_shape[ra - 2];
  const int64_t K = ta ? a_shape[ra - 2] : a_shape[ra - 1];
  const int64_t N = tb ? b_shape[rb - 2] : b_shape[rb - 1];
  const Shape a_batch(a_shape.begin(), a_shape.end() - 2),
      b_batch(b_shape.begin(), b_shape.end() - 2);
  const Shape batch = broadcast_shape(a_batch, b_batch);
  int64_t count = 1;
  for (int64_t d : batch) count *= d;
  y->value.assign(static_cast<size_t>(count * M * N), 0.0);
  y->scale.assign(y->value.size(), 0.0);
  if (y->value.empty()) return;
  Shape idx(batch.size(), 0);
  for (int64_t bi = 0; bi < count; ++bi, next_index(idx, batch)) {
    const double* pa = a.data() + broadcast_index(idx, a_batch) * M * K;
    const double* pb = b.data() + broadcast_index(idx, b_batch) * K * N;
    for (int64_t m = 0; m < M; ++m)
      for (int64_t n = 0; n < N; ++n) {
        double s = 0.0, mag = 0.0;
        for (int64_t k = 0; k < K; ++k) {
          const double p = pa[ta ? k * M + m : m * K + k] * pb[tb ? n * K + k : k * N + n];
          s += p;
          mag += std::abs(p);
        }
        const auto o = static_cast<size_t>((bi * M + m) * N + n);
        y->value[o] = alpha * s;
        y->scale[o] = std::abs(alpha) * mag;
      }
  }
}

}  // namespace tboost::kernels::ref
