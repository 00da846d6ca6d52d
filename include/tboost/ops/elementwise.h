// Elementwise: the pointwise math of a transformer graph.
//
// Binary (inputs a, b): add, sub, mul, div, pow, max, min, with numpy broadcasting in both
// directions (y's shape is the broadcast of a's and b's). Unary (input x): scale
// (y = alpha · x), neg, sqrt, rsqrt (1/sqrt), reciprocal, exp, tanh, erf, sigmoid, abs, and
// cast (y = x converted to out_dtype). Float dtypes compute in f32 (exp/tanh/erf/sigmoid to a
// few f32 ulp, not correctly rounded); every type but cast needs its inputs and output in one
// float dtype. pow with a broadcast exponent of 2, 0.5, 1, -1 or -0.5 runs as the exact
// multiply / sqrt / copy / reciprocal / rsqrt; other exponents call std::pow per element.
// Cast converts between any two dtypes (rounding to nearest even, saturating into integers).
#pragma once

#include "tboost/core/dtype.h"

namespace tboost::ops {

enum class ElementwiseType {
  kAdd,
  kMul,
  kScale,
  kCast,
  kSub,
  kDiv,
  kPow,
  kMax,
  kMin,  // binary
  kNeg,
  kSqrt,
  kRsqrt,
  kReciprocal,
  kExp,
  kTanh,
  kErf,
  kSigmoid,
  kAbs  // unary
};
constexpr bool is_binary(ElementwiseType t) {
  return t == ElementwiseType::kAdd || t == ElementwiseType::kMul ||
         (t >= ElementwiseType::kSub && t <= ElementwiseType::kMin);
}
const char* elementwise_type_name(ElementwiseType t);

struct ElementwiseParam {
  ElementwiseType type = ElementwiseType::kAdd;
  float alpha = 1.0f;             // kScale
  DType out_dtype = DType::kF32;  // kCast
  bool operator==(const ElementwiseParam&) const = default;
};

}  // namespace tboost::ops
