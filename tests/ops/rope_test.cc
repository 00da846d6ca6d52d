// Rope: both rotations and layouts, every float dtype, partial rotary dims, head dims that are
// not vector multiples, packed variable-length batches, large positions, strided views and
// thread counts, against the float64 reference; in place against out of place; bad input.
#include <cmath>
#include <cstring>
#include <limits>

#include "tests/ops/harness.h"

namespace tboost::testing {
namespace {

using ops::QkvLayout;
using ops::RopeParam;
using ops::RopeRotation;

enum class PosKind { kRandom, kPacked, kLarge, kTransposed };

struct RopeCfg {
  RopeRotation rotation;
  QkvLayout layout;
  DType dtype;
  Shape shape;  // x
  int64_t rotary_dim;
  bool strided;
  int threads;
  PosKind pos = PosKind::kRandom;
  DType pos_dtype = DType::kI32;
  float theta = 10000.0f;
  float scaling = 1.0f;
};

const char* rotation_name(RopeRotation r) {
  return r == RopeRotation::kRotateHalf ? "half" : "interleaved";
}
const char* layout_name(QkvLayout l) { return l == QkvLayout::kBSND ? "BSND" : "BNSD"; }

std::string cfg_name(const RopeCfg& c) {
  std::string s = std::string(rotation_name(c.rotation)) + "_" + layout_name(c.layout) + "_" +
                  dtype_name(c.dtype) + "_" + shape_to_string(c.shape) + "_r" +
                  std::to_string(c.rotary_dim) + "_pos" + dtype_name(c.pos_dtype);
  if (c.pos == PosKind::kPacked) s += "_packed";
  if (c.pos == PosKind::kLarge) s += "_large";
  if (c.pos == PosKind::kTransposed) s += "_posview";
  if (c.theta != 10000.0f) s += "_theta" + std::to_string(static_cast<int64_t>(c.theta));
  if (c.scaling != 1.0f) s += "_scale" + std::to_string(static_cast<int64_t>(c.scaling));
  if (c.strided) s += "_strided";
  s += "_t" + std::to_string(c.threads);
  return s;
}

// Positions of every token: (B,S) for 4-d x, (T) for packed (T,H,D).
Shape token_shape(const RopeCfg& c) {
  if (c.shape.size() == 3) return {c.shape[0]};
  if (c.layout == QkvLayout::kBNSD) return {c.shape[0], c.shape[2]};
  return {c.shape[0], c.shape[1]};
}

Tensor make_positions(const RopeCfg& c, Rng& rng) {
  const Shape ts = token_shape(c);
  switch (c.pos) {
    case PosKind::kRandom:
      return random_ints(rng, c.pos_dtype, ts, 0, 4096);
    case PosKind::kLarge:
      return random_ints(rng, c.pos_dtype, ts, 0, 500000);
    case PosKind::kTransposed: {
      // A non-contiguous view: (S,B) storage seen as (B,S).
      const Tensor t = random_ints(rng, c.pos_dtype, {ts[1], ts[0]}, 0, 4096);
      return t.transpose(0, 1);
    }
    case PosKind::kPacked:
      break;
  }
  // Several sequences packed back to back, each counting from 0.
  static const int64_t kPattern[] = {0, 1, 2, 0, 1, 0, 1, 2, 3};
  Tensor t = Tensor::empty(c.pos_dtype, ts);
  for (int64_t i = 0; i < ts[0]; ++i) t.set({i}, static_cast<double>(kPattern[i % 9]));
  return t;
}

// Position of every row of x in row-major row order.
Vec positions_of_rows(const RopeCfg& c, const Vec& tok_pos) {
  const Shape& s = c.shape;
  int64_t rows = 1;
  for (size_t i = 0; i + 1 < s.size(); ++i) rows *= s[i];
  Vec out(static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r) {
    int64_t tok;
    if (c.layout == QkvLayout::kBNSD) {
      const int64_t H = s[1], S = s[2];
      const int64_t b = r / (H * S), sq = r % S;
      tok = b * S + sq;
    } else {
      tok = r / s[s.size() - 2];
    }
    out[static_cast<size_t>(r)] = tok_pos[static_cast<size_t>(tok)];
  }
  return out;
}

OpCase build(const RopeCfg& c, Rng& rng) {
  OpCase oc;
  oc.param = RopeParam{.rotation = c.rotation,
                       .rotary_dim = c.rotary_dim,
                       .theta = c.theta,
                       .scaling_factor = c.scaling,
                       .layout = c.layout};
  oc.inputs.push_back(random_tensor(rng, c.dtype, c.shape, c.strided));
  Buffer pos;
  pos.view = make_positions(c, rng);
  pos.storage = pos.view;
  oc.inputs.push_back(pos);
  oc.strided_outputs = c.strided;
  oc.threads = c.threads;
  oc.reference = [c](const std::vector<Tensor>& in) {
    const Vec x = to_f64(in[0]);
    const Vec p = positions_of_rows(c, to_f64(in[1]));
    const int64_t D = c.shape.back();
    RefOut y;
    kernels::ref::rope(&y, x, p, static_cast<int64_t>(p.size()), D, c.rotary_dim, c.rotation,
                       c.theta, c.scaling);
    // No reduction: each output is two products and one sum, rounded once to the dtype.
    return std::vector<Expected>{{y, tolerance(c.dtype)}};
  };
  return oc;
}

std::vector<CaseSpec> rope_cases() {
  std::vector<CaseSpec> cases;
  auto add = [&](RopeCfg c) {
    cases.push_back({cfg_name(c), [c](Rng& rng) { return build(c, rng); }});
  };
  for (RopeRotation rot : {RopeRotation::kRotateHalf, RopeRotation::kInterleaved})
    for (QkvLayout lay : {QkvLayout::kBSND, QkvLayout::kBNSD})
      for (DType dt : {DType::kF32, DType::kBF16, DType::kF16}) {
        const bool bsnd = lay == QkvLayout::kBSND;
        // Full rotary, vector-multiple D.
        add({rot, lay, dt, bsnd ? Shape{2, 5, 3, 64} : Shape{2, 3, 5, 64}, 0, false, 1});
        // Partial rotary, D and r/2 not vector multiples, strided in and out.
        add({rot, lay, dt, bsnd ? Shape{2, 7, 3, 66} : Shape{2, 3, 7, 66}, 34, true, 2,
             PosKind::kRandom, DType::kI64});
        // Many token blocks over two threads.
        add({rot, lay, dt, bsnd ? Shape{3, 70, 4, 96} : Shape{2, 4, 100, 128}, 0, false, 2});
      }
  for (RopeRotation rot : {RopeRotation::kRotateHalf, RopeRotation::kInterleaved}) {
    // Packed variable-length batch (T,H,D).
    for (DType dt : {DType::kF32, DType::kBF16, DType::kF16})
      add({rot, QkvLayout::kBSND, dt, {9, 4, 128}, 0, false, 1, PosKind::kPacked});
    const Shape packed = {27, 2, 40};  // three times the packed pattern, strided
    add({rot, QkvLayout::kBSND, DType::kF32, packed, 24, true, 2, PosKind::kPacked, DType::kI64});
    // Large positions: the angle must be reduced in f64.
    for (QkvLayout lay : {QkvLayout::kBSND, QkvLayout::kBNSD}) {
      const Shape s = lay == QkvLayout::kBSND ? Shape{2, 33, 2, 128} : Shape{2, 2, 33, 128};
      add({rot, lay, DType::kF32, s, 0, false, 2, PosKind::kLarge, DType::kI64});
      add({rot, lay, DType::kF32, s, 0, false, 1, PosKind::kLarge, DType::kI32, 500000.0f, 4.0f});
      add({rot, lay, DType::kBF16, s, 64, true, 2, PosKind::kLarge});
    }
    // Tiny head dims (less than one vector), rotary_dim 2, and a non-contiguous positions view.
    add({rot, QkvLayout::kBSND, DType::kF32, {3, 4, 2, 10}, 0, true, 1});
    add({rot, QkvLayout::kBNSD, DType::kF16, {2, 3, 5, 6}, 2, false, 2});
    add({rot, QkvLayout::kBSND, DType::kF32, {3, 5, 2, 32}, 0, false, 2, PosKind::kTransposed});
    const Shape bnsd = {3, 2, 5, 32};
    add({rot, QkvLayout::kBNSD, DType::kBF16, bnsd, 16, true, 1, PosKind::kTransposed,
         DType::kI64});
  }
  // Outputs of 16 MiB and more are written with non-temporal stores through a staging row:
  // aligned rows, and (strided, D = 130 bf16) rows whose ends are not vector aligned.
  if (streamed_outputs_possible()) {
    add({RopeRotation::kRotateHalf, QkvLayout::kBSND, DType::kF32, {1024, 32, 128}, 0, false, 2});
    const Shape big = {2, 32, 1040, 130};
    add({RopeRotation::kInterleaved, QkvLayout::kBNSD, DType::kBF16, big, 66, true, 2});
  }
  return cases;
}

BadCase bad_base(Rng& rng, QkvLayout layout = QkvLayout::kBSND) {
  BadCase b;
  b.param = RopeParam{.layout = layout};
  b.inputs.push_back(random_tensor(rng, DType::kF32, {2, 6, 3, 8}, false));
  Buffer pos;
  pos.view =
      random_ints(rng, DType::kI32, layout == QkvLayout::kBSND ? Shape{2, 6} : Shape{2, 3}, 0, 100);
  pos.storage = pos.view;
  b.inputs.push_back(pos);
  b.outputs.push_back(TensorDesc::contiguous(DType::kF32, {2, 6, 3, 8}));
  return b;
}

Buffer int_buffer(Tensor t) {
  Buffer b;
  b.view = t;
  b.storage = t;
  return b;
}

std::vector<BadSpec> rope_bad() {
  return {
      {"positions_wrong_count",
       [](Rng& rng) {
         BadCase b = bad_base(rng);
         b.inputs[1] = int_buffer(random_ints(rng, DType::kI32, {11}, 0, 10));
         b.expect_substring = "input 1 (positions) expected 12 elements (one per token), got 11";
         return b;
       }},
      {"positions_wrong_count_bnsd",
       [](Rng& rng) {
         BadCase b = bad_base(rng, QkvLayout::kBNSD);  // (B,H,S,D) = (2,6,3,8): 6 tokens
         b.inputs[1] = int_buffer(random_ints(rng, DType::kI64, {2, 6}, 0, 10));
         b.expect_substring = "input 1 (positions) expected 6 elements (one per token), got 12";
         return b;
       }},
      {"positions_wrong_dtype",
       [](Rng& rng) {
         BadCase b = bad_base(rng);
         b.inputs[1] = random_tensor(rng, DType::kF32, {2, 6}, false, 0.0, 10.0);
         b.expect_substring = "input 1 (positions) expected dtype one of {i32, i64}, got f32";
         return b;
       }},
      {"x_wrong_dtype",
       [](Rng& rng) {
         BadCase b = bad_base(rng);
         b.inputs[0] = int_buffer(random_ints(rng, DType::kI32, {2, 6, 3, 8}, 1, 5));
         b.expect_substring = "input 0 (x) expected dtype one of {f32, bf16, f16}, got i32";
         return b;
       }},
      {"odd_rotary_dim",
       [](Rng& rng) {
         BadCase b = bad_base(rng);
         b.param = RopeParam{.rotary_dim = 5};
         b.expect_substring = "rotary_dim must be even (features rotate in pairs), got 5";
         return b;
       }},
      {"negative_rotary_dim",
       [](Rng& rng) {
         BadCase b = bad_base(rng);
         b.param = RopeParam{.rotary_dim = -2};
         b.expect_substring = "rotary_dim must be >= 0";
         return b;
       }},
      {"rotary_dim_exceeds_head_dim",
       [](Rng& rng) {
         BadCase b = bad_base(rng);
         b.param = RopeParam{.rotary_dim = 10};
         b.expect_substring = "rotary_dim 10 exceeds head_dim 8 of input 0 (x)";
         return b;
       }},
      {"odd_head_dim_full_rotary",
       [](Rng& rng) {
         BadCase b = bad_base(rng);
         b.inputs[0] = random_tensor(rng, DType::kF32, {2, 6, 3, 7}, false);
         b.outputs[0] = TensorDesc::contiguous(DType::kF32, {2, 6, 3, 7});
         b.expect_substring = "has head_dim 7";
         return b;
       }},
      {"x_rank_2",
       [](Rng& rng) {
         BadCase b = bad_base(rng);
         b.inputs[0] = random_tensor(rng, DType::kF32, {12, 8}, false);
         b.outputs[0] = TensorDesc::contiguous(DType::kF32, {12, 8});
         b.expect_substring = "input 0 (x) expected rank 3..4, got rank 2";
         return b;
       }},
      {"x_rank_3_bnsd",
       [](Rng& rng) {
         BadCase b = bad_base(rng, QkvLayout::kBNSD);
         b.inputs[0] = random_tensor(rng, DType::kF32, {6, 3, 8}, false);
         b.outputs[0] = TensorDesc::contiguous(DType::kF32, {6, 3, 8});
         b.expect_substring = "input 0 (x) expected rank 4, got rank 3";
         return b;
       }},
      {"theta_zero",
       [](Rng& rng) {
         BadCase b = bad_base(rng);
         b.param = RopeParam{.theta = 0.0f};
         b.expect_substring = "theta must be finite and > 0";
         return b;
       }},
      {"theta_negative",
       [](Rng& rng) {
         BadCase b = bad_base(rng);
         b.param = RopeParam{.theta = -10000.0f};
         b.expect_substring = "theta must be finite and > 0";
         return b;
       }},
      {"scaling_zero",
       [](Rng& rng) {
         BadCase b = bad_base(rng);
         b.param = RopeParam{.scaling_factor = 0.0f};
         b.expect_substring = "scaling_factor must be finite and > 0";
         return b;
       }},
      {"negative_position",
       [](Rng& rng) {
         BadCase b = bad_base(rng);
         b.inputs[1].view.set({0, 4}, -3.0);
         b.error_at_execute_only = true;
         b.expect_substring = "input 1 (positions) has negative position -3 at token 4";
         return b;
       }},
      {"negative_position_i64",
       [](Rng& rng) {
         BadCase b = bad_base(rng);
         b.inputs[1] = int_buffer(random_ints(rng, DType::kI64, {2, 6}, 0, 100));
         b.inputs[1].view.set({1, 5}, -1.0);
         b.error_at_execute_only = true;
         b.expect_substring = "negative position -1 at token 11";
         return b;
       }},
      {"null_x",
       [](Rng& rng) {
         BadCase b = bad_base(rng);
         b.inputs[0].view = Tensor(b.inputs[0].view.desc(), nullptr);
         b.expect_substring = "input 0 (x) f32[2,6,3,8] has no data pointer";
         b.expect_code = ErrorCode::kNullData;
         b.check_code = true;
         return b;
       }},
      {"null_positions",
       [](Rng& rng) {
         BadCase b = bad_base(rng);
         b.inputs[1].view = Tensor(b.inputs[1].view.desc(), nullptr);
         b.expect_substring = "input 1 (positions) i32[2,6] has no data pointer";
         return b;
       }},
      {"wrong_output_shape",
       [](Rng& rng) {
         BadCase b = bad_base(rng);
         b.outputs[0] = TensorDesc::contiguous(DType::kF32, {2, 6, 3, 9});
         b.expect_substring = "output 0 (y) expected f32[2,6,3,8], got f32[2,6,3,9]";
         return b;
       }},
      {"wrong_output_dtype",
       [](Rng& rng) {
         BadCase b = bad_base(rng);
         b.outputs[0] = TensorDesc::contiguous(DType::kBF16, {2, 6, 3, 8});
         b.expect_substring = "output 0 (y) expected f32[2,6,3,8], got bf16[2,6,3,8]";
         return b;
       }},
      {"missing_positions",
       [](Rng& rng) {
         BadCase b = bad_base(rng);
         b.inputs.pop_back();
         b.expect_substring = "expected 2 inputs (x, positions), got 1";
         return b;
       }},
  };
}

TBOOST_OP_TESTS(Rope, rope_cases, rope_bad);

// In place (y is x, strided or not) must give bitwise the out-of-place result.
TEST(RopeOp, InPlaceMatchesOutOfPlace) {
  for (RopeRotation rot : {RopeRotation::kRotateHalf, RopeRotation::kInterleaved})
    for (QkvLayout lay : {QkvLayout::kBSND, QkvLayout::kBNSD})
      for (DType dt : {DType::kF32, DType::kBF16})
        for (bool strided : {false, true})
          for (int64_t rd : {int64_t{0}, int64_t{18}}) {
            Rng rng;
            SCOPED_TRACE(std::string(rotation_name(rot)) + " " + layout_name(lay) + " " +
                         dtype_name(dt) + (strided ? " strided" : "") + " r" + std::to_string(rd) +
                         " seed " + std::to_string(rng.seed()));
            const Shape shape = lay == QkvLayout::kBSND ? Shape{2, 9, 3, 42} : Shape{2, 3, 9, 42};
            ContextOptions opt;
            opt.num_threads = 2;
            Context ctx(opt);
            auto op = create_operation(
                RopeParam{.rotation = rot, .rotary_dim = rd, .theta = 10000.0f, .layout = lay});
            Buffer x = random_tensor(rng, dt, shape, strided);
            const Tensor pos = random_ints(rng, DType::kI64, {2, 9}, 0, 100000);
            Tensor y = Tensor::empty(dt, shape);
            run_operation(*op, {{x.view, pos}, {y}}, ctx);
            run_operation(*op, {{x.view, pos}, {x.view}}, ctx);
            const Vec a = to_f64(y), b = to_f64(x.view);
            ASSERT_EQ(a.size(), b.size());
            int64_t diff = 0;
            for (size_t i = 0; i < a.size(); ++i) diff += a[i] != b[i];
            EXPECT_EQ(diff, 0) << diff << " elements differ between in place and out of place";
          }
}

// The result is bitwise independent of the thread count and of the store path: a large
// out-of-place run (streamed, two threads) equals an in-place run on one thread.
TEST(RopeOp, StreamedAndThreadedMatchInPlaceSingleThread) {
  for (DType dt : {DType::kF16, DType::kBF16})
    for (RopeRotation rot : {RopeRotation::kRotateHalf, RopeRotation::kInterleaved}) {
      Rng rng;
      SCOPED_TRACE(std::string(dtype_name(dt)) + " " + rotation_name(rot) + " seed " +
                   std::to_string(rng.seed()));
      const Shape shape = {2, 1040, 32, 128};  // 17 MB: past the streaming threshold
      auto op = create_operation(RopeParam{.rotation = rot, .rotary_dim = 96});
      Buffer x = random_tensor(rng, dt, shape, false);
      const Tensor pos = random_ints(rng, DType::kI32, {2, 1040}, 0, 200000);
      Tensor y = Tensor::empty(dt, shape);
      ContextOptions two;
      two.num_threads = 2;
      Context ctx2(two);
      run_operation(*op, {{x.view, pos}, {y}}, ctx2);
      ContextOptions one;
      one.num_threads = 1;
      Context ctx1(one);
      run_operation(*op, {{x.view, pos}, {x.view}}, ctx1);
      EXPECT_EQ(std::memcmp(y.data(), x.view.data(), y.nbytes()), 0);
    }
}

// y may be x itself, but not a view that partly overlaps it (rows would be read after another
// thread rotated them): rejected before anything is written.
TEST(RopeOp, RejectsPartialOverlapOfOutputAndInput) {
  Rng rng;
  Context ctx;
  auto op = create_operation(RopeParam{});
  Buffer storage = random_tensor(rng, DType::kF32, {5, 2, 16}, false);
  const Tensor x = storage.view.slice(0, 0, 4);
  const Tensor y = storage.view.slice(0, 1, 4);  // shifted by one token
  const Tensor pos = random_ints(rng, DType::kI32, {4}, 0, 100);
  const Vec before = to_f64(storage.view);
  try {
    run_operation(*op, {{x, pos}, {y}}, ctx);
    ADD_FAILURE() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("without being the same view"), std::string::npos)
        << e.what();
  }
  EXPECT_EQ(to_f64(storage.view), before);
}

TEST(RopeOp, PositionZeroIsIdentity) {
  Rng rng;
  Context ctx;
  auto op = create_operation(RopeParam{.rotation = RopeRotation::kInterleaved});
  Buffer x = random_tensor(rng, DType::kF32, {4, 2, 16}, false);
  Tensor pos = Tensor::zeros(DType::kI32, {4});
  Tensor y = Tensor::empty(DType::kF32, {4, 2, 16});
  run_operation(*op, {{x.view, pos}, {y}}, ctx);
  EXPECT_EQ(std::memcmp(y.data(), x.view.data(), y.nbytes()), 0);
}

// NaN in x gives NaN in both elements of its pair (never Inf or a number), Inf gives a
// non-finite pair, and every other element stays finite: for the bf16 rounding path too.
TEST(RopeOp, NonFiniteInputsStayNonFinite) {
  for (DType dt : {DType::kF32, DType::kBF16, DType::kF16})
    for (RopeRotation rot : {RopeRotation::kRotateHalf, RopeRotation::kInterleaved}) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + " " + rotation_name(rot));
      Rng rng;
      Context ctx;
      auto op = create_operation(RopeParam{.rotation = rot});
      const int64_t D = 64, half = D / 2;
      Buffer x = random_tensor(rng, dt, {3, 2, D}, false);
      x.view.set({0, 0, 5}, std::nan(""));
      x.view.set({1, 1, 10}, std::numeric_limits<double>::infinity());
      const Tensor pos = random_ints(rng, DType::kI32, {3}, 1, 1000);
      Tensor y = Tensor::empty(dt, {3, 2, D});
      run_operation(*op, {{x.view, pos}, {y}}, ctx);
      auto partner = [&](int64_t i) {
        if (rot == RopeRotation::kInterleaved) return i ^ 1;
        return i < half ? i + half : i - half;
      };
      for (int64_t t = 0; t < 3; ++t)
        for (int64_t h = 0; h < 2; ++h)
          for (int64_t i = 0; i < D; ++i) {
            const double v = y.get({t, h, i});
            const bool nan_pair = t == 0 && h == 0 && (i == 5 || partner(i) == 5);
            const bool inf_pair = t == 1 && h == 1 && (i == 10 || partner(i) == 10);
            if (nan_pair) {
              EXPECT_TRUE(std::isnan(v)) << "element " << i << " = " << v;
            } else if (inf_pair) {
              EXPECT_FALSE(std::isfinite(v)) << "element " << i << " = " << v;
            } else {
              EXPECT_TRUE(std::isfinite(v)) << "token " << t << " head " << h << " element " << i;
            }
          }
    }
}

}  // namespace
}  // namespace tboost::testing
