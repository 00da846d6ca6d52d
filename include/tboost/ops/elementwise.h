// Elementwise: add and mul (two inputs, numpy broadcasting of the second against the
// first's shape), scale (y = alpha · x) and cast (y = x converted to out_dtype). Float
// dtypes compute in f32; add/mul/scale need both inputs and the output in one float dtype.
// Cast converts between any two dtypes (rounding to nearest even, saturating into integers).
#pragma once

#include "tboost/core/dtype.h"

namespace tboost::ops {

enum class ElementwiseType { kAdd, kMul, kScale, kCast };
const char* elementwise_type_name(ElementwiseType t);

struct ElementwiseParam {
  ElementwiseType type = ElementwiseType::kAdd;
  float alpha = 1.0f;             // kScale
  DType out_dtype = DType::kF32;  // kCast
  bool operator==(const ElementwiseParam&) const = default;
};

}  // namespace tboost::ops
