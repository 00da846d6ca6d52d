// Gather, Where and Compare: broadcasting in every direction, negative axes and indices,
// strided inputs, integer and float dtypes; exact against a float64 reference. Bad input:
// indices out of range (checked before anything is written), shapes that do not broadcast,
// wrong dtypes.
#include <cmath>

#include "tests/ops/harness.h"

namespace tboost::testing {
namespace {

using ops::CompareParam;
using ops::CompareType;
using ops::GatherParam;
using ops::WhereParam;

int64_t numel(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

Shape bcast(const std::vector<Shape>& in) {
  size_t r = 0;
  for (const Shape& s : in) r = std::max(r, s.size());
  Shape o(r, 1);
  for (const Shape& s : in)
    for (size_t i = 0; i < s.size(); ++i) {
      const int64_t d = s[s.size() - 1 - i];
      if (d != 1) o[r - 1 - i] = d;
    }
  return o;
}

// Value of input `v` (row-major values of shape s) at output flat index i of shape o.
double at(const Vec& v, const Shape& s, const Shape& o, int64_t i) {
  int64_t idx = 0, stride = 1;
  for (size_t k = o.size(); k-- > 0;) {
    const int64_t c = i % o[k];
    i /= o[k];
    const int64_t j = static_cast<int64_t>(k) - static_cast<int64_t>(o.size() - s.size());
    if (j >= 0) {
      const int64_t d = s[static_cast<size_t>(j)];
      if (d != 1) idx += c * stride;
      stride *= d;
    }
  }
  return v[static_cast<size_t>(idx)];
}

std::vector<CaseSpec> cases() {
  std::vector<CaseSpec> out;
  // Gather
  struct G {
    Shape data, idx;
    int64_t axis;
    DType dt;
    bool strided;
  };
  const G gs[] = {{{50, 7}, {3, 5}, 0, DType::kF32, false},
                  {{4, 9, 6}, {11}, 1, DType::kI64, true},
                  {{4, 9, 6}, {2, 2}, -1, DType::kBF16, true},
                  {{5}, {}, 0, DType::kI32, false},
                  {{3, 8}, {0}, 1, DType::kF32, false}};
  for (const G& g : gs)
    out.push_back({"gather_" + std::string(dtype_name(g.dt)) + shape_to_string(g.data) + "_idx" +
                       shape_to_string(g.idx) + "_axis" + std::to_string(g.axis) +
                       (g.strided ? "_strided" : ""),
                   [=](Rng& rng) {
                     OpCase c;
                     c.param = GatherParam{.axis = g.axis};
                     c.inputs.push_back(random_tensor(rng, g.dt, g.data, g.strided, -50, 50));
                     const int a = static_cast<int>(
                         g.axis < 0 ? g.axis + static_cast<int64_t>(g.data.size()) : g.axis);
                     const int64_t n = g.data[static_cast<size_t>(a)];
                     Buffer ids;
                     ids.view = random_ints(rng, DType::kI64, g.idx, -n,
                                            n - 1);  // negatives count from the end
                     ids.storage = ids.view;
                     c.inputs.push_back(ids);
                     c.threads = 2;
                     c.reference = [=](const std::vector<Tensor>& in) {
                       const Vec d = to_f64(in[0]), ix = to_f64(in[1]);
                       const int64_t outer = numel(Shape(g.data.begin(), g.data.begin() + a));
                       const int64_t inner = numel(Shape(g.data.begin() + a + 1, g.data.end()));
                       RefOut y;
                       for (int64_t o = 0; o < outer; ++o)
                         for (double iv : ix) {
                           auto k = static_cast<int64_t>(iv);
                           if (k < 0) k += n;
                           for (int64_t j = 0; j < inner; ++j)
                             y.value.push_back(d[static_cast<size_t>((o * n + k) * inner + j)]);
                         }
                       y.scale.assign(y.value.size(), 1.0);
                       return std::vector<Expected>{{y, 0.0}};
                     };
                     return c;
                   }});
  // Where
  struct W {
    Shape c, x, z;
    DType dt;
  };
  const W ws[] = {{{2, 1, 5, 5}, {1}, {2, 3, 5, 5}, DType::kF32},
                  {{7}, {3, 7}, {1}, DType::kI64},
                  {{4, 1}, {1, 6}, {4, 6}, DType::kBF16}};
  for (const W& w : ws)
    out.push_back({"where_" + std::string(dtype_name(w.dt)) + shape_to_string(w.c) +
                       shape_to_string(w.x) + shape_to_string(w.z),
                   [=](Rng& rng) {
                     OpCase c;
                     c.param = WhereParam{};
                     Buffer cond;
                     cond.view = random_ints(rng, DType::kU8, w.c, 0, 3);  // 2, 3 are true too
                     cond.storage = cond.view;
                     c.inputs.push_back(cond);
                     c.inputs.push_back(random_tensor(rng, w.dt, w.x, false, -9, 9));
                     c.inputs.push_back(random_tensor(rng, w.dt, w.z, true, -9, 9));
                     c.reference = [=](const std::vector<Tensor>& in) {
                       const Shape o = bcast({w.c, w.x, w.z});
                       const Vec cv = to_f64(in[0]), xv = to_f64(in[1]), zv = to_f64(in[2]);
                       RefOut y;
                       for (int64_t i = 0; i < numel(o); ++i)
                         y.value.push_back(at(cv, w.c, o, i) != 0 ? at(xv, w.x, o, i)
                                                                  : at(zv, w.z, o, i));
                       y.scale.assign(y.value.size(), 1.0);
                       return std::vector<Expected>{{y, 0.0}};
                     };
                     return c;
                   }});
  // Compare
  for (CompareType t : {CompareType::kEqual, CompareType::kLess, CompareType::kLessEqual,
                        CompareType::kGreater, CompareType::kGreaterEqual, CompareType::kAnd,
                        CompareType::kOr, CompareType::kXor, CompareType::kNot})
    out.push_back({std::string("compare_") + ops::compare_type_name(t), [=](Rng& rng) {
                     OpCase c;
                     c.param = CompareParam{.type = t};
                     const Shape sa = {3, 1, 6}, sb = {4, 1};
                     // Integers against f32 values (equality and both orders occur).
                     c.inputs.push_back(random_tensor(rng, DType::kI64, sa, false, -2, 2));
                     if (t != CompareType::kNot)
                       c.inputs.push_back(random_tensor(rng, DType::kF32, sb, true, -2, 2));
                     if (t != CompareType::kNot) c.inputs.back().view.data_as<float>()[0] = 1.0f;
                     c.reference = [=](const std::vector<Tensor>& in) {
                       const Shape o = t == CompareType::kNot ? sa : bcast({sa, sb});
                       const Vec av = to_f64(in[0]);
                       const Vec bv = in.size() > 1 ? to_f64(in[1]) : av;
                       RefOut y;
                       for (int64_t i = 0; i < numel(o); ++i) {
                         const double u = at(av, sa, o, i);
                         const double v = in.size() > 1 ? at(bv, sb, o, i) : u;
                         bool r = false;
                         switch (t) {
                           case CompareType::kEqual:
                             r = u == v;
                             break;
                           case CompareType::kLess:
                             r = u < v;
                             break;
                           case CompareType::kLessEqual:
                             r = u <= v;
                             break;
                           case CompareType::kGreater:
                             r = u > v;
                             break;
                           case CompareType::kGreaterEqual:
                             r = u >= v;
                             break;
                           case CompareType::kAnd:
                             r = u != 0 && v != 0;
                             break;
                           case CompareType::kOr:
                             r = u != 0 || v != 0;
                             break;
                           case CompareType::kXor:
                             r = (u != 0) != (v != 0);
                             break;
                           case CompareType::kNot:
                             r = u == 0;
                             break;
                         }
                         y.value.push_back(r);
                       }
                       y.scale.assign(y.value.size(), 1.0);
                       return std::vector<Expected>{{y, 0.0}};
                     };
                     return c;
                   }});
  return out;
}

std::vector<BadSpec> bad() {
  std::vector<BadSpec> out;
  out.push_back({"gather_index_out_of_range", [](Rng& rng) {
                   BadCase b;
                   b.param = GatherParam{.axis = 0};
                   b.inputs.push_back(random_tensor(rng, DType::kF32, {5, 3}, false));
                   Buffer ids;
                   ids.view = Tensor::empty(DType::kI64, {2});
                   ids.view.data_as<int64_t>()[0] = 1;
                   ids.view.data_as<int64_t>()[1] = 5;
                   ids.storage = ids.view;
                   b.inputs.push_back(ids);
                   b.outputs = {TensorDesc::contiguous(DType::kF32, {2, 3})};
                   b.expect_substring = "element 1 = 5 is out of range";
                   b.error_at_execute_only = true;
                   return b;
                 }});
  out.push_back({"gather_float_indices", [](Rng& rng) {
                   BadCase b;
                   b.param = GatherParam{};
                   b.inputs.push_back(random_tensor(rng, DType::kF32, {5, 3}, false));
                   b.inputs.push_back(random_tensor(rng, DType::kF32, {2}, false));
                   b.outputs = {TensorDesc::contiguous(DType::kF32, {2, 3})};
                   b.expect_substring = "indices";
                   b.expect_code = ErrorCode::kDTypeMismatch;
                   b.check_code = true;
                   return b;
                 }});
  out.push_back({"where_no_broadcast", [](Rng& rng) {
                   BadCase b;
                   b.param = WhereParam{};
                   Buffer cond;
                   cond.view = random_ints(rng, DType::kU8, {3}, 0, 1);
                   cond.storage = cond.view;
                   b.inputs.push_back(cond);
                   b.inputs.push_back(random_tensor(rng, DType::kF32, {4}, false));
                   b.inputs.push_back(random_tensor(rng, DType::kF32, {4}, false));
                   b.outputs = {TensorDesc::contiguous(DType::kF32, {4})};
                   b.expect_substring = "does not broadcast";
                   return b;
                 }});
  out.push_back({"where_float_cond", [](Rng& rng) {
                   BadCase b;
                   b.param = WhereParam{};
                   b.inputs.push_back(random_tensor(rng, DType::kF32, {4}, false));
                   b.inputs.push_back(random_tensor(rng, DType::kF32, {4}, false));
                   b.inputs.push_back(random_tensor(rng, DType::kF32, {4}, false));
                   b.outputs = {TensorDesc::contiguous(DType::kF32, {4})};
                   b.expect_substring = "cond";
                   return b;
                 }});
  return out;
}

TBOOST_OP_TESTS(Select, cases, bad);

}  // namespace
}  // namespace tboost::testing
