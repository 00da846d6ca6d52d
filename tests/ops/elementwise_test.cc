// Elementwise (binary types with broadcasting both ways, pow's exact forms, unary math, scale,
// cast) and Embedding against float64; NaN propagation and the accuracy of exp/tanh/erf/sigmoid
// in ulp.
#include <algorithm>
#include <cmath>
#include <iostream>
#include <limits>
#include <tuple>

#include "tests/ops/harness.h"

namespace tboost::testing {
namespace {

using ops::ElementwiseParam;
using ops::ElementwiseType;

constexpr DType kFloats[] = {DType::kF32, DType::kBF16, DType::kF16};

// Input range per binary type: pow keeps a > 0 (no NaN from fractional exponents) and |b|
// moderate, so results stay finite in f16; the rest draw from [-4, 4].
void binary_range(ElementwiseType t, bool for_b, double* lo, double* hi) {
  *lo = -4, *hi = 4;
  if (t == ElementwiseType::kPow) *lo = for_b ? -2.5 : 0.25, *hi = for_b ? 2.5 : 2.5;
}

std::vector<CaseSpec> elementwise_cases() {
  std::vector<CaseSpec> cases;
  struct Bin {
    Shape a, b;
    bool strided;
  };
  // b onto a, a onto b, both ways at once, scalars, rank 0, size-1 last dims.
  const Bin bins[] = {{{5, 37}, {5, 37}, false},
                      {{3, 4, 37}, {37}, true},
                      {{3, 4, 37}, {4, 1}, false},
                      {{3, 4, 37}, {3, 1, 37}, true},
                      {{2, 1031}, {1}, false},
                      {{1027}, {1027}, false},
                      {{37}, {3, 4, 37}, false},
                      {{4, 1}, {1, 37}, false},
                      {{3, 1, 37}, {1, 5, 1}, true},
                      {{}, {5, 7}, false},
                      {{6, 1}, {6, 1}, true},
                      {{2, 1, 3, 1, 19}, {5, 1, 1, 19}, true},
                      // Outputs past the 16 MiB streaming threshold (add and mul only): f32
                      // and bf16 y are written with non-temporal stores (StreamOutput).
                      {{1030, 4096}, {1030, 4096}, false},
                      {{2060, 4096}, {4096}, false}};
  for (ElementwiseType t :
       {ElementwiseType::kAdd, ElementwiseType::kMul, ElementwiseType::kSub, ElementwiseType::kDiv,
        ElementwiseType::kPow, ElementwiseType::kMax, ElementwiseType::kMin})
    for (DType dt : kFloats)
      for (const Bin& s : bins) {
        // The large shapes run once each (~1 s apiece): add in f32, full by full; mul in bf16,
        // by a broadcast row.
        const bool big = s.a.size() == 2 && s.a[0] >= 1030;
        const bool big_kept =
            (t == ElementwiseType::kAdd && dt == DType::kF32 && s.b.size() == 2) ||
            (t == ElementwiseType::kMul && dt == DType::kBF16 && s.b.size() == 1);
        if (big && (!big_kept || !streamed_outputs_possible())) continue;
        const std::string name = std::string(ops::elementwise_type_name(t)) + "_" + dtype_name(dt) +
                                 "_" + shape_to_string(s.a) + "_by_" + shape_to_string(s.b) +
                                 (s.strided ? "_strided" : "");
        cases.push_back({name, [=](Rng& rng) {
                           OpCase c;
                           c.param = ElementwiseParam{.type = t};
                           double lo, hi;
                           binary_range(t, false, &lo, &hi);
                           c.inputs.push_back(random_tensor(rng, dt, s.a, s.strided, lo, hi));
                           binary_range(t, true, &lo, &hi);
                           c.inputs.push_back(random_tensor(rng, dt, s.b, false, lo, hi));
                           c.strided_outputs = s.strided;
                           c.threads = 2;
                           c.reference = [=](const std::vector<Tensor>& in) {
                             RefOut y;
                             kernels::ref::elementwise_binary(&y, to_f64(in[0]), in[0].shape(),
                                                              to_f64(in[1]), in[1].shape(), t);
                             return std::vector<Expected>{{y, tolerance(dt)}};
                           };
                           return c;
                         }});
      }
  // pow with one exponent for all: the exact unary forms (2, 0.5, 1, -1, -0.5) and std::pow.
  for (double e : {2.0, 0.5, 1.0, -1.0, -0.5, 3.0, -1.5})
    for (DType dt : kFloats)
      cases.push_back(
          {std::string("pow_") + dtype_name(dt) + "_scalar_exponent_" + std::to_string(e),
           [=](Rng& rng) {
             OpCase c;
             c.param = ElementwiseParam{.type = ElementwiseType::kPow};
             c.inputs.push_back(random_tensor(rng, dt, {3, 5, 67}, true, 0.1, 4.0));
             Buffer b = random_tensor(rng, dt, {1, 1}, false);
             store_from_f64(b.view.data(), dt, 0, e);
             c.inputs.push_back(b);
             c.strided_outputs = true;
             c.reference = [=](const std::vector<Tensor>& in) {
               RefOut y;
               kernels::ref::elementwise_binary(&y, to_f64(in[0]), in[0].shape(), to_f64(in[1]),
                                                in[1].shape(), ElementwiseType::kPow);
               return std::vector<Expected>{{y, tolerance(dt)}};
             };
             return c;
           }});
  // Unary math. Ranges keep results finite and normal in each dtype (f16 overflows at
  // e^11); "wide" cases cross exp's and sigmoid's overflow / underflow handling.
  struct Un {
    ElementwiseType type;
    double lo, hi;
    const char* tag;
  };
  const Un uns[] = {{ElementwiseType::kNeg, -4, 4, ""},
                    {ElementwiseType::kSqrt, 0.01, 9, ""},
                    {ElementwiseType::kRsqrt, 0.01, 9, ""},
                    {ElementwiseType::kReciprocal, -4, 4, ""},
                    {ElementwiseType::kExp, -9, 10, ""},
                    {ElementwiseType::kTanh, -6, 6, ""},
                    {ElementwiseType::kTanh, -0.35, 0.35, "_near0"},
                    {ElementwiseType::kErf, -4, 4, ""},
                    {ElementwiseType::kErf, -0.6, 0.6, "_near0"},
                    {ElementwiseType::kSigmoid, -20, 20, ""},
                    {ElementwiseType::kAbs, -4, 4, ""}};
  for (const Un& u : uns)
    for (DType dt : kFloats)
      for (const Shape& shape : {Shape{3, 5, 67}, Shape{}}) {
        const bool strided = !shape.empty();
        cases.push_back({std::string(ops::elementwise_type_name(u.type)) + u.tag + "_" +
                             dtype_name(dt) + "_" + shape_to_string(shape),
                         [=](Rng& rng) {
                           OpCase c;
                           c.param = ElementwiseParam{.type = u.type};
                           c.inputs.push_back(random_tensor(rng, dt, shape, strided, u.lo, u.hi));
                           c.strided_outputs = strided;
                           c.threads = 2;
                           c.reference = [=](const std::vector<Tensor>& in) {
                             RefOut y;
                             kernels::ref::elementwise_unary(&y, to_f64(in[0]), u.type, 1.0);
                             return std::vector<Expected>{{y, tolerance(dt)}};
                           };
                           return c;
                         }});
      }
  for (auto [t, lo, hi] : {std::tuple{ElementwiseType::kExp, -87.0, 88.0},
                           std::tuple{ElementwiseType::kSigmoid, -100.0, 100.0}})
    for (DType dt : {DType::kF32, DType::kBF16})
      cases.push_back(
          {std::string(ops::elementwise_type_name(t)) + "_wide_" + dtype_name(dt), [=](Rng& rng) {
             OpCase c;
             c.param = ElementwiseParam{.type = t};
             c.inputs.push_back(random_tensor(rng, dt, {4099}, false, lo, hi));
             c.reference = [=](const std::vector<Tensor>& in) {
               RefOut y;
               kernels::ref::elementwise_unary(&y, to_f64(in[0]), t, 1.0);
               return std::vector<Expected>{{y, tolerance(dt)}};
             };
             return c;
           }});
  // {1030, 4096} f32: an output past the streaming threshold (non-temporal stores).
  for (DType dt : kFloats)
    for (const Shape& shape : {Shape{3, 5, 67}, Shape{1030, 4096}}) {
      const bool strided = shape.size() == 3;
      if (!strided && (dt != DType::kF32 || !streamed_outputs_possible())) continue;
      cases.push_back(
          {std::string("scale_") + dtype_name(dt) + "_" + shape_to_string(shape) +
               (strided ? "_strided" : ""),
           [=](Rng& rng) {
             OpCase c;
             c.param = ElementwiseParam{.type = ElementwiseType::kScale, .alpha = -0.37f};
             c.inputs.push_back(random_tensor(rng, dt, shape, strided));
             c.strided_outputs = strided;
             c.reference = [=](const std::vector<Tensor>& in) {
               RefOut y;
               kernels::ref::elementwise_unary(&y, to_f64(in[0]), ElementwiseType::kScale,
                                               static_cast<double>(-0.37f));
               return std::vector<Expected>{{y, tolerance(dt)}};
             };
             return c;
           }});
    }
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
      {"not_broadcastable",
       two({3, 4}, {3}, DType::kF32, DType::kF32, {3, 4},
           "input 0 (a) [3,4] and input 1 (b) [3] do not broadcast: dim 1 of a is 4, dim 0 of b "
           "is 3")},
      {"not_broadcastable_inner",
       two({2, 3, 4}, {5, 1, 4}, DType::kF32, DType::kF32, {2, 3, 4},
           "input 0 (a) [2,3,4] and input 1 (b) [5,1,4] do not broadcast: dim 0 of a is 2, dim "
           "0 of b is 5")},
      {"dtype_mismatch", two({3, 4}, {4}, DType::kF32, DType::kBF16, {3, 4},
                             "input 1 (b) expected dtype f32 (same as a), got bf16")},
      // b may now have more dims than a (y takes the broadcast shape); y must be that shape.
      {"b_bigger_output_is_a", two({4}, {3, 4}, DType::kF32, DType::kF32, {4},
                                   "output 0 (y) expected f32[3,4], got f32[4]")},
      {"wrong_output", two({3, 4}, {4}, DType::kF32, DType::kF32, {3, 5},
                           "output 0 (y) expected f32[3,4], got f32[3,5]")},
      {"a_last_dim_strided",
       [](Rng& rng) {
         BadCase c;
         c.param = ElementwiseParam{.type = ElementwiseType::kSub};
         c.inputs.push_back(random_tensor(rng, DType::kF32, {4, 3}, false));
         c.inputs[0].view = c.inputs[0].view.transpose(0, 1);
         c.inputs.push_back(random_tensor(rng, DType::kF32, {3, 4}, false));
         c.outputs.push_back(TensorDesc::contiguous(DType::kF32, {3, 4}));
         c.expect_substring = "input 0 (a) needs a contiguous last dim (stride 1)";
         return c;
       }},
      {"unary_int",
       [](Rng& rng) {
         BadCase c;
         c.param = ElementwiseParam{.type = ElementwiseType::kSqrt};
         c.inputs.push_back(random_tensor(rng, DType::kI32, {3, 4}, false, 1, 9));
         c.outputs.push_back(TensorDesc::contiguous(DType::kI32, {3, 4}));
         c.expect_substring = "input 0 (x) expected dtype one of {f32, bf16, f16}, got i32";
         return c;
       }},
      {"unary_two_inputs",
       [](Rng& rng) {
         BadCase c;
         c.param = ElementwiseParam{.type = ElementwiseType::kExp};
         c.inputs.push_back(random_tensor(rng, DType::kF32, {3, 4}, false));
         c.inputs.push_back(random_tensor(rng, DType::kF32, {3, 4}, false));
         c.outputs.push_back(TensorDesc::contiguous(DType::kF32, {3, 4}));
         c.expect_substring = "expected 1 inputs (x for exp), got 2";
         return c;
       }},
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

// y = op(inputs) for contiguous f32 tensors (a fresh op, 2 threads).
Tensor run_f32(ElementwiseType t, const std::vector<Tensor>& in) {
  ContextOptions o;
  o.num_threads = 2;
  Context ctx(o);
  auto op = create_operation(ElementwiseParam{.type = t});
  std::vector<TensorDesc> descs;
  for (const Tensor& x : in) descs.push_back(x.desc());
  Tensor y = Tensor::empty(DType::kF32, op->infer_shape(descs)[0].shape());
  run_operation(*op, {in, {y}}, ctx);
  return y;
}

Tensor f32_tensor(const std::vector<float>& v) {
  Tensor t = Tensor::empty(DType::kF32, {static_cast<int64_t>(v.size())});
  std::copy(v.begin(), v.end(), t.data_as<float>());
  return t;
}

// NaN in, NaN out (x86's max/min and the exp clamps would drop it), and the limits at ±inf.
TEST(ElementwiseOp, NaNPropagatesAndInfinitiesHaveTheirLimits) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  // 11 elements: a vector of 8 and a tail, NaN in both, on either side.
  const Tensor a = f32_tensor({1, nan, 3, -4, 5, 6, 7, nan, 9, 10, nan});
  const Tensor b = f32_tensor({nan, 2, 3, -5, 5, nan, 1, nan, 0, 20, 1});
  for (ElementwiseType t : {ElementwiseType::kMax, ElementwiseType::kMin}) {
    const Tensor y = run_f32(t, {a, b});
    for (int i = 0; i < 11; ++i) {
      const float p = a.data_as<float>()[i], q = b.data_as<float>()[i];
      const float want = std::isnan(p) || std::isnan(q) ? nan
                         : t == ElementwiseType::kMax   ? std::max(p, q)
                                                        : std::min(p, q);
      const float got = y.data_as<float>()[i];
      EXPECT_TRUE(std::isnan(want) ? std::isnan(got) : got == want)
          << ops::elementwise_type_name(t) << " element " << i << ": got " << got;
    }
  }
  const Tensor x = f32_tensor({nan, inf, -inf, 1000, -1000, 0.5f, nan, 1, 2, 3, nan});
  struct Limit {
    ElementwiseType t;
    float at_inf, at_minus_inf, at_1000, at_minus_1000;
  };
  for (const Limit& l :
       {Limit{ElementwiseType::kExp, inf, 0, inf, 0}, Limit{ElementwiseType::kTanh, 1, -1, 1, -1},
        Limit{ElementwiseType::kErf, 1, -1, 1, -1}, Limit{ElementwiseType::kSigmoid, 1, 0, 1, 0}}) {
    const Tensor y = run_f32(l.t, {x});
    const float* v = y.data_as<float>();
    const char* name = ops::elementwise_type_name(l.t);
    for (int i : {0, 6, 10}) EXPECT_TRUE(std::isnan(v[i])) << name << " element " << i;
    EXPECT_EQ(v[1], l.at_inf) << name;
    EXPECT_EQ(v[2], l.at_minus_inf) << name;
    EXPECT_EQ(v[3], l.at_1000) << name;
    EXPECT_EQ(v[4], l.at_minus_1000) << name;
  }
}

// Accuracy of the f32 transcendental kernels in ulp of the float64 result, over a dense sweep:
// the header promises a few ulp (not correctly rounded). Measured on AVX2: exp 2.7, sigmoid
// 3.1, erf 5.3 (near |x| = 0.5, where A&S takes over from the series), tanh 5.7 (near 0.5:
// 2·sigmoid(2x) - 1 doubles sigmoid's error); bounds 8 leave room for other targets' roundings.
TEST(ElementwiseOp, TranscendentalsAreAccurateToAFewUlp) {
  struct Sweep {
    ElementwiseType t;
    double lo, hi, max_ulp;
  };
  for (const Sweep& s :
       {Sweep{ElementwiseType::kExp, -87.0, 88.5, 8}, Sweep{ElementwiseType::kTanh, -12.0, 12.0, 8},
        Sweep{ElementwiseType::kErf, -5.0, 5.0, 8},
        Sweep{ElementwiseType::kSigmoid, -85.0, 40.0, 8}}) {
    const int64_t n = 200003;
    Tensor x = Tensor::empty(DType::kF32, {n});
    for (int64_t i = 0; i < n; ++i)
      x.data_as<float>()[i] = static_cast<float>(s.lo + (s.hi - s.lo) * static_cast<double>(i) /
                                                            static_cast<double>(n - 1));
    const Tensor y = run_f32(s.t, {x});
    RefOut ref;
    kernels::ref::elementwise_unary(&ref, to_f64(x), s.t, 1.0);
    double worst = 0.0;
    int64_t at = 0;
    for (int64_t i = 0; i < n; ++i) {
      const double r = ref.value[static_cast<size_t>(i)];
      if (r == 0.0 || std::abs(r) < std::numeric_limits<float>::min()) continue;  // FTZ range
      const double ulp = std::ldexp(1.0, std::ilogb(static_cast<float>(r)) - 23);
      const double e = std::abs(y.data_as<float>()[i] - r) / ulp;
      if (e > worst) worst = e, at = i;
    }
    std::cout << "[ accuracy ] " << ops::elementwise_type_name(s.t) << ": max " << worst
              << " ulp at x = " << x.data_as<float>()[at] << "\n";
    EXPECT_LE(worst, s.max_ulp) << ops::elementwise_type_name(s.t)
                                << " at x = " << x.data_as<float>()[at];
  }
}

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
