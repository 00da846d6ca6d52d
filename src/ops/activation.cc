// Activation and Softmax operations: validation and dispatch to the CPU kernels.
#include <cmath>

#include "src/kernels/cpu/kernels.h"
#include "src/ops/op_base.h"
#include "src/ops/ops.h"
#include "src/ops/registry.h"

namespace tboost::ops_internal {
namespace {

// One input x, one output y, row by row through a registered kernel taking Args (which has
// x, x_rows, y, y_rows, dtype, threads, ftz). Subclasses add their params in fill().
template <class P, class Args>
class RowwiseOp : public OpBase<P> {
 public:
  using OpBase<P>::OpBase;
  std::string input_role(size_t) const override { return "x"; }
  std::string output_role(size_t) const override { return "y"; }

 protected:
  using Kernel = void(const Args&);
  virtual void fill(Args& a) const = 0;

  // The one input: x (..., C) in a float dtype with a contiguous last dim.
  const TensorDesc& check_x(const Checker& chk, const std::vector<TensorDesc>& in) const {
    chk.count(in, 1, "x");
    chk.rank(0, "x", in[0], 1, kMaxDims);
    chk.dtype_in(0, "x", in[0], {DType::kF32, DType::kBF16, DType::kF16});
    chk.last_dim_contiguous(0, "x", in[0]);
    return in[0];
  }

  size_t do_setup(const VariantPack& pack, Context& ctx, const Checker& chk) override {
    chk.last_dim_contiguous(0, "y", pack.outputs[0].desc());
    kernel_ = get_kernel<Kernel>(this->name(), ctx.device(), pack.inputs[0].dtype(), &this->impl_);
    return 0;
  }

  void do_execute(const VariantPack& pack, void*, Context& ctx) override {
    Args a;
    a.x = pack.inputs[0].data();
    a.x_rows = row_view(pack.inputs[0].desc());
    a.y = pack.outputs[0].data();
    a.y_rows = row_view(pack.outputs[0].desc());
    a.dtype = pack.inputs[0].dtype();
    a.threads = ctx.num_threads();
    a.ftz = ctx.flush_denormals();
    fill(a);
    kernel_(a);
  }

 private:
  Kernel* kernel_ = nullptr;
};

class ActivationOp : public RowwiseOp<ops::ActivationParam, kernels::ActivationArgs> {
 public:
  using RowwiseOp::RowwiseOp;
  const char* name() const override { return "Activation"; }

  std::vector<TensorDesc> do_infer_shape(const std::vector<TensorDesc>& in) const override {
    const Checker chk(name());
    const TensorDesc& x = check_x(chk, in);
    Shape s = x.shape();
    if (ops::is_gated(param_.type)) {
      if (s.back() % 2 != 0)
        chk.fail(ErrorCode::kShapeMismatch, std::string("input 0 (x) last dim must be even for ") +
                                                ops::activation_type_name(param_.type) +
                                                " (gate and up halves), got " +
                                                std::to_string(s.back()));
      s.back() /= 2;
    }
    return {TensorDesc::contiguous(x.dtype, s)};
  }

  void fill(kernels::ActivationArgs& a) const override {
    a.type = param_.type;
    a.gate_first = param_.gate_first;
  }
};

class SoftmaxOp : public RowwiseOp<ops::SoftmaxParam, kernels::SoftmaxArgs> {
 public:
  using RowwiseOp::RowwiseOp;
  const char* name() const override { return "Softmax"; }

  void validate_param(const Checker& chk) const override {
    // A scale <= 0 would turn masked (-inf) entries into +inf or NaN.
    chk.param(std::isfinite(param_.scale) && param_.scale > 0.0f,
              "scale must be finite and > 0, got " + std::to_string(param_.scale));
  }

  std::vector<TensorDesc> do_infer_shape(const std::vector<TensorDesc>& in) const override {
    const Checker chk(name());
    const TensorDesc& x = check_x(chk, in);
    if (x.dim(-1) == 0) chk.fail(ErrorCode::kShapeMismatch, "input 0 (x) has an empty last dim");
    return {TensorDesc::contiguous(x.dtype, x.shape())};
  }

  void fill(kernels::SoftmaxArgs& a) const override { a.scale = param_.scale; }
};

}  // namespace

std::unique_ptr<Operation> make_activation(const ops::ActivationParam& p) {
  return std::make_unique<ActivationOp>(p);
}
std::unique_ptr<Operation> make_softmax(const ops::SoftmaxParam& p) {
  return std::make_unique<SoftmaxOp>(p);
}

}  // namespace tboost::ops_internal

namespace tboost::ops {
const char* activation_type_name(ActivationType t) {
  switch (t) {
    case ActivationType::kRelu:
      return "relu";
    case ActivationType::kGeluErf:
      return "gelu_erf";
    case ActivationType::kGeluTanh:
      return "gelu_tanh";
    case ActivationType::kSilu:
      return "silu";
    case ActivationType::kSwiGlu:
      return "swiglu";
    case ActivationType::kGeGluErf:
      return "geglu_erf";
    case ActivationType::kGeGluTanh:
      return "geglu_tanh";
  }
  return "?";
}
}  // namespace tboost::ops
