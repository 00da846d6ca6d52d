// Reduce: sum/mean/max/min, every float dtype, each kernel path (rows: the reduced dim
// contiguous; columns: a kept dim contiguous; strided: neither), negative and multiple axes,
// all axes, keepdims on and off, strided inputs and outputs, long reductions, against the
// float64 reference; bad axes and dtypes; results independent of the thread count; the empty
// reductions.
#include <algorithm>
#include <cmath>

#include "tests/ops/harness.h"

namespace tboost::testing {
namespace {

using ops::ReduceParam;
using ops::ReduceType;

enum class View { kPlain, kTransposed, kStepped };

struct RedCfg {
  Shape x;  // logical shape
  std::vector<int64_t> axes;
  bool keepdims = true;
  View view = View::kPlain;
  bool strided = false;  // padded input and output (harness)
  int threads = 2;
};

std::string cfg_name(ReduceType t, DType dt, const RedCfg& c) {
  std::string s = std::string(ops::reduce_type_name(t)) + "_" + dtype_name(dt) + "_x" +
                  shape_to_string(c.x) + "_axes" + shape_to_string(c.axes);
  if (!c.keepdims) s += "_nokeep";
  if (c.view == View::kTransposed) s += "_transposed";
  if (c.view == View::kStepped) s += "_stepped";
  if (c.strided) s += "_strided";
  return s + "_t" + std::to_string(c.threads);
}

Buffer make_input(Rng& rng, DType dt, const RedCfg& c) {
  const size_t r = c.x.size();
  if (c.view == View::kTransposed) {  // the last two dims swapped in storage
    Shape stored = c.x;
    std::swap(stored[r - 1], stored[r - 2]);
    Buffer b = random_tensor(rng, dt, stored, false, -2, 2);
    b.view = b.view.transpose(static_cast<int>(r) - 1, static_cast<int>(r) - 2);
    return b;
  }
  if (c.view == View::kStepped) {  // every other element of the last dim
    Shape stored = c.x;
    stored[r - 1] *= 2;
    Buffer b = random_tensor(rng, dt, stored, false, -2, 2);
    TensorDesc d = b.view.desc();
    d.dims[r - 1] = c.x[r - 1];
    d.strides[r - 1] = 2;
    b.view = Tensor(d, b.view.data());
    return b;
  }
  return random_tensor(rng, dt, c.x, c.strided, -2, 2);
}

OpCase build(ReduceType t, DType dt, const RedCfg& c, Rng& rng) {
  OpCase oc;
  oc.param = ReduceParam{.type = t, .axes = c.axes, .keepdims = c.keepdims};
  oc.inputs.push_back(make_input(rng, dt, c));
  oc.strided_outputs = c.strided;
  oc.threads = c.threads;
  oc.reference = [t, dt, c](const std::vector<Tensor>& in) {
    std::vector<int64_t> axes;
    const auto rank = static_cast<int64_t>(c.x.size());
    int64_t n = 1;
    for (int64_t a : c.axes) axes.push_back(a < 0 ? a + rank : a);
    for (int64_t d = 0; d < rank; ++d)
      if (axes.empty() || std::find(axes.begin(), axes.end(), d) != axes.end())
        n *= c.x[static_cast<size_t>(d)];
    RefOut y;
    kernels::ref::reduce(&y, to_f64(in[0]), c.x, axes, t);
    return std::vector<Expected>{{y, tolerance(dt, n)}};
  };
  return oc;
}

std::vector<CaseSpec> reduce_cases() {
  std::vector<CaseSpec> cases;
  // clang-format off
  const RedCfg cfgs[] = {
      {.x = {7, 129}, .axes = {-1}},                                     // rows
      {.x = {33, 40}, .axes = {0}, .keepdims = false},                   // columns
      {.x = {3, 5, 67}, .axes = {1}, .strided = true},                   // columns, padded
      {.x = {3, 5, 67}, .axes = {0, 2}, .strided = true},                // rows, two runs each
      {.x = {3, 5, 67}, .axes = {2, 0}, .keepdims = false},              // order does not matter
      {.x = {4, 3, 5, 9}, .axes = {1, 3}, .strided = true, .threads = 3},
      {.x = {4, 6, 10}, .axes = {}, .keepdims = false},                  // everything
      {.x = {5, 1, 7}, .axes = {1}},                                     // a size-1 axis
      {.x = {9, 70}, .axes = {0}, .view = View::kTransposed},            // rows via the view
      {.x = {9, 70}, .axes = {1}, .view = View::kTransposed},            // columns via the view
      {.x = {6, 5, 11}, .axes = {2}, .view = View::kStepped},            // strided
      {.x = {6, 5, 11}, .axes = {0}, .keepdims = false, .view = View::kStepped},
      {.x = {2, 5000}, .axes = {1}},                                     // long: 2048+ terms
      {.x = {3000, 3}, .axes = {0}, .threads = 1},                       // long column
      {.x = {}, .axes = {}},                                             // a scalar
      {.x = {3, 0, 4}, .axes = {1}},                                     // empty: sum 0
  };
  // clang-format on
  for (ReduceType t : {ReduceType::kSum, ReduceType::kMean, ReduceType::kMax, ReduceType::kMin})
    for (DType dt : {DType::kF32, DType::kBF16, DType::kF16})
      for (const RedCfg& c : cfgs) {
        const bool empty = std::find(c.x.begin(), c.x.end(), 0) != c.x.end();
        if (empty && t != ReduceType::kSum) continue;  // mean: NaN; max/min: an error
        cases.push_back({cfg_name(t, dt, c), [=](Rng& rng) { return build(t, dt, c, rng); }});
      }
  return cases;
}

BadCase bad_base(Rng& rng, ReduceParam p, Shape x, Shape y, DType dt = DType::kF32) {
  BadCase c;
  c.param = p;
  c.inputs.push_back(random_tensor(rng, dt, x, false));
  c.outputs.push_back(TensorDesc::contiguous(dt, y));
  return c;
}

std::vector<BadSpec> reduce_bad() {
  return {
      {"axis_out_of_range",
       [](Rng& rng) {
         BadCase c = bad_base(rng, {.axes = {3}}, {2, 3, 4}, {2, 3, 1});
         c.expect_substring = "invalid param: axis 3 is outside -3..2 for input 0 (x) of rank 3";
         return c;
       }},
      {"negative_axis_out_of_range",
       [](Rng& rng) {
         BadCase c = bad_base(rng, {.axes = {-4}}, {2, 3, 4}, {2, 3, 1});
         c.expect_substring = "invalid param: axis -4 is outside -3..2";
         return c;
       }},
      {"repeated_axis",
       [](Rng& rng) {
         BadCase c = bad_base(rng, {.axes = {1, -2}}, {2, 3, 4}, {2, 1, 4});
         c.expect_substring = "invalid param: axis 1 is given twice";
         return c;
       }},
      {"int_dtype",
       [](Rng& rng) {
         BadCase c = bad_base(rng, {.axes = {1}}, {2, 3}, {2, 1}, DType::kI32);
         c.expect_substring = "input 0 (x) expected dtype one of {f32, bf16, f16}, got i32";
         return c;
       }},
      {"max_of_empty_axis",
       [](Rng& rng) {
         BadCase c = bad_base(rng, {.type = ReduceType::kMax, .axes = {1}}, {2, 0, 3}, {2, 1, 3});
         c.expect_substring = "input 0 (x) [2,0,3] has an empty axis 1: max of no elements";
         return c;
       }},
      {"keepdims_output_shape",
       [](Rng& rng) {
         BadCase c = bad_base(rng, {.axes = {1}, .keepdims = false}, {2, 3, 4}, {2, 1, 4});
         c.expect_substring = "output 0 (y) expected f32[2,4], got f32[2,1,4]";
         return c;
       }},
      {"no_input",
       [](Rng&) {
         BadCase c;
         c.param = ReduceParam{};
         c.outputs.push_back(TensorDesc::contiguous(DType::kF32, {1}));
         c.expect_substring = "expected 1 inputs (x), got 0";
         return c;
       }},
  };
}

TBOOST_OP_TESTS(Reduce, reduce_cases, reduce_bad);

Tensor run_reduce(const ReduceParam& p, const Tensor& x, int threads) {
  ContextOptions o;
  o.num_threads = threads;
  Context ctx(o);
  auto op = create_operation(p);
  Tensor y = Tensor::empty(x.dtype(), op->infer_shape({x.desc()})[0].shape());
  run_operation(*op, {{x}, {y}}, ctx);
  return y;
}

// Work is split over outputs only: every thread count gives the same bits, on every path.
TEST(ReduceOp, ResultDoesNotDependOnThreadCount) {
  Rng rng;
  for (auto [shape, axis] :
       {std::pair{Shape{64, 3001}, int64_t{1}}, std::pair{Shape{3001, 64}, int64_t{0}},
        std::pair{Shape{17, 19, 23}, int64_t{1}}})
    for (ReduceType t : {ReduceType::kSum, ReduceType::kMean, ReduceType::kMax}) {
      Buffer x = random_tensor(rng, DType::kF32, shape, false, -3, 3);
      const ReduceParam p{.type = t, .axes = {axis}};
      const Vec one = to_f64(run_reduce(p, x.view, 1));
      for (int threads : {2, 3, 7})
        EXPECT_EQ(to_f64(run_reduce(p, x.view, threads)), one)
            << ops::reduce_type_name(t) << " " << shape_to_string(shape) << " threads " << threads;
    }
}

TEST(ReduceOp, EmptyMeanIsNaNAndNaNPropagates) {
  Tensor empty = Tensor::empty(DType::kF32, {3, 0});
  const Tensor mean = run_reduce({.type = ReduceType::kMean, .axes = {1}}, empty, 2);
  ASSERT_EQ(mean.numel(), 3);
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(std::isnan(mean.data_as<float>()[i]));
  // A NaN anywhere in a row makes that row's max, min, sum and mean NaN, on every path.
  Rng rng;
  Buffer x = random_tensor(rng, DType::kF32, {4, 37}, false);
  x.view.data_as<float>()[1 * 37 + 30] = std::nanf("");  // row 1, in the vector tail
  for (ReduceType t : {ReduceType::kSum, ReduceType::kMean, ReduceType::kMax, ReduceType::kMin})
    for (int64_t axis : {0, 1}) {
      const Vec y = to_f64(run_reduce({.type = t, .axes = {axis}, .keepdims = false}, x.view, 2));
      for (size_t i = 0; i < y.size(); ++i) {
        const bool has_nan = axis == 1 ? i == 1 : i == 30;
        EXPECT_EQ(std::isnan(y[i]), has_nan)
            << ops::reduce_type_name(t) << " axis " << axis << " output " << i;
      }
    }
}

}  // namespace
}  // namespace tboost::testing
