// Internal kernel entry points of the CPU backend: one argument struct and one function per
// op family. The ops (src/ops) fill the structs after validation; the public free functions
// (include/tboost/kernels/cpu.h) fill them for contiguous data. Every pointer here has been
// validated by the caller: kernels do not check.
#pragma once

#include <cstdint>

#include "tboost/core/dtype.h"
#include "tboost/ops/activation.h"
#include "tboost/ops/rope.h"

namespace tboost::kernels {

// Rows of a tensor whose last dim is contiguous: `count` rows; row r starts at element
// offset(r). Collapsible leading dims give one uniform stride (the fast path).
struct RowView {
  int64_t count = 0;
  int64_t cols = 0;
  int64_t uniform_stride = -1;  // >= 0 when offset(r) == r * uniform_stride
  int outer = 0;
  int64_t dims[8] = {};
  int64_t strides[8] = {};
  int64_t offset(int64_t r) const {
    if (uniform_stride >= 0) return r * uniform_stride;
    int64_t off = 0;
    for (int d = outer - 1; d >= 0; --d) {
      off += (r % dims[d]) * strides[d];
      r /= dims[d];
    }
    return off;
  }
  static RowView contiguous(int64_t rows, int64_t cols) {
    RowView v;
    v.count = rows;
    v.cols = cols;
    v.uniform_stride = cols;
    return v;
  }
};

struct NormArgs {
  void* y = nullptr;
  RowView y_rows;
  void* sum = nullptr;  // kPreNorm: x + residual (the new residual stream)
  RowView sum_rows;
  const void* x = nullptr;
  RowView x_rows;
  const void* residual = nullptr;  // null for kNorm
  RowView res_rows;
  const void* weight = nullptr;
  const void* bias = nullptr;  // LayerNorm only; null for none
  float* mean = nullptr;       // optional stats, one per row at stats_rows.offset(r)
  float* rstd = nullptr;
  RowView stats_rows;
  DType dtype = DType::kF32;   // x, residual, y, sum
  DType wdtype = DType::kF32;  // weight, bias
  float eps = 1e-6f;           // rows and cols: x_rows.count and x_rows.cols
  bool rms = true;
  bool plus_one = false;
  int threads = 1;
  bool ftz = true;
};
void norm_forward(const NormArgs& a);

struct RopeArgs {
  void* y = nullptr;
  RowView y_rows;  // rows of D features
  const void* x = nullptr;
  RowView x_rows;
  const void* positions = nullptr;
  RowView pos_rows;  // one element per token: positions[pos_rows.offset(token)]
  DType pos_dtype = DType::kI32;
  DType dtype = DType::kF32;
  ops::RopeRotation rotation = ops::RopeRotation::kRotateHalf;
  ops::QkvLayout layout = ops::QkvLayout::kBSND;
  int64_t heads = 1, seq = 1;  // H, and S for kBNSD: row (b,h,s) is token b*S+s; kBSND: row/H
  int64_t head_dim = 0, rotary_dim = 0;
  double scaling = 1.0;
  const double* inv_freq = nullptr;  // rotary_dim/2 values theta^(-2i/r), made once by the op
  int threads = 1;
  bool ftz = true;
};
void rope_forward(const RopeArgs& a);

struct ActivationArgs {
  void* y = nullptr;
  RowView y_rows;  // cols = F
  const void* x = nullptr;
  RowView x_rows;  // cols = F, or 2F for gated types
  DType dtype = DType::kF32;
  ops::ActivationType type = ops::ActivationType::kSilu;
  bool gate_first = true;
  int threads = 1;
  bool ftz = true;
};
void activation_forward(const ActivationArgs& a);

struct SoftmaxArgs {
  void* y = nullptr;
  RowView y_rows;
  const void* x = nullptr;
  RowView x_rows;
  DType dtype = DType::kF32;
  float scale = 1.0f;
  int threads = 1;
  bool ftz = true;
};
void softmax_forward(const SoftmaxArgs& a);

// y = a op b over rows of the output; each input row is found through its own RowView (a
// broadcast dim has stride 0) and its last dim has stride 1 or 0 (scalar broadcast).
enum class BinaryOp { kAdd, kMul };
struct BinaryArgs {
  void* y = nullptr;
  RowView y_rows;
  const void* a = nullptr;
  RowView a_rows;
  int64_t a_col_stride = 1;
  const void* b = nullptr;
  RowView b_rows;
  int64_t b_col_stride = 1;
  DType dtype = DType::kF32;
  BinaryOp op = BinaryOp::kAdd;
  int threads = 1;
  bool ftz = true;
};
void binary_forward(const BinaryArgs& a);

struct ScaleArgs {
  void* y = nullptr;
  RowView y_rows;
  const void* x = nullptr;
  RowView x_rows;
  DType dtype = DType::kF32;
  float alpha = 1.0f;
  int threads = 1;
  bool ftz = true;
};
void scale_forward(const ScaleArgs& a);

namespace cpu {
// Registers every CPU kernel with the op registry (called once, on first lookup).
void register_cpu_kernels();
}  // namespace cpu

}  // namespace tboost::kernels
