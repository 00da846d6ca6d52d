// Elementwise (binary with numpy broadcasting both ways, unary math, scale, cast) and Embedding
// operations. Inputs are validated here; the views are flattened (size-1 dims dropped,
// contiguous neighbours merged) before the row kernels run, so a broadcast over a small last
// dim still gets long vector loops.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "src/core/parallel.h"
#include "src/kernels/cpu/kernels.h"
#include "src/ops/op_base.h"
#include "src/ops/ops.h"
#include "src/ops/registry.h"

namespace tboost::ops_internal {
namespace {

using ops::ElementwiseType;

kernels::BinaryOp binary_op(ElementwiseType t) {
  switch (t) {
    case ElementwiseType::kSub:
      return kernels::BinaryOp::kSub;
    case ElementwiseType::kMul:
      return kernels::BinaryOp::kMul;
    case ElementwiseType::kDiv:
      return kernels::BinaryOp::kDiv;
    case ElementwiseType::kPow:
      return kernels::BinaryOp::kPow;
    case ElementwiseType::kMax:
      return kernels::BinaryOp::kMax;
    case ElementwiseType::kMin:
      return kernels::BinaryOp::kMin;
    default:
      return kernels::BinaryOp::kAdd;
  }
}

kernels::UnaryOp unary_op(ElementwiseType t) {
  switch (t) {
    case ElementwiseType::kNeg:
      return kernels::UnaryOp::kNeg;
    case ElementwiseType::kSqrt:
      return kernels::UnaryOp::kSqrt;
    case ElementwiseType::kRsqrt:
      return kernels::UnaryOp::kRsqrt;
    case ElementwiseType::kReciprocal:
      return kernels::UnaryOp::kReciprocal;
    case ElementwiseType::kExp:
      return kernels::UnaryOp::kExp;
    case ElementwiseType::kTanh:
      return kernels::UnaryOp::kTanh;
    case ElementwiseType::kErf:
      return kernels::UnaryOp::kErf;
    case ElementwiseType::kSigmoid:
      return kernels::UnaryOp::kSigmoid;
    case ElementwiseType::kAbs:
      return kernels::UnaryOp::kAbs;
    default:
      return kernels::UnaryOp::kScale;
  }
}

// pow with one exponent for every element: the exponents whose exact form is one cheap
// instruction (x·x, sqrt, copy, 1/x, 1/sqrt) become a unary op; false for any other.
bool pow_as_unary(float e, kernels::UnaryOp* op) {
  using kernels::UnaryOp;
  if (e == 2.0f)
    *op = UnaryOp::kSquare;
  else if (e == 0.5f)
    *op = UnaryOp::kSqrt;
  else if (e == 1.0f)
    *op = UnaryOp::kIdentity;
  else if (e == -1.0f)
    *op = UnaryOp::kReciprocal;
  else if (e == -0.5f)
    *op = UnaryOp::kRsqrt;
  else
    return false;
  return true;
}

class ElementwiseOp : public OpBase<ops::ElementwiseParam> {
 public:
  using OpBase::OpBase;
  const char* name() const override { return "Elementwise"; }
  std::string input_role(size_t i) const override {
    if (!ops::is_binary(param_.type)) return i == 0 ? "x" : "extra";
    return i == 0 ? "a" : i == 1 ? "b" : "extra";
  }
  std::string output_role(size_t) const override { return "y"; }

  void validate_param(const Checker& chk) const override {
    chk.param(std::isfinite(param_.alpha), "alpha must be finite");
  }

  std::vector<TensorDesc> do_infer_shape(const std::vector<TensorDesc>& in) const override {
    const Checker chk(name());
    const char* what = ops::elementwise_type_name(param_.type);
    if (ops::is_binary(param_.type)) {
      chk.count(in, 2, std::string("a, b for ") + what);
      const TensorDesc& a = in[0];
      const TensorDesc& b = in[1];
      chk.dtype_in(0, "a", a, {DType::kF32, DType::kBF16, DType::kF16});
      chk.dtype_eq(1, "b", b, a.dtype, "same as a");
      Shape ys;
      int bad = 0;
      if (!broadcast_shapes(a.shape(), b.shape(), &ys, &bad))
        chk.fail(ErrorCode::kShapeMismatch,
                 "input 0 (a) " + a.shape_string() + " and input 1 (b) " + b.shape_string() +
                     " do not broadcast: dim " + std::to_string(a.ndim - bad) + " of a is " +
                     std::to_string(a.dim(-bad)) + ", dim " + std::to_string(b.ndim - bad) +
                     " of b is " + std::to_string(b.dim(-bad)) +
                     " (aligned from the right, sizes must be equal or 1)");
      // A last dim that is broadcast along y's rows (size 1, or missing) may have any stride.
      const bool row_dim = !ys.empty() && ys.back() > 1;
      if (row_dim && a.ndim > 0 && a.dim(-1) > 1) chk.last_dim_contiguous(0, "a", a);
      if (row_dim && b.ndim > 0 && b.dim(-1) > 1) chk.last_dim_contiguous(1, "b", b);
      return {TensorDesc::contiguous(a.dtype, ys)};
    }
    chk.count(in, 1, std::string("x for ") + what);
    const TensorDesc& x = in[0];
    chk.last_dim_contiguous(0, "x", x);
    if (param_.type == ElementwiseType::kCast)
      return {TensorDesc::contiguous(param_.out_dtype, x.shape())};
    chk.dtype_in(0, "x", x, {DType::kF32, DType::kBF16, DType::kF16});
    return {TensorDesc::contiguous(x.dtype, x.shape())};
  }

  size_t do_setup(const VariantPack& pack, Context& ctx, const Checker& chk) override {
    chk.last_dim_contiguous(0, "y", pack.outputs[0].desc());
    const DType t = pack.inputs[0].dtype();
    if (param_.type == ElementwiseType::kCast) {
      impl_ = "convert";
      return 0;
    }
    if (ops::is_binary(param_.type))
      binary_ = get_kernel<decltype(kernels::binary_forward)>("Elementwise.binary", ctx.device(), t,
                                                              &impl_);
    if (!ops::is_binary(param_.type) || param_.type == ElementwiseType::kPow)
      unary_ = get_kernel<decltype(kernels::unary_forward)>("Elementwise.unary", ctx.device(), t,
                                                            &impl_);
    if (param_.type == ElementwiseType::kPow)
      impl_ += "; pow: scalar exponent 2, 0.5, 1, -1, -0.5 exact, others std::pow";
    return 0;
  }

  void do_execute(const VariantPack& pack, void*, Context& ctx) override {
    const Tensor& y = pack.outputs[0];
    if (y.numel() == 0) return;
    if (param_.type == ElementwiseType::kCast) return cast(pack, ctx);
    if (!ops::is_binary(param_.type)) {
      const kernels::UnaryOp op = unary_op(param_.type);
      return unary(y, pack.inputs[0].desc(), pack.inputs[0].data(), op, ctx);
    }
    const Tensor& ta = pack.inputs[0];
    const Tensor& tb = pack.inputs[1];
    kernels::UnaryOp pow_op{};
    // The exponent is data: read at every execute, not at setup.
    if (param_.type == ElementwiseType::kPow && tb.numel() == 1 &&
        pow_as_unary(static_cast<float>(load_as_f64(tb.data(), tb.dtype(), 0)), &pow_op))
      return unary(y, broadcast_to(ta.desc(), y.shape()), ta.data(), pow_op, ctx);
    TensorDesc yd = y.desc(), ad = broadcast_to(ta.desc(), y.shape()),
               bd = broadcast_to(tb.desc(), y.shape());
    coalesce_views({&yd, &ad, &bd});
    kernels::BinaryArgs a;
    a.y = y.data(), a.y_rows = row_view(yd);
    a.a = ta.data(), a.a_rows = row_view(ad);
    a.b = tb.data(), a.b_rows = row_view(bd);
    a.a_col_stride = ad.ndim && ad.stride(-1) == 0 ? 0 : 1;
    a.b_col_stride = bd.ndim && bd.stride(-1) == 0 ? 0 : 1;
    a.dtype = ta.dtype();
    a.op = binary_op(param_.type);
    a.threads = ctx.num_threads(), a.ftz = ctx.flush_denormals();
    binary_(a);
  }

 private:
  void unary(const Tensor& y, TensorDesc xd, const void* x, kernels::UnaryOp op, Context& ctx) {
    TensorDesc yd = y.desc();
    coalesce_views({&yd, &xd});
    kernels::UnaryArgs a;
    a.x = x, a.x_rows = row_view(xd);
    a.y = y.data(), a.y_rows = row_view(yd);
    a.dtype = y.dtype(), a.op = op, a.alpha = param_.alpha;
    a.threads = ctx.num_threads(), a.ftz = ctx.flush_denormals();
    unary_(a);
  }

  void cast(const VariantPack& pack, Context& ctx) {
    const Tensor& x = pack.inputs[0];
    const Tensor& y = pack.outputs[0];
    const RowView xr = row_view(x.desc()), yr = row_view(y.desc());
    const size_t xs = dtype_size(x.dtype()), ys = dtype_size(y.dtype());
    const int64_t min_rows = std::max<int64_t>(1, 16384 / std::max<int64_t>(1, yr.cols));
    parallel_for(
        ctx.num_threads(), yr.count, min_rows, ctx.flush_denormals(), [&](int64_t r0, int64_t r1) {
          for (int64_t r = r0; r < r1; ++r)
            convert(static_cast<char*>(y.data()) + yr.offset(r) * static_cast<int64_t>(ys),
                    y.dtype(),
                    static_cast<const char*>(x.data()) + xr.offset(r) * static_cast<int64_t>(xs),
                    x.dtype(), yr.cols);
        });
  }

  decltype(kernels::binary_forward)* binary_ = nullptr;
  decltype(kernels::unary_forward)* unary_ = nullptr;
};

class EmbeddingOp : public OpBase<ops::EmbeddingParam> {
 public:
  using OpBase::OpBase;
  const char* name() const override { return "Embedding"; }
  bool checks_input_values() const override { return true; }  // ids
  std::string input_role(size_t i) const override { return i == 0 ? "table" : "ids"; }
  std::string output_role(size_t) const override { return "y"; }

  std::vector<TensorDesc> do_infer_shape(const std::vector<TensorDesc>& in) const override {
    const Checker chk(name());
    chk.count(in, 2, "table, ids");
    const TensorDesc& table = in[0];
    const TensorDesc& ids = in[1];
    chk.rank(0, "table", table, 2, 2);
    chk.dtype_in(0, "table", table, {DType::kF32, DType::kBF16, DType::kF16});
    chk.last_dim_contiguous(0, "table", table);
    chk.rank(1, "ids", ids, 0, kMaxDims - 1);
    chk.dtype_in(1, "ids", ids, {DType::kI32, DType::kI64});
    if (!ids.is_contiguous())
      chk.fail(ErrorCode::kShapeMismatch,
               "input 1 (ids) must be contiguous, got " + ids.to_string());
    Shape s = ids.shape();
    s.push_back(table.dim(1));
    return {TensorDesc::contiguous(table.dtype, s)};
  }

  size_t do_setup(const VariantPack& pack, Context&, const Checker& chk) override {
    chk.last_dim_contiguous(0, "y", pack.outputs[0].desc());
    impl_ = "memcpy rows";
    return 0;
  }

  void do_execute(const VariantPack& pack, void*, Context& ctx) override {
    const Tensor& table = pack.inputs[0];
    const Tensor& ids = pack.inputs[1];
    const Tensor& y = pack.outputs[0];
    const int64_t n = ids.numel(), V = table.dim(0), C = table.dim(1);
    auto id_at = [&](int64_t i) {
      return ids.dtype() == DType::kI32 ? static_cast<int64_t>(ids.data_as<int32_t>()[i])
                                        : ids.data_as<int64_t>()[i];
    };
    // Every id is checked before any row is written: no partial output on bad input.
    for (int64_t i = 0; i < n; ++i) {
      const int64_t id = id_at(i);
      if (id < 0 || id >= V)
        Checker(name()).fail(ErrorCode::kInvalidArgument,
                             "input 1 (ids) element " + std::to_string(i) + " is " +
                                 std::to_string(id) + ", outside the table's [0, " +
                                 std::to_string(V) + ")");
    }
    const size_t es = dtype_size(table.dtype());
    const RowView yr = row_view(y.desc());
    const int64_t ts = table.stride(0);
    parallel_for(
        ctx.num_threads(), n, std::max<int64_t>(1, 4096 / std::max<int64_t>(1, C)), false,
        [&](int64_t r0, int64_t r1) {
          for (int64_t r = r0; r < r1; ++r)
            std::memcpy(
                static_cast<char*>(y.data()) + yr.offset(r) * static_cast<int64_t>(es),
                static_cast<const char*>(table.data()) + id_at(r) * ts * static_cast<int64_t>(es),
                static_cast<size_t>(C) * es);
        });
  }
};

}  // namespace

std::unique_ptr<Operation> make_elementwise(const ops::ElementwiseParam& p) {
  return std::make_unique<ElementwiseOp>(p);
}
std::unique_ptr<Operation> make_embedding(const ops::EmbeddingParam& p) {
  return std::make_unique<EmbeddingOp>(p);
}

}  // namespace tboost::ops_internal

namespace tboost::ops {
const char* elementwise_type_name(ElementwiseType t) {
  switch (t) {
    case ElementwiseType::kAdd:
      return "add";
    case ElementwiseType::kMul:
      return "mul";
    case ElementwiseType::kScale:
      return "scale";
    case ElementwiseType::kCast:
      return "cast";
    case ElementwiseType::kSub:
      return "sub";
    case ElementwiseType::kDiv:
      return "div";
    case ElementwiseType::kPow:
      return "pow";
    case ElementwiseType::kMax:
      return "max";
    case ElementwiseType::kMin:
      return "min";
    case ElementwiseType::kNeg:
      return "neg";
    case ElementwiseType::kSqrt:
      return "sqrt";
    case ElementwiseType::kRsqrt:
      return "rsqrt";
    case ElementwiseType::kReciprocal:
      return "reciprocal";
    case ElementwiseType::kExp:
      return "exp";
    case ElementwiseType::kTanh:
      return "tanh";
    case ElementwiseType::kErf:
      return "erf";
    case ElementwiseType::kSigmoid:
      return "sigmoid";
    case ElementwiseType::kAbs:
      return "abs";
  }
  return "?";
}
}  // namespace tboost::ops
