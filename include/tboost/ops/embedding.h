// Embedding: gathers rows of a table. Inputs: table (V, C) in any float dtype, ids (...) in
// i32 or i64. Output (..., C) in the table's dtype. Every id is checked against [0, V) before
// any output row is written; one out of range is an error naming its position and value.
#pragma once

namespace tboost::ops {

struct EmbeddingParam {
  bool operator==(const EmbeddingParam&) const = default;
};

}  // namespace tboost::ops
