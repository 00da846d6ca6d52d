// Rope operation: validation, output shape and dispatch to the CPU kernel.
//
// Inputs x (kBSND: (B,S,H,D) or (T,H,D); kBNSD: (B,H,S,D)) and positions (i32/i64, one per
// token, any shape); output y with x's shape and dtype, which may be x itself (in place).
// Everything shape- and param-related is checked in setup; negative positions and the
// aliasing of y (which may be x itself, but may not partly overlap it) depend on data
// pointers and values, so they are checked at execute, before the kernel writes anything.
#include <cmath>
#include <string>
#include <vector>

#include "src/kernels/cpu/kernels.h"
#include "src/ops/op_base.h"
#include "src/ops/ops.h"
#include "src/ops/registry.h"

namespace tboost::ops_internal {
namespace {

class RopeOp : public OpBase<ops::RopeParam> {
 public:
  using OpBase::OpBase;
  const char* name() const override { return "Rope"; }
  std::string input_role(size_t i) const override {
    return i == 0 ? "x" : i == 1 ? "positions" : "extra";
  }
  std::string output_role(size_t) const override { return "y"; }

  bool bnsd() const { return param_.layout == ops::QkvLayout::kBNSD; }
  int64_t rotary_dim(const TensorDesc& x) const {
    return param_.rotary_dim == 0 ? x.dim(-1) : param_.rotary_dim;
  }

  void validate_param(const Checker& chk) const override {
    chk.param(param_.rotation == ops::RopeRotation::kRotateHalf ||
                  param_.rotation == ops::RopeRotation::kInterleaved,
              "unknown rotation " + std::to_string(static_cast<int>(param_.rotation)));
    chk.param(param_.layout == ops::QkvLayout::kBSND || param_.layout == ops::QkvLayout::kBNSD,
              "unknown layout " + std::to_string(static_cast<int>(param_.layout)));
    chk.param(param_.rotary_dim >= 0, "rotary_dim must be >= 0 (0 means all of head_dim), got " +
                                          std::to_string(param_.rotary_dim));
    chk.param(param_.rotary_dim % 2 == 0,
              "rotary_dim must be even (features rotate in pairs), got " +
                  std::to_string(param_.rotary_dim));
    chk.param(std::isfinite(param_.theta) && param_.theta > 0.0f,
              "theta must be finite and > 0, got " + std::to_string(param_.theta));
    chk.param(
        std::isfinite(param_.scaling_factor) && param_.scaling_factor > 0.0f,
        "scaling_factor must be finite and > 0, got " + std::to_string(param_.scaling_factor));
    if (param_.scaling == ops::RopeScaling::kLlama3)
      chk.param(param_.low_freq_factor > 0.0f && param_.high_freq_factor > param_.low_freq_factor &&
                    param_.original_max_position > 0.0f,
                "llama3 rope scaling needs 0 < low_freq_factor < high_freq_factor and "
                "original_max_position > 0");
  }

  // Tokens of x: kBSND all dims before H; kBNSD B·S.
  static int64_t tokens_of(const TensorDesc& x, bool bnsd) {
    if (bnsd) return x.dim(0) * x.dim(2);
    int64_t t = 1;
    for (int i = 0; i < x.ndim - 2; ++i) t *= x.dim(i);
    return t;
  }

  std::vector<TensorDesc> do_infer_shape(const std::vector<TensorDesc>& in) const override {
    const Checker chk(name());
    validate_param(chk);
    chk.count(in, 2, "x, positions");
    const TensorDesc& x = in[0];
    if (bnsd()) {
      chk.rank(0, "x", x, 4, 4);
    } else {
      chk.rank(0, "x", x, 3, 4);
    }
    chk.dtype_in(0, "x", x, {DType::kF32, DType::kBF16, DType::kF16});
    chk.last_dim_contiguous(0, "x", x);
    const int64_t D = x.dim(-1);
    if (param_.rotary_dim == 0 && D % 2 != 0)
      chk.fail(ErrorCode::kShapeMismatch,
               "rotary_dim 0 rotates all of head_dim, which must then be even; input 0 (x) " +
                   x.shape_string() + " has head_dim " + std::to_string(D));
    if (param_.rotary_dim > D)
      chk.fail(ErrorCode::kShapeMismatch, "rotary_dim " + std::to_string(param_.rotary_dim) +
                                              " exceeds head_dim " + std::to_string(D) +
                                              " of input 0 (x) " + x.shape_string());
    const TensorDesc& pos = in[1];
    chk.dtype_in(1, "positions", pos, {DType::kI32, DType::kI64});
    chk.rank(1, "positions", pos, 0, kMaxDims - 1);
    const int64_t T = tokens_of(x, bnsd());
    if (pos.numel() != T)
      chk.fail(ErrorCode::kShapeMismatch, "input 1 (positions) expected " + std::to_string(T) +
                                              " elements (one per token), got " +
                                              std::to_string(pos.numel()) + " (positions " +
                                              pos.shape_string() + ", x " + x.shape_string() + ")");
    return {TensorDesc::contiguous(x.dtype, x.shape())};
  }

  size_t do_setup(const VariantPack& pack, Context& ctx, const Checker& chk) override {
    chk.last_dim_contiguous(0, "y", pack.outputs[0].desc());
    kernel_ = get_kernel<decltype(kernels::rope_forward)>(name(), ctx.device(),
                                                          pack.inputs[0].dtype(), &impl_);
    // The frequencies once per setup: r/2 calls of pow cost about as much as rotating a few
    // thousand elements, which is a whole decode step's worth of q or k.
    inv_freq_ = ops::rope_inv_freq(param_, rotary_dim(pack.inputs[0].desc()));
    return 0;
  }

  void do_execute(const VariantPack& pack, void*, Context& ctx) override {
    const Tensor& x = pack.inputs[0];
    const Tensor& pos = pack.inputs[1];
    const Tensor& y = pack.outputs[0];
    kernels::RopeArgs a;
    a.pos_rows = element_view(pos.desc());
    a.positions = pos.data();
    a.pos_dtype = pos.dtype();
    // Data-dependent check before any output byte is written: a negative position has no
    // meaning for a cache index and usually means an uninitialised or mis-offset tensor.
    const int64_t T = pos.numel();
    for (int64_t t = 0; t < T; ++t) {
      const int64_t off = a.pos_rows.offset(t);
      const int64_t p = a.pos_dtype == DType::kI64 ? pos.data_as<const int64_t>()[off]
                                                   : pos.data_as<const int32_t>()[off];
      if (p < 0)
        Checker(name()).fail(ErrorCode::kInvalidArgument,
                             "input 1 (positions) has negative position " + std::to_string(p) +
                                 " at token " + std::to_string(t) + " (positions must be >= 0)");
    }
    a.x = x.data();
    a.x_rows = row_view(x.desc());
    a.y = y.data();
    a.y_rows = row_view(y.desc());
    a.dtype = x.dtype();
    a.rotation = param_.rotation;
    a.layout = param_.layout;
    a.heads = bnsd() ? x.dim(1) : x.dim(-2);
    a.seq = bnsd() ? x.dim(2) : 1;
    a.head_dim = x.dim(-1);
    a.rotary_dim = rotary_dim(x.desc());
    a.inv_freq = inv_freq_.data();
    a.scaling = 1.0;  // in inv_freq_
    a.threads = ctx.num_threads();
    a.ftz = ctx.flush_denormals();
    kernel_(a);
  }

 private:
  decltype(kernels::rope_forward)* kernel_ = nullptr;
  std::vector<double> inv_freq_;
};

}  // namespace

std::unique_ptr<Operation> make_rope(const ops::RopeParam& p) {
  return std::make_unique<RopeOp>(p);
}

}  // namespace tboost::ops_internal

namespace tboost::ops {
std::vector<double> rope_inv_freq(const RopeParam& p, int64_t rotary_dim) {
  const int64_t half = rotary_dim / 2;
  std::vector<double> f(static_cast<size_t>(half));
  const double factor = p.scaling_factor;
  for (int64_t i = 0; i < half; ++i) {
    const double base = std::pow(static_cast<double>(p.theta),
                                 -2.0 * static_cast<double>(i) / static_cast<double>(rotary_dim));
    double v = base / factor;
    if (p.scaling == RopeScaling::kLlama3) {
      const double wavelen = 2.0 * M_PI / base;
      const double old_len = p.original_max_position;
      if (wavelen < old_len / p.high_freq_factor) {
        v = base;
      } else if (wavelen <= old_len / p.low_freq_factor) {
        const double smooth =
            (old_len / wavelen - p.low_freq_factor) / (p.high_freq_factor - p.low_freq_factor);
        v = (1.0 - smooth) * base / factor + smooth * base;
      }
    }
    f[static_cast<size_t>(i)] = v;
  }
  return f;
}
}  // namespace tboost::ops
