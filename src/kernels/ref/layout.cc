// Float64 references of the layout copies (Transpose, Concat): plain index arithmetic.
#include "src/kernels/ref/reference.h"

namespace tboost::kernels::ref {

void transpose(Vec* y, const Vec& x, const Shape& shape, const std::vector<int64_t>& perm) {
  const size_t rank = shape.size();
  Shape ys(rank), xstride(rank, 1);
  for (size_t d = rank; d-- > 1;) xstride[d - 1] = xstride[d] * shape[d];
  for (size_t i = 0; i < rank; ++i) ys[i] = shape[static_cast<size_t>(perm[i])];
  y->assign(x.size(), 0.0);
  if (x.empty()) return;
  Shape idx(rank, 0);
  size_t o = 0;
  do {
    int64_t src = 0;
    for (size_t i = 0; i < rank; ++i) src += idx[i] * xstride[static_cast<size_t>(perm[i])];
    (*y)[o++] = x[static_cast<size_t>(src)];
  } while (next_index(idx, ys));
}

void concat(Vec* y, const std::vector<Vec>& xs, const std::vector<Shape>& shapes, int64_t axis) {
  const auto ax = static_cast<size_t>(axis);
  int64_t outer = 1;
  for (size_t d = 0; d < ax; ++d) outer *= shapes[0][d];
  y->clear();
  for (int64_t o = 0; o < outer; ++o)
    for (size_t k = 0; k < xs.size(); ++k) {
      int64_t block = 1;  // elements of input k per outer index
      for (size_t d = ax; d < shapes[k].size(); ++d) block *= shapes[k][d];
      const auto begin = xs[k].begin() + o * block;
      y->insert(y->end(), begin, begin + block);
    }
}

}  // namespace tboost::kernels::ref
