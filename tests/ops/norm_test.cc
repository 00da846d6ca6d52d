// RmsNorm / LayerNorm: every layer kind, dtype, weight dtype, odd and strided shapes, against
// the float64 reference; bad input of every kind.
#include "src/kernels/cpu/kernels.h"
#include "tests/ops/harness.h"

namespace tboost::testing {
namespace {

using ops::LayerNormParam;
using ops::NormLayer;
using ops::RmsNormParam;

struct NormCfg {
  bool rms;
  NormLayer layer;
  DType dtype;
  DType wdtype;
  Shape shape;
  bool strided;
  bool plus_one;
  bool bias;
  bool stats;
  int threads;
  double offset = 0.0;  // added to x: a large row mean
};

std::string cfg_name(const NormCfg& c) {
  std::string s = std::string(c.rms ? "rms_" : "ln_") + ops::norm_layer_name(c.layer) + "_" +
                  dtype_name(c.dtype) + "_w" + dtype_name(c.wdtype) + "_" +
                  shape_to_string(c.shape);
  if (c.strided) s += "_strided";
  if (c.plus_one) s += "_plus1";
  if (!c.rms && !c.bias) s += "_nobias";
  if (c.stats) s += "_stats";
  if (c.offset != 0.0) s += "_mean" + std::to_string(static_cast<int>(c.offset));
  s += "_t" + std::to_string(c.threads);
  return s;
}

OpCase build(const NormCfg& c, Rng& rng) {
  OpCase oc;
  const float eps = c.rms ? 1e-6f : 1e-5f;
  if (c.rms) {
    oc.param = RmsNormParam{
        .epsilon = eps, .layer = c.layer, .weight_plus_one = c.plus_one, .output_stats = c.stats};
  } else {
    oc.param = LayerNormParam{.epsilon = eps,
                              .layer = c.layer,
                              .has_bias = c.bias,
                              .weight_plus_one = c.plus_one,
                              .output_stats = c.stats};
  }
  const int64_t C = c.shape.back();
  // A non-zero mean makes LayerNorm's cancellation visible.
  oc.inputs.push_back(
      random_tensor(rng, c.dtype, c.shape, c.strided, c.offset - 1.0, c.offset + 3.0));
  const bool res = c.layer != NormLayer::kNorm;
  if (res) oc.inputs.push_back(random_tensor(rng, c.dtype, c.shape, c.strided));
  oc.inputs.push_back(random_tensor(rng, c.wdtype, {C}, false, 0.5, 1.5));
  const bool bias = !c.rms && c.bias;
  if (bias) oc.inputs.push_back(random_tensor(rng, c.wdtype, {C}, false));
  oc.strided_outputs = c.strided;
  oc.threads = c.threads;
  oc.reference = [c, res, bias, C, eps](const std::vector<Tensor>& in) {
    const Vec x = to_f64(in[0]);
    Vec r;
    size_t k = 1;
    if (res) r = to_f64(in[k++]);
    const Vec w = to_f64(in[k++]);
    Vec b;
    if (bias) b = to_f64(in[k]);
    const int64_t rows = static_cast<int64_t>(x.size()) / C;
    RefOut y, sum;
    Vec mean, rstd;
    kernels::ref::norm(&y, &sum, &mean, &rstd, x, res ? &r : nullptr, w, bias ? &b : nullptr, eps,
                       rows, C, c.rms, c.plus_one);
    if (c.layer == NormLayer::kPreNorm && c.dtype != DType::kF32) {
      // The kernel normalizes the PRENORM sum as stored (rounded to bf16 / f16, what the next
      // layer reads). Against the exact sum that is a second rounding of y: up to 2·2^-8 for
      // bf16, the whole tolerance; random inputs reached 0.97 of it. y's reference therefore
      // normalizes the rounded sum (its rstd then comes from the rounded sum too, the kernel's
      // from the f32 one: a difference far below the tolerance). The sum and the statistics
      // outputs are still checked against the exact sum.
      Vec rounded(sum.value.size());
      for (size_t i = 0; i < rounded.size(); ++i) {
        const auto f = static_cast<float>(sum.value[i]);
        rounded[i] =
            c.dtype == DType::kBF16 ? to_f32(from_f32<bf16_t>(f)) : to_f32(from_f32<f16_t>(f));
      }
      RefOut y_rounded;
      kernels::ref::norm(&y_rounded, nullptr, nullptr, nullptr, rounded, nullptr, w,
                         bias ? &b : nullptr, eps, rows, C, c.rms, c.plus_one);
      y = std::move(y_rounded);
    }
    const double tol = tolerance(c.dtype, C);
    std::vector<Expected> out = {{y, tol}};
    if (c.layer == NormLayer::kPreNorm) out.push_back({sum, tolerance(c.dtype)});
    if (c.stats) {
      if (!c.rms) out.push_back({RefOut{mean, {}}, tolerance(DType::kF32, C)});
      // rstd: relative error bounded by the variance's, scaled by |rstd| itself.
      out.push_back({RefOut{rstd, {}}, tolerance(DType::kF32, C)});
    }
    // LayerNorm mean: cancellation-free sum of terms is sum(|x|)/C; use it as the scale.
    if (c.stats && !c.rms) {
      RefOut& m = out[out.size() - 2].ref;
      m.scale.assign(m.value.size(), 0.0);
      for (size_t i = 0; i < m.value.size(); ++i) {
        double s = 0;
        for (int64_t j = 0; j < C; ++j)
          s += std::abs(x[i * static_cast<size_t>(C) + static_cast<size_t>(j)]) +
               (res ? std::abs(r[i * static_cast<size_t>(C) + static_cast<size_t>(j)]) : 0.0);
        m.scale[i] = s / static_cast<double>(C);
      }
    }
    return out;
  };
  return oc;
}

std::vector<CaseSpec> norm_cases() {
  std::vector<CaseSpec> cases;
  auto add = [&](NormCfg c) {
    cases.push_back({cfg_name(c), [c](Rng& rng) { return build(c, rng); }});
  };
  for (bool rms : {true, false})
    for (NormLayer layer : {NormLayer::kNorm, NormLayer::kPreNorm, NormLayer::kPostNorm})
      for (DType dt : {DType::kF32, DType::kBF16, DType::kF16}) {
        add({rms, layer, dt, dt, {7, 77}, false, false, true, false, 0});
        add({rms, layer, dt, DType::kF32, {3, 5, 131}, true, false, true, true, 2});
        add({rms, layer, dt, dt, {2, 3, 2053}, false, true, false, true, 1});
      }
  add({true, NormLayer::kNorm, DType::kF32, DType::kF32, {1, 1}, false, false, true, false, 0});
  add({false,
       NormLayer::kNorm,
       DType::kF32,
       DType::kF32,
       {64, 4096},
       false,
       false,
       true,
       false,
       2});
  add({true,
       NormLayer::kPreNorm,
       DType::kBF16,
       DType::kBF16,
       {33, 4096},
       true,
       false,
       true,
       true,
       2});
  add({true, NormLayer::kNorm, DType::kF32, DType::kF32, {5, 16}, false, true, true, false, 1});
  // Rows with a mean 1000x their spread: the variance must not cancel.
  add({false,
       NormLayer::kNorm,
       DType::kF32,
       DType::kF32,
       {9, 3001},
       false,
       false,
       true,
       true,
       2,
       1000.0});
  add({false,
       NormLayer::kPreNorm,
       DType::kF32,
       DType::kF32,
       {4, 770},
       true,
       false,
       true,
       true,
       2,
       -500.0});
  // Outputs past the 16 MiB streaming threshold with aligned rows: y is written with
  // non-temporal stores (StreamOutput); the PRENORM sum, read back, is not.
  if (streamed_outputs_possible()) {
    add({true,
         NormLayer::kNorm,
         DType::kF32,
         DType::kF32,
         {1030, 4096},
         false,
         false,
         true,
         false,
         2});
    add({false,
         NormLayer::kPreNorm,
         DType::kF32,
         DType::kF32,
         {1030, 4112},
         false,
         false,
         true,
         true,
         2});
    add({true,
         NormLayer::kPostNorm,
         DType::kBF16,
         DType::kBF16,
         {2060, 4096},
         false,
         true,
         true,
         false,
         2});
  }
  return cases;
}

BadCase bad_base(Rng& rng) {
  BadCase b;
  b.param = RmsNormParam{};
  b.inputs.push_back(random_tensor(rng, DType::kF32, {4, 64}, false));
  b.inputs.push_back(random_tensor(rng, DType::kF32, {64}, false));
  b.outputs.push_back(TensorDesc::contiguous(DType::kF32, {4, 64}));
  return b;
}

std::vector<BadSpec> norm_bad() {
  return {
      {"weight_wrong_shape",
       [](Rng& rng) {
         BadCase b = bad_base(rng);
         b.inputs[1] = random_tensor(rng, DType::kF32, {63}, false);
         b.expect_substring = "input 1 (weight) expected shape [64], got [63]";
         return b;
       }},
      {"wrong_dtype",
       [](Rng& rng) {
         BadCase b = bad_base(rng);
         b.inputs[0] = random_tensor(rng, DType::kI32, {4, 64}, false, 1, 5);
         b.expect_substring = "input 0 (x) expected dtype one of {f32, bf16, f16}, got i32";
         return b;
       }},
      {"wrong_rank_weight",
       [](Rng& rng) {
         BadCase b = bad_base(rng);
         b.inputs[1] = random_tensor(rng, DType::kF32, {1, 64}, false);
         b.expect_substring = "input 1 (weight) expected shape [64], got [1,64]";
         return b;
       }},
      {"null_data",
       [](Rng& rng) {
         BadCase b = bad_base(rng);
         b.inputs[0].view = Tensor(b.inputs[0].view.desc(), nullptr);
         b.expect_substring = "input 0 (x) f32[4,64] has no data pointer";
         return b;
       }},
      {"missing_residual_for_prenorm",
       [](Rng& rng) {
         BadCase b = bad_base(rng);
         b.param = RmsNormParam{.layer = NormLayer::kPreNorm};
         b.outputs.push_back(TensorDesc::contiguous(DType::kF32, {4, 64}));
         b.expect_substring = "expected 3 inputs (x, residual, weight for layer PRENORM), got 2";
         return b;
       }},
      {"residual_shape",
       [](Rng& rng) {
         BadCase b = bad_base(rng);
         b.param = RmsNormParam{.layer = NormLayer::kPostNorm};
         b.inputs.insert(b.inputs.begin() + 1, random_tensor(rng, DType::kF32, {5, 64}, false));
         b.expect_substring = "input 1 (residual) expected shape [4,64] (same as x), got [5,64]";
         return b;
       }},
      {"negative_epsilon",
       [](Rng& rng) {
         BadCase b = bad_base(rng);
         b.param = RmsNormParam{.epsilon = -1.0f};
         b.expect_substring = "epsilon must be finite and > 0";
         return b;
       }},
      {"wrong_output_shape",
       [](Rng& rng) {
         BadCase b = bad_base(rng);
         b.outputs[0] = TensorDesc::contiguous(DType::kF32, {4, 65});
         b.expect_substring = "output 0 (y) expected f32[4,64], got f32[4,65]";
         return b;
       }},
      {"missing_prenorm_sum_output",
       [](Rng& rng) {
         BadCase b = bad_base(rng);
         b.param = RmsNormParam{.layer = NormLayer::kPreNorm};
         b.inputs.insert(b.inputs.begin() + 1, random_tensor(rng, DType::kF32, {4, 64}, false));
         b.expect_substring = "expected 2 outputs, got 1";
         return b;
       }},
      {"layernorm_bias_dtype",
       [](Rng& rng) {
         BadCase b;
         b.param = LayerNormParam{};
         b.inputs.push_back(random_tensor(rng, DType::kBF16, {4, 64}, false));
         b.inputs.push_back(random_tensor(rng, DType::kF32, {64}, false));
         b.inputs.push_back(random_tensor(rng, DType::kBF16, {64}, false));
         b.outputs.push_back(TensorDesc::contiguous(DType::kBF16, {4, 64}));
         b.expect_substring = "weight and bias must share a dtype, got f32 and bf16";
         return b;
       }},
      {"layernorm_missing_bias",
       [](Rng& rng) {
         BadCase b;
         b.param = LayerNormParam{};
         b.inputs.push_back(random_tensor(rng, DType::kF32, {4, 64}, false));
         b.inputs.push_back(random_tensor(rng, DType::kF32, {64}, false));
         b.outputs.push_back(TensorDesc::contiguous(DType::kF32, {4, 64}));
         b.expect_substring = "expected 3 inputs (x, weight, bias for layer NORM), got 2";
         return b;
       }},
  };
}

TBOOST_OP_TESTS(Norm, norm_cases, norm_bad);

TEST(NormOp, UpdateChangesParamsAndReplans) {
  Rng rng;
  Context ctx;
  auto op = create_operation(RmsNormParam{.epsilon = 1e-6f});
  Buffer x = random_tensor(rng, DType::kF32, {2, 8}, false);
  Buffer w = random_tensor(rng, DType::kF32, {8}, false);
  Tensor y = Tensor::empty(DType::kF32, {2, 8});
  run_operation(*op, {{x.view, w.view}, {y}}, ctx);
  op->update(RmsNormParam{.epsilon = 1e-6f, .weight_plus_one = true});
  Tensor y2 = Tensor::empty(DType::kF32, {2, 8});
  run_operation(*op, {{x.view, w.view}, {y2}}, ctx);
  for (int64_t i = 0; i < 8; ++i) {
    const double wi = w.view.get({i});
    EXPECT_NEAR(y2.get({0, i}), y.get({0, i}) / wi * (wi + 1.0), 1e-4);
  }
  EXPECT_THROW(op->update(ops::SoftmaxParam{}), Error);
  EXPECT_TRUE(std::holds_alternative<RmsNormParam>(op->param()));
}

}  // namespace
}  // namespace tboost::testing

// The kernel's own precondition: a PRENORM sum comes with a residual (the op always pairs
// them); a direct caller that passes a sum alone gets an error naming it, and y is untouched.
TEST(NormKernel, SumWithoutResidualIsAnError) {
  std::vector<float> x(64, 1.0f), w(64, 1.0f), y(64, -7.0f), sum(64, -7.0f);
  tboost::kernels::NormArgs a;
  const tboost::kernels::RowView rv = tboost::kernels::RowView::contiguous(1, 64);
  a.x = x.data(), a.x_rows = rv, a.y = y.data(), a.y_rows = rv, a.sum = sum.data();
  a.sum_rows = rv, a.weight = w.data(), a.rms = true, a.threads = 1;
  try {
    tboost::kernels::norm_forward(a);
    ADD_FAILURE() << "expected a tboost::Error";
  } catch (const tboost::Error& e) {
    EXPECT_NE(std::string(e.what()).find("needs a residual"), std::string::npos) << e.what();
  }
  EXPECT_EQ(y[0], -7.0f);
}
