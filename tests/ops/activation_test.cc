// Activation (GELU erf/tanh, SiLU, ReLU, SwiGLU, GeGLU) and Softmax against float64.
#include <cmath>

#include "tests/ops/harness.h"

namespace tboost::testing {
namespace {

using ops::ActivationParam;
using ops::ActivationType;

CaseSpec activation_case(ActivationType t, DType dt, const Shape& shape, bool strided, int threads,
                         bool gate_first) {
  const std::string name = std::string(ops::activation_type_name(t)) + "_" + dtype_name(dt) + "_" +
                           shape_to_string(shape) + (strided ? "_strided" : "") +
                           (gate_first ? "" : "_upfirst") + "_t" + std::to_string(threads);
  return {name, [=](Rng& rng) {
            OpCase c;
            c.param = ActivationParam{.type = t, .gate_first = gate_first};
            // Wide range: exercises the exp clamps and both GELU tails.
            c.inputs.push_back(random_tensor(rng, dt, shape, strided, -12, 12));
            c.strided_outputs = strided;
            c.threads = threads;
            c.reference = [=](const std::vector<Tensor>& in) {
              const Vec x = to_f64(in[0]);
              const int64_t cols = shape.back();
              const int64_t rows = static_cast<int64_t>(x.size()) / cols;
              RefOut y;
              kernels::ref::activation(&y, x, rows, ops::is_gated(t) ? cols / 2 : cols, t,
                                       gate_first);
              return std::vector<Expected>{{y, tolerance(dt)}};
            };
            return c;
          }};
}

std::vector<CaseSpec> activation_cases() {
  std::vector<CaseSpec> cases;
  const ActivationType types[] = {ActivationType::kRelu,     ActivationType::kGeluErf,
                                  ActivationType::kGeluTanh, ActivationType::kSilu,
                                  ActivationType::kSwiGlu,   ActivationType::kGeGluErf,
                                  ActivationType::kGeGluTanh};
  struct Shp {
    Shape shape;
    bool strided;
    int threads;
  };
  const Shp shapes[] = {
      {{5, 38}, false, 0}, {{3, 4, 70}, true, 2}, {{1, 2}, false, 1}, {{129, 130}, false, 2}};
  for (ActivationType t : types)
    for (DType dt : {DType::kF32, DType::kBF16, DType::kF16})
      for (const Shp& s : shapes)
        for (bool gate_first : {true, false}) {
          if (!ops::is_gated(t) && !gate_first) continue;
          cases.push_back(activation_case(t, dt, s.shape, s.strided, s.threads, gate_first));
        }
  // Outputs past the 16 MiB streaming threshold with aligned rows: written with non-temporal
  // stores (StreamOutput).
  if (streamed_outputs_possible()) {
    cases.push_back(
        activation_case(ActivationType::kSilu, DType::kF32, {1030, 4096}, false, 2, true));
    cases.push_back(
        activation_case(ActivationType::kSwiGlu, DType::kBF16, {2060, 8192}, false, 2, false));
  }
  return cases;
}

std::vector<BadSpec> activation_bad() {
  return {
      {"odd_gated_width",
       [](Rng& rng) {
         BadCase b;
         b.param = ActivationParam{.type = ActivationType::kSwiGlu};
         b.inputs.push_back(random_tensor(rng, DType::kF32, {4, 7}, false));
         b.outputs.push_back(TensorDesc::contiguous(DType::kF32, {4, 3}));
         b.expect_substring = "last dim must be even for swiglu";
         return b;
       }},
      {"wrong_output_shape",
       [](Rng& rng) {
         BadCase b;
         b.param = ActivationParam{.type = ActivationType::kSwiGlu};
         b.inputs.push_back(random_tensor(rng, DType::kF32, {4, 8}, false));
         b.outputs.push_back(TensorDesc::contiguous(DType::kF32, {4, 8}));
         b.expect_substring = "output 0 (y) expected f32[4,4], got f32[4,8]";
         return b;
       }},
      {"int_dtype",
       [](Rng& rng) {
         BadCase b;
         b.param = ActivationParam{.type = ActivationType::kSilu};
         b.inputs.push_back(random_tensor(rng, DType::kI8, {4, 8}, false, 1, 5));
         b.outputs.push_back(TensorDesc::contiguous(DType::kI8, {4, 8}));
         b.expect_substring = "input 0 (x) expected dtype one of {f32, bf16, f16}, got i8";
         return b;
       }},
      {"output_dtype",
       [](Rng& rng) {
         BadCase b;
         b.param = ActivationParam{.type = ActivationType::kGeluErf};
         b.inputs.push_back(random_tensor(rng, DType::kBF16, {4, 8}, false));
         b.outputs.push_back(TensorDesc::contiguous(DType::kF32, {4, 8}));
         b.expect_substring = "output 0 (y) expected bf16[4,8], got f32[4,8]";
         return b;
       }},
      {"two_inputs",
       [](Rng& rng) {
         BadCase b;
         b.param = ActivationParam{.type = ActivationType::kRelu};
         b.inputs.push_back(random_tensor(rng, DType::kF32, {4, 8}, false));
         b.inputs.push_back(random_tensor(rng, DType::kF32, {4, 8}, false));
         b.outputs.push_back(TensorDesc::contiguous(DType::kF32, {4, 8}));
         b.expect_substring = "expected 1 inputs (x), got 2";
         return b;
       }},
      {"null_data",
       [](Rng& rng) {
         BadCase b;
         b.param = ActivationParam{.type = ActivationType::kRelu};
         b.inputs.push_back(random_tensor(rng, DType::kF32, {4, 8}, false));
         b.inputs[0].view = Tensor(b.inputs[0].view.desc(), nullptr);
         b.outputs.push_back(TensorDesc::contiguous(DType::kF32, {4, 8}));
         b.expect_substring = "input 0 (x) f32[4,8] has no data pointer";
         return b;
       }},
  };
}

TBOOST_OP_TESTS(Activation, activation_cases, activation_bad);

std::vector<CaseSpec> softmax_cases() {
  std::vector<CaseSpec> cases;
  struct Shp {
    Shape shape;
    bool strided;
    float scale;
    bool masked;
  };
  const Shp shapes[] = {{{7, 77}, false, 1.0f, false},
                        {{2, 3, 130}, true, 0.125f, false},
                        {{3, 4099}, false, 1.0f, false},
                        {{6, 33}, false, 0.5f, true},
                        {{1, 1}, false, 1.0f, false}};
  for (DType dt : {DType::kF32, DType::kBF16, DType::kF16})
    for (const Shp& s : shapes) {
      const std::string name = std::string("softmax_") + dtype_name(dt) + "_" +
                               shape_to_string(s.shape) + (s.strided ? "_strided" : "") +
                               (s.masked ? "_masked" : "") + "_s" + std::to_string(s.scale);
      cases.push_back({name, [=](Rng& rng) {
                         OpCase c;
                         c.param = ops::SoftmaxParam{.scale = s.scale};
                         c.inputs.push_back(random_tensor(rng, dt, s.shape, s.strided, -8, 8));
                         if (s.masked) {
                           // Row 0 fully masked, others partly: -inf entries.
                           Tensor& x = c.inputs[0].view;
                           for (int64_t j = 0; j < s.shape[1]; ++j) x.set({0, j}, -INFINITY);
                           for (int64_t r = 1; r < s.shape[0]; ++r)
                             for (int64_t j = r; j < s.shape[1]; j += 3) x.set({r, j}, -INFINITY);
                         }
                         c.strided_outputs = s.strided;
                         c.reference = [=](const std::vector<Tensor>& in) {
                           const Vec x = to_f64(in[0]);
                           const int64_t cols = s.shape.back();
                           RefOut y;
                           kernels::ref::softmax(&y, x, static_cast<int64_t>(x.size()) / cols, cols,
                                                 s.scale);
                           return std::vector<Expected>{{y, tolerance(dt, cols)}};
                         };
                         return c;
                       }});
    }
  return cases;
}

std::vector<BadSpec> softmax_bad() {
  return {
      {"empty_last_dim",
       [](Rng&) {
         BadCase b;
         b.param = ops::SoftmaxParam{};
         b.inputs.push_back(
             Buffer{Tensor::empty(DType::kF32, {3, 0}), Tensor::empty(DType::kF32, {3, 0})});
         b.outputs.push_back(TensorDesc::contiguous(DType::kF32, {3, 0}));
         b.expect_substring = "input 0 (x) has an empty last dim";
         return b;
       }},
      {"nan_scale",
       [](Rng& rng) {
         BadCase b;
         b.param = ops::SoftmaxParam{.scale = NAN};
         b.inputs.push_back(random_tensor(rng, DType::kF32, {3, 4}, false));
         b.outputs.push_back(TensorDesc::contiguous(DType::kF32, {3, 4}));
         b.expect_substring = "scale must be finite";
         return b;
       }},
      {"strided_last_dim",
       [](Rng& rng) {
         BadCase b;
         b.param = ops::SoftmaxParam{};
         Buffer x = random_tensor(rng, DType::kF32, {4, 3}, false);
         x.view = x.view.transpose(0, 1);
         b.inputs.push_back(x);
         b.outputs.push_back(TensorDesc::contiguous(DType::kF32, {3, 4}));
         b.expect_substring = "input 0 (x) needs a contiguous last dim";
         return b;
       }},
      {"null_data",
       [](Rng& rng) {
         BadCase b;
         b.param = ops::SoftmaxParam{};
         b.inputs.push_back(random_tensor(rng, DType::kF32, {3, 4}, false));
         b.inputs[0].view = Tensor(b.inputs[0].view.desc(), nullptr);
         b.outputs.push_back(TensorDesc::contiguous(DType::kF32, {3, 4}));
         b.expect_substring = "input 0 (x) f32[3,4] has no data pointer";
         return b;
       }},
      {"wrong_output_dtype",
       [](Rng& rng) {
         BadCase b;
         b.param = ops::SoftmaxParam{};
         b.inputs.push_back(random_tensor(rng, DType::kF16, {3, 4}, false));
         b.outputs.push_back(TensorDesc::contiguous(DType::kBF16, {3, 4}));
         b.expect_substring = "output 0 (y) expected f16[3,4], got bf16[3,4]";
         return b;
       }},
  };
}

TBOOST_OP_TESTS(Softmax, softmax_cases, softmax_bad);

}  // namespace
}  // namespace tboost::testing
