// Rope: rotary position embedding applied to q or k.
//
// Inputs: x and positions; output y with x's shape (y may alias x: in place is allowed).
// x layouts: kBSND (B, S, H, D) or (T, H, D) for packed variable-length batches; kBNSD
// (B, H, S, D). positions: i32 or i64 with one entry per token (B*S or T elements, any shape
// with that count), so packed batches simply pass each token's own position.
// rotation: kRotateHalf pairs (i, i + r/2) (NeoX / LLaMA); kInterleaved pairs (2i, 2i+1)
// (GPT-J). Only the first rotary_dim features rotate (0 means all of D); the rest are copied.
// Angle of pair i at position p: p · rope_inv_freq(param, rotary_dim)[i] (kLinear:
// (p / scaling_factor) · theta^(-2i / rotary_dim)), computed in f64 and reduced to [-pi, pi] before
// the f32 sin/cos, so large positions stay accurate.
#pragma once

#include <cstdint>
#include <vector>

namespace tboost::ops {

enum class RopeRotation { kRotateHalf, kInterleaved };
enum class QkvLayout { kBSND, kBNSD };

// How scaling_factor stretches the context: kLinear divides every position by it; kLlama3
// (Llama 3.1's "rope_type": "llama3") divides only the low frequencies (wavelength above
// original_max_position / low_freq_factor) by it, keeps the high ones (wavelength below
// original_max_position / high_freq_factor) and blends linearly in between.
enum class RopeScaling { kLinear, kLlama3 };
struct RopeParam {
  RopeRotation rotation = RopeRotation::kRotateHalf;
  int64_t rotary_dim = 0;
  float theta = 10000.0f;
  float scaling_factor = 1.0f;
  QkvLayout layout = QkvLayout::kBSND;
  RopeScaling scaling = RopeScaling::kLinear;
  float low_freq_factor = 1.0f;           // kLlama3
  float high_freq_factor = 4.0f;          // kLlama3
  float original_max_position = 8192.0f;  // kLlama3
  bool operator==(const RopeParam&) const = default;
};
// The rotary_dim/2 angular frequencies, scaling included: pair i at position p turns by
// p * rope_inv_freq(p, r)[i] radians. Computed in f64.
std::vector<double> rope_inv_freq(const RopeParam& p, int64_t rotary_dim);

}  // namespace tboost::ops
