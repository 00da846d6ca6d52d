// MatMul: batched y = alpha · op(a) · op(b) as one oneDNN matmul (include/tboost/ops/matmul.h).
//
// Contract: validation in infer_shape/setup, nothing written on bad input, every oneDNN error
// turned into a tboost::Error naming the op.
//
// How it runs. setup makes a Plan from the descriptors: the oneDNN memory descriptors of a, b
// and y at y's rank (missing batch dims, and batch dims of stride 0, become dims of 1, which
// oneDNN broadcasts; see matmul_views for the exception), what is staged, and the workspace
// offsets. The primitive is built for the plan and kept; it is rebuilt only when the plan
// changes (shapes, strides, params, threads).
//
// Layouts. oneDNN's gemm path reads any batch strides and any matrix whose rows or columns are
// contiguous, so such operands go in place, transposes included (a transposed operand is just
// the other unit stride). An operand whose matrix has no unit stride is staged: copied
// contiguous into the workspace (kernels::strided_copy). y is written in place when its rows
// are contiguous; otherwise (oneDNN would fall back to its slow reference kernel for a
// column-major y) it is computed contiguous in the workspace and copied out.
//
// 16-bit types. We first ask oneDNN for a bf16 (or f16) matmul; oneDNN 2.6 has bf16 only with
// AVX-512 and no f16 on CPUs. Where creation fails, a and b are converted to f32 in the
// workspace, y is computed in f32 there and rounded once into the storage type. impl_info()
// says which ran. alpha is oneDNN's output scale (applied to the f32 accumulator).
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <dnnl.hpp>
#include <string>
#include <unordered_map>
#include <vector>

#include "src/ops/dnnl_util.h"
#include "src/ops/op_base.h"
#include "src/ops/ops.h"

namespace tboost::ops_internal {
namespace {

using ops::MatMulParam;
using md_t = dnnl::memory::desc;
using Dims = std::array<int64_t, kMaxDims>;

// What oneDNN sees of one operand (a as (batch, M, K), b as (batch, K, N), y as (batch, M, N)).
struct Operand {
  Dims dims{}, strides{};
  bool staged = false;  // read from / written to the workspace, contiguous in stored dim order
  size_t offset = 0;    // in the workspace
  bool operator==(const Operand&) const = default;
};

// Everything that decides the primitive and the staging. Two equal plans share a primitive.
struct Plan : PlanBase {
  MatMulParam param;
  int rank = 2;
  Operand a, b, y;
  size_t ws_bytes = 0;
  bool operator==(const Plan&) const = default;
};

// The matrix (rows, cols) with strides (sr, sc) in a form oneDNN's gemm reads: row-major
// (sc == 1, sr >= cols) or column-major (sr == 1, sc >= rows). The stride of a dim of size 1
// is free and is set to make one of those; false when neither is possible.
bool blas_matrix(int64_t rows, int64_t cols, int64_t* sr, int64_t* sc, bool row_major_only) {
  if (rows == 1 && cols == 1) {
    *sr = *sc = 1;
  } else if (rows == 1) {
    if (*sc == 1 || row_major_only)
      *sc = 1, *sr = cols;
    else
      *sr = 1;
    return *sc >= 1;
  } else if (cols == 1) {
    if (*sr == 1 && !row_major_only)
      *sc = rows;
    else
      *sc = 1;
    return *sr >= 1;
  }
  return (*sc == 1 && *sr >= cols) || (!row_major_only && *sr == 1 && *sc >= rows);
}

// a's and b's descriptors as oneDNN should read them. A batch dim of stride 0 (a broadcast
// view) is folded to size 1: oneDNN broadcasts it itself, and a staged copy need not repeat
// it. Unless neither operand would then give y its size there: that dim stays, and its operand
// is staged (*stage set), since oneDNN's gemm path does not take stride 0.
void matmul_views(const TensorDesc& a, const TensorDesc& b, const TensorDesc& y, TensorDesc* av,
                  TensorDesc* bv, bool* stage_a, bool* stage_b) {
  *av = a, *bv = b;
  *stage_a = *stage_b = false;
  for (TensorDesc* v : {av, bv})
    for (int i = 0; i + 2 < v->ndim; ++i)
      if (v->strides[static_cast<size_t>(i)] == 0) v->dims[static_cast<size_t>(i)] = 1;
  for (int k = 0; k + 2 < y.ndim; ++k) {
    const int ja = k - (y.ndim - a.ndim), jb = k - (y.ndim - b.ndim);
    const int64_t da = ja >= 0 ? av->dim(ja) : 1, db = jb >= 0 ? bv->dim(jb) : 1;
    if (y.dim(k) == 1 || da > 1 || db > 1) continue;
    if (ja >= 0 && a.dim(ja) > 1) {
      av->dims[static_cast<size_t>(ja)] = a.dim(ja);
      *stage_a = true;
    } else {
      bv->dims[static_cast<size_t>(jb)] = b.dim(jb);
      *stage_b = true;
    }
  }
}

// oneDNN dims/strides at `rank` for a (..., r, c) view used as (..., c, r) when `transpose`.
// Missing batch dims are 1. Dims of size 1 get the span of the view as stride (a stride of 0
// sends oneDNN to its reference kernel). False when the matrix is not BLAS-addressable.
bool to_onednn(const TensorDesc& v, int rank, bool transpose, bool row_major_only, Operand* o) {
  int64_t span = 1;
  for (int i = 0; i < v.ndim; ++i)
    if (v.dim(i) > 1) span = std::max(span, v.dim(i) * v.stride(i));
  const int off = rank - v.ndim;
  for (int i = 0; i + 2 < rank; ++i) {
    const auto u = static_cast<size_t>(i);
    const int j = i - off;
    o->dims[u] = j < 0 ? 1 : v.dim(j);
    o->strides[u] = o->dims[u] == 1 ? span : v.stride(j);
  }
  const int r = transpose ? -1 : -2, c = transpose ? -2 : -1;
  const auto ur = static_cast<size_t>(rank - 2), uc = static_cast<size_t>(rank - 1);
  o->dims[ur] = v.dim(r), o->dims[uc] = v.dim(c);
  o->strides[ur] = v.stride(r), o->strides[uc] = v.stride(c);
  return blas_matrix(o->dims[ur], o->dims[uc], &o->strides[ur], &o->strides[uc], row_major_only);
}

class MatMulOp : public OpBase<MatMulParam> {
 public:
  using OpBase<MatMulParam>::OpBase;

  const char* name() const override { return "MatMul"; }
  std::string input_role(size_t i) const override { return i == 0 ? "a" : i == 1 ? "b" : "extra"; }
  std::string output_role(size_t i) const override { return i == 0 ? "y" : "extra"; }
  // a and b are read while oneDNN writes y.
  Overlap input_overlap(size_t) const override { return Overlap::kNone; }

  void validate_param(const Checker& chk) const override {
    chk.param(std::isfinite(param_.alpha), "alpha must be finite");
  }

  std::vector<TensorDesc> do_infer_shape(const std::vector<TensorDesc>& in) const override {
    const Checker chk(name());
    chk.count(in, 2, "a, b");
    const TensorDesc& a = in[0];
    const TensorDesc& b = in[1];
    chk.dtype_in(0, "a", a, {DType::kF32, DType::kBF16, DType::kF16});
    chk.rank(0, "a", a, 2, kMaxDims);
    chk.dtype_eq(1, "b", b, a.dtype, "same as a");
    chk.rank(1, "b", b, 2, kMaxDims);
    const bool ta = param_.transpose_a, tb = param_.transpose_b;
    const int64_t M = a.dim(ta ? -1 : -2), K = a.dim(ta ? -2 : -1);
    const int64_t N = b.dim(tb ? -2 : -1);
    if (K == 0)
      chk.fail(ErrorCode::kShapeMismatch, "input 0 (a) has an empty K dim: " + a.to_string());
    if (b.dim(tb ? -1 : -2) != K)
      chk.fail(ErrorCode::kShapeMismatch,
               "input 1 (b) expected dim " + std::to_string(b.ndim + (tb ? -1 : -2)) + " = " +
                   std::to_string(K) + " (K of a" + (ta ? ", transposed" : "") + "), got " +
                   std::to_string(b.dim(tb ? -1 : -2)) + " in shape " + b.shape_string() +
                   (tb ? " (transpose_b: b is (..., N, K))" : " (b is (..., K, N))"));
    const Shape ab(a.dims.begin(), a.dims.begin() + a.ndim - 2);
    const Shape bb(b.dims.begin(), b.dims.begin() + b.ndim - 2);
    Shape ys;
    int bad = 0;
    if (!broadcast_shapes(ab, bb, &ys, &bad))
      chk.fail(ErrorCode::kShapeMismatch,
               "batch dims " + shape_to_string(ab) + " of input 0 (a) " + a.shape_string() +
                   " and " + shape_to_string(bb) + " of input 1 (b) " + b.shape_string() +
                   " do not broadcast (aligned from the right, sizes must be equal or 1)");
    ys.push_back(M);
    ys.push_back(N);
    return {TensorDesc::contiguous(a.dtype, ys)};
  }

 protected:
  size_t do_setup(const VariantPack& pack, Context& ctx, const Checker& chk) override {
    if (ctx.device() != Device::kCPU)
      chk.fail(ErrorCode::kUnsupported,
               std::string("no kernel for device ") + device_name(ctx.device()));
    if (pack.outputs[0].numel() == 0) {
      impl_ = "empty (nothing to compute)";
      return 0;
    }
    with_dnnl_errors(chk, "setting up", impl_, [&] { refresh(pack, ctx, chk); });
    return plan_.ws_bytes;
  }

  void do_execute(const VariantPack& pack, void* workspace, Context& ctx) override {
    const Checker chk(name());
    if (pack.outputs[0].numel() == 0) return;
    // A new thread count re-plans here; the workspace depends on the descriptors only, which
    // setup saw, so the caller's still fits.
    with_dnnl_errors(chk, "executing", impl_, [&] {
      refresh(pack, ctx, chk);
      run(pack, static_cast<char*>(workspace), ctx);
    });
  }

 private:
  Plan make_plan(const VariantPack& pack, int threads, bool native) const {
    const Tensor& y = pack.outputs[0];
    Plan p;
    p.init(y.dtype(), native, threads);
    p.param = param_;
    p.rank = y.ndim();
    const DType cd = p.compute();
    WorkspaceLayout ws;
    auto place = [&](const TensorDesc& v, bool transpose, bool stage, bool row_major_only,
                     Operand* o) {
      o->staged = stage || !p.native || !to_onednn(v, p.rank, transpose, row_major_only, o);
      if (o->staged) {
        const TensorDesc dense = TensorDesc::contiguous(cd, v.shape());
        to_onednn(dense, p.rank, transpose, row_major_only, o);
        o->offset = ws.take(static_cast<size_t>(dense.numel()) * dtype_size(cd));
      }
    };
    TensorDesc av, bv;
    bool stage_a, stage_b;
    matmul_views(pack.inputs[0].desc(), pack.inputs[1].desc(), y.desc(), &av, &bv, &stage_a,
                 &stage_b);
    place(av, param_.transpose_a, stage_a, false, &p.a);
    place(bv, param_.transpose_b, stage_b, false, &p.b);
    place(y.desc(), false, false, true, &p.y);
    p.ws_bytes = ws.bytes;
    return p;
  }

  void refresh(const VariantPack& pack, Context& ctx, const Checker& chk) {
    cache_.refresh(
        chk, [&](bool native) { return make_plan(pack, ctx.num_threads(), native); },
        [&](const Plan& p) { build(p); });
  }

  void build(const Plan& p) {
    const auto cd = dnnl_type(p.compute());
    auto md = [&](const Operand& o) {
      const auto n = static_cast<size_t>(p.rank);
      return md_t(dnnl::memory::dims(o.dims.begin(), o.dims.begin() + n), cd,
                  dnnl::memory::dims(o.strides.begin(), o.strides.begin() + n));
    };
    a_md_ = md(p.a), b_md_ = md(p.b), y_md_ = md(p.y);
    dnnl::primitive_attr attr = user_scratchpad_attr();
    if (p.param.alpha != 1.0f) attr.set_output_scales(0, {p.param.alpha});
    const dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(a_md_, b_md_, y_md_), attr,
                                          cpu_engine());
    prim_ = dnnl::matmul(pd);
    scratch_md_ = pd.scratchpad_desc();
    plan_ = p;
    impl_ = p.impl_name(pd.impl_info_str());
    std::string staged;
    for (auto [on, what] :
         {std::pair{p.a.staged, "a"}, std::pair{p.b.staged, "b"}, std::pair{p.y.staged, "y"}})
      if (on) staged += (staged.empty() ? "" : ",") + std::string(what);
    if (!staged.empty()) impl_ += "; staged " + staged;
  }

  dnnl::stream& stream() {
    if (!stream_) stream_ = dnnl::stream(cpu_engine());
    return stream_;
  }

  void run(const VariantPack& pack, char* ws, Context& ctx) {
    const Plan& p = plan_;
    const DType cd = p.compute();
    OmpThreads threads(p.threads);
    dnnl::engine& eng = cpu_engine();
    const Tensor& y = pack.outputs[0];
    TensorDesc av, bv;
    bool stage_a, stage_b;
    matmul_views(pack.inputs[0].desc(), pack.inputs[1].desc(), y.desc(), &av, &bv, &stage_a,
                 &stage_b);
    // A staged input is copied (converted) contiguous into the workspace.
    auto input = [&](const Tensor& t, const TensorDesc& src, const Operand& o) -> void* {
      if (!o.staged) return t.data();
      const TensorDesc dense = TensorDesc::contiguous(cd, src.shape());
      kernels::strided_copy(copy_args(ws + o.offset, dense, t.data(), src, p.threads));
      return ws + o.offset;
    };
    void* yp = p.y.staged ? ws + p.y.offset : y.data();
    std::unordered_map<int, dnnl::memory> args;
    args[DNNL_ARG_SRC] = dnnl::memory(a_md_, eng, input(pack.inputs[0], av, p.a));
    args[DNNL_ARG_WEIGHTS] = dnnl::memory(b_md_, eng, input(pack.inputs[1], bv, p.b));
    args[DNNL_ARG_DST] = dnnl::memory(y_md_, eng, yp);
    args[DNNL_ARG_SCRATCHPAD] = thread_scratchpad(scratch_md_, eng);
    prim_.execute(stream(), args);
    stream().wait();
    if (p.y.staged)
      kernels::strided_copy(
          copy_args(y.data(), y.desc(), yp, TensorDesc::contiguous(cd, y.shape()), p.threads));
  }

  // The current plan and its primitive, and the native plan that led to them.
  Plan plan_;
  PlanCache<Plan> cache_;
  dnnl::matmul prim_;
  md_t a_md_, b_md_, y_md_, scratch_md_;
  dnnl::stream stream_;
};

}  // namespace

std::unique_ptr<Operation> make_matmul(const ops::MatMulParam& p) {
  return std::make_unique<MatMulOp>(p);
}

}  // namespace tboost::ops_internal
