// RmsNorm and LayerNorm operations: validation, output shapes and dispatch to the CPU kernel.
#include <cmath>
#include <string>

#include "src/kernels/cpu/kernels.h"
#include "src/ops/op_base.h"
#include "src/ops/ops.h"
#include "src/ops/registry.h"

namespace tboost::ops_internal {
namespace {

const char* layer_text(ops::NormLayer l) { return ops::norm_layer_name(l); }

template <class P>
class NormOp : public OpBase<P> {
 public:
  static constexpr bool kRms = std::is_same_v<P, ops::RmsNormParam>;
  using OpBase<P>::OpBase;
  using OpBase<P>::param_;
  using OpBase<P>::impl_;

  const char* name() const override { return kRms ? "RmsNorm" : "LayerNorm"; }

  bool has_residual() const { return param_.layer != ops::NormLayer::kNorm; }
  bool has_bias() const {
    if constexpr (kRms) {
      return false;
    } else {
      return param_.has_bias;
    }
  }
  std::string input_role(size_t i) const override {
    std::vector<std::string> roles = {"x"};
    if (has_residual()) roles.push_back("residual");
    roles.push_back("weight");
    if (has_bias()) roles.push_back("bias");
    return i < roles.size() ? roles[i] : "extra";
  }
  std::string output_role(size_t i) const override {
    std::vector<std::string> roles = {"y"};
    if (param_.layer == ops::NormLayer::kPreNorm) roles.push_back("sum");
    if (param_.output_stats) {
      if (!kRms) roles.push_back("mean");
      roles.push_back("rstd");
    }
    return i < roles.size() ? roles[i] : "extra";
  }

  void validate_param(const Checker& chk) const override {
    chk.param(param_.epsilon > 0.0f && std::isfinite(param_.epsilon),
              "epsilon must be finite and > 0, got " + std::to_string(param_.epsilon));
  }

  std::vector<TensorDesc> do_infer_shape(const std::vector<TensorDesc>& in) const override {
    const Checker chk(name());
    validate_param(chk);
    const size_t n = 2 + (has_residual() ? 1 : 0) + (has_bias() ? 1 : 0);
    std::string names = "x";
    if (has_residual()) names += ", residual";
    names += ", weight";
    if (has_bias()) names += ", bias";
    chk.count(in, n, names + " for layer " + layer_text(param_.layer));
    const TensorDesc& x = in[0];
    chk.rank(0, "x", x, 1, kMaxDims);
    chk.dtype_in(0, "x", x, {DType::kF32, DType::kBF16, DType::kF16});
    chk.last_dim_contiguous(0, "x", x);
    const int64_t C = x.dim(-1);
    if (C == 0) chk.fail(ErrorCode::kShapeMismatch, "input 0 (x) has an empty last dim");
    int k = 1;
    if (has_residual()) {
      chk.dtype_eq(1, "residual", in[1], x.dtype, "same as x");
      if (!in[1].same_shape(x))
        chk.fail(ErrorCode::kShapeMismatch, "input 1 (residual) expected shape " +
                                                x.shape_string() + " (same as x), got " +
                                                in[1].shape_string());
      chk.last_dim_contiguous(1, "residual", in[1]);
      k = 2;
    }
    for (int j = k; j < static_cast<int>(n); ++j) {
      const char* role = j == k ? "weight" : "bias";
      chk.shape_eq(j, role, in[static_cast<size_t>(j)], {C});
      chk.dtype_in(j, role, in[static_cast<size_t>(j)], {DType::kF32, x.dtype});
      chk.last_dim_contiguous(j, role, in[static_cast<size_t>(j)]);
    }
    if (has_bias() && in[static_cast<size_t>(k)].dtype != in[static_cast<size_t>(k) + 1].dtype)
      chk.fail(ErrorCode::kDTypeMismatch,
               "weight and bias must share a dtype, got " +
                   std::string(dtype_name(in[static_cast<size_t>(k)].dtype)) + " and " +
                   dtype_name(in[static_cast<size_t>(k) + 1].dtype));
    std::vector<TensorDesc> out = {TensorDesc::contiguous(x.dtype, x.shape())};
    if (param_.layer == ops::NormLayer::kPreNorm)
      out.push_back(TensorDesc::contiguous(x.dtype, x.shape()));
    if (param_.output_stats) {
      Shape rows = x.shape();
      rows.pop_back();
      if (!kRms) out.push_back(TensorDesc::contiguous(DType::kF32, rows));
      out.push_back(TensorDesc::contiguous(DType::kF32, rows));
    }
    return out;
  }

  size_t do_setup(const VariantPack& pack, Context& ctx, const Checker& chk) override {
    for (size_t i = 0; i < pack.outputs.size(); ++i) {
      const TensorDesc& o = pack.outputs[i].desc();
      if (o.ndim > 0 && o.dim(-1) > 1 && o.stride(-1) != 1)
        chk.fail(ErrorCode::kShapeMismatch, "output " + std::to_string(i) + " (" + output_role(i) +
                                                ") needs a contiguous last dim, got " +
                                                o.to_string());
    }
    const size_t n = pack.outputs.size();
    if (!kRms && param_.output_stats &&
        !same_descs({pack.outputs[n - 2]}, {pack.outputs[n - 1].desc()}))
      chk.fail(ErrorCode::kShapeMismatch, "outputs mean and rstd need the same strides");
    kernel_ = get_kernel<decltype(kernels::norm_forward)>(name(), ctx.device(),
                                                          pack.inputs[0].dtype(), &impl_);
    return 0;
  }

  void do_execute(const VariantPack& pack, void*, Context& ctx) override {
    kernels::NormArgs a;
    const Tensor& x = pack.inputs[0];
    a.x = x.data();
    a.x_rows = row_view(x.desc());
    size_t k = 1;
    if (has_residual()) {
      a.residual = pack.inputs[1].data();
      a.res_rows = row_view(pack.inputs[1].desc());
      k = 2;
    }
    a.weight = pack.inputs[k].data();
    a.wdtype = pack.inputs[k].dtype();
    if (has_bias()) a.bias = pack.inputs[k + 1].data();
    a.y = pack.outputs[0].data();
    a.y_rows = row_view(pack.outputs[0].desc());
    size_t o = 1;
    if (param_.layer == ops::NormLayer::kPreNorm) {
      a.sum = pack.outputs[1].data();
      a.sum_rows = row_view(pack.outputs[1].desc());
      o = 2;
    }
    if (param_.output_stats) {
      if (!kRms) a.mean = pack.outputs[o++].data_as<float>();
      a.rstd = pack.outputs[o].data_as<float>();
      a.stats_rows = element_view(pack.outputs[o].desc());  // mean and rstd share a shape
    }
    a.dtype = x.dtype();
    a.eps = param_.epsilon;
    a.rms = kRms;
    a.plus_one = param_.weight_plus_one;
    a.threads = ctx.num_threads();
    a.ftz = ctx.flush_denormals();
    kernel_(a);
  }

 private:
  decltype(kernels::norm_forward)* kernel_ = nullptr;
};

}  // namespace

std::unique_ptr<Operation> make_rms_norm(const ops::RmsNormParam& p) {
  return std::make_unique<NormOp<ops::RmsNormParam>>(p);
}
std::unique_ptr<Operation> make_layer_norm(const ops::LayerNormParam& p) {
  return std::make_unique<NormOp<ops::LayerNormParam>>(p);
}

}  // namespace tboost::ops_internal

namespace tboost::ops {
const char* norm_layer_name(NormLayer l) {
  switch (l) {
    case NormLayer::kNorm:
      return "NORM";
    case NormLayer::kPreNorm:
      return "PRENORM";
    case NormLayer::kPostNorm:
      return "POSTNORM";
  }
  return "?";
}
}  // namespace tboost::ops
