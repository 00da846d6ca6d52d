// Transpose and Concat: the layout ops that copy (include/tboost/ops/layout.h).
//
// Both are one kernels::strided_copy per input: Transpose copies x viewed with permuted dims
// into y; Concat copies input k into y's slice [offset_k, offset_k + size_k) along the axis.
// Any dtype, any input and output strides. Inputs are read while y is written, so they must not
// share memory with it (an identical view would be a no-op copy, which memcpy does not allow).
#include <string>
#include <vector>

#include "src/kernels/cpu/kernels.h"
#include "src/ops/op_base.h"
#include "src/ops/ops.h"
#include "src/ops/registry.h"

namespace tboost::ops_internal {
namespace {

class TransposeOp : public OpBase<ops::TransposeParam> {
 public:
  using OpBase::OpBase;
  const char* name() const override { return "Transpose"; }
  std::string input_role(size_t i) const override { return i == 0 ? "x" : "extra"; }
  std::string output_role(size_t) const override { return "y"; }
  Overlap input_overlap(size_t) const override { return Overlap::kNone; }

  std::vector<TensorDesc> do_infer_shape(const std::vector<TensorDesc>& in) const override {
    const Checker chk(name());
    chk.count(in, 1, "x");
    const TensorDesc& x = in[0];
    const std::vector<int> perm = normalized(chk, x.ndim);
    Shape ys;
    for (int p : perm) ys.push_back(x.dim(p));
    return {TensorDesc::contiguous(x.dtype, ys)};
  }

  size_t do_setup(const VariantPack& pack, Context& ctx, const Checker&) override {
    copy_ = get_kernel<decltype(kernels::strided_copy)>("Transpose", ctx.device(),
                                                        pack.inputs[0].dtype(), &impl_);
    return 0;
  }

  void do_execute(const VariantPack& pack, void*, Context& ctx) override {
    const Tensor& x = pack.inputs[0];
    const Tensor& y = pack.outputs[0];
    const std::vector<int> perm = normalized(Checker(name()), x.ndim());
    TensorDesc xv = y.desc();  // x seen in y's dim order
    xv.dtype = x.dtype();
    for (size_t i = 0; i < perm.size(); ++i) xv.strides[i] = x.stride(perm[i]);
    copy_(copy_args(y.data(), y.desc(), x.data(), xv, ctx.num_threads()));
  }

 private:
  // perm with negative entries resolved; throws unless it is a permutation of 0..rank-1.
  std::vector<int> normalized(const Checker& chk, int rank) const {
    std::vector<int64_t> p = param_.perm;
    if (p.empty())  // the identity: a contiguous copy of any view
      for (int i = 0; i < rank; ++i) p.push_back(i);
    auto text = [&] {
      std::string s;
      for (int64_t v : p) s += (s.empty() ? "" : ",") + std::to_string(v);
      return "perm [" + s + "]";
    };
    if (p.size() != static_cast<size_t>(rank))
      chk.fail(ErrorCode::kInvalidArgument,
               "invalid param: " + text() + " has " + std::to_string(p.size()) +
                   " entries, input 0 (x) has rank " + std::to_string(rank));
    std::vector<int> out;
    std::vector<bool> seen(p.size(), false);
    for (size_t i = 0; i < p.size(); ++i) {
      const int d =
          chk.axis(p[i], rank, text() + " entry " + std::to_string(i) + " on input 0 (x)");
      if (seen[static_cast<size_t>(d)])
        chk.fail(ErrorCode::kInvalidArgument, "invalid param: " + text() +
                                                  " is not a permutation: dim " +
                                                  std::to_string(d) + " appears twice");
      seen[static_cast<size_t>(d)] = true;
      out.push_back(d);
    }
    return out;
  }

  decltype(kernels::strided_copy)* copy_ = nullptr;
};

class ConcatOp : public OpBase<ops::ConcatParam> {
 public:
  using OpBase::OpBase;
  const char* name() const override { return "Concat"; }
  std::string input_role(size_t i) const override { return "x" + std::to_string(i); }
  std::string output_role(size_t) const override { return "y"; }
  Overlap input_overlap(size_t) const override { return Overlap::kNone; }

  std::vector<TensorDesc> do_infer_shape(const std::vector<TensorDesc>& in) const override {
    const Checker chk(name());
    if (in.empty()) chk.fail(ErrorCode::kInvalidArgument, "expected at least 1 input, got 0");
    const TensorDesc& x0 = in[0];
    if (x0.ndim == 0)
      chk.fail(ErrorCode::kShapeMismatch, "input 0 (x0) is a scalar (rank 0): nothing to join");
    const int axis = chk.axis(param_.axis, x0.ndim, "input 0 (x0)");
    const std::string why =
        "as input 0; only the concat axis " + std::to_string(axis) + " may differ";
    Shape ys = x0.shape();
    for (size_t i = 1; i < in.size(); ++i) {
      const int k = static_cast<int>(i);
      const std::string role = input_role(i);
      chk.dtype_eq(k, role.c_str(), in[i], x0.dtype, "same as input 0");
      chk.rank(k, role.c_str(), in[i], x0.ndim, x0.ndim);
      for (int d = 0; d < x0.ndim; ++d)
        if (d != axis) chk.dim_eq(k, role.c_str(), in[i], d, x0.dim(d), why.c_str());
      ys[static_cast<size_t>(axis)] += in[i].dim(axis);
    }
    return {TensorDesc::contiguous(x0.dtype, ys)};
  }

  size_t do_setup(const VariantPack& pack, Context& ctx, const Checker&) override {
    copy_ = get_kernel<decltype(kernels::strided_copy)>("Concat", ctx.device(),
                                                        pack.inputs[0].dtype(), &impl_);
    return 0;
  }

  void do_execute(const VariantPack& pack, void*, Context& ctx) override {
    const Tensor& y = pack.outputs[0];
    if (y.numel() == 0) return;
    const auto axis = static_cast<size_t>(Checker(name()).axis(param_.axis, y.ndim(), "y"));
    const int64_t step = y.desc().strides[axis] * static_cast<int64_t>(dtype_size(y.dtype()));
    char* yp = static_cast<char*>(y.data());
    for (const Tensor& x : pack.inputs) {
      TensorDesc slice = y.desc();
      slice.dims[axis] = x.desc().dims[axis];
      copy_(copy_args(yp, slice, x.data(), x.desc(), ctx.num_threads()));
      yp += slice.dims[axis] * step;
    }
  }

 private:
  decltype(kernels::strided_copy)* copy_ = nullptr;
};

}  // namespace

std::unique_ptr<Operation> make_transpose(const ops::TransposeParam& p) {
  return std::make_unique<TransposeOp>(p);
}
std::unique_ptr<Operation> make_concat(const ops::ConcatParam& p) {
  return std::make_unique<ConcatOp>(p);
}

}  // namespace tboost::ops_internal
