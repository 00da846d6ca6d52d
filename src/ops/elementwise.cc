// Elementwise (add, mul with numpy broadcasting; scale; cast) and Embedding operations.
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

bool binary(ElementwiseType t) { return t == ElementwiseType::kAdd || t == ElementwiseType::kMul; }

// Descriptor of `in` broadcast to `out_shape` (right-aligned; size-1 or missing dims get
// stride 0). The caller has checked that the shapes are compatible.
TensorDesc broadcast_to(const TensorDesc& in, const Shape& out_shape) {
  TensorDesc d;
  d.dtype = in.dtype;
  d.ndim = static_cast<int>(out_shape.size());
  const int off = d.ndim - in.ndim;
  for (int i = 0; i < d.ndim; ++i) {
    const auto u = static_cast<size_t>(i);
    d.dims[u] = out_shape[u];
    const int j = i - off;
    d.strides[u] = (j < 0 || in.dim(j) == 1) ? 0 : in.stride(j);
  }
  return d;
}

class ElementwiseOp : public OpBase<ops::ElementwiseParam> {
 public:
  using OpBase::OpBase;
  const char* name() const override { return "Elementwise"; }
  std::string input_role(size_t i) const override { return i == 0 ? "a" : "b"; }
  std::string output_role(size_t) const override { return "y"; }

  void validate_param(const Checker& chk) const override {
    chk.param(std::isfinite(param_.alpha), "alpha must be finite");
  }

  std::vector<TensorDesc> do_infer_shape(const std::vector<TensorDesc>& in) const override {
    const Checker chk(name());
    const char* what = ops::elementwise_type_name(param_.type);
    if (binary(param_.type)) {
      chk.count(in, 2, std::string("a, b for ") + what);
      const TensorDesc& a = in[0];
      const TensorDesc& b = in[1];
      chk.rank(0, "a", a, 1, kMaxDims);
      chk.dtype_in(0, "a", a, {DType::kF32, DType::kBF16, DType::kF16});
      chk.dtype_eq(1, "b", b, a.dtype, "same as a");
      chk.last_dim_contiguous(0, "a", a);
      if (!(b.ndim > 0 && b.dim(-1) == 1)) chk.last_dim_contiguous(1, "b", b);
      if (b.ndim > a.ndim)
        chk.fail(ErrorCode::kShapeMismatch, "input 1 (b) " + b.shape_string() +
                                                " has more dims than input 0 (a) " +
                                                a.shape_string() + ": b broadcasts onto a");
      for (int i = 1; i <= b.ndim; ++i)
        if (b.dim(-i) != 1 && b.dim(-i) != a.dim(-i))
          chk.fail(ErrorCode::kShapeMismatch,
                   "input 1 (b) " + b.shape_string() + " does not broadcast to input 0 (a) " +
                       a.shape_string() + " (dim " + std::to_string(b.ndim - i) + ": " +
                       std::to_string(b.dim(-i)) + " vs " + std::to_string(a.dim(-i)) + ")");
      return {TensorDesc::contiguous(a.dtype, a.shape())};
    }
    chk.count(in, 1, std::string("x for ") + what);
    const TensorDesc& x = in[0];
    if (param_.type == ElementwiseType::kScale) {
      chk.dtype_in(0, "x", x, {DType::kF32, DType::kBF16, DType::kF16});
      chk.last_dim_contiguous(0, "x", x);
      return {TensorDesc::contiguous(x.dtype, x.shape())};
    }
    chk.last_dim_contiguous(0, "x", x);
    return {TensorDesc::contiguous(param_.out_dtype, x.shape())};
  }

  size_t do_setup(const VariantPack& pack, Context& ctx, const Checker& chk) override {
    chk.last_dim_contiguous(0, "y", pack.outputs[0].desc());
    const DType t = pack.inputs[0].dtype();
    if (binary(param_.type)) {
      binary_ = get_kernel<decltype(kernels::binary_forward)>("Elementwise.binary", ctx.device(), t,
                                                              &impl_);
    } else if (param_.type == ElementwiseType::kScale) {
      scale_ = get_kernel<decltype(kernels::scale_forward)>("Elementwise.scale", ctx.device(), t,
                                                            &impl_);
    } else {
      impl_ = "convert";
    }
    return 0;
  }

  void do_execute(const VariantPack& pack, void*, Context& ctx) override {
    const Tensor& y = pack.outputs[0];
    if (binary(param_.type)) {
      kernels::BinaryArgs a;
      const Tensor& ta = pack.inputs[0];
      const Tensor& tb = pack.inputs[1];
      const TensorDesc bd = broadcast_to(tb.desc(), y.shape());
      a.y = y.data(), a.y_rows = row_view(y.desc());
      a.a = ta.data(), a.a_rows = row_view(ta.desc());
      a.b = tb.data(), a.b_rows = row_view(bd);
      a.a_col_stride = ta.dim(-1) == 1 ? 0 : 1;
      a.b_col_stride = bd.ndim ? bd.stride(-1) : 0;
      if (a.b_col_stride != 0) a.b_col_stride = 1;
      a.dtype = ta.dtype();
      a.op =
          param_.type == ElementwiseType::kAdd ? kernels::BinaryOp::kAdd : kernels::BinaryOp::kMul;
      a.threads = ctx.num_threads(), a.ftz = ctx.flush_denormals();
      binary_(a);
    } else if (param_.type == ElementwiseType::kScale) {
      kernels::ScaleArgs a;
      a.x = pack.inputs[0].data(), a.x_rows = row_view(pack.inputs[0].desc());
      a.y = y.data(), a.y_rows = row_view(y.desc());
      a.dtype = y.dtype(), a.alpha = param_.alpha;
      a.threads = ctx.num_threads(), a.ftz = ctx.flush_denormals();
      scale_(a);
    } else {
      const Tensor& x = pack.inputs[0];
      const RowView xr = row_view(x.desc()), yr = row_view(y.desc());
      const size_t xs = dtype_size(x.dtype()), ys = dtype_size(y.dtype());
      const int64_t min_rows = std::max<int64_t>(1, 16384 / std::max<int64_t>(1, yr.cols));
      parallel_for(
          ctx.num_threads(), yr.count, min_rows, ctx.flush_denormals(),
          [&](int64_t r0, int64_t r1) {
            for (int64_t r = r0; r < r1; ++r)
              convert(static_cast<char*>(y.data()) + yr.offset(r) * static_cast<int64_t>(ys),
                      y.dtype(),
                      static_cast<const char*>(x.data()) + xr.offset(r) * static_cast<int64_t>(xs),
                      x.dtype(), yr.cols);
          });
    }
  }

 private:
  decltype(kernels::binary_forward)* binary_ = nullptr;
  decltype(kernels::scale_forward)* scale_ = nullptr;
};

class EmbeddingOp : public OpBase<ops::EmbeddingParam> {
 public:
  using OpBase::OpBase;
  const char* name() const override { return "Embedding"; }
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
  }
  return "?";
}
}  // namespace tboost::ops
