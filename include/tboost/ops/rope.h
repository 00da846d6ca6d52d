// Rope: rotary position embedding applied to q or k.
//
// Inputs: x and positions; output y with x's shape (y may alias x: in place is allowed).
// x layouts: kBSND (B, S, H, D) or (T, H, D) for packed variable-length batches; kBNSD
// (B, H, S, D). positions: i32 or i64 with one entry per token (B*S or T elements, any shape
// with that count), so packed batches simply pass each token's own position.
// rotation: kRotateHalf pairs (i, i + r/2) (NeoX / LLaMA); kInterleaved pairs (2i, 2i+1)
// (GPT-J). Only the first rotary_dim features rotate (0 means all of D); the rest are copied.
// Angle of pair i at position p: (p / scaling_factor) · theta^(-2i / rotary_dim), computed in
// f64 and reduced to [-pi, pi] before the f32 sin/cos, so large positions stay accurate.
#pragma once

#include <cstdint>

namespace tboost::ops {

enum class RopeRotation { kRotateHalf, kInterleaved };
enum class QkvLayout { kBSND, kBNSD };

struct RopeParam {
  RopeRotation rotation = RopeRotation::kRotateHalf;
  int64_t rotary_dim = 0;
  float theta = 10000.0f;
  float scaling_factor = 1.0f;  // linear position scaling
  QkvLayout layout = QkvLayout::kBSND;
  bool operator==(const RopeParam&) const = default;
};

}  // namespace tboost::ops
