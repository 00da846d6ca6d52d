// Elementwise (add/mul with broadcasting, scale, cast) and Embedding against float64.
#include <cmath>

#include "tests/ops/harness.h"

namespace tboost::testing {
namespace {

using ops::ElementwiseParam;
using ops::ElementwiseType;

// Reference for a op b with b broadcast onto a's shape.
RefOut ref_binary(const Tensor& a, const Tensor& b, bool add) {
  const Vec va = to_f64(a);
  const Vec vb = to_f64(b);
  const Shape as = a.shape(), bs = b.shape();
  RefOut y;
  y.value.resize(va.size());
  y.scale.resize(va.size());
  const size_t nd = as.size(), off = nd - bs.size();
  Shape idx(nd, 0);
  for (size_t i = 0; i < va.size(); ++i) {
    int64_t bi = 0;
    for (size_t d = off; d < nd; ++d) {
      const int64_t k = bs[d - off] == 1 ? 0 : idx[d];
      bi = bi * bs[d - off] + k;
    }
    const double x = va[i], z = vb[static_cast<size_t>(bi)];
    y.value[i] = add ? x + z : x * z;
    y.scale[i] = add ? std::abs(x) + std::abs(z) : std::abs(x * z);
    for (size_t d = nd; d-- > 0;) {
      if (++idx[d] < as[d]) break;
      idx[d] = 0;
    }
  }
  return y;
}

std::vector<CaseSpec> elementwise_cases() {
  std::vector<CaseSpec> cases;
  struct Bin {
    Shape a, b;
    bool strided;
  };
  const Bin bins[] = {{{5, 37}, {5, 37}, false},   {{3, 4, 37}, {37}, true},
                      {{3, 4, 37}, {4, 1}, false}, {{3, 4, 37}, {3, 1, 37}, true},
                      {{2, 1031}, {1}, false},     {{1027}, {1027}, false}};
  for (bool add : {true, false})
    for (DType dt : {DType::kF32, DType::kBF16, DType::kF16})
      for (const Bin& s : bins) {
        const std::string name = std::string(add ? "add_" : "mul_") + dtype_name(dt) + "_" +
                                 shape_to_string(s.a) + "_by_" + shape_to_string(s.b) +
                                 (s.strided ? "_strided" : "");
        cases.push_back(
            {name, [=](Rng& rng) {
               OpCase c;
               c.param =
                   ElementwiseParam{.type = add ? ElementwiseType::kAdd : ElementwiseType::kMul};
               c.inputs.push_back(random_tensor(rng, dt, s.a, s.strided, -4, 4));
               c.inputs.push_back(random_tensor(rng, dt, s.b, false, -4, 4));
               c.strided_outputs = s.strided;
               c.threads = 2;
               c.reference = [=](const std::vector<Tensor>& in) {
                 return std::vector<Expected>{{ref_binary(in[0], in[1], add), tolerance(dt)}};
               };
               return c;
             }});
      }
  for (DType dt : {DType::kF32, DType::kBF16, DType::kF16})
    cases.push_back({std::string("scale_") + dtype_name(dt) + "_[3,5,67]_strided", [=](Rng& rng) {
                       OpCase c;
                       c.param = ElementwiseParam{.type = ElementwiseType::kScale, .alpha = -0.37f};
                       c.inputs.push_back(random_tensor(rng, dt, {3, 5, 67}, true));
                       c.strided_outputs = true;
                       c.reference = [=](const std::vector<Tensor>& in) {
                         RefOut y;
                         y.value = to_f64(in[0]);
                         for (double& v : y.value) v *= static_cast<double>(-0.37f);
                         return std::vector<Expected>{{y, tolerance(dt)}};
                       };
                       return c;
                     }});
  const DType all[] = {DType::kF32, DType::kBF16, DType::kF16, DType::kI8, DType::kI32};
  for (DType from : all)
    for (DType to : all) {
      cases.push_back(
          {std::string("cast_") + dtype_name(from) + "_to_" + dtype_name(to), [=](Rng& rng) {
             OpCase c;
             c.param = ElementwiseParam{.type = ElementwiseType::kCast, .out_dtype = to};
             c.inputs.push_back(random_tensor(rng, from, {4, 3, 45}, true, -100, 100));
             c.strided_outputs = true;
             c.reference = [=](const std::vector<Tensor>& in) {
               RefOut y;
               y.value = to_f64(in[0]);
               // Casting rounds once to the target type: exact for integers (which
               // hold only integral values here), half an ulp for floats.
               for (double& v : y.value)
                 if (!is_floating(to)) v = std::nearbyint(v);
               const double tol = is_floating(to) ? tolerance(to) : 0.0;
               return std::vector<Expected>{{y, tol}};
             };
             return c;
           }});
    }
  return cases;
}

std::vector<BadSpec> elementwise_bad() {
  auto two = [](Shape a, Shape b, DType ta, DType tb, Shape out, std::string msg) {
    return [=](Rng& rng) {
      BadCase c;
      c.param = ElementwiseParam{.type = ElementwiseType::kAdd};
      c.inputs.push_back(random_tensor(rng, ta, a, false));
      c.inputs.push_back(random_tensor(rng, tb, b, false));
      c.outputs.push_back(TensorDesc::contiguous(ta, out));
      c.expect_substring = msg;
      return c;
    };
  };
  return {
      {"not_broadcastable", two({3, 4}, {3}, DType::kF32, DType::kF32, {3, 4},
                                "input 1 (b) [3] does not broadcast to input 0 (a) [3,4]")},
      {"dtype_mismatch", two({3, 4}, {4}, DType::kF32, DType::kBF16, {3, 4},
                             "input 1 (b) expected dtype f32 (same as a), got bf16")},
      {"b_bigger", two({4}, {3, 4}, DType::kF32, DType::kF32, {4},
                       "input 1 (b) [3,4] has more dims than input 0 (a) [4]")},
      {"wrong_output", two({3, 4}, {4}, DType::kF32, DType::kF32, {3, 5},
                           "output 0 (y) expected f32[3,4], got f32[3,5]")},
      {"missing_b",
       [](Rng& rng) {
         BadCase c;
         c.param = ElementwiseParam{.type = ElementwiseType::kMul};
         c.inputs.push_back(random_tensor(rng, DType::kF32, {3, 4}, false));
         c.outputs.push_back(TensorDesc::contiguous(DType::kF32, {3, 4}));
         c.expect_substring = "expected 2 inputs (a, b for mul), got 1";
         return c;
       }},
      {"null_b",
       [](Rng& rng) {
         BadCase c;
         c.param = ElementwiseParam{.type = ElementwiseType::kAdd};
         c.inputs.push_back(random_tensor(rng, DType::kF32, {3, 4}, false));
         c.inputs.push_back(random_tensor(rng, DType::kF32, {4}, false));
         c.inputs[1].view = Tensor(c.inputs[1].view.desc(), nullptr);
         c.outputs.push_back(TensorDesc::contiguous(DType::kF32, {3, 4}));
         c.expect_substring = "input 1 (b) f32[4] has no data pointer";
         return c;
       }},
      {"scale_int",
       [](Rng& rng) {
         BadCase c;
         c.param = ElementwiseParam{.type = ElementwiseType::kScale, .alpha = 2.0f};
         c.inputs.push_back(random_tensor(rng, DType::kI32, {3, 4}, false, 1, 9));
         c.outputs.push_back(TensorDesc::contiguous(DType::kI32, {3, 4}));
         c.expect_substring = "input 0 (x) expected dtype one of {f32, bf16, f16}, got i32";
         return c;
       }},
      {"cast_wrong_out_dtype",
       [](Rng& rng) {
         BadCase c;
         c.param = ElementwiseParam{.type = ElementwiseType::kCast, .out_dtype = DType::kBF16};
         c.inputs.push_back(random_tensor(rng, DType::kF32, {3, 4}, false));
         c.outputs.push_back(TensorDesc::contiguous(DType::kF16, {3, 4}));
         c.expect_substring = "output 0 (y) expected bf16[3,4], got f16[3,4]";
         return c;
       }},
  };
}

TBOOST_OP_TESTS(Elementwise, elementwise_cases, elementwise_bad);

std::vector<CaseSpec> embedding_cases() {
  std::vector<CaseSpec> cases;
  for (DType dt : {DType::kF32, DType::kBF16, DType::kF16})
    for (DType it : {DType::kI32, DType::kI64})
      for (bool strided : {false, true}) {
        const std::string name = std::string("embedding_") + dtype_name(dt) + "_" + dtype_name(it) +
                                 (strided ? "_strided" : "");
        cases.push_back({name, [=](Rng& rng) {
                           OpCase c;
                           c.param = ops::EmbeddingParam{};
                           const int64_t V = 101, C = 67;
                           c.inputs.push_back(random_tensor(rng, dt, {V, C}, strided));
                           Tensor ids = random_ints(rng, it, {3, 9}, 0, V - 1);
                           c.inputs.push_back(Buffer{ids, ids});
                           c.strided_outputs = strided;
                           c.threads = 2;
                           c.reference = [=](const std::vector<Tensor>& in) {
                             const Vec table = to_f64(in[0]);
                             const Vec id = to_f64(in[1]);
                             RefOut y;
                             for (double i : id)
                               for (int64_t j = 0; j < C; ++j)
                                 y.value.push_back(
                                     table[static_cast<size_t>(static_cast<int64_t>(i) * C + j)]);
                             return std::vector<Expected>{{y, 0.0}};  // a copy: exact
                           };
                           return c;
                         }});
      }
  return cases;
}

std::vector<BadSpec> embedding_bad() {
  auto with_ids = [](Tensor ids, std::string msg, bool exec) {
    return [=](Rng& rng) {
      BadCase c;
      c.param = ops::EmbeddingParam{};
      c.inputs.push_back(random_tensor(rng, DType::kF32, {10, 8}, false));
      c.inputs.push_back(Buffer{ids, ids});
      Shape s = ids.shape();
      s.push_back(8);
      c.outputs.push_back(TensorDesc::contiguous(DType::kF32, s));
      c.expect_substring = msg;
      c.error_at_execute_only = exec;
      return c;
    };
  };
  Tensor big = Tensor::empty(DType::kI32, {4});
  for (int i = 0; i < 4; ++i) big.data_as<int32_t>()[i] = i == 2 ? 10 : i;
  Tensor neg = Tensor::empty(DType::kI64, {3});
  for (int i = 0; i < 3; ++i) neg.data_as<int64_t>()[i] = i == 1 ? -1 : i;
  Tensor fl = Tensor::zeros(DType::kF32, {3});
  return {
      {"id_too_large",
       with_ids(big, "input 1 (ids) element 2 is 10, outside the table's [0, 10)", true)},
      {"id_negative",
       with_ids(neg, "input 1 (ids) element 1 is -1, outside the table's [0, 10)", true)},
      {"float_ids", with_ids(fl, "input 1 (ids) expected dtype one of {i32, i64}, got f32", false)},
      {"null_table",
       [](Rng& rng) {
         BadCase c;
         c.param = ops::EmbeddingParam{};
         c.inputs.push_back(random_tensor(rng, DType::kF32, {10, 8}, false));
         c.inputs[0].view = Tensor(c.inputs[0].view.desc(), nullptr);
         Tensor ids = Tensor::zeros(DType::kI32, {2});
         c.inputs.push_back(Buffer{ids, ids});
         c.outputs.push_back(TensorDesc::contiguous(DType::kF32, {2, 8}));
         c.expect_substring = "input 0 (table) f32[10,8] has no data pointer";
         return c;
       }},
      {"table_rank",
       [](Rng& rng) {
         BadCase c;
         c.param = ops::EmbeddingParam{};
         c.inputs.push_back(random_tensor(rng, DType::kF32, {10}, false));
         Tensor ids = Tensor::zeros(DType::kI32, {2});
         c.inputs.push_back(Buffer{ids, ids});
         c.outputs.push_back(TensorDesc::contiguous(DType::kF32, {2, 10}));
         c.expect_substring = "input 0 (table) expected rank 2, got rank 1";
         return c;
       }},
  };
}

TBOOST_OP_TESTS(Embedding, embedding_cases, embedding_bad);

}  // namespace
}  // namespace tboost::testing
