// Softmax over the last axis: y = softmax(scale · x). Dtypes f32, bf16, f16; the max and the
// sum are kept in f32. A row of all -inf gives zeros (defined, never NaN).
#pragma once

namespace tboost::ops {

struct SoftmaxParam {
  float scale = 1.0f;
  bool operator==(const SoftmaxParam&) const = default;
};

}  // namespace tboost::ops
