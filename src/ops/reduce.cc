// Reduce: sum, mean, max or min of x over a set of axes (include/tboost/ops/reduce.h).
//
// The op resolves the axes (negative from the end, empty = all; repeated or out of range is an
// error), splits x's dims into kept and reduced ones with their strides and y's strides for the
// kept ones, and hands both lists to kernels::reduce_forward, which flattens them and picks a
// row, column or strided loop. Any x and y strides.
#include <string>
#include <vector>

#include "src/kernels/cpu/kernels.h"
#include "src/ops/op_base.h"
#include "src/ops/ops.h"
#include "src/ops/registry.h"

namespace tboost::ops_internal {
namespace {

using ops::ReduceType;

class ReduceOp : public OpBase<ops::ReduceParam> {
 public:
  using OpBase::OpBase;
  const char* name() const override { return "Reduce"; }
  std::string input_role(size_t i) const override { return i == 0 ? "x" : "extra"; }
  std::string output_role(size_t) const override { return "y"; }

  std::vector<TensorDesc> do_infer_shape(const std::vector<TensorDesc>& in) const override {
    const Checker chk(name());
    chk.count(in, 1, "x");
    const TensorDesc& x = in[0];
    chk.dtype_in(0, "x", x, {DType::kF32, DType::kBF16, DType::kF16});
    const std::vector<bool> red = reduced(chk, x.ndim);
    Shape ys;
    for (int d = 0; d < x.ndim; ++d) {
      const auto u = static_cast<size_t>(d);
      if (red[u] && x.dim(d) == 0 &&
          (param_.type == ReduceType::kMax || param_.type == ReduceType::kMin))
        chk.fail(ErrorCode::kShapeMismatch, std::string("input 0 (x) ") + x.shape_string() +
                                                " has an empty axis " + std::to_string(d) + ": " +
                                                ops::reduce_type_name(param_.type) +
                                                " of no elements is undefined");
      if (!red[u])
        ys.push_back(x.dim(d));
      else if (param_.keepdims)
        ys.push_back(1);
    }
    return {TensorDesc::contiguous(x.dtype, ys)};
  }

  size_t do_setup(const VariantPack& pack, Context& ctx, const Checker&) override {
    kernel_ = get_kernel<decltype(kernels::reduce_forward)>("Reduce", ctx.device(),
                                                            pack.inputs[0].dtype(), &impl_);
    return 0;
  }

  void do_execute(const VariantPack& pack, void*, Context& ctx) override {
    const Tensor& x = pack.inputs[0];
    const Tensor& y = pack.outputs[0];
    const std::vector<bool> red = reduced(Checker(name()), x.ndim());
    kernels::ReduceArgs a;
    a.x = x.data(), a.y = y.data(), a.dtype = x.dtype();
    int yd = 0;  // y's dim for x's dim d
    for (int d = 0; d < x.ndim(); ++d) {
      if (red[static_cast<size_t>(d)]) {
        a.red_dims[a.red] = x.dim(d), a.x_red_strides[a.red] = x.stride(d);
        ++a.red;
        if (param_.keepdims) ++yd;
      } else {
        a.kept_dims[a.kept] = x.dim(d), a.x_kept_strides[a.kept] = x.stride(d);
        a.y_kept_strides[a.kept] = y.stride(yd++);
        ++a.kept;
      }
    }
    switch (param_.type) {
      case ReduceType::kSum:
        a.op = kernels::ReduceOp::kSum;
        break;
      case ReduceType::kMean:
        a.op = kernels::ReduceOp::kMean;
        break;
      case ReduceType::kMax:
        a.op = kernels::ReduceOp::kMax;
        break;
      case ReduceType::kMin:
        a.op = kernels::ReduceOp::kMin;
        break;
    }
    a.threads = ctx.num_threads(), a.ftz = ctx.flush_denormals();
    kernel_(a);
  }

 private:
  // Which of x's dims are reduced; throws on an axis out of range or given twice.
  std::vector<bool> reduced(const Checker& chk, int rank) const {
    std::vector<bool> red(static_cast<size_t>(rank), param_.axes.empty());
    std::vector<bool> given(static_cast<size_t>(rank), false);
    for (int64_t ax : param_.axes) {
      const auto d = static_cast<size_t>(chk.axis(ax, rank, "input 0 (x)"));
      if (given[d])
        chk.fail(ErrorCode::kInvalidArgument,
                 "invalid param: axis " + std::to_string(d) + " is given twice");
      given[d] = red[d] = true;
    }
    return red;
  }

  decltype(kernels::reduce_forward)* kernel_ = nullptr;
};

}  // namespace

std::unique_ptr<Operation> make_reduce(const ops::ReduceParam& p) {
  return std::make_unique<ReduceOp>(p);
}

}  // namespace tboost::ops_internal

namespace tboost::ops {
const char* reduce_type_name(ReduceType t) {
  switch (t) {
    case ReduceType::kSum:
      return "sum";
    case ReduceType::kMean:
      return "mean";
    case ReduceType::kMax:
      return "max";
    case ReduceType::kMin:
      return "min";
  }
  return "?";
}
}  // namespace tboost::ops
