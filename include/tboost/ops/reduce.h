// Reduce: sum, mean, max or min over a set of axes (a graph's ReduceMean / ReduceSum /
// ReduceMax). Input x in f32, bf16 or f16, any strides; output in x's dtype, accumulated in
// f32. axes may be negative (counted from the end); empty axes reduce every axis; a repeated
// or out-of-range axis is an error. keepdims keeps the reduced axes with size 1. Reducing an
// empty axis gives 0 (sum), NaN (mean) and an error for max/min.
#pragma once

#include <cstdint>
#include <vector>

namespace tboost::ops {

enum class ReduceType { kSum, kMean, kMax, kMin };
const char* reduce_type_name(ReduceType t);

struct ReduceParam {
  ReduceType type = ReduceType::kMean;
  std::vector<int64_t> axes;  // empty: all axes
  bool keepdims = true;
  bool operator==(const ReduceParam&) const = default;
};

}  // namespace tboost::ops
