// MatMul: every dtype, transposes, alpha, batch broadcasting both ways (missing dims, size-1
// dims, stride-0 views), odd and edge sizes (M, N or K = 1), strided operands (given to oneDNN
// in place), transposed views (column-major, in place), views with no unit stride (staged),
// a column-major y (staged), against the float64 reference; bad input of every kind; the
// cached primitive across executes, update() and thread changes.
#include <cmath>
#include <iostream>

#include "tests/ops/harness.h"

namespace tboost::testing {
namespace {

using ops::MatMulParam;

// How an operand's view is made from its logical shape.
enum class View {
  kPlain,           // random_tensor (padded when the case is strided)
  kTransposed,      // the last two dims swapped in storage: column-major, unit stride on rows
  kStepped,         // every other element of the last dim: no unit stride, so staged
  kBroadcastBatch,  // dim 0 a stride-0 view of one stored batch
};

struct MmCfg {
  DType dtype = DType::kF32;
  Shape a, b;  // logical shapes as the op sees them: (..., M, K) or (..., K, M) with ta
  bool ta = false, tb = false;
  float alpha = 1.0f;
  View va = View::kPlain, vb = View::kPlain;
  bool strided_in = false, strided_out = false;
  int threads = 0;
};

const char* view_name(View v) {
  switch (v) {
    case View::kPlain:
      return "";
    case View::kTransposed:
      return "T";
    case View::kStepped:
      return "S";
    case View::kBroadcastBatch:
      return "B";
  }
  return "?";
}

std::string cfg_name(const MmCfg& c) {
  std::string s = std::string(dtype_name(c.dtype)) + "_a" + shape_to_string(c.a) + view_name(c.va) +
                  "_b" + shape_to_string(c.b) + view_name(c.vb);
  if (c.ta) s += "_ta";
  if (c.tb) s += "_tb";
  if (c.alpha != 1.0f) s += "_alpha";
  if (c.strided_in) s += "_sin";
  if (c.strided_out) s += "_sout";
  return s + "_t" + std::to_string(c.threads);
}

Buffer make_view(Rng& rng, DType dt, const Shape& shape, View v, bool strided) {
  const size_t r = shape.size();
  switch (v) {
    case View::kPlain:
      return random_tensor(rng, dt, shape, strided);
    case View::kTransposed: {
      Shape stored = shape;
      std::swap(stored[r - 1], stored[r - 2]);
      Buffer b = random_tensor(rng, dt, stored, false);
      b.view = b.view.transpose(static_cast<int>(r) - 1, static_cast<int>(r) - 2);
      return b;
    }
    case View::kStepped: {
      Shape stored = shape;
      stored[r - 1] *= 2;
      Buffer b = random_tensor(rng, dt, stored, false);
      TensorDesc d = b.view.desc();
      d.dims[r - 1] = shape[r - 1];
      d.strides[r - 1] = 2;
      b.view = Tensor(d, b.view.data());
      return b;
    }
    case View::kBroadcastBatch: {
      Shape stored = shape;
      stored[0] = 1;
      Buffer b = random_tensor(rng, dt, stored, false);
      TensorDesc d = b.view.desc();
      d.dims[0] = shape[0];
      d.strides[0] = 0;
      b.view = Tensor(d, b.view.data());
      return b;
    }
  }
  return {};
}

OpCase build(const MmCfg& c, Rng& rng) {
  OpCase oc;
  oc.param = MatMulParam{.transpose_a = c.ta, .transpose_b = c.tb, .alpha = c.alpha};
  oc.inputs.push_back(make_view(rng, c.dtype, c.a, c.va, c.strided_in));
  oc.inputs.push_back(make_view(rng, c.dtype, c.b, c.vb, c.strided_in));
  oc.strided_outputs = c.strided_out;
  oc.threads = c.threads;
  const int64_t K = c.ta ? c.a[c.a.size() - 2] : c.a.back();
  oc.reference = [c, K](const std::vector<Tensor>& in) {
    RefOut y;
    kernels::ref::matmul(&y, to_f64(in[0]), in[0].shape(), to_f64(in[1]), in[1].shape(), c.ta, c.tb,
                         static_cast<double>(c.alpha));
    return std::vector<Expected>{{y, tolerance(c.dtype, K)}};
  };
  return oc;
}

std::vector<CaseSpec> matmul_cases() {
  std::vector<CaseSpec> cases;
  auto add = [&](MmCfg c) {
    cases.push_back({cfg_name(c), [c](Rng& rng) { return build(c, rng); }});
  };
  using V = View;
  // clang-format off
  for (DType dt : {DType::kF32, DType::kBF16, DType::kF16}) {
    add({.dtype = dt, .a = {7, 33}, .b = {33, 65}});
    add({.dtype = dt, .a = {33, 7}, .b = {65, 33}, .ta = true, .tb = true, .alpha = 0.125f});
    add({.dtype = dt, .a = {7, 33}, .b = {65, 33}, .tb = true, .strided_in = true,
         .strided_out = true});
    // Batched, all strided (padded rows and a gap between matrices: non-dense batch strides).
    add({.dtype = dt, .a = {2, 3, 17, 24}, .b = {2, 3, 24, 19}, .strided_in = true,
         .strided_out = true, .threads = 2});
    // Broadcasting: b without batch dims, a without batch dims, both ways at once.
    add({.dtype = dt, .a = {2, 3, 17, 24}, .b = {24, 19}, .strided_in = true, .threads = 2});
    add({.dtype = dt, .a = {17, 24}, .b = {4, 19, 24}, .tb = true});
    add({.dtype = dt, .a = {3, 1, 9, 16}, .b = {1, 4, 16, 11}, .alpha = -0.5f,
         .strided_out = true});
    // Transposed views (column-major operands, in place) and views with no unit stride.
    add({.dtype = dt, .a = {2, 9, 20}, .b = {2, 20, 13}, .va = V::kTransposed,
         .vb = V::kTransposed});
    add({.dtype = dt, .a = {2, 9, 20}, .b = {20, 13}, .va = V::kStepped, .vb = V::kStepped});
    add({.dtype = dt, .a = {4, 9, 20}, .b = {4, 20, 13}, .va = V::kBroadcastBatch,
         .strided_out = true});
  }
  // Edges: M = N = 1, K = 1, a rank-2 x rank-4 product, a long K, a larger threaded one.
  add({.a = {4, 1, 40}, .b = {4, 40, 1}});
  add({.a = {6, 1}, .b = {1, 8}, .strided_in = true, .strided_out = true});
  add({.a = {1, 1}, .b = {1, 1}, .alpha = 3.0f});
  add({.a = {5, 12}, .b = {2, 3, 12, 7}, .va = V::kTransposed, .threads = 1});
  add({.a = {20, 5}, .b = {2, 1, 20, 7}, .ta = true, .vb = V::kBroadcastBatch});
  add({.dtype = DType::kBF16, .a = {3, 2100}, .b = {2100, 5}});
  add({.dtype = DType::kF32, .a = {3, 2100}, .b = {5, 2100}, .tb = true, .vb = V::kStepped});
  add({.a = {2, 64, 256}, .b = {256, 96}, .threads = 2});
  add({.dtype = DType::kBF16, .a = {2, 4, 33, 64}, .b = {2, 4, 48, 64}, .tb = true,
       .alpha = 0.125f, .strided_in = true, .strided_out = true, .threads = 2});
  // clang-format on
  return cases;
}

BadCase bad_base(Rng& rng, Shape a, Shape b, Shape y, MatMulParam p = {}) {
  BadCase c;
  c.param = p;
  c.inputs.push_back(random_tensor(rng, DType::kF32, a, false));
  c.inputs.push_back(random_tensor(rng, DType::kF32, b, false));
  c.outputs.push_back(TensorDesc::contiguous(DType::kF32, y));
  c.expect_code = ErrorCode::kShapeMismatch;
  c.check_code = true;
  return c;
}

std::vector<BadSpec> matmul_bad() {
  return {
      {"a_rank_1",
       [](Rng& rng) {
         BadCase c = bad_base(rng, {8}, {8, 5}, {5});
         c.expect_substring = "input 0 (a) expected rank 2..8, got rank 1";
         return c;
       }},
      {"b_rank_1",
       [](Rng& rng) {
         BadCase c = bad_base(rng, {4, 8}, {8}, {4});
         c.expect_substring = "input 1 (b) expected rank 2..8, got rank 1";
         return c;
       }},
      {"k_mismatch",
       [](Rng& rng) {
         BadCase c = bad_base(rng, {4, 8}, {9, 5}, {4, 5});
         c.expect_substring = "input 1 (b) expected dim 0 = 8 (K of a), got 9 in shape [9,5]";
         return c;
       }},
      {"k_mismatch_transposed",
       [](Rng& rng) {
         BadCase c = bad_base(rng, {8, 4}, {2, 5, 9}, {2, 4, 5},
                              {.transpose_a = true, .transpose_b = true});
         c.expect_substring =
             "input 1 (b) expected dim 2 = 8 (K of a, transposed), got 9 in shape [2,5,9] "
             "(transpose_b: b is (..., N, K))";
         return c;
       }},
      {"batch_not_broadcastable",
       [](Rng& rng) {
         BadCase c = bad_base(rng, {2, 4, 8}, {3, 8, 5}, {2, 4, 5});
         c.expect_substring =
             "batch dims [2] of input 0 (a) [2,4,8] and [3] of input 1 (b) [3,8,5] do not "
             "broadcast";
         return c;
       }},
      {"dtype_mismatch",
       [](Rng& rng) {
         BadCase c = bad_base(rng, {4, 8}, {8, 5}, {4, 5});
         c.inputs[1] = random_tensor(rng, DType::kBF16, {8, 5}, false);
         c.expect_substring = "input 1 (b) expected dtype f32 (same as a), got bf16";
         c.expect_code = ErrorCode::kDTypeMismatch;
         return c;
       }},
      {"int_dtype",
       [](Rng& rng) {
         BadCase c = bad_base(rng, {4, 8}, {8, 5}, {4, 5});
         c.inputs[0] = random_tensor(rng, DType::kI32, {4, 8}, false, 1, 9);
         c.inputs[1] = random_tensor(rng, DType::kI32, {8, 5}, false, 1, 9);
         c.outputs[0] = TensorDesc::contiguous(DType::kI32, {4, 5});
         c.expect_substring = "input 0 (a) expected dtype one of {f32, bf16, f16}, got i32";
         c.expect_code = ErrorCode::kDTypeMismatch;
         return c;
       }},
      {"wrong_output",
       [](Rng& rng) {
         BadCase c = bad_base(rng, {2, 4, 8}, {8, 5}, {4, 5});
         c.expect_substring = "output 0 (y) expected f32[2,4,5], got f32[4,5]";
         return c;
       }},
      {"empty_k",
       [](Rng& rng) {
         BadCase c = bad_base(rng, {4, 0}, {0, 5}, {4, 5});
         c.expect_substring = "input 0 (a) has an empty K dim";
         return c;
       }},
      {"alpha_nan",
       [](Rng& rng) {
         BadCase c = bad_base(rng, {4, 8}, {8, 5}, {4, 5}, {.alpha = std::nanf("")});
         c.expect_substring = "invalid param: alpha must be finite";
         c.check_code = false;
         return c;
       }},
      {"null_b",
       [](Rng& rng) {
         BadCase c = bad_base(rng, {4, 8}, {8, 5}, {4, 5});
         c.inputs[1].view = Tensor(c.inputs[1].view.desc(), nullptr);
         c.expect_substring = "input 1 (b) f32[8,5] has no data pointer";
         c.expect_code = ErrorCode::kNullData;
         return c;
       }},
  };
}

TBOOST_OP_TESTS(MatMul, matmul_cases, matmul_bad);

Vec reference(const Tensor& a, const Tensor& b, MatMulParam p = {}) {
  RefOut y;
  kernels::ref::matmul(&y, to_f64(a), a.shape(), to_f64(b), b.shape(), p.transpose_a, p.transpose_b,
                       static_cast<double>(p.alpha));
  return y.value;
}

// Which oneDNN path this machine takes, for the logs: never oneDNN's reference matmul for the
// layouts it can read in place, and the f32 fallback named where bf16/f16 has no primitive.
TEST(MatMulOp, ImplInfoNamesThePath) {
  Rng rng;
  Context ctx;
  for (DType dt : {DType::kF32, DType::kBF16, DType::kF16}) {
    auto op = create_operation(MatMulParam{.transpose_b = true, .alpha = 0.5f});
    Buffer a = random_tensor(rng, dt, {2, 3, 16, 32}, true);
    Buffer b = random_tensor(rng, dt, {2, 3, 24, 32}, true);
    Buffer y = poisoned_output(TensorDesc::contiguous(dt, {2, 3, 16, 24}), true);
    run_operation(*op, {{a.view, b.view}, {y.view}}, ctx);
    const std::string impl = op->impl_info();
    std::cout << "[ impl     ] MatMul " << dtype_name(dt) << ": " << impl << "\n";
    EXPECT_EQ(impl.rfind("onednn:", 0), 0u) << impl;
    EXPECT_EQ(impl.find("ref:"), std::string::npos) << "oneDNN's reference matmul: " << impl;
    if (dt == DType::kF32) {
      EXPECT_EQ(impl.find("staged"), std::string::npos) << impl;
    } else if (impl.find("fallback") != std::string::npos) {
      EXPECT_NE(impl.find("f32-compute fallback for " + std::string(dtype_name(dt))),
                std::string::npos)
          << impl;
    }
    expect_close(y.view, reference(a.view, b.view, {.transpose_b = true, .alpha = 0.5f}),
                 tolerance(dt, 32) * 32);
  }
}

// A column-major y is computed contiguous in the workspace and copied out (oneDNN 2.6 would
// otherwise pick its reference kernel); a view with no unit stride is staged likewise.
TEST(MatMulOp, UnreadableLayoutsAreStaged) {
  Rng rng;
  Context ctx;
  auto op = create_operation(MatMulParam{});
  Buffer a = random_tensor(rng, DType::kF32, {3, 9, 40}, false);
  TensorDesc sd = a.view.desc();  // (3, 9, 20) taking every other column
  sd.dims[2] = 20;
  sd.strides[2] = 2;
  const Tensor stepped(sd, a.view.data());
  Buffer b = random_tensor(rng, DType::kF32, {20, 13}, false);
  Tensor y_store = Tensor::empty(DType::kF32, {3, 13, 9});
  const Tensor y = y_store.transpose(1, 2);  // (3, 9, 13), column-major matrices
  run_operation(*op, {{stepped, b.view}, {y}}, ctx);
  const std::string impl = op->impl_info();
  EXPECT_NE(impl.find("staged a,y"), std::string::npos) << impl;
  EXPECT_EQ(impl.find("ref:"), std::string::npos) << impl;
  expect_close(y, reference(stepped, b.view), 1e-5);
}

TEST(MatMulOp, UpdateAndThreadChangesReuseOrRebuildThePrimitive) {
  Rng rng;
  Buffer a = random_tensor(rng, DType::kF32, {4, 24, 40}, false);
  Buffer b = random_tensor(rng, DType::kF32, {40, 30}, false);
  Tensor y1 = Tensor::empty(DType::kF32, {4, 24, 30});
  Tensor y2 = Tensor::empty(DType::kF32, {4, 24, 30});
  ContextOptions o1, o2;
  o1.num_threads = 1;
  o2.num_threads = 2;
  Context c1(o1), c2(o2);
  auto op = create_operation(MatMulParam{});
  run_operation(*op, {{a.view, b.view}, {y1}}, c1);
  expect_close(y1, reference(a.view, b.view), 1e-5);
  // Same shapes, new contents: the cached primitive must read the new data.
  for (int64_t i = 0; i < b.view.numel(); ++i)
    store_from_f64(b.view.data(), DType::kF32, i, rng.nonzero(-1.0, 1.0));
  const size_t ws = op->setup({{a.view, b.view}, {y1}}, c1);
  op->execute({{a.view, b.view}, {y1}}, ws ? c1.workspace(ws) : nullptr, ws, c1);
  expect_close(y1, reference(a.view, b.view), 1e-5);
  // Another thread count: re-planned at execute, same result within rounding.
  op->execute({{a.view, b.view}, {y2}}, ws ? c2.workspace(ws) : nullptr, ws, c2);
  expect_close(y2, to_f64(y1), 1e-5);
  // alpha = 2 scales the f32 accumulator: exactly twice the alpha = 1 result.
  op->update(MatMulParam{.alpha = 2.0f});
  op->execute({{a.view, b.view}, {y2}}, ws ? c1.workspace(ws) : nullptr, ws, c1);
  const Vec v1 = to_f64(y1), v2 = to_f64(y2);
  for (size_t i = 0; i < v1.size(); ++i) ASSERT_EQ(v2[i], 2.0 * v1[i]) << "element " << i;
  EXPECT_THROW(op->update(ops::ReduceParam{}), Error);
}

TEST(MatMulOp, EmptyBatchWritesNothing) {
  Rng rng;
  Context ctx;
  auto op = create_operation(MatMulParam{});
  Tensor a = Tensor::empty(DType::kF32, {0, 4, 16});
  Buffer b = random_tensor(rng, DType::kF32, {16, 8}, false);
  Tensor y = Tensor::empty(DType::kF32, {0, 4, 8});
  EXPECT_NO_THROW(run_operation(*op, {{a, b.view}, {y}}, ctx));
  EXPECT_EQ(op->impl_info(), "empty (nothing to compute)");
}

TEST(MatMulOp, OutputOverlappingAnInputIsRejected) {
  Rng rng;
  Context ctx;
  auto op = create_operation(MatMulParam{});
  Buffer a = random_tensor(rng, DType::kF32, {4, 4}, false);
  Buffer b = random_tensor(rng, DType::kF32, {4, 4}, false);
  const Vec before = to_f64(a.view);
  try {
    run_operation(*op, {{a.view, b.view}, {a.view}}, ctx);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("overlaps input 0 (a)"), std::string::npos) << e.what();
  }
  EXPECT_EQ(to_f64(a.view), before);
}

}  // namespace
}  // namespace tboost::testing
