// Float64 references of the elementwise ops (binary with broadcasting, unary math).
#include <algorithm>
#include <cmath>

#include "src/kernels/ref/reference.h"

namespace tboost::kernels::ref {

Shape broadcast_shape(const Shape& a, const Shape& b) {
  Shape s(std::max(a.size(), b.size()), 1);
  for (size_t i = 1; i <= s.size(); ++i) {
    const int64_t da = i <= a.size() ? a[a.size() - i] : 1;
    const int64_t db = i <= b.size() ? b[b.size() - i] : 1;
    s[s.size() - i] = da == 1 ? db : da;
  }
  return s;
}

static int64_t numel(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

void elementwise_binary(RefOut* y, const Vec& a, const Shape& a_shape, const Vec& b,
                        const Shape& b_shape, ops::ElementwiseType type) {
  using ops::ElementwiseType;
  const Shape ys = broadcast_shape(a_shape, b_shape);
  y->value.assign(static_cast<size_t>(numel(ys)), 0.0);
  y->scale.assign(y->value.size(), 0.0);
  if (y->value.empty()) return;
  Shape idx(ys.size(), 0);
  size_t i = 0;
  do {
    const double p = a[static_cast<size_t>(broadcast_index(idx, a_shape))];
    const double q = b[static_cast<size_t>(broadcast_index(idx, b_shape))];
    double v = 0.0;
    switch (type) {
      case ElementwiseType::kAdd:
        v = p + q;
        break;
      case ElementwiseType::kSub:
        v = p - q;
        break;
      case ElementwiseType::kMul:
        v = p * q;
        break;
      case ElementwiseType::kDiv:
        v = p / q;
        break;
      case ElementwiseType::kPow:
        v = std::pow(p, q);
        break;
      case ElementwiseType::kMax:
        v = std::isnan(p) || std::isnan(q) ? NAN : std::max(p, q);
        break;
      case ElementwiseType::kMin:
        v = std::isnan(p) || std::isnan(q) ? NAN : std::min(p, q);
        break;
      default:
        v = NAN;  // not binary
        break;
    }
    const bool sums = type == ElementwiseType::kAdd || type == ElementwiseType::kSub;
    y->value[i] = v;
    y->scale[i] = sums ? std::abs(p) + std::abs(q) : std::abs(v);
    ++i;
  } while (next_index(idx, ys));
}

void elementwise_unary(RefOut* y, const Vec& x, ops::ElementwiseType type, double alpha) {
  using ops::ElementwiseType;
  y->value.resize(x.size());
  y->scale.resize(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    const double v = x[i];
    double r = NAN;
    switch (type) {
      case ElementwiseType::kScale:
        r = alpha * v;
        break;
      case ElementwiseType::kNeg:
        r = -v;
        break;
      case ElementwiseType::kSqrt:
        r = std::sqrt(v);
        break;
      case ElementwiseType::kRsqrt:
        r = 1.0 / std::sqrt(v);
        break;
      case ElementwiseType::kReciprocal:
        r = 1.0 / v;
        break;
      case ElementwiseType::kExp:
        r = std::exp(v);
        break;
      case ElementwiseType::kTanh:
        r = std::tanh(v);
        break;
      case ElementwiseType::kErf:
        r = std::erf(v);
        break;
      case ElementwiseType::kSigmoid:
        r = 1.0 / (1.0 + std::exp(-v));
        break;
      case ElementwiseType::kAbs:
        r = std::abs(v);
        break;
      default:  // binary types and cast have no unary reference
        break;
    }
    y->value[i] = r;
    y->scale[i] = std::abs(r);
  }
}

}  // namespace tboost::kernels::ref
