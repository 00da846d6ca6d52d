// The Operation contract across ops: descriptors, aliasing and in-place rules enforced by
// OpBase, and the edge cases a kernel must survive (empty rows).
#include "tests/ops/harness.h"

namespace tboost::testing {
namespace {

std::string error_of(Operation& op, const VariantPack& pack, Context& ctx) {
  try {
    run_operation(op, pack, ctx);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(Contract, PreNormInPlaceOnTheResidualMatchesOutOfPlace) {
  Rng rng;
  Context ctx;
  for (DType dt : {DType::kF32, DType::kBF16}) {
    Buffer x = random_tensor(rng, dt, {5, 3, 67}, false);
    Buffer res = random_tensor(rng, dt, {5, 3, 67}, false);
    Buffer w = random_tensor(rng, dt, {67}, false);
    Tensor res_copy = res.view.contiguous_copy();
    auto op = create_operation(ops::RmsNormParam{.layer = ops::NormLayer::kPreNorm});
    Tensor y1 = Tensor::empty(dt, {5, 3, 67}), s1 = Tensor::empty(dt, {5, 3, 67});
    run_operation(*op, {{x.view, res_copy, w.view}, {y1, s1}}, ctx);
    Tensor y2 = Tensor::empty(dt, {5, 3, 67});
    run_operation(*op, {{x.view, res.view, w.view}, {y2, res.view}}, ctx);  // sum -> residual
    EXPECT_EQ(to_f64(y1), to_f64(y2)) << dtype_name(dt);
    EXPECT_EQ(to_f64(s1), to_f64(res.view)) << dtype_name(dt);
  }
}

TEST(Contract, ActivationAndSoftmaxInPlace) {
  Rng rng;
  Context ctx;
  Buffer x = random_tensor(rng, DType::kF32, {9, 133}, false, -5, 5);
  Tensor ref = Tensor::empty(DType::kF32, {9, 133});
  for (const AnyParam& p : {AnyParam(ops::ActivationParam{.type = ops::ActivationType::kGeluTanh}),
                            AnyParam(ops::SoftmaxParam{.scale = 0.5f})}) {
    Tensor in = x.view.contiguous_copy();
    auto op = create_operation(p);
    run_operation(*op, {{in}, {ref}}, ctx);
    run_operation(*op, {{in}, {in}}, ctx);
    EXPECT_EQ(to_f64(ref), to_f64(in));
  }
}

TEST(Contract, RejectsNegativeStridesAndBadRank) {
  Rng rng;
  Context ctx;
  Buffer x = random_tensor(rng, DType::kF32, {4, 8}, false);
  TensorDesc d = x.view.desc();
  d.strides[0] = -8;
  Tensor neg(d, x.view.data_as<float>() + 24);
  Tensor y = Tensor::empty(DType::kF32, {4, 8});
  auto op = create_operation(ops::ActivationParam{.type = ops::ActivationType::kRelu});
  EXPECT_NE(error_of(*op, {{neg}, {y}}, ctx).find("input 0 (x) has a negative stride -8 in dim 0"),
            std::string::npos);
  TensorDesc big = x.view.desc();
  big.ndim = 9;
  EXPECT_NE(error_of(*op, {{Tensor(big, x.view.data())}, {y}}, ctx).find("has rank 9"),
            std::string::npos);
  TensorDesc huge = TensorDesc::contiguous(DType::kF32, {4, 8});
  huge.dims[0] = int64_t{1} << 62;
  EXPECT_NE(error_of(*op, {{Tensor(huge, x.view.data())}, {y}}, ctx).find("overflows int64"),
            std::string::npos);
}

TEST(Contract, RejectsOverlappingOutputs) {
  Rng rng;
  Context ctx;
  Buffer x = random_tensor(rng, DType::kF32, {4, 8}, false);
  auto relu = create_operation(ops::ActivationParam{.type = ops::ActivationType::kRelu});
  // y shifted by one element inside x: partial overlap.
  Tensor xs = x.view.slice(1, 0, 7);
  Tensor ys(xs.desc(), x.view.data_as<float>() + 1);
  EXPECT_NE(error_of(*relu, {{xs}, {ys}}, ctx).find("overlaps input 0 (x)"), std::string::npos);
  // Stride-0 output rows.
  TensorDesc bd = TensorDesc::contiguous(DType::kF32, {4, 8});
  bd.strides[0] = 0;
  Tensor yb = Tensor::empty(DType::kF32, {8});
  EXPECT_NE(error_of(*relu, {{x.view}, {Tensor(bd, yb.data())}}, ctx).find("broadcast (stride 0)"),
            std::string::npos);
  // PRENORM y and sum the same buffer.
  Buffer w = random_tensor(rng, DType::kF32, {8}, false);
  Tensor both = Tensor::empty(DType::kF32, {4, 8});
  auto norm = create_operation(ops::RmsNormParam{.layer = ops::NormLayer::kPreNorm});
  EXPECT_NE(error_of(*norm, {{x.view, x.view, w.view}, {both, both}}, ctx)
                .find("output 0 (y) overlaps output 1 (sum)"),
            std::string::npos);
  // Embedding output over its own ids.
  Tensor buf = Tensor::zeros(DType::kI32, {64});
  Tensor ids = buf.slice(0, 0, 4);
  Buffer table = random_tensor(rng, DType::kF32, {10, 8}, false);
  auto emb = create_operation(ops::EmbeddingParam{});
  Tensor yid = Tensor::view(buf.data(), DType::kF32, {4, 8});
  EXPECT_NE(error_of(*emb, {{table.view, ids}, {yid}}, ctx).find("overlaps input 1 (ids)"),
            std::string::npos);
}

TEST(Contract, EmptyRowsAndScalars) {
  Context ctx;
  Tensor a = Tensor::empty(DType::kF32, {3, 0}), b = Tensor::empty(DType::kF32, {3, 0});
  Tensor y = Tensor::empty(DType::kF32, {3, 0});
  auto add = create_operation(ops::ElementwiseParam{.type = ops::ElementwiseType::kAdd});
  EXPECT_NO_THROW(run_operation(*add, {{a, b}, {y}}, ctx));
  // Rank 0 broadcasts like any other shape: scalar + scalar is a scalar.
  Tensor s = Tensor::empty(DType::kF32, {}), sy = Tensor::empty(DType::kF32, {});
  *s.data_as<float>() = 1.5f;
  EXPECT_EQ(error_of(*add, {{s, s}, {sy}}, ctx), "");
  EXPECT_EQ(*sy.data_as<float>(), 3.0f);
  auto sm = create_operation(ops::SoftmaxParam{.scale = -1.0f});
  Tensor x = Tensor::zeros(DType::kF32, {2, 3}), z = Tensor::empty(DType::kF32, {2, 3});
  EXPECT_NE(error_of(*sm, {{x}, {z}}, ctx).find("scale must be finite and > 0"), std::string::npos);
}

TEST(Contract, IntegerToBf16CastRoundsOnce) {
  Context ctx;
  Tensor i = Tensor::empty(DType::kI32, {2});
  i.data_as<int32_t>()[0] = 16842753;  // 2^24 + 2^16 + 1: double rounding would give 2^24
  i.data_as<int32_t>()[1] = -16842753;
  Tensor y = Tensor::empty(DType::kBF16, {2});
  auto cast = create_operation(
      ops::ElementwiseParam{.type = ops::ElementwiseType::kCast, .out_dtype = DType::kBF16});
  run_operation(*cast, {{i}, {y}}, ctx);
  EXPECT_EQ(y.get({0}), 16908288.0);
  EXPECT_EQ(y.get({1}), -16908288.0);
}

}  // namespace
}  // namespace tboost::testing

namespace tboost::testing {
namespace {
TEST(Contract, NaNInputsPropagate) {
  Context ctx;
  Tensor x = Tensor::zeros(DType::kF32, {2, 19});
  for (int64_t j = 0; j < 19; ++j) x.set({0, j}, 0.1 * static_cast<double>(j) - 1.0);
  x.set({0, 5}, std::nan(""));
  Tensor y = Tensor::empty(DType::kF32, {2, 19});
  auto relu = create_operation(ops::ActivationParam{.type = ops::ActivationType::kRelu});
  run_operation(*relu, {{x}, {y}}, ctx);
  EXPECT_TRUE(std::isnan(y.get({0, 5})));
  EXPECT_EQ(y.get({0, 0}), 0.0);
  auto sm = create_operation(ops::SoftmaxParam{});
  run_operation(*sm, {{x}, {y}}, ctx);
  for (int64_t j = 0; j < 19; ++j) EXPECT_TRUE(std::isnan(y.get({0, j})));
  EXPECT_NEAR(y.get({1, 0}), 1.0 / 19.0, 1e-6);
}
}  // namespace
}  // namespace tboost::testing

namespace tboost::testing {
namespace {
// The public free-function kernels (include/tboost/kernels/cpu.h) against the float64
// reference, contiguous data, odd sizes.
TEST(PublicKernels, NormsMatchReference) {
  Rng rng;
  const int64_t rows = 7, cols = 131;
  Buffer x = random_tensor(rng, DType::kF32, {rows, cols}, false, -1, 3);
  Buffer r = random_tensor(rng, DType::kF32, {rows, cols}, false);
  Buffer w = random_tensor(rng, DType::kF32, {cols}, false, 0.5, 1.5);
  Buffer b = random_tensor(rng, DType::kF32, {cols}, false);
  const Vec vx = to_f64(x.view), vr = to_f64(r.view), vw = to_f64(w.view), vb = to_f64(b.view);
  const double tol = tolerance(DType::kF32, cols);
  auto check = [&](const Tensor& got, const RefOut& ref) {
    const Vec g = to_f64(got);
    for (size_t i = 0; i < g.size(); ++i)
      ASSERT_LE(std::abs(g[i] - ref.value[i]), tol * ref.scale[i] + 1e-30) << i;
  };
  Tensor y = Tensor::empty(DType::kF32, {rows, cols}), s = Tensor::empty(DType::kF32, {rows, cols});
  std::vector<float> mean(rows), rstd(rows);
  RefOut ry, rs;
  kernels::cpu::rms_norm_forward(y.data_as<float>(), rstd.data(), x.view.data_as<float>(),
                                 w.view.data_as<float>(), 1e-6f, rows, cols, 2);
  kernels::ref::norm(&ry, nullptr, nullptr, nullptr, vx, nullptr, vw, nullptr, 1e-6, rows, cols,
                     true, false);
  check(y, ry);
  kernels::cpu::rms_norm_prenorm_forward(y.data_as<float>(), s.data_as<float>(), nullptr,
                                         x.view.data_as<float>(), r.view.data_as<float>(),
                                         w.view.data_as<float>(), 1e-6f, rows, cols, 1);
  kernels::ref::norm(&ry, &rs, nullptr, nullptr, vx, &vr, vw, nullptr, 1e-6, rows, cols, true,
                     false);
  check(y, ry);
  check(s, rs);
  kernels::cpu::layer_norm_forward(y.data_as<float>(), mean.data(), rstd.data(),
                                   x.view.data_as<float>(), w.view.data_as<float>(),
                                   b.view.data_as<float>(), 1e-5f, rows, cols, 0);
  Vec rm, rrs;
  kernels::ref::norm(&ry, nullptr, &rm, &rrs, vx, nullptr, vw, &vb, 1e-5, rows, cols, false, false);
  check(y, ry);
  for (int64_t i = 0; i < rows; ++i) {
    EXPECT_NEAR(mean[static_cast<size_t>(i)], rm[static_cast<size_t>(i)], 1e-5);
    EXPECT_NEAR(rstd[static_cast<size_t>(i)], rrs[static_cast<size_t>(i)],
                1e-5 * rrs[static_cast<size_t>(i)]);
  }
  // bf16 overload: same as the op.
  Buffer xb = random_tensor(rng, DType::kBF16, {rows, cols}, false);
  Buffer wb = random_tensor(rng, DType::kBF16, {cols}, false);
  Tensor yb = Tensor::empty(DType::kBF16, {rows, cols}),
         yo = Tensor::empty(DType::kBF16, {rows, cols});
  kernels::cpu::rms_norm_forward(yb.data_as<bf16_t>(), nullptr, xb.view.data_as<bf16_t>(),
                                 wb.view.data_as<bf16_t>(), 1e-6f, rows, cols);
  Context ctx;
  auto op = create_operation(ops::RmsNormParam{});
  run_operation(*op, {{xb.view, wb.view}, {yo}}, ctx);
  EXPECT_EQ(to_f64(yb), to_f64(yo));
}
}  // namespace
}  // namespace tboost::testing
