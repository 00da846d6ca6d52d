// Transpose and Concat: every dtype (floats and integers), each copy path (memcpy rows when
// the last dim stays last, tiles when it moves, element rows for gathers), negative perms and
// axes, strided inputs and outputs, ranks 0 to 5, empty inputs; exact against the reference.
// Bad perms, axes, ranks, dims and dtypes; inputs overlapping the output.
#include "tests/ops/harness.h"

namespace tboost::testing {
namespace {

using ops::ConcatParam;
using ops::TransposeParam;

// Values every dtype holds exactly (u8 has no negatives).
Buffer layout_input(Rng& rng, DType dt, const Shape& shape, bool strided) {
  return dt == DType::kU8 ? random_tensor(rng, dt, shape, strided, 1, 250)
                          : random_tensor(rng, dt, shape, strided, -100, 100);
}

std::vector<CaseSpec> transpose_cases() {
  std::vector<CaseSpec> cases;
  struct Tr {
    Shape x;
    std::vector<int64_t> perm;
    bool strided;
  };
  const Tr trs[] = {
      {{3, 5, 67}, {0, 2, 1}, true},         // last dim moves: tiles
      {{3, 5, 67}, {2, 0, 1}, false},        // tiles, outer dim in front
      {{3, 5, 67}, {1, 0, 2}, true},         // last dim stays: memcpy rows
      {{3, 5, 67}, {0, 1, 2}, true},         // identity: a strided view made contiguous
      {{3, 5, 67}, {}, true},                // empty perm: the identity too
      {{2, 7, 3, 16}, {0, 2, 1, 3}, false},  // (B, S, H, D) -> (B, H, S, D)
      {{2, 70, 45}, {0, 2, 1}, true},        // several tiles per matrix, ragged edges
      {{4, 3, 5, 2, 3}, {4, 3, 2, 1, 0}, false},
      {{5, 6}, {-1, -2}, false},  // negative entries
      {{37}, {0}, false},
      {{}, {}, false},                // a scalar
      {{3, 0, 4}, {2, 1, 0}, false},  // empty
  };
  for (DType dt : kAllDTypes)
    for (const Tr& t : trs) {
      cases.push_back({std::string("transpose_") + dtype_name(dt) + "_" + shape_to_string(t.x) +
                           "_perm" + shape_to_string(t.perm) + (t.strided ? "_strided" : ""),
                       [=](Rng& rng) {
                         OpCase c;
                         c.param = TransposeParam{.perm = t.perm};
                         c.inputs.push_back(layout_input(rng, dt, t.x, t.strided));
                         c.strided_outputs = t.strided;
                         c.threads = 2;
                         c.reference = [=](const std::vector<Tensor>& in) {
                           std::vector<int64_t> perm;
                           if (t.perm.empty())  // the identity
                             for (size_t i = 0; i < t.x.size(); ++i)
                               perm.push_back(static_cast<int64_t>(i));
                           for (int64_t p : t.perm)
                             perm.push_back(p < 0 ? p + static_cast<int64_t>(t.x.size()) : p);
                           RefOut y;
                           kernels::ref::transpose(&y.value, to_f64(in[0]), t.x, perm);
                           return std::vector<Expected>{{y, 0.0}};  // a copy: exact
                         };
                         return c;
                       }});
    }
  // Views with no unit stride (every other element of the last dim): a tile walk whose reads
  // are strided, and (identity perm) an element gather per row.
  for (DType dt : {DType::kF32, DType::kI8, DType::kI64})
    for (const std::vector<int64_t>& perm : {std::vector<int64_t>{1, 0}, {0, 1}})
      cases.push_back({std::string("transpose_") + dtype_name(dt) + "_stepped_view_perm" +
                           shape_to_string(perm),
                       [=](Rng& rng) {
                         OpCase c;
                         c.param = TransposeParam{.perm = perm};
                         Buffer x = layout_input(rng, dt, {37, 90}, false);
                         TensorDesc d = x.view.desc();
                         d.dims[1] = 45, d.strides[1] = 2;
                         x.view = Tensor(d, x.view.data());
                         c.inputs.push_back(x);
                         c.strided_outputs = true;
                         c.reference = [=](const std::vector<Tensor>& in) {
                           RefOut y;
                           kernels::ref::transpose(&y.value, to_f64(in[0]), {37, 45}, perm);
                           return std::vector<Expected>{{y, 0.0}};
                         };
                         return c;
                       }});
  // A transposed input view (strides permuted, not padded) copied through the tile path.
  cases.push_back({"transpose_f32_of_a_transposed_view", [](Rng& rng) {
                     OpCase c;
                     c.param = TransposeParam{.perm = {1, 0, 2}};
                     Buffer x = random_tensor(rng, DType::kF32, {6, 40, 9}, false);
                     x.view = x.view.transpose(1, 2);  // (6, 9, 40), last stride 9
                     c.inputs.push_back(x);
                     c.reference = [](const std::vector<Tensor>& in) {
                       RefOut y;
                       kernels::ref::transpose(&y.value, to_f64(in[0]), in[0].shape(), {1, 0, 2});
                       return std::vector<Expected>{{y, 0.0}};
                     };
                     return c;
                   }});
  return cases;
}

std::vector<BadSpec> transpose_bad() {
  auto with_perm = [](std::vector<int64_t> perm, std::string msg) {
    return [=](Rng& rng) {
      BadCase c;
      c.param = TransposeParam{.perm = perm};
      c.inputs.push_back(random_tensor(rng, DType::kF32, {2, 3, 4}, false));
      c.outputs.push_back(TensorDesc::contiguous(DType::kF32, {4, 3, 2}));
      c.expect_substring = msg;
      return c;
    };
  };
  return {
      {"perm_too_short",
       with_perm({1, 0}, "invalid param: perm [1,0] has 2 entries, input 0 (x) has rank 3")},
      {"perm_repeats", with_perm({2, 1, -2},
                                 "invalid param: perm [2,1,-2] is not a permutation: dim 1 appears "
                                 "twice")},
      {"perm_out_of_range",
       with_perm({0, 3, 1},
                 "invalid param: axis 3 is outside -3..2 for perm [0,3,1] entry 1 on "
                 "input 0 (x) of rank 3")},
      {"wrong_output",
       [](Rng& rng) {
         BadCase c;
         c.param = TransposeParam{.perm = {0, 2, 1}};
         c.inputs.push_back(random_tensor(rng, DType::kI32, {2, 3, 4}, false, 1, 9));
         c.outputs.push_back(TensorDesc::contiguous(DType::kI32, {2, 3, 4}));
         c.expect_substring = "output 0 (y) expected i32[2,4,3], got i32[2,3,4]";
         return c;
       }},
  };
}

TBOOST_OP_TESTS(Transpose, transpose_cases, transpose_bad);

std::vector<CaseSpec> concat_cases() {
  std::vector<CaseSpec> cases;
  struct Cat {
    std::vector<Shape> xs;
    int64_t axis;
    bool strided;
  };
  const Cat cats[] = {
      {{{2, 3, 5}, {2, 4, 5}, {2, 1, 5}}, 1, true},  {{{2, 3, 5}, {1, 3, 5}}, 0, false},
      {{{2, 3, 5}, {2, 3, 7}, {2, 3, 1}}, -1, true},  // along the last dim: row pieces
      {{{4, 37}, {4, 0}, {4, 6}}, 1, false},          // an empty input
      {{{3, 2, 2, 9}, {3, 2, 5, 9}}, 2, true},       {{{11}}, 0, false},  // one input: a copy
  };
  for (DType dt : kAllDTypes)
    for (const Cat& k : cats) {
      std::string shapes;
      for (const Shape& s : k.xs) shapes += shape_to_string(s);
      cases.push_back({std::string("concat_") + dtype_name(dt) + "_" + shapes + "_axis" +
                           std::to_string(k.axis) + (k.strided ? "_strided" : ""),
                       [=](Rng& rng) {
                         OpCase c;
                         c.param = ConcatParam{.axis = k.axis};
                         for (const Shape& s : k.xs)
                           c.inputs.push_back(layout_input(rng, dt, s, k.strided));
                         c.strided_outputs = k.strided;
                         c.threads = 2;
                         c.reference = [=](const std::vector<Tensor>& in) {
                           std::vector<Vec> xs;
                           for (const Tensor& t : in) xs.push_back(to_f64(t));
                           const auto rank = static_cast<int64_t>(k.xs[0].size());
                           RefOut y;
                           kernels::ref::concat(&y.value, xs, k.xs,
                                                k.axis < 0 ? k.axis + rank : k.axis);
                           return std::vector<Expected>{{y, 0.0}};
                         };
                         return c;
                       }});
    }
  return cases;
}

std::vector<BadSpec> concat_bad() {
  auto two = [](Shape a, Shape b, DType tb, int64_t axis, Shape y, std::string msg) {
    return [=](Rng& rng) {
      BadCase c;
      c.param = ConcatParam{.axis = axis};
      c.inputs.push_back(random_tensor(rng, DType::kF32, a, false));
      c.inputs.push_back(random_tensor(rng, tb, b, false, 1, 9));
      c.outputs.push_back(TensorDesc::contiguous(DType::kF32, y));
      c.expect_substring = msg;
      return c;
    };
  };
  return {
      {"dim_mismatch",
       two({2, 3, 5}, {2, 4, 6}, DType::kF32, 1, {2, 7, 5},
           "input 1 (x1) expected dim 2 = 5 (as input 0; only the concat axis 1 may differ), "
           "got 6 in shape [2,4,6]")},
      {"rank_mismatch", two({2, 3, 5}, {2, 3}, DType::kF32, 0, {4, 3, 5},
                            "input 1 (x1) expected rank 3, got rank 2")},
      {"dtype_mismatch", two({2, 3}, {2, 3}, DType::kI32, 0, {4, 3},
                             "input 1 (x1) expected dtype f32 (same as input 0), got i32")},
      {"axis_out_of_range",
       two({2, 3}, {2, 3}, DType::kF32, 2, {2, 6},
           "invalid param: axis 2 is outside -2..1 for input 0 (x0) of rank 2")},
      {"wrong_output", two({2, 3}, {2, 3}, DType::kF32, -1, {4, 3},
                           "output 0 (y) expected f32[2,6], got f32[4,3]")},
      {"no_inputs",
       [](Rng&) {
         BadCase c;
         c.param = ConcatParam{};
         c.outputs.push_back(TensorDesc::contiguous(DType::kF32, {1}));
         c.expect_substring = "expected at least 1 input, got 0";
         return c;
       }},
      {"scalar_inputs",
       [](Rng& rng) {
         BadCase c;
         c.param = ConcatParam{};
         c.inputs.push_back(random_tensor(rng, DType::kF32, {}, false));
         c.outputs.push_back(TensorDesc::contiguous(DType::kF32, {1}));
         c.expect_substring = "input 0 (x0) is a scalar (rank 0): nothing to join";
         return c;
       }},
  };
}

TBOOST_OP_TESTS(Concat, concat_cases, concat_bad);

// An input that shares memory with y is rejected before anything is written.
TEST(LayoutOps, InputsOverlappingTheOutputAreRejected) {
  Rng rng;
  Context ctx;
  Buffer x = random_tensor(rng, DType::kF32, {4, 4}, false);
  const Vec before = to_f64(x.view);
  for (const AnyParam& p : {AnyParam(TransposeParam{.perm = {1, 0}}), AnyParam(ConcatParam{})}) {
    auto op = create_operation(p);
    try {
      run_operation(*op, {{x.view}, {x.view}}, ctx);  // y is x itself
      ADD_FAILURE() << op->name() << ": no error";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("overlaps input 0 (x"), std::string::npos) << e.what();
    }
    EXPECT_EQ(to_f64(x.view), before) << op->name();
  }
}

}  // namespace
}  // namespace tboost::testing
