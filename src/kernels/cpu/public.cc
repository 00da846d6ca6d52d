// The public free-function kernels (include/tboost/kernels/cpu.h): thin wrappers that fill
// the internal argument structs for contiguous data.
#include <cmath>
#include <cstdlib>
#include <vector>

#include "src/kernels/cpu/kernels.h"
#include "tboost/core/context.h"
#include "tboost/core/error.h"
#include "tboost/kernels/cpu.h"

namespace tboost::kernels::cpu {
namespace {
int threads_or_all(int t) { return t > 0 ? t : available_cores(); }

template <class T, class W>
void norm(T* y, T* sum, float* mean, float* rstd, const T* x, const T* res, const W* w, const W* b,
          float eps, int64_t rows, int64_t cols, bool rms, int threads) {
  NormArgs a;
  const RowView rv = RowView::contiguous(rows, cols);
  a.y = y, a.y_rows = rv, a.sum = sum, a.sum_rows = rv, a.x = x, a.x_rows = rv;
  a.residual = res, a.res_rows = rv, a.weight = w, a.bias = b, a.mean = mean, a.rstd = rstd;
  a.stats_rows = RowView::contiguous(rows, 1);
  a.dtype = dtype_of<T>::value;
  a.wdtype = dtype_of<W>::value;
  a.eps = eps, a.rms = rms, a.threads = threads_or_all(threads);
  norm_forward(a);
}

template <class T, class W>
void norm_bwd(T* dx, float* dw, float* db, const T* dy, const T* x, const W* w, const float* mean,
              const float* rstd, const T* dsum, int64_t rows, int64_t cols, bool rms, int threads) {
  NormBackwardArgs a;
  a.dx = dx, a.dw = dw, a.db = db, a.dy = dy, a.x = x, a.weight = w, a.mean = mean;
  a.rstd = rstd, a.dsum = dsum, a.rows = rows, a.cols = cols, a.rms = rms;
  a.dtype = dtype_of<T>::value;
  a.wdtype = dtype_of<W>::value;
  a.threads = threads_or_all(threads);
  kernels::norm_backward(a);
}

template <class T>
void act_bwd(T* dx, const T* dy, const T* x, ops::ActivationType type, bool gate_first,
             int64_t rows, int64_t F, int threads) {
  ActivationBackwardArgs a;
  a.dx = dx, a.dy = dy, a.x = x, a.type = type, a.gate_first = gate_first;
  a.rows = rows, a.cols = F, a.dtype = dtype_of<T>::value, a.threads = threads_or_all(threads);
  kernels::activation_backward(a);
}

template <class T>
void rope_bwd(T* dx, const T* dy, const int32_t* positions, const ops::RopeParam& p, int64_t tokens,
              int64_t heads, int64_t head_dim, int threads) {
  const int64_t r = p.rotary_dim > 0 ? p.rotary_dim : head_dim;
  const std::vector<double> inv = ops::rope_inv_freq(p, r);
  RopeArgs a;
  a.y = dx, a.x = dy;
  a.y_rows = a.x_rows = RowView::contiguous(tokens * heads, head_dim);
  a.positions = positions;
  a.pos_rows = RowView::contiguous(tokens, 1);
  a.pos_dtype = DType::kI32;
  a.dtype = dtype_of<T>::value;
  a.rotation = p.rotation;
  a.layout = ops::QkvLayout::kBSND;
  a.heads = heads, a.seq = 1, a.head_dim = head_dim, a.rotary_dim = r;
  a.inv_freq = inv.data();
  a.inverse = true;
  a.threads = threads_or_all(threads);
  kernels::rope_forward(a);
}

template <class T>
void linear_bwd(T* dx, float* dw, float* db, const T* dy, const T* x, const T* w, int64_t M,
                int64_t K, int64_t N, int threads) {
  const int t = threads_or_all(threads);
  const DType dt = dtype_of<T>::value;
  if (dx) {  // dx (M, K) = dy (M, N) · W (N, K)
    GemmArgs g;
    g.y = dx, g.ldy = K, g.y_dtype = dt;
    g.a = dy, g.lda = N, g.a_dtype = dt;
    g.b = w, g.ldb = K, g.b_dtype = dt;
    g.M = M, g.N = K, g.K = N, g.threads = t;
    gemm(g);
  }
  if (dw) {  // dW (N, K) += dyᵀ (N, M) · x (M, K)
    GemmArgs g;
    g.y = dw, g.ldy = K, g.y_dtype = DType::kF32;
    g.a = dy, g.lda = N, g.a_dtype = dt, g.trans_a = true;
    g.b = x, g.ldb = K, g.b_dtype = dt;
    g.M = N, g.N = K, g.K = M, g.accumulate = true, g.threads = t;
    gemm(g);
  }
  if (db) column_sum_accumulate(db, dy, dt, M, N, t);
}

template <class T>
double lce(T* dx, float* dw, const T* x, const T* w, const int32_t* labels, int64_t M, int64_t K,
           int64_t V, int64_t ignore_index, float eps, int64_t chunk, int threads) {
  LinearCrossEntropyArgs a;
  a.dx = dx, a.dw = dw, a.x = x, a.w = w, a.labels = labels, a.dtype = dtype_of<T>::value;
  a.M = M, a.K = K, a.V = V, a.ignore_index = ignore_index, a.label_smoothing = eps;
  a.chunk_rows = chunk, a.threads = threads_or_all(threads);
  return kernels::linear_cross_entropy(a);
}

template <class T>
void emb_bwd(float* dw, const T* dy, const int32_t* ids, int64_t tokens, int64_t vocab,
             int64_t cols, int threads) {
  EmbeddingBackwardArgs a;
  a.dw = dw, a.dy = dy, a.ids = ids, a.dtype = dtype_of<T>::value, a.ids_dtype = DType::kI32;
  a.tokens = tokens, a.vocab = vocab, a.cols = cols, a.threads = threads_or_all(threads);
  kernels::embedding_backward(a);
}
}  // namespace

void rms_norm_forward(float* y, float* rstd, const float* x, const float* w, float eps,
                      int64_t rows, int64_t cols, int threads) {
  norm<float, float>(y, nullptr, nullptr, rstd, x, nullptr, w, nullptr, eps, rows, cols, true,
                     threads);
}
void rms_norm_forward(bf16_t* y, float* rstd, const bf16_t* x, const bf16_t* w, float eps,
                      int64_t rows, int64_t cols, int threads) {
  norm<bf16_t, bf16_t>(y, nullptr, nullptr, rstd, x, nullptr, w, nullptr, eps, rows, cols, true,
                       threads);
}
void rms_norm_prenorm_forward(float* y, float* sum, float* rstd, const float* x,
                              const float* residual, const float* w, float eps, int64_t rows,
                              int64_t cols, int threads) {
  norm<float, float>(y, sum, nullptr, rstd, x, residual, w, nullptr, eps, rows, cols, true,
                     threads);
}
void layer_norm_forward(float* y, float* mean, float* rstd, const float* x, const float* w,
                        const float* b, float eps, int64_t rows, int64_t cols, int threads) {
  norm<float, float>(y, nullptr, mean, rstd, x, nullptr, w, b, eps, rows, cols, false, threads);
}

void rms_norm_backward(float* dx, float* dw, const float* dy, const float* x, const float* w,
                       const float* rstd, const float* dsum, int64_t rows, int64_t cols,
                       int threads) {
  norm_bwd(dx, dw, nullptr, dy, x, w, nullptr, rstd, dsum, rows, cols, true, threads);
}
void rms_norm_backward(bf16_t* dx, float* dw, const bf16_t* dy, const bf16_t* x, const bf16_t* w,
                       const float* rstd, const bf16_t* dsum, int64_t rows, int64_t cols,
                       int threads) {
  norm_bwd(dx, dw, nullptr, dy, x, w, nullptr, rstd, dsum, rows, cols, true, threads);
}
void layer_norm_backward(float* dx, float* dw, float* db, const float* dy, const float* x,
                         const float* w, const float* mean, const float* rstd, const float* dsum,
                         int64_t rows, int64_t cols, int threads) {
  norm_bwd(dx, dw, db, dy, x, w, mean, rstd, dsum, rows, cols, false, threads);
}
void layer_norm_backward(bf16_t* dx, float* dw, float* db, const bf16_t* dy, const bf16_t* x,
                         const bf16_t* w, const float* mean, const float* rstd, const bf16_t* dsum,
                         int64_t rows, int64_t cols, int threads) {
  norm_bwd(dx, dw, db, dy, x, w, mean, rstd, dsum, rows, cols, false, threads);
}
void activation_backward(float* dx, const float* dy, const float* x, ops::ActivationType type,
                         int64_t rows, int64_t F, bool gate_first, int threads) {
  act_bwd(dx, dy, x, type, gate_first, rows, F, threads);
}
void activation_backward(bf16_t* dx, const bf16_t* dy, const bf16_t* x, ops::ActivationType type,
                         int64_t rows, int64_t F, bool gate_first, int threads) {
  act_bwd(dx, dy, x, type, gate_first, rows, F, threads);
}
void rope_backward(float* dx, const float* dy, const int32_t* positions, const ops::RopeParam& p,
                   int64_t tokens, int64_t heads, int64_t head_dim, int threads) {
  rope_bwd(dx, dy, positions, p, tokens, heads, head_dim, threads);
}
void rope_backward(bf16_t* dx, const bf16_t* dy, const int32_t* positions, const ops::RopeParam& p,
                   int64_t tokens, int64_t heads, int64_t head_dim, int threads) {
  rope_bwd(dx, dy, positions, p, tokens, heads, head_dim, threads);
}
void embedding_backward(float* dw, const float* dy, const int32_t* ids, int64_t tokens,
                        int64_t vocab, int64_t cols, int threads) {
  emb_bwd(dw, dy, ids, tokens, vocab, cols, threads);
}
void embedding_backward(float* dw, const bf16_t* dy, const int32_t* ids, int64_t tokens,
                        int64_t vocab, int64_t cols, int threads) {
  emb_bwd(dw, dy, ids, tokens, vocab, cols, threads);
}

void linear_backward(float* dx, float* dw, float* db, const float* dy, const float* x,
                     const float* w, int64_t M, int64_t K, int64_t N, int threads) {
  linear_bwd(dx, dw, db, dy, x, w, M, K, N, threads);
}
void linear_backward(bf16_t* dx, float* dw, float* db, const bf16_t* dy, const bf16_t* x,
                     const bf16_t* w, int64_t M, int64_t K, int64_t N, int threads) {
  linear_bwd(dx, dw, db, dy, x, w, M, K, N, threads);
}

double linear_cross_entropy(float* dx, float* dw, const float* x, const float* w,
                            const int32_t* labels, int64_t M, int64_t K, int64_t V,
                            int64_t ignore_index, float label_smoothing, int64_t chunk_rows,
                            int threads) {
  return lce(dx, dw, x, w, labels, M, K, V, ignore_index, label_smoothing, chunk_rows, threads);
}
double linear_cross_entropy(bf16_t* dx, float* dw, const bf16_t* x, const bf16_t* w,
                            const int32_t* labels, int64_t M, int64_t K, int64_t V,
                            int64_t ignore_index, float label_smoothing, int64_t chunk_rows,
                            int threads) {
  return lce(dx, dw, x, w, labels, M, K, V, ignore_index, label_smoothing, chunk_rows, threads);
}

namespace {
// The internal arguments of BSHD (or varlen packed) attention; o and lse as outputs or inputs.
AttentionArgs attn_args(DType dt, const void* o, const float* lse, const void* q, const void* k,
                        const void* v, int64_t batch, int64_t sq, int64_t sk, int64_t heads,
                        int64_t kv_heads, int64_t D, int64_t Dv, const AttentionOptions& opt,
                        int threads) {
  if (heads <= 0 || kv_heads <= 0 || heads % kv_heads != 0 || D <= 0 || Dv <= 0 || batch < 0)
    throw Error(ErrorCode::kInvalidArgument,
                "attention: heads must be a positive multiple of kv_heads and head dims positive, "
                "got heads " +
                    std::to_string(heads) + ", kv_heads " + std::to_string(kv_heads) + ", D " +
                    std::to_string(D) + ", Dv " + std::to_string(Dv) + ", batch " +
                    std::to_string(batch));
  if (opt.mask && opt.cu_seqlens_q)
    throw Error(ErrorCode::kUnsupported, "attention: a mask with varlen is not supported");
  if (!opt.cu_seqlens_q != !opt.cu_seqlens_k)
    throw Error(ErrorCode::kInvalidArgument,
                "attention: cu_seqlens_q and cu_seqlens_k must be given together");
  AttentionArgs a;
  a.o = const_cast<void*>(o);
  a.q = q, a.k = k, a.v = v, a.lse = const_cast<float*>(lse);
  a.dtype = a.kv_dtype = dt;
  a.batch = batch, a.heads = heads, a.kv_heads = kv_heads, a.head_dim = D, a.v_head_dim = Dv;
  a.sq = sq, a.sk = sk;
  a.q_ss = heads * D, a.q_sh = D, a.q_sb = sq * heads * D;
  a.o_ss = heads * Dv, a.o_sh = Dv, a.o_sb = sq * heads * Dv;
  a.k_ss = kv_heads * D, a.k_sh = D, a.k_sb = sk * kv_heads * D;
  a.v_ss = kv_heads * Dv, a.v_sh = Dv, a.v_sb = sk * kv_heads * Dv;
  if (opt.cu_seqlens_q) {
    a.cu_q = opt.cu_seqlens_q, a.cu_k = opt.cu_seqlens_k, a.sq_is_bound = true;
    const int64_t total_q = opt.cu_seqlens_q[batch];
    a.lse_ss = 1, a.lse_sh = total_q, a.lse_sb = 0;
  } else {
    a.lse_ss = 1, a.lse_sh = sq, a.lse_sb = heads * sq;
  }
  a.scale = opt.scale != 0.0f ? opt.scale : 1.0f / std::sqrt(static_cast<float>(D));
  a.causal = opt.causal, a.window_left = opt.window_left, a.window_right = opt.window_right;
  a.alibi = opt.alibi_slopes, a.mask = opt.mask, a.mask_sb = sq * sk, a.mask_si = sk;
  a.threads = threads_or_all(threads);
  // As the SelfAttention op: the bf16 pair path's emulation, forced (tests) where the CPU has
  // no vdpbf16ps.
  a.force_bf16_pairs = std::getenv("TBOOST_ATTN_BF16_PAIRS") != nullptr;
  a.allow_amx = attention_amx_allowed();
  return a;
}

template <class T>
void attn_fwd(T* o, float* lse, const T* q, const T* k, const T* v, int64_t batch, int64_t sq,
              int64_t sk, int64_t heads, int64_t kv_heads, int64_t D, int64_t Dv,
              const AttentionOptions& opt, int threads) {
  const AttentionArgs a = attn_args(dtype_of<T>::value, o, lse, q, k, v, batch, sq, sk, heads,
                                    kv_heads, D, Dv, opt, threads);
  std::vector<char> ws(attention_workspace(a) + 64);
  attention_forward(
      a, reinterpret_cast<void*>((reinterpret_cast<uintptr_t>(ws.data()) + 63) & ~uintptr_t{63}));
}

template <class T>
void attn_bwd(T* dq, T* dk, T* dv, const T* dout, const T* q, const T* k, const T* v, const T* o,
              const float* lse, int64_t batch, int64_t sq, int64_t sk, int64_t heads,
              int64_t kv_heads, int64_t D, int64_t Dv, const AttentionOptions& opt, int threads) {
  AttentionBackwardArgs b;
  b.f = attn_args(dtype_of<T>::value, o, lse, q, k, v, batch, sq, sk, heads, kv_heads, D, Dv, opt,
                  threads);
  b.dout = dout, b.do_sb = b.f.o_sb, b.do_sh = b.f.o_sh, b.do_ss = b.f.o_ss;
  b.dq = dq, b.dq_sb = b.f.q_sb, b.dq_sh = b.f.q_sh, b.dq_ss = b.f.q_ss;
  b.dk = dk, b.dk_sb = b.f.k_sb, b.dk_sh = b.f.k_sh, b.dk_ss = b.f.k_ss;
  b.dv = dv, b.dv_sb = b.f.v_sb, b.dv_sh = b.f.v_sh, b.dv_ss = b.f.v_ss;
  std::vector<char> ws(attention_backward_workspace(b) + 64);
  attention_backward(b, ws.data());
}
}  // namespace

void attention_forward(float* o, float* lse, const float* q, const float* k, const float* v,
                       int64_t batch, int64_t sq, int64_t sk, int64_t heads, int64_t kv_heads,
                       int64_t D, int64_t Dv, const AttentionOptions& opt, int threads) {
  attn_fwd(o, lse, q, k, v, batch, sq, sk, heads, kv_heads, D, Dv, opt, threads);
}
void attention_forward(bf16_t* o, float* lse, const bf16_t* q, const bf16_t* k, const bf16_t* v,
                       int64_t batch, int64_t sq, int64_t sk, int64_t heads, int64_t kv_heads,
                       int64_t D, int64_t Dv, const AttentionOptions& opt, int threads) {
  attn_fwd(o, lse, q, k, v, batch, sq, sk, heads, kv_heads, D, Dv, opt, threads);
}
void attention_backward(float* dq, float* dk, float* dv, const float* dout, const float* q,
                        const float* k, const float* v, const float* o, const float* lse,
                        int64_t batch, int64_t sq, int64_t sk, int64_t heads, int64_t kv_heads,
                        int64_t D, int64_t Dv, const AttentionOptions& opt, int threads) {
  attn_bwd(dq, dk, dv, dout, q, k, v, o, lse, batch, sq, sk, heads, kv_heads, D, Dv, opt, threads);
}
void attention_backward(bf16_t* dq, bf16_t* dk, bf16_t* dv, const bf16_t* dout, const bf16_t* q,
                        const bf16_t* k, const bf16_t* v, const bf16_t* o, const float* lse,
                        int64_t batch, int64_t sq, int64_t sk, int64_t heads, int64_t kv_heads,
                        int64_t D, int64_t Dv, const AttentionOptions& opt, int threads) {
  attn_bwd(dq, dk, dv, dout, q, k, v, o, lse, batch, sq, sk, heads, kv_heads, D, Dv, opt, threads);
}

double grad_sum_squares(const float* g, int64_t n, int threads) {
  return sum_squares(g, n, threads_or_all(threads));
}
void adamw_step(float* p, float* m, float* v, const float* g, bf16_t* p16, int64_t n, int64_t step,
                const AdamWHyper& h, float grad_scale, int threads) {
  AdamWArgs a;
  a.p = p, a.m = m, a.v = v, a.g = g, a.p16 = p16, a.n = n, a.step = step;
  a.lr = h.lr, a.beta1 = h.beta1, a.beta2 = h.beta2, a.eps = h.eps, a.weight_decay = h.weight_decay;
  a.grad_scale = grad_scale, a.threads = threads_or_all(threads);
  kernels::adamw_step(a);
}

}  // namespace tboost::kernels::cpu
