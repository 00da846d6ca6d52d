// Float64 reference of Reduce (sum, mean, max, min over a set of axes).
#include <algorithm>
#include <cmath>

#include "src/kernels/ref/reference.h"

namespace tboost::kernels::ref {

void reduce(RefOut* y, const Vec& x, const Shape& shape, const std::vector<int64_t>& axes,
            ops::ReduceType type) {
  const size_t rank = shape.size();
  std::vector<bool> red(rank, axes.empty());
  for (int64_t a : axes) red[static_cast<size_t>(a)] = true;
  Shape kept;  // the output's dims, and for each x dim its place in them
  std::vector<int64_t> place(rank, -1);
  int64_t n = 1;
  for (size_t d = 0; d < rank; ++d) {
    if (red[d]) {
      n *= shape[d];
    } else {
      place[d] = static_cast<int64_t>(kept.size());
      kept.push_back(shape[d]);
    }
  }
  int64_t outs = 1;
  for (int64_t d : kept) outs *= d;
  const bool is_max = type == ops::ReduceType::kMax, is_min = type == ops::ReduceType::kMin;
  Vec acc(static_cast<size_t>(outs), is_max ? -INFINITY : is_min ? INFINITY : 0.0);
  Vec mag(acc.size(), 0.0);
  if (!x.empty()) {
    Shape idx(rank, 0);
    size_t i = 0;
    do {
      int64_t o = 0;
      for (size_t d = 0; d < rank; ++d)
        if (!red[d]) o = o * shape[d] + idx[d];
      const auto u = static_cast<size_t>(o);
      const double v = x[i++];
      if (is_max || is_min)
        acc[u] = std::isnan(v) || std::isnan(acc[u]) ? NAN
                 : is_max                            ? std::max(acc[u], v)
                                                     : std::min(acc[u], v);
      else
        acc[u] += v;
      mag[u] += std::abs(v);
    } while (next_index(idx, shape));
  }
  y->value = acc;
  y->scale.resize(acc.size());
  for (size_t o = 0; o < acc.size(); ++o) {
    if (type == ops::ReduceType::kMean) {
      y->value[o] = n > 0 ? acc[o] / static_cast<double>(n) : NAN;
      y->scale[o] = n > 0 ? mag[o] / static_cast<double>(n) : 0.0;
    } else {
      y->scale[o] = is_max || is_min ? std::abs(acc[o]) : mag[o];
    }
  }
}

}  // namespace tboost::kernels::ref
