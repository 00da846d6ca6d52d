// Layout ops that copy: Transpose (a permuted, contiguous copy: y.dim(i) = x.dim(perm[i]);
// an identity perm makes any strided view contiguous) and Concat (inputs joined along axis,
// all other dims equal). Any dtype, any input strides; outputs contiguous. Views that need no
// copy (reshape of contiguous data, slices) are the graph layer's business, not ops.
#pragma once

#include <cstdint>
#include <vector>

namespace tboost::ops {

struct TransposeParam {
  // A permutation of 0..rank-1 (negative entries count from the end); empty: the identity
  // (a contiguous copy of any view).
  std::vector<int64_t> perm;
  bool operator==(const TransposeParam&) const = default;
};

struct ConcatParam {
  int64_t axis = 0;  // negative counts from the end
  bool operator==(const ConcatParam&) const = default;
};

}  // namespace tboost::ops
