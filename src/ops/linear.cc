// Linear operation: y = act(x · Wᵀ + bias) + residual as one oneDNN matmul with post-ops.
//
// Contract (include/tboost/ops/linear.h): validation in infer_shape/setup, nothing written on
// bad input, every oneDNN error turned into a tboost::Error naming the op.
//
// How it runs. setup makes a Plan from the descriptors (and the pointers, for aliasing), then
// builds the matmul primitive for it: the bias is the matmul's bias argument, the activation an
// eltwise post-op and the residual a binary_add post-op. The primitive and the packed weight
// are kept in the op and rebuilt only when the plan changes (shapes, strides, params, thread
// count, aliasing), so a repeated setup with the same shapes costs a comparison.
//
// Layouts oneDNN reads and writes in place: any operand whose rows are uniformly strided
// (row_view(desc).uniform_stride >= 0) goes to oneDNN with explicit strides. Anything else
// (non-collapsible leading dims, rows that overlap, inputs that overlap y) is staged through
// the workspace: x is copied contiguous before, y is computed contiguous and copied out after.
// oneDNN 2.6's fast gemm path needs the residual laid out exactly like y (otherwise it falls
// back to its reference matmul), so a residual with other strides is staged with y's.
//
// 16-bit types. We first ask oneDNN for a bf16 (or f16) matmul. oneDNN 2.6 has one only on
// CPUs with AVX-512 (bf16 via avx512_core/avx512_bf16) and none for f16; where creation fails
// the op computes in f32: the weight is converted to f32 once at setup (constant_weight) or per
// call into the workspace, x and the residual are converted into the workspace, y is computed
// in f32 and rounded once to the storage type on the way out. impl_info() says which path ran.
//
// constant_weight: the primitive is created with weights format_tag::any and the weight is
// reordered once into the layout oneDNN prefers (re-packed when the weight pointer changes).
// When that layout is the weight's own, it is used in place and nothing is copied.
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <dnnl.hpp>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "src/core/parallel.h"
#include "src/ops/dnnl_util.h"
#include "src/ops/op_base.h"
#include "src/ops/ops.h"

namespace tboost::ops_internal {
namespace {

using ops::Activation;
using ops::LinearParam;
using mdt = dnnl::memory::data_type;
using md_t = dnnl::memory::desc;

// Rows oneDNN can address with one leading dimension, without rows overlapping.
bool rows_addressable(const RowView& r) {
  return r.uniform_stride >= 0 && (r.count <= 1 || r.uniform_stride >= r.cols);
}
// Leading dim to hand oneDNN for such rows (a single row gets the dense value).
int64_t leading_dim(const RowView& r) { return r.count <= 1 ? r.cols : r.uniform_stride; }

RowView strided_rows(int64_t count, int64_t cols, int64_t ld) {
  RowView v = RowView::contiguous(count, cols);
  v.uniform_stride = ld;
  return v;
}

// The Activation kernel's type for a Linear epilogue activation (not kNone).
ops::ActivationType activation_type(Activation a) {
  switch (a) {
    case Activation::kRelu:
      return ops::ActivationType::kRelu;
    case Activation::kGeluErf:
      return ops::ActivationType::kGeluErf;
    case Activation::kGeluTanh:
      return ops::ActivationType::kGeluTanh;
    default:
      return ops::ActivationType::kSilu;
  }
}

bool same_layout(const TensorDesc& a, const TensorDesc& b) {
  return a.dtype == b.dtype && a.ndim == b.ndim && a.dims == b.dims && a.strides == b.strides;
}

// Copies (converting) rows between two row views; a same-type copy is a memcpy per row.
void copy_rows(void* dst, DType dt_dst, const RowView& dst_rows, const void* src, DType dt_src,
               const RowView& src_rows, int threads, bool ftz) {
  const int64_t cols = src_rows.cols;
  const size_t es_d = dtype_size(dt_dst), es_s = dtype_size(dt_src);
  // ~32K elements per thread before a fork pays for itself.
  parallel_for(threads, src_rows.count, std::max<int64_t>(1, 32768 / std::max<int64_t>(1, cols)),
               ftz, [&](int64_t begin, int64_t end) {
                 for (int64_t r = begin; r < end; ++r) {
                   auto* d =
                       static_cast<char*>(dst) + dst_rows.offset(r) * static_cast<int64_t>(es_d);
                   const auto* s = static_cast<const char*>(src) +
                                   src_rows.offset(r) * static_cast<int64_t>(es_s);
                   if (dt_dst == dt_src)
                     std::memcpy(d, s, static_cast<size_t>(cols) * es_s);
                   else
                     convert(d, dt_dst, s, dt_src, cols);
                 }
               });
}

// Everything that decides the primitive and the staging. Two equal plans share a primitive.
// dtype: that of x, weight, residual and y.
struct Plan : PlanBase {
  LinearParam param;
  int64_t M = 0, K = 0, N = 0;
  DType bias_dtype = DType::kF32;
  // Leading dims of what oneDNN sees, in elements: x's row stride (its K-row stride when
  // transpose_a), the weight's row stride, y's, the residual's.
  int64_t ld_x = 0, ld_w = 0, ld_y = 0, ld_res = 0;
  bool stage_x = false;     // x copied (converted) into the workspace
  bool w_copy = false;      // weight converted/copied contiguous (owned if constant, else ws)
  bool stage_bias = false;  // bias converted to f32 into the workspace
  bool stage_res = false;   // residual copied into the workspace with y's leading dim
  bool stage_y = false;     // y computed in the workspace, copied out after
  size_t off_x = 0, off_w = 0, off_bias = 0, off_res = 0, off_y = 0, ws_bytes = 0;
  bool operator==(const Plan&) const = default;

  bool stage_w() const { return w_copy && !param.constant_weight; }
};

class LinearOp : public OpBase<LinearParam> {
 public:
  using OpBase<LinearParam>::OpBase;

  const char* name() const override { return "Linear"; }
  // x and the residual may overlap y (they are staged first); the weight and bias are read
  // after oneDNN starts writing y, so they must not.
  Overlap input_overlap(size_t i) const override {
    return i == 1 || (param_.has_bias && i == 2) ? Overlap::kNone : Overlap::kAny;
  }

  void validate_param(const Checker& chk) const override {
    chk.param(!param_.residual_is_multiplier || param_.has_residual,
              "residual_is_multiplier needs has_residual");
  }

  std::string input_role(size_t i) const override {
    std::vector<std::string> roles = {"x", "weight"};
    if (param_.has_bias) roles.push_back("bias");
    if (param_.has_residual) roles.push_back("residual");
    return i < roles.size() ? roles[i] : "extra";
  }
  std::string output_role(size_t i) const override { return i == 0 ? "y" : "extra"; }

  std::vector<TensorDesc> do_infer_shape(const std::vector<TensorDesc>& in) const override {
    const Checker chk(name());
    const bool ta = param_.transpose_a, tb = param_.transpose_b;
    std::string names = "x, weight";
    if (param_.has_bias) names += ", bias";
    if (param_.has_residual) names += ", residual";
    chk.count(in, 2 + (param_.has_bias ? 1 : 0) + (param_.has_residual ? 1 : 0), names);

    const TensorDesc& x = in[0];
    chk.dtype_in(0, "x", x, {DType::kF32, DType::kBF16, DType::kF16});
    if (ta && x.ndim != 2)
      chk.fail(ErrorCode::kShapeMismatch,
               "input 0 (x) with transpose_a must be rank 2 (K, M), got rank " +
                   std::to_string(x.ndim) + " " + x.to_string());
    chk.rank(0, "x", x, 1, kMaxDims);
    chk.last_dim_contiguous(0, "x", x);
    const int64_t K = ta ? x.dim(0) : x.dim(-1);
    if (K == 0)
      chk.fail(ErrorCode::kShapeMismatch, "input 0 (x) has an empty K dim: " + x.to_string());

    const TensorDesc& w = in[1];
    chk.rank(1, "weight", w, 2, 2);
    chk.dtype_eq(1, "weight", w, x.dtype, "same as x");
    chk.dim_eq(1, "weight", w, tb ? 1 : 0, K, "K of x");
    chk.last_dim_contiguous(1, "weight", w);
    const int64_t N = w.dim(tb ? 0 : 1);

    size_t k = 2;
    if (param_.has_bias) {
      const TensorDesc& b = in[k];
      chk.shape_eq(2, "bias", b, {N});
      if (x.dtype == DType::kF32)
        chk.dtype_eq(2, "bias", b, DType::kF32);
      else
        chk.dtype_in(2, "bias", b, {DType::kF32, x.dtype});
      chk.last_dim_contiguous(2, "bias", b);
      ++k;
    }
    Shape ys = x.shape();
    if (ta)
      ys = {x.dim(1), N};
    else
      ys.back() = N;
    if (param_.has_residual) {
      const int idx = static_cast<int>(k);
      const TensorDesc& r = in[k];
      chk.dtype_eq(idx, "residual", r, x.dtype, "same as y");
      if (r.shape() != ys)
        chk.fail(ErrorCode::kShapeMismatch,
                 "input " + std::to_string(idx) + " (residual) expected shape " +
                     shape_to_string(ys) + " (same as y), got " + r.shape_string());
      chk.last_dim_contiguous(idx, "residual", r);
    }
    return {TensorDesc::contiguous(x.dtype, ys)};
  }

 protected:
  size_t do_setup(const VariantPack& pack, Context& ctx, const Checker& chk) override {
    if (ctx.device() != Device::kCPU)
      chk.fail(ErrorCode::kUnsupported,
               std::string("no kernel for device ") + device_name(ctx.device()));
    const Tensor& y = pack.outputs[0];
    if (y.ndim() > 0 && y.dim(-1) > 1 && y.stride(-1) != 1)
      chk.fail(ErrorCode::kShapeMismatch,
               "output 0 (y) needs a contiguous last dim (stride 1), got " + y.desc().to_string());
    if (y.numel() == 0) {
      impl_ = "empty (nothing to compute)";
      return setup_ws_ = 0;
    }
    if (gemv_ok(pack)) {
      impl_ = std::string("tboost gemv (weight streaming, ") + dtype_name(pack.inputs[1].dtype()) +
              " weight as stored, no packing)";
      return setup_ws_ = 0;
    }
    with_dnnl_errors(chk, "setting up", impl_, [&] {
      refresh(pack, ctx, chk);
      if (param_.constant_weight) {
        OmpThreads threads(plan_.threads);
        pack_weight(pack.inputs[1], ctx);
      }
    });
    return setup_ws_ = plan_.ws_bytes;
  }

  void do_execute(const VariantPack& pack, void* workspace, Context& ctx) override {
    const Checker chk(name());
    if (pack.outputs[0].numel() == 0) return;
    if (gemv_ok(pack)) return run_gemv(pack, ctx);
    with_dnnl_errors(chk, "executing", impl_, [&] {
      refresh(pack, ctx, chk);  // a new thread count or new aliasing re-plans
      // A plan made here may need more than the caller was told at setup: use our own.
      char* ws = static_cast<char*>(workspace);
      if (plan_.ws_bytes > setup_ws_) {
        if (scratch_bytes_ < plan_.ws_bytes) {
          scratch_ = aligned_buffer(plan_.ws_bytes);
          scratch_bytes_ = plan_.ws_bytes;
        }
        ws = static_cast<char*>(scratch_.get());
      }
      run(pack, ws, ctx);
    });
  }

 private:
  // Small M (decode) runs our weight-streaming GEMV on the weight as stored (src/kernels/cpu/
  // gemv.cc): no packing, one pass over the weights. TBOOST_GEMV=0 in the environment turns it
  // off (oneDNN for every M, for comparisons).
  static bool gemv_enabled() {
    static const bool on = [] {
      const char* e = std::getenv("TBOOST_GEMV");
      return !(e && std::string(e) == "0");
    }();
    return on;
  }
  bool gemv_ok(const VariantPack& pack) const {
    const LinearParam& prm = param_;
    if (!gemv_enabled() || prm.transpose_a || !prm.transpose_b) return false;
    const Tensor& x = pack.inputs[0];
    const Tensor& y = pack.outputs[0];
    const int64_t K = x.dim(-1);
    if (x.numel() / K > kernels::kGemvMaxRows) return false;
    if (row_view(x.desc()).uniform_stride < 0 || row_view(y.desc()).uniform_stride < 0 ||
        row_view(pack.inputs[1].desc()).uniform_stride < 0)
      return false;
    if (prm.has_residual) {
      // The epilogue reads each residual element just before writing the same y element: a
      // residual that is y itself is fine, one partly overlapping it is not.
      const Tensor& r = pack.inputs[prm.has_bias ? 3 : 2];
      const RowView rr = row_view(r.desc());
      if (rr.uniform_stride < 0) return false;
      if (overlaps(r, y) && !(r.data() == y.data() && same_layout(r.desc(), y.desc())))
        return false;
    }
    return true;
  }
  void run_gemv(const VariantPack& pack, Context& ctx) {
    const Tensor& x = pack.inputs[0];
    const Tensor& w = pack.inputs[1];
    const Tensor& y = pack.outputs[0];
    kernels::GemvArgs a;
    a.K = x.dim(-1);
    a.M = x.numel() / a.K;
    a.N = w.dim(0);
    a.x = x.data();
    a.ldx = leading_dim(row_view(x.desc()));
    a.x_dtype = x.dtype();
    a.w = w.data();
    a.ldw = leading_dim(row_view(w.desc()));
    a.w_dtype = w.dtype();
    a.y = y.data();
    a.ldy = leading_dim(row_view(y.desc()));
    a.y_dtype = y.dtype();
    if (param_.has_bias) {
      a.bias = pack.inputs[2].data();
      a.bias_dtype = pack.inputs[2].dtype();
    }
    if (param_.has_residual) {
      const Tensor& r = pack.inputs[param_.has_bias ? 3 : 2];
      a.residual = r.data();
      a.ldr = leading_dim(row_view(r.desc()));
      a.residual_mul = param_.residual_is_multiplier;
    }
    a.has_act = param_.activation != Activation::kNone;
    a.act = activation_type(param_.activation);
    a.threads = ctx.num_threads();
    a.ftz = ctx.flush_denormals();
    kernels::gemv_forward(a);
  }

  Plan make_plan(const VariantPack& pack, int threads, bool native) const {
    const LinearParam& prm = param_;
    const Tensor& x = pack.inputs[0];
    const Tensor& w = pack.inputs[1];
    const Tensor& y = pack.outputs[0];
    Plan p;
    p.init(x.dtype(), native, threads);
    p.param = prm;
    p.K = prm.transpose_a ? x.dim(0) : x.dim(-1);
    p.N = w.dim(prm.transpose_b ? 0 : 1);
    p.M = x.numel() / p.K;
    const DType cd = p.compute();
    const size_t ce = dtype_size(cd);
    WorkspaceLayout ws;
    auto take = [&ws](size_t bytes) { return ws.take(bytes); };

    const RowView xr = row_view(x.desc());  // M rows of K, or K rows of M with transpose_a
    p.stage_x = !p.native || !rows_addressable(xr) || overlaps(x, y);
    p.ld_x = p.stage_x ? xr.cols : leading_dim(xr);
    if (p.stage_x) p.off_x = take(static_cast<size_t>(p.M * p.K) * ce);

    const RowView wr = row_view(w.desc());
    p.w_copy = !p.native || !rows_addressable(wr);
    p.ld_w = p.w_copy ? wr.cols : leading_dim(wr);
    if (p.stage_w()) p.off_w = take(static_cast<size_t>(p.K * p.N) * ce);

    if (prm.has_bias) {
      p.bias_dtype = pack.inputs[2].dtype();
      p.stage_bias = p.bias_dtype != DType::kF32 && p.bias_dtype != cd;
      if (p.stage_bias) p.off_bias = take(static_cast<size_t>(p.N) * sizeof(float));
    }

    const RowView yr = row_view(y.desc());
    p.stage_y = !p.native || !rows_addressable(yr);
    p.ld_y = p.stage_y ? p.N : leading_dim(yr);

    if (prm.has_residual) {
      const Tensor& r = pack.inputs[prm.has_bias ? 3 : 2];
      const RowView rr = row_view(r.desc());
      p.stage_res =
          !p.native || !rows_addressable(rr) || leading_dim(rr) != p.ld_y || overlaps(r, y);
      p.ld_res = p.ld_y;
      if (p.stage_res) p.off_res = take(static_cast<size_t>((p.M - 1) * p.ld_res + p.N) * ce);
    }
    if (p.stage_y) p.off_y = take(static_cast<size_t>(p.M * p.N) * ce);
    p.ws_bytes = ws.bytes;
    return p;
  }

  // Makes plan_/prim_ current for this pack: first the native plan; for 16-bit types, the
  // f32-compute plan when oneDNN has no matmul for the type.
  void refresh(const VariantPack& pack, Context& ctx, const Checker& chk) {
    cache_.refresh(
        chk, [&](bool native) { return make_plan(pack, ctx.num_threads(), native); },
        [&](const Plan& p) { build(p); });
  }

  void build(const Plan& p) {
    const mdt cd = dnnl_type(p.compute());
    const auto M = p.M, K = p.K, N = p.N;
    src_md_ = p.param.transpose_a ? md_t({M, K}, cd, {1, p.ld_x}) : md_t({M, K}, cd, {p.ld_x, 1});
    wsrc_md_ = p.param.transpose_b ? md_t({K, N}, cd, {1, p.ld_w}) : md_t({K, N}, cd, {p.ld_w, 1});
    const md_t wq =
        p.param.constant_weight ? md_t({K, N}, cd, dnnl::memory::format_tag::any) : wsrc_md_;
    bias_md_ = p.param.has_bias
                   ? md_t({1, N}, p.stage_bias ? mdt::f32 : dnnl_type(p.bias_dtype), {N, 1})
                   : md_t();
    dst_md_ = md_t({M, N}, cd, {p.ld_y, 1});
    dnnl::post_ops po;
    int idx = 0;
    // Without a residual the activation runs as our own in-place pass over y right after the
    // matmul (y is still in L2/L3): oneDNN 2.6's eltwise post-ops on AVX2 cost more than the
    // whole unfused chain (matmul 15.7 ms, with gelu_tanh post-op 20.9 ms, unfused 17.6 ms at
    // 512x768x3072). With a residual the order act-then-add keeps it in oneDNN's post-ops.
    const Activation post_act = p.param.has_residual ? p.param.activation : Activation::kNone;
    switch (post_act) {
      case Activation::kNone:
        break;
      case Activation::kRelu:
        po.append_eltwise(1.0f, dnnl::algorithm::eltwise_relu, 0.0f, 0.0f);
        break;
      case Activation::kGeluErf:
        po.append_eltwise(1.0f, dnnl::algorithm::eltwise_gelu_erf, 0.0f, 0.0f);
        break;
      case Activation::kGeluTanh:
        po.append_eltwise(1.0f, dnnl::algorithm::eltwise_gelu_tanh, 0.0f, 0.0f);
        break;
      case Activation::kSilu:  // swish with alpha 1: x * sigmoid(x)
        po.append_eltwise(1.0f, dnnl::algorithm::eltwise_swish, 1.0f, 0.0f);
        break;
    }
    if (post_act != Activation::kNone) ++idx;
    if (p.param.has_residual) {
      res_md_ = md_t({M, N}, cd, {p.ld_res, 1});
      po.append_binary(p.param.residual_is_multiplier ? dnnl::algorithm::binary_mul
                                                      : dnnl::algorithm::binary_add,
                       res_md_);
      res_arg_ = DNNL_ARG_ATTR_MULTIPLE_POST_OP(idx) | DNNL_ARG_SRC_1;
    }
    dnnl::primitive_attr attr = user_scratchpad_attr();
    attr.set_post_ops(po);
    const dnnl::matmul::desc desc(src_md_, wq, bias_md_, dst_md_);
    const dnnl::matmul::primitive_desc pd(desc, attr, cpu_engine());
    wei_md_ = pd.weights_desc();
    scratch_md_ = pd.scratchpad_desc();
    prim_ = dnnl::matmul(pd);
    plan_ = p;

    impl_ = p.impl_name(pd.impl_info_str());
    if (p.param.constant_weight)
      impl_ += wei_md_ == wsrc_md_ ? "; weight in place" : "; weight packed";
    std::string staged;
    for (auto [on, what] : {std::pair{p.stage_x, "x"}, std::pair{p.stage_w(), "weight"},
                            std::pair{p.stage_bias, "bias"}, std::pair{p.stage_res, "residual"},
                            std::pair{p.stage_y, "y"}})
      if (on) staged += (staged.empty() ? "" : ",") + std::string(what);
    if (!staged.empty()) impl_ += "; staged " + staged;
  }

  // Fills the owned weight (constant_weight): the user's weight, converted to the compute
  // type if needed, reordered into wei_md_ unless that is already its layout. Keyed by the
  // pointer, the descriptor and both layouts, so a changed param or plan re-packs.
  void pack_weight(const Tensor& w, Context& ctx) {
    if (packed_ok_ && packed_from_ == w.data() && same_layout(packed_desc_, w.desc()) &&
        packed_src_md_ == wsrc_md_ && packed_md_ == wei_md_)
      return;
    packed_ok_ = false;
    packed_mem_ = dnnl::memory();
    copy_.reset();
    void* src = w.data();
    if (plan_.w_copy) {
      copy_ = aligned_buffer(static_cast<size_t>(plan_.K * plan_.N) * dtype_size(plan_.compute()));
      const RowView wr = row_view(w.desc());
      copy_rows(copy_.get(), plan_.compute(), RowView::contiguous(wr.count, wr.cols), w.data(),
                w.dtype(), wr, plan_.threads, ctx.flush_denormals());
      src = copy_.get();
    }
    if (wei_md_ != wsrc_md_) {
      dnnl::memory from(wsrc_md_, cpu_engine(), src);
      packed_mem_ = dnnl::memory(wei_md_, cpu_engine());
      dnnl::reorder(from, packed_mem_).execute(stream(), from, packed_mem_);
      stream().wait();
      copy_.reset();
    }
    packed_from_ = w.data();
    packed_desc_ = w.desc();
    packed_src_md_ = wsrc_md_;
    packed_md_ = wei_md_;
    packed_ok_ = true;
  }

  dnnl::stream& stream() {
    if (!stream_) stream_ = dnnl::stream(cpu_engine());
    return stream_;
  }

  void run(const VariantPack& pack, char* ws, Context& ctx) {
    const Plan& p = plan_;
    const DType cd = p.compute();
    const int nt = p.threads;
    const bool ftz = ctx.flush_denormals();
    OmpThreads threads(nt);
    const Tensor& x = pack.inputs[0];
    const Tensor& w = pack.inputs[1];
    const Tensor& y = pack.outputs[0];
    dnnl::engine& eng = cpu_engine();
    std::unordered_map<int, dnnl::memory> args;

    void* xp = x.data();
    if (p.stage_x) {
      const RowView xr = row_view(x.desc());
      xp = ws + p.off_x;
      copy_rows(xp, cd, RowView::contiguous(xr.count, xr.cols), x.data(), x.dtype(), xr, nt, ftz);
    }
    args[DNNL_ARG_SRC] = dnnl::memory(src_md_, eng, xp);

    if (p.param.constant_weight) {
      pack_weight(w, ctx);
      if (packed_mem_)
        args[DNNL_ARG_WEIGHTS] = packed_mem_;
      else
        args[DNNL_ARG_WEIGHTS] = dnnl::memory(wei_md_, eng, copy_ ? copy_.get() : w.data());
    } else {
      void* wp = w.data();
      if (p.stage_w()) {
        const RowView wr = row_view(w.desc());
        wp = ws + p.off_w;
        copy_rows(wp, cd, RowView::contiguous(wr.count, wr.cols), w.data(), w.dtype(), wr, nt, ftz);
      }
      args[DNNL_ARG_WEIGHTS] = dnnl::memory(wei_md_, eng, wp);
    }

    if (p.param.has_bias) {
      const Tensor& b = pack.inputs[2];
      void* bp = b.data();
      if (p.stage_bias) {
        bp = ws + p.off_bias;
        convert(bp, DType::kF32, b.data(), b.dtype(), p.N);
      }
      args[DNNL_ARG_BIAS] = dnnl::memory(bias_md_, eng, bp);
    }

    if (p.param.has_residual) {
      const Tensor& r = pack.inputs[p.param.has_bias ? 3 : 2];
      void* rp = r.data();
      if (p.stage_res) {
        const RowView rr = row_view(r.desc());
        rp = ws + p.off_res;
        copy_rows(rp, cd, strided_rows(rr.count, rr.cols, p.ld_res), r.data(), r.dtype(), rr, nt,
                  ftz);
      }
      args[res_arg_] = dnnl::memory(res_md_, eng, rp);
    }

    void* yp = p.stage_y ? ws + p.off_y : y.data();
    args[DNNL_ARG_DST] = dnnl::memory(dst_md_, eng, yp);
    args[DNNL_ARG_SCRATCHPAD] = thread_scratchpad(scratch_md_, eng);
    prim_.execute(stream(), args);
    stream().wait();

    if (p.param.activation != Activation::kNone && !p.param.has_residual) {
      kernels::ActivationArgs act;
      act.x = act.y = yp;
      act.x_rows = act.y_rows = strided_rows(p.M, p.N, p.ld_y);
      act.dtype = p.compute();
      act.type = activation_type(p.param.activation);
      act.threads = nt;
      act.ftz = ftz;
      kernels::activation_forward(act);
    }

    if (p.stage_y)
      copy_rows(y.data(), y.dtype(), row_view(y.desc()), yp, cd, RowView::contiguous(p.M, p.N), nt,
                ftz);
  }

  // The current plan and its primitive, and the native plan that led to them.
  Plan plan_;
  PlanCache<Plan> cache_;
  dnnl::matmul prim_;
  md_t src_md_, wsrc_md_, wei_md_, bias_md_, dst_md_, res_md_, scratch_md_;
  int res_arg_ = 0;
  dnnl::stream stream_;
  size_t setup_ws_ = 0;
  std::shared_ptr<void> scratch_;  // when a plan made at execute outgrows the setup workspace
  size_t scratch_bytes_ = 0;
  // Packed weight (constant_weight).
  bool packed_ok_ = false;
  const void* packed_from_ = nullptr;
  TensorDesc packed_desc_;
  md_t packed_src_md_, packed_md_;
  dnnl::memory packed_mem_;     // reordered weight, owned by oneDNN; empty when not reordered
  std::shared_ptr<void> copy_;  // contiguous compute-type copy, when used as the weight itself
};

}  // namespace

std::unique_ptr<Operation> make_linear(const ops::LinearParam& p) {
  return std::make_unique<LinearOp>(p);
}

}  // namespace tboost::ops_internal

namespace tboost::ops {
const char* activation_name(Activation a) {
  switch (a) {
    case Activation::kNone:
      return "none";
    case Activation::kRelu:
      return "relu";
    case Activation::kGeluErf:
      return "gelu_erf";
    case Activation::kGeluTanh:
      return "gelu_tanh";
    case Activation::kSilu:
      return "silu";
  }
  return "?";
}
}  // namespace tboost::ops
