// Linear: every dtype, activation, bias dtype, layout flag (transpose_a/b, constant_weight),
// odd sizes, decode-sized M = 1, batched and strided operands (uniform rows go to oneDNN with
// strides, non-uniform ones through the workspace), against the float64 reference; bad input
// of every kind; weight changes, in-place residual, re-planning on update and thread changes.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <iostream>

#include "src/kernels/cpu/kernels.h"
#include "tests/ops/harness.h"

namespace tboost::testing {
namespace {

using ops::Activation;
using ops::LinearParam;

struct LinCfg {
  DType dtype = DType::kF32;
  Shape x;  // as stored: (..., K), or (K, M) with transpose_a
  int64_t N = 0;
  bool ta = false, tb = true;
  bool bias = false;
  DType bias_dtype = DType::kF32;
  Activation act = Activation::kNone;
  bool res = false;
  bool res_mul = false;
  bool constw = true;
  bool strided_in = false, strided_out = false;
  int threads = 0;
  // Bound each output by what f32 accumulation can lose, not by the dtype's tolerance (see
  // build()); for cases without an activation.
  bool tight = false;
};

std::string cfg_name(const LinCfg& c) {
  std::string s = std::string(dtype_name(c.dtype)) + "_x" + shape_to_string(c.x) + "_N" +
                  std::to_string(c.N) + "_" + ops::activation_name(c.act);
  if (c.ta) s += "_ta";
  if (!c.tb) s += "_notb";
  if (c.bias) s += std::string("_bias") + dtype_name(c.bias_dtype);
  if (c.res) s += c.res_mul ? "_resmul" : "_res";
  if (!c.constw) s += "_varw";
  if (c.strided_in) s += "_sin";
  if (c.strided_out) s += "_sout";
  if (c.tight) s += "_tight";
  s += "_t" + std::to_string(c.threads);
  return s;
}

// (rows, cols) row-major -> (cols, rows) row-major.
Vec transposed(const Vec& a, int64_t rows, int64_t cols) {
  Vec t(a.size());
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c)
      t[static_cast<size_t>(c * rows + r)] = a[static_cast<size_t>(r * cols + c)];
  return t;
}

OpCase build(const LinCfg& c, Rng& rng) {
  OpCase oc;
  oc.param = LinearParam{.transpose_a = c.ta,
                         .transpose_b = c.tb,
                         .has_bias = c.bias,
                         .activation = c.act,
                         .has_residual = c.res,
                         .residual_is_multiplier = c.res_mul,
                         .constant_weight = c.constw};
  const int64_t K = c.ta ? c.x[0] : c.x.back();
  Shape ys = c.x;
  if (c.ta)
    ys = {c.x[1], c.N};
  else
    ys.back() = c.N;
  const int64_t M = c.ta ? c.x[1] : [&] {
    int64_t m = 1;
    for (size_t i = 0; i + 1 < c.x.size(); ++i) m *= c.x[i];
    return m;
  }();
  oc.inputs.push_back(random_tensor(rng, c.dtype, c.x, c.strided_in));
  const Shape ws = c.tb ? Shape{c.N, K} : Shape{K, c.N};
  oc.inputs.push_back(random_tensor(rng, c.dtype, ws, c.strided_in));
  if (c.bias) oc.inputs.push_back(random_tensor(rng, c.bias_dtype, {c.N}, false));
  if (c.res) oc.inputs.push_back(random_tensor(rng, c.dtype, ys, c.strided_in));
  oc.strided_outputs = c.strided_out;
  oc.threads = c.threads;
  oc.reference = [c, K, M](const std::vector<Tensor>& in) {
    Vec x = to_f64(in[0]);
    if (c.ta) x = transposed(x, K, M);
    Vec w = to_f64(in[1]);
    if (!c.tb) w = transposed(w, K, c.N);
    size_t k = 2;
    Vec b, r;
    if (c.bias) b = to_f64(in[k++]);
    if (c.res) r = to_f64(in[k]);
    RefOut y;
    kernels::ref::linear(&y, x, w, b, r, M, K, c.N, c.act, c.res_mul);
    if (!c.tight) return std::vector<Expected>{{y, tolerance(c.dtype, K)}};
    // Products of f32 values carry one rounding and those of bf16 / f16 values none, the f32
    // sum of K + 2 terms (bias, residual) at most (K + 2) roundings of 2^-24 relative to the sum
    // of their magnitudes, and the store one rounding of the output type (bounded here by twice
    // its unit roundoff: 2^-7 bf16, 2^-10 f16, 2^-23 f32). The dtype tolerance scales with that sum
    // of magnitudes (2^-6 of it for bf16 at K >= 2048): a dot that dropped a 16-element step of
    // 2080 would pass it, not this bound. Expressed through scale with tol = 1.
    const double out_u = c.dtype == DType::kBF16  ? std::ldexp(1.0, -7)
                         : c.dtype == DType::kF16 ? std::ldexp(1.0, -10)
                                                  : std::ldexp(1.0, -23);
    for (size_t i = 0; i < y.value.size(); ++i)
      y.scale[i] = out_u * std::abs(y.value[i]) +
                   static_cast<double>(K + 2) * std::ldexp(1.0, -24) * y.scale[i];
    return std::vector<Expected>{{y, 1.0}};
  };
  return oc;
}

std::vector<CaseSpec> linear_cases() {
  std::vector<CaseSpec> cases;
  auto add = [&](LinCfg c) {
    cases.push_back({cfg_name(c), [c](Rng& rng) { return build(c, rng); }});
  };
  // One case per line reads better than one field per line.
  // clang-format off
  for (DType dt : {DType::kF32, DType::kBF16, DType::kF16}) {
    // Odd sizes, bias in x's dtype, residual.
    add({.dtype = dt, .x = {7, 33}, .N = 65, .bias = true, .bias_dtype = dt,
         .act = Activation::kGeluErf, .res = true});
    // Batched rank 3, strided everything (non-uniform rows: the staging path), f32 bias.
    add({.dtype = dt, .x = {2, 5, 64}, .N = 96, .bias = true, .act = Activation::kSilu,
         .res = true, .constw = false, .strided_in = true, .strided_out = true, .threads = 2});
    add({.dtype = dt, .x = {2, 5, 64}, .N = 96, .act = Activation::kRelu, .res = true,
         .strided_in = true, .strided_out = false, .threads = 1});
    // Decode: M = 1 (GEMV), long reduction.
    add({.dtype = dt, .x = {1, 2048}, .N = 96, .bias = true, .act = Activation::kSilu});
    add({.dtype = dt, .x = {1, 1, 130}, .N = 70, .res = true, .constw = false});
    // M = 1 over long rows (f32 on AVX2: 4 rows per pass, asking ahead per group; bf16 and
    // f16 at K = 2090 one row at a time), N not a multiple of 4, K with a tail, padded rows.
    add({.dtype = dt, .x = {1, 2090}, .N = 39, .res = true, .strided_in = true, .threads = 2,
         .tight = true});
    // M = 1, K a multiple of 16 but not of 128: bf16's pair-split rows 4 per pass on AVX2.
    add({.dtype = dt, .x = {1, 2080}, .N = 21, .bias = true, .tight = true});
    // M = 1 at K = 784: f32 rows of 3136 bytes, just over the side-by-side threshold (3072);
    // bf16 / f16 rows one at a time (bf16: 8 accumulators, 49 steps of 16, a partial last
    // group). K = 700: every dtype one row at a time. Then several x rows over long rows.
    add({.dtype = dt, .x = {1, 784}, .N = 50, .bias = true, .bias_dtype = dt, .tight = true});
    add({.dtype = dt, .x = {1, 700}, .N = 33, .res = true, .tight = true});
    add({.dtype = dt, .x = {3, 2080}, .N = 37, .res = true, .threads = 2, .tight = true});
    // M = 1 with 8 blocks of 16 rows or more: on AVX2 and AVX-512 (f32, bf16 pairs, bf16 x
    // and weights dotted with vdpbf16ps at K a multiple of 32) 4 streams a quarter of the
    // matrix apart, items of blocks i, i + Q, i + 2Q, i + 3Q. N = 128: 2 items, all whole.
    // N = 247: 16 blocks, the last short, whose item takes the blocks path; K with a tail, padded
    // rows. N = 208: 13 blocks, one whole item and three of 3 blocks; bf16 pairs at a K that is
    // not a multiple of 128. N = 149: every item short, with an activation.
    add({.dtype = dt, .x = {1, 784}, .N = 128, .bias = true, .threads = 2, .tight = true});
    add({.dtype = dt, .x = {1, 2090}, .N = 247, .res = true, .strided_in = true, .threads = 2,
         .tight = true});
    add({.dtype = dt, .x = {1, 2080}, .N = 208, .res = true, .tight = true});
    add({.dtype = dt, .x = {1, 768}, .N = 149, .bias = true, .bias_dtype = dt,
         .act = Activation::kSilu, .threads = 1});
    // The same for 2-4 x rows (AVX2: f32 4 streams for 2 rows, 2 for 3-4, bf16 pairs 2;
    // AVX-512: 4), and 6 rows over 10 blocks (the blocks path).
    add({.dtype = dt, .x = {2, 784}, .N = 128, .bias = true, .threads = 2, .tight = true});
    add({.dtype = dt, .x = {3, 2090}, .N = 247, .res = true, .strided_in = true, .threads = 2,
         .tight = true});
    add({.dtype = dt, .x = {4, 2080}, .N = 208, .res = true, .tight = true});
    add({.dtype = dt, .x = {2, 768}, .N = 149, .bias = true, .bias_dtype = dt,
         .act = Activation::kGeluTanh, .threads = 1});
    add({.dtype = dt, .x = {6, 768}, .N = 150, .res = true, .threads = 2, .tight = true});
    // Whole items for 2 and 3 x rows at K a multiple of 32 (bf16 x: vdpbf16ps where the CPU
    // has it, else bf16 pairs).
    add({.dtype = dt, .x = {2, 1024}, .N = 128, .threads = 2, .tight = true});
    add({.dtype = dt, .x = {3, 768}, .N = 256, .bias = true, .tight = true});
    // Batched decode, rows of >= 4 KiB: several weight rows per pass (N not a multiple of
    // them), K with a tail (2090) and without (2080: bf16's pair-dot path).
    add({.dtype = dt, .x = {3, 2080}, .N = 37, .bias = true, .act = Activation::kSilu,
         .res = true});
    add({.dtype = dt, .x = {8, 2090}, .N = 45, .constw = false, .threads = 2});
    add({.dtype = dt, .x = {5, 2048}, .N = 19, .bias = true, .bias_dtype = dt});
    add({.dtype = dt, .x = {2, 2112}, .N = 23, .act = Activation::kGeluTanh, .threads = 2});
    // The same with padded rows of x, w, the residual and y (ldw != K).
    add({.dtype = dt, .x = {4, 2080}, .N = 29, .res = true, .strided_in = true,
         .strided_out = true});
    // Weight as (K, N).
    add({.dtype = dt, .x = {7, 33}, .N = 65, .tb = false, .act = Activation::kRelu});
    add({.dtype = dt, .x = {7, 33}, .N = 65, .tb = false, .bias = true, .res = true,
         .constw = false, .strided_in = true, .strided_out = true});
    // x as (K, M).
    add({.dtype = dt, .x = {33, 7}, .N = 65, .ta = true, .bias = true, .bias_dtype = dt,
         .act = Activation::kGeluTanh, .res = true, .strided_in = true, .strided_out = true});
    add({.dtype = dt, .x = {40, 9}, .N = 17, .ta = true, .tb = false, .constw = false});
  }
  // Every activation, with and without packing, rank-2 strided (uniform rows: strides given to
  // oneDNN directly; the residual's row stride then equals y's).
  for (Activation a : {Activation::kNone, Activation::kRelu, Activation::kGeluErf,
                       Activation::kGeluTanh, Activation::kSilu})
    for (bool constw : {true, false}) {
      add({.dtype = DType::kF32, .x = {5, 40}, .N = 24, .bias = true, .act = a, .res = true,
           .constw = constw, .strided_in = true, .strided_out = true, .threads = 1});
      add({.dtype = DType::kBF16, .x = {3, 4, 24}, .N = 40, .bias = true, .act = a,
           .constw = constw, .threads = 2});
    }
  // Multiplier epilogue (the gated MLP's second GEMM): f32 native, bf16/f16 f32 fallback,
  // strided and staged, every activation.
  for (DType dt : {DType::kF32, DType::kBF16, DType::kF16})
    for (Activation a : {Activation::kSilu, Activation::kGeluTanh, Activation::kNone}) {
      add({.dtype = dt, .x = {7, 33}, .N = 65, .bias = true, .act = a, .res = true,
           .res_mul = true});
      add({.dtype = dt, .x = {2, 5, 64}, .N = 40, .act = a, .res = true, .res_mul = true,
           .strided_in = true, .strided_out = true, .threads = 2});
    }
  // Small M runs the weight-streaming GEMV (M <= 8), M = 9 oneDNN: every row-group size of the
  // GEMV (1-4 rows, then groups of 4), N not a multiple of its 16-output blocks, K not a
  // multiple of the vector width, two threads splitting N, strided rows.
  for (DType dt : {DType::kF32, DType::kBF16, DType::kF16})
    for (int64_t m : {1, 2, 3, 4, 5, 7, 8, 9}) {
      add({.dtype = dt, .x = {m, 257}, .N = 301, .bias = true, .act = Activation::kGeluTanh,
           .res = true, .threads = 2});
      add({.dtype = dt, .x = {m, 64}, .N = 37, .bias = true, .bias_dtype = dt, .res = true,
           .res_mul = true, .strided_in = true, .strided_out = true, .threads = 2});
    }
  // Residual strided, y contiguous: the residual is staged with y's leading dim.
  add({.dtype = DType::kF32, .x = {6, 20}, .N = 30, .res = true, .strided_in = true});
  // y strided (uniform), residual contiguous.
  add({.dtype = DType::kF32, .x = {6, 20}, .N = 30, .act = Activation::kSilu, .res = true,
       .strided_out = true});
  // Edge sizes: K = 1, N = 1, M = 1 transposed, rank-1 x, rank-4 strided x.
  add({.dtype = DType::kF32, .x = {33, 1}, .N = 20, .ta = true, .bias = true, .res = true,
       .strided_in = true});
  add({.dtype = DType::kF32, .x = {3, 1}, .N = 5, .bias = true});
  add({.dtype = DType::kF32, .x = {4, 17}, .N = 1, .bias = true, .res = true});
  add({.dtype = DType::kBF16, .x = {4, 17}, .N = 1, .tb = false, .res = true, .constw = false});
  add({.dtype = DType::kF32, .x = {33}, .N = 10, .act = Activation::kGeluErf});
  add({.dtype = DType::kF16, .x = {33}, .N = 10, .bias = true, .bias_dtype = DType::kF16});
  add({.dtype = DType::kF32, .x = {2, 3, 4, 16}, .N = 8, .bias = true, .res = true,
       .strided_in = true, .strided_out = true});
  // Larger, threaded.
  add({.dtype = DType::kF32, .x = {64, 256}, .N = 192, .bias = true,
       .act = Activation::kGeluTanh, .res = true, .threads = 2});
  add({.dtype = DType::kBF16, .x = {2, 32, 256}, .N = 160, .bias = true,
       .bias_dtype = DType::kBF16, .act = Activation::kSilu, .res = true, .threads = 2});
  // clang-format on
  return cases;
}

BadCase bad_base(Rng& rng, LinearParam p = {}) {
  BadCase b;
  b.param = p;
  b.inputs.push_back(random_tensor(rng, DType::kF32, {4, 768}, false));
  b.inputs.push_back(random_tensor(rng, DType::kF32, {64, 768}, false));
  if (p.has_bias) b.inputs.push_back(random_tensor(rng, DType::kF32, {64}, false));
  if (p.has_residual) b.inputs.push_back(random_tensor(rng, DType::kF32, {4, 64}, false));
  b.outputs.push_back(TensorDesc::contiguous(DType::kF32, {4, 64}));
  return b;
}

std::vector<BadSpec> linear_bad() {
  return {
      {"k_mismatch",
       [](Rng& rng) {
         BadCase b = bad_base(rng);
         b.inputs[1] = random_tensor(rng, DType::kF32, {64, 767}, false);
         b.expect_substring = "input 1 (weight) expected dim 1 = 768 (K of x), got 767";
         b.expect_code = ErrorCode::kShapeMismatch;
         b.check_code = true;
         return b;
       }},
      {"multiplier_without_residual",
       [](Rng& rng) {
         BadCase b = bad_base(rng, {.residual_is_multiplier = true});
         b.expect_substring = "residual_is_multiplier needs has_residual";
         return b;
       }},
      {"k_mismatch_not_transposed",
       [](Rng& rng) {
         BadCase b = bad_base(rng, {.transpose_b = false});
         b.inputs[1] = random_tensor(rng, DType::kF32, {64, 768}, false);
         b.expect_substring = "input 1 (weight) expected dim 0 = 768 (K of x), got 64";
         return b;
       }},
      {"weight_rank",
       [](Rng& rng) {
         BadCase b = bad_base(rng);
         b.inputs[1] = random_tensor(rng, DType::kF32, {2, 32, 768}, false);
         b.expect_substring = "input 1 (weight) expected rank 2, got rank 3";
         return b;
       }},
      {"bias_shape",
       [](Rng& rng) {
         BadCase b = bad_base(rng, {.has_bias = true});
         b.inputs[2] = random_tensor(rng, DType::kF32, {63}, false);
         b.expect_substring = "input 2 (bias) expected shape [64], got [63]";
         return b;
       }},
      {"bias_dtype",
       [](Rng& rng) {
         BadCase b = bad_base(rng, {.has_bias = true});
         b.inputs[2] = random_tensor(rng, DType::kBF16, {64}, false);
         b.expect_substring = "input 2 (bias) expected dtype f32, got bf16";
         b.expect_code = ErrorCode::kDTypeMismatch;
         b.check_code = true;
         return b;
       }},
      {"residual_shape",
       [](Rng& rng) {
         BadCase b = bad_base(rng, {.has_residual = true});
         b.inputs[2] = random_tensor(rng, DType::kF32, {4, 65}, false);
         b.expect_substring = "input 2 (residual) expected shape [4,64] (same as y), got [4,65]";
         return b;
       }},
      {"residual_dtype",
       [](Rng& rng) {
         BadCase b = bad_base(rng, {.has_bias = true, .has_residual = true});
         b.inputs[3] = random_tensor(rng, DType::kBF16, {4, 64}, false);
         b.expect_substring = "input 3 (residual) expected dtype f32 (same as y), got bf16";
         return b;
       }},
      {"missing_residual",
       [](Rng& rng) {
         BadCase b = bad_base(rng);
         b.param = LinearParam{.has_residual = true};
         b.expect_substring = "expected 3 inputs (x, weight, residual), got 2";
         return b;
       }},
      {"weight_dtype",
       [](Rng& rng) {
         BadCase b = bad_base(rng);
         b.inputs[1] = random_tensor(rng, DType::kBF16, {64, 768}, false);
         b.expect_substring = "input 1 (weight) expected dtype f32 (same as x), got bf16";
         b.expect_code = ErrorCode::kDTypeMismatch;
         b.check_code = true;
         return b;
       }},
      {"x_dtype",
       [](Rng& rng) {
         BadCase b = bad_base(rng);
         b.inputs[0] = random_tensor(rng, DType::kI32, {4, 768}, false, 1, 5);
         b.expect_substring = "input 0 (x) expected dtype one of {f32, bf16, f16}, got i32";
         return b;
       }},
      {"null_data",
       [](Rng& rng) {
         BadCase b = bad_base(rng);
         b.inputs[1].view = Tensor(b.inputs[1].view.desc(), nullptr);
         b.expect_substring = "input 1 (weight) f32[64,768] has no data pointer";
         b.expect_code = ErrorCode::kNullData;
         b.check_code = true;
         return b;
       }},
      {"transpose_a_rank3",
       [](Rng& rng) {
         BadCase b = bad_base(rng, {.transpose_a = true});
         b.inputs[0] = random_tensor(rng, DType::kF32, {2, 768, 4}, false);
         b.outputs[0] = TensorDesc::contiguous(DType::kF32, {2, 4, 64});
         b.expect_substring = "input 0 (x) with transpose_a must be rank 2 (K, M), got rank 3";
         return b;
       }},
      {"wrong_output_shape",
       [](Rng& rng) {
         BadCase b = bad_base(rng);
         b.outputs[0] = TensorDesc::contiguous(DType::kF32, {4, 65});
         b.expect_substring = "output 0 (y) expected f32[4,64], got f32[4,65]";
         return b;
       }},
      {"wrong_output_dtype",
       [](Rng& rng) {
         BadCase b = bad_base(rng);
         b.outputs[0] = TensorDesc::contiguous(DType::kBF16, {4, 64});
         b.expect_substring = "output 0 (y) expected f32[4,64], got bf16[4,64]";
         b.expect_code = ErrorCode::kDTypeMismatch;
         b.check_code = true;
         return b;
       }},
      {"x_last_dim_not_contiguous",
       [](Rng& rng) {
         BadCase b = bad_base(rng);
         b.inputs[0] = random_tensor(rng, DType::kF32, {768, 4}, false);
         b.inputs[0].view = b.inputs[0].view.transpose(0, 1);
         b.expect_substring = "input 0 (x) needs a contiguous last dim (stride 1)";
         return b;
       }},
      {"empty_k",
       [](Rng& rng) {
         BadCase b = bad_base(rng);
         b.inputs[0] = random_tensor(rng, DType::kF32, {4, 0}, false);
         b.inputs[1] = random_tensor(rng, DType::kF32, {64, 0}, false);
         b.expect_substring = "input 0 (x) has an empty K dim";
         return b;
       }},
  };
}

TBOOST_OP_TESTS(Linear, linear_cases, linear_bad);

// y from the float64 reference for contiguous f32 x (M,K), w (N,K), no bias.
Vec reference_y(const Tensor& x, const Tensor& w, const Vec& residual, Activation act) {
  RefOut y;
  kernels::ref::linear(&y, to_f64(x), to_f64(w), {}, residual, x.dim(0), x.dim(1), w.dim(0), act);
  return y.value;
}

TEST(LinearOp, NonConstantWeightSeesNewContents) {
  Rng rng;
  Context ctx;
  auto op = create_operation(LinearParam{.constant_weight = false});
  Buffer x = random_tensor(rng, DType::kF32, {5, 48}, false);
  Buffer w = random_tensor(rng, DType::kF32, {16, 48}, false);
  Tensor y = Tensor::empty(DType::kF32, {5, 16});
  run_operation(*op, {{x.view, w.view}, {y}}, ctx);
  expect_close(y, reference_y(x.view, w.view, {}, Activation::kNone), 1e-4);
  // New contents, same pointer: both a fresh setup and a bare execute must see them.
  for (int64_t i = 0; i < w.view.numel(); ++i)
    store_from_f64(w.view.data(), DType::kF32, i, rng.nonzero(-1.0, 1.0));
  run_operation(*op, {{x.view, w.view}, {y}}, ctx);
  expect_close(y, reference_y(x.view, w.view, {}, Activation::kNone), 1e-4);
  for (int64_t i = 0; i < w.view.numel(); ++i)
    store_from_f64(w.view.data(), DType::kF32, i, rng.nonzero(-1.0, 1.0));
  const size_t ws = op->setup({{x.view, w.view}, {y}}, ctx);
  op->execute({{x.view, w.view}, {y}}, ws ? ctx.workspace(ws) : nullptr, ws, ctx);
  expect_close(y, reference_y(x.view, w.view, {}, Activation::kNone), 1e-4);
}

TEST(LinearOp, ConstantWeightRepacksOnNewPointer) {
  Rng rng;
  Context ctx;
  for (DType dt : {DType::kF32, DType::kBF16}) {
    auto op = create_operation(LinearParam{});  // constant_weight = true
    Buffer x = random_tensor(rng, dt, {3, 40}, false);
    Buffer w1 = random_tensor(rng, dt, {24, 40}, false);
    Buffer w2 = random_tensor(rng, dt, {24, 40}, false);
    Tensor y = Tensor::empty(dt, {3, 24});
    const double tol = tolerance(dt, 40) * 40;
    run_operation(*op, {{x.view, w1.view}, {y}}, ctx);
    expect_close(y, reference_y(x.view, w1.view, {}, Activation::kNone), tol);
    const size_t ws = op->setup({{x.view, w1.view}, {y}}, ctx);
    op->execute({{x.view, w2.view}, {y}}, ws ? ctx.workspace(ws) : nullptr, ws, ctx);
    expect_close(y, reference_y(x.view, w2.view, {}, Activation::kNone), tol);
  }
}

TEST(LinearOp, UpdateActivationReplans) {
  Rng rng;
  Context ctx;
  auto op = create_operation(LinearParam{});
  Buffer x = random_tensor(rng, DType::kF32, {4, 32}, false);
  Buffer w = random_tensor(rng, DType::kF32, {12, 32}, false);
  Tensor y = Tensor::empty(DType::kF32, {4, 12});
  run_operation(*op, {{x.view, w.view}, {y}}, ctx);
  const Vec before = to_f64(y);
  op->update(LinearParam{.activation = Activation::kRelu});
  const size_t ws = op->setup({{x.view, w.view}, {y}}, ctx);
  op->execute({{x.view, w.view}, {y}}, ws ? ctx.workspace(ws) : nullptr, ws, ctx);
  const Vec after = to_f64(y);
  bool some_negative = false;
  for (size_t i = 0; i < before.size(); ++i) {
    some_negative |= before[i] < 0;
    EXPECT_NEAR(after[i], std::max(0.0, before[i]), 1e-5) << "element " << i;
  }
  EXPECT_TRUE(some_negative);
  // update() without setup: execute re-plans by itself.
  op->update(LinearParam{.activation = Activation::kSilu});
  op->execute({{x.view, w.view}, {y}}, ws ? ctx.workspace(ws) : nullptr, ws, ctx);
  expect_close(y, reference_y(x.view, w.view, {}, Activation::kSilu), 1e-4);
  EXPECT_THROW(op->update(ops::SoftmaxParam{}), Error);
  EXPECT_TRUE(std::holds_alternative<LinearParam>(op->param()));
}

// y = x·Wᵀ + y: the residual is the output itself (the residual stream updated in place).
TEST(LinearOp, InPlaceResidual) {
  Rng rng;
  for (DType dt : {DType::kF32, DType::kBF16}) {
    Context ctx;
    auto op =
        create_operation(LinearParam{.activation = Activation::kGeluErf, .has_residual = true});
    Buffer x = random_tensor(rng, dt, {6, 48}, false);
    Buffer w = random_tensor(rng, dt, {20, 48}, false);
    Buffer r = random_tensor(rng, dt, {6, 20}, false);
    const Vec want = reference_y(x.view, w.view, to_f64(r.view), Activation::kGeluErf);
    run_operation(*op, {{x.view, w.view, r.view}, {r.view}}, ctx);
    expect_close(r.view, want, tolerance(dt, 48) * 48);
  }
}

// Setup with distinct buffers, then execute in place: the plan is redone at execute (with
// op-owned scratch, since the caller's workspace was sized for the first plan).
TEST(LinearOp, AliasingAppearsAtExecute) {
  Rng rng;
  Context ctx;
  auto op = create_operation(LinearParam{.has_residual = true});
  Buffer x = random_tensor(rng, DType::kF32, {6, 48}, false);
  Buffer w = random_tensor(rng, DType::kF32, {20, 48}, false);
  Buffer r = random_tensor(rng, DType::kF32, {6, 20}, false);
  Tensor y = Tensor::empty(DType::kF32, {6, 20});
  const size_t ws = op->setup({{x.view, w.view, r.view}, {y}}, ctx);
  EXPECT_EQ(ws, 0u);
  const Vec want = reference_y(x.view, w.view, to_f64(r.view), Activation::kNone);
  op->execute({{x.view, w.view, r.view}, {r.view}}, nullptr, 0, ctx);
  expect_close(r.view, want, 1e-4);
}

TEST(LinearOp, WeightOverlappingOutputIsRejected) {
  Rng rng;
  Context ctx;
  auto op = create_operation(LinearParam{});
  Buffer x = random_tensor(rng, DType::kF32, {4, 4}, false);
  Buffer w = random_tensor(rng, DType::kF32, {4, 4}, false);
  try {
    run_operation(*op, {{x.view, w.view}, {w.view}}, ctx);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("overlaps input 1 (weight)"), std::string::npos)
        << e.what();
  }
}

TEST(LinearOp, ThreadCountChangeGivesSameResult) {
  Rng rng;
  auto op = create_operation(LinearParam{.has_bias = true, .activation = Activation::kSilu});
  Buffer x = random_tensor(rng, DType::kF32, {96, 128}, false);
  Buffer w = random_tensor(rng, DType::kF32, {80, 128}, false);
  Buffer b = random_tensor(rng, DType::kF32, {80}, false);
  Tensor y1 = Tensor::empty(DType::kF32, {96, 80});
  Tensor y2 = Tensor::empty(DType::kF32, {96, 80});
  ContextOptions o1, o2;
  o1.num_threads = 1;
  o2.num_threads = 2;
  Context c1(o1), c2(o2);
  run_operation(*op, {{x.view, w.view, b.view}, {y1}}, c1);
  run_operation(*op, {{x.view, w.view, b.view}, {y2}}, c2);
  expect_close(y2, to_f64(y1), 1e-5);
}

TEST(LinearOp, EmptyBatchWritesNothing) {
  Rng rng;
  Context ctx;
  auto op = create_operation(LinearParam{});
  Tensor x = Tensor::empty(DType::kF32, {0, 16});
  Buffer w = random_tensor(rng, DType::kF32, {8, 16}, false);
  Tensor y = Tensor::empty(DType::kF32, {0, 8});
  EXPECT_NO_THROW(run_operation(*op, {{x, w.view}, {y}}, ctx));
}

// Which oneDNN path this machine takes, for the logs (and a sanity check of the string).
TEST(LinearOp, ImplInfoNamesThePath) {
  Rng rng;
  Context ctx;
  for (DType dt : {DType::kF32, DType::kBF16, DType::kF16}) {
    auto op = create_operation(
        LinearParam{.has_bias = true, .activation = Activation::kGeluErf, .has_residual = true});
    Buffer x = random_tensor(rng, dt, {16, 64}, false);  // M > kGemvMaxRows: oneDNN
    Buffer w = random_tensor(rng, dt, {32, 64}, false);
    Buffer b = random_tensor(rng, DType::kF32, {32}, false);
    Buffer r = random_tensor(rng, dt, {16, 32}, false);
    Tensor y = Tensor::empty(dt, {16, 32});
    run_operation(*op, {{x.view, w.view, b.view, r.view}, {y}}, ctx);
    const std::string impl = op->impl_info();
    std::cout << "[ impl     ] Linear " << dtype_name(dt) << ": " << impl << "\n";
    EXPECT_EQ(impl.rfind("onednn:", 0), 0u) << impl;
    EXPECT_EQ(impl.find("ref:"), std::string::npos) << "oneDNN's reference matmul: " << impl;
  }
}

// Decode-sized M runs the weight-streaming GEMV on the weight as stored (nothing packed);
// M = 9 and up goes to oneDNN.
TEST(LinearOp, SmallMRunsGemv) {
  Rng rng;
  Context ctx;
  for (int64_t m : {1, 8, 9}) {
    auto op = create_operation(LinearParam{.has_bias = true});
    Buffer x = random_tensor(rng, DType::kBF16, {m, 64}, false);
    Buffer w = random_tensor(rng, DType::kBF16, {24, 64}, false);
    Buffer b = random_tensor(rng, DType::kF32, {24}, false);
    Tensor y = Tensor::empty(DType::kBF16, {m, 24});
    run_operation(*op, {{x.view, w.view, b.view}, {y}}, ctx);
    const std::string impl = op->impl_info();
    EXPECT_EQ(impl.find("gemv") != std::string::npos, m <= 8) << "M=" << m << ": " << impl;
  }
}

// The weight-stream hint (kernels::set_weight_stream_nta: prefetchnta requests in the decode
// GEMVs' far streams) changes only how weights are fetched: outputs are bitwise the same with
// it on or off, for 1 and 2 x rows, f32 and bf16 weights (vdpbf16ps where the CPU has it),
// matrices whose last item is short, and the hint goes back off.
TEST(LinearOp, WeightStreamHintLeavesOutputsBitwiseEqual) {
  if (!kernels::weight_stream_hint_applies())
    GTEST_SKIP() << "the hint does nothing on this CPU (not an AMD one with AVX-512)";
  Rng rng;
  Context ctx;
  for (DType dt : {DType::kF32, DType::kBF16})
    for (int64_t m : {1, 2}) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + " M=" + std::to_string(m));
      auto op = create_operation(LinearParam{.has_residual = true});
      Buffer x = random_tensor(rng, dt, {m, 328}, false);
      Buffer w = random_tensor(rng, dt, {1000, 328}, false);  // 63 blocks of 16 outputs
      Buffer r = random_tensor(rng, dt, {m, 1000}, false);
      Tensor y0 = Tensor::empty(dt, {m, 1000}), y1 = Tensor::empty(dt, {m, 1000});
      run_operation(*op, {{x.view, w.view, r.view}, {y0}}, ctx);
      kernels::set_weight_stream_nta(true);
      EXPECT_TRUE(kernels::weight_stream_nta());
      run_operation(*op, {{x.view, w.view, r.view}, {y1}}, ctx);
      kernels::set_weight_stream_nta(false);
      EXPECT_NE(op->impl_info().find("gemv"), std::string::npos) << op->impl_info();
      EXPECT_EQ(std::memcmp(y0.data(), y1.data(), y0.nbytes()), 0);
      expect_close(y1, reference_y(x.view, w.view, to_f64(r.view), Activation::kNone),
                   tolerance(dt, 328));
    }
  EXPECT_FALSE(kernels::weight_stream_nta());
}

// A residual laid out unlike y is staged with y's row stride: oneDNN 2.6 otherwise drops to
// its reference matmul (orders of magnitude slower).
TEST(LinearOp, MismatchedResidualLayoutStaysOnFastPath) {
  Rng rng;
  Context ctx;
  auto op = create_operation(LinearParam{.has_residual = true});
  Buffer x = random_tensor(rng, DType::kF32, {16, 32}, false);  // M > kGemvMaxRows: oneDNN
  Buffer w = random_tensor(rng, DType::kF32, {20, 32}, false);
  Buffer r = random_tensor(rng, DType::kF32, {16, 20}, false);
  Buffer y = poisoned_output(TensorDesc::contiguous(DType::kF32, {16, 20}), true);  // ld 23
  run_operation(*op, {{x.view, w.view, r.view}, {y.view}}, ctx);
  const std::string impl = op->impl_info();
  EXPECT_EQ(impl.find("ref:"), std::string::npos) << impl;
  EXPECT_NE(impl.find("staged residual"), std::string::npos) << impl;
  expect_close(y.view, reference_y(x.view, w.view, to_f64(r.view), Activation::kNone), 1e-4);
}

}  // namespace
}  // namespace tboost::testing
