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
  Tensor s = Tensor::empty(DType::kF32, {});
  EXPECT_NE(error_of(*add, {{s, s}, {Tensor::empty(DType::kF32, {})}}, ctx)
                .find("input 0 (a) expected rank 1..8"),
            std::string::npos);
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
