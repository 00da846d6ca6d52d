// Selection and logic ops a graph's mask arithmetic uses (small tensors: masks, ids).
//
// Gather: y = data indexed along `axis` by indices (numpy take): data (d0..dn) any dtype,
// indices (i...) i32 or i64, negative indices count from the end of the axis; y has shape
// data.shape[:axis] + indices.shape + data.shape[axis+1:] in data's dtype. Every index is
// checked before any output element is written.
// Where: y = cond ? x : z elementwise with numpy broadcasting of all three; cond u8 (bool:
// nonzero is true); x and z share a dtype, which y has.
// Compare: y (u8, 0 or 1) = a OP b with numpy broadcasting; a and b any numeric dtypes
// (compared as double); and/or/xor treat nonzero as true; not takes one input.
#pragma once

#include <cstdint>

namespace tboost::ops {

struct GatherParam {
  int64_t axis = 0;  // negative counts from the end
  bool operator==(const GatherParam&) const = default;
};

struct WhereParam {
  bool operator==(const WhereParam&) const = default;
};

enum class CompareType {
  kEqual,
  kLess,
  kLessEqual,
  kGreater,
  kGreaterEqual,
  kAnd,
  kOr,
  kXor,
  kNot
};
const char* compare_type_name(CompareType t);

struct CompareParam {
  CompareType type = CompareType::kEqual;
  bool operator==(const CompareParam&) const = default;
};

}  // namespace tboost::ops
