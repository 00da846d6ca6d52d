// Fused linear + cross-entropy (the LM head of training): logits, softmax, loss and gradients in
// chunks of rows, so the (M, V) logits never exist; only a (chunk, V) f32 block does.
//
// Per chunk: logits = x_c · Wᵀ (oneDNN), then per row (our Highway pass) the log-sum-exp, the
// row's loss and the logits' gradient G = (softmax - target) / valid_rows, written over the
// logits in the head's dtype, then dx_c = G · W and dW += Gᵀ · x_c (oneDNN, the second
// accumulating through a sum post-op).
// The loss is summed in f64 in row order: thread-count independent. Label smoothing eps as
// PyTorch's cross_entropy: target = (1 - eps) one_hot + eps / V.
// clang-format off: Highway's per-target re-inclusion needs this exact order.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "src/kernels/cpu/cross_entropy.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
// clang-format on

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "hwy/highway.h"
#include "src/core/parallel.h"
#include "src/kernels/cpu/hwy_util-inl.h"
#include "src/kernels/cpu/kernels.h"
#include "tboost/core/error.h"

HWY_BEFORE_NAMESPACE();
namespace tboost::kernels::HWY_NAMESPACE {

// Rows [r0, r1) of z (rows, V) f32: loss[r] (f64) and d loss / d z into g (rows, V) in T. g is
// z's own memory (see XentRows): row r of g may overlap z's row r itself (T = float, or r = 0)
// and, for 16-bit T, z's row r / 2, so a row is read whole before its gradient is written.
template <class T>
void XentRowRange(const float* z, T* g, double* loss, const int32_t* labels, int64_t r0, int64_t r1,
                  int64_t V, int64_t ignore_index, float eps, float inv_valid) {
  const hn::ScalableTag<float> d;
  const int64_t L = static_cast<int64_t>(hn::Lanes(d));
  for (int64_t r = r0; r < r1; ++r) {
    const float* zr = z + r * V;
    T* gr = g + r * V;
    const int64_t y = labels[r];
    if (y == ignore_index) {
      const auto zero = hn::Zero(d);
      for (int64_t i = 0; i < V; i += L) StoreN(d, zero, gr + i, std::min(L, V - i));
      loss[r] = 0.0;
      continue;
    }
    auto mx = hn::Set(d, -INFINITY);
    auto sz = hn::Zero(d);
    for (int64_t i = 0; i < V; i += L) {
      const int64_t n = std::min(L, V - i);
      const auto v = LoadN(d, zr + i, n, -INFINITY);
      mx = hn::Max(mx, v);
      if (eps != 0.0f) sz = hn::Add(sz, LoadN(d, zr + i, n));
    }
    const float m = ReduceMaxF(d, mx);
    const auto vm = hn::Set(d, m), lo = hn::Set(d, -87.0f);
    // exp of (z - max) clamped at -87: FastExp's 2^n needs n >= -126; e^-87 ~ 1.6e-38.
    auto ex = [&](hn::Vec<decltype(d)> z)
                  TBOOST_INLINE_LAMBDA { return FastExp<5>(d, hn::Max(hn::Sub(z, vm), lo)); };
    // The sum without the label's term, kept apart: the label's gradient is p_y - 1 =
    // -(that sum) / (whole sum), exact where p_y - 1 from a rounded p_y would lose every bit
    // for a confident row (p_y within an ulp of 1).
    const hn::RebindToSigned<decltype(d)> di;
    auto se = hn::Zero(d);
    for (int64_t i = 0; i < V; i += L) {
      const int64_t n = std::min(L, V - i);
      auto keep = hn::FirstN(d, static_cast<size_t>(n));
      if (y >= i && y < i + n)
        keep = hn::And(keep, hn::RebindMask(d, hn::Ne(hn::Iota(di, static_cast<int32_t>(i)),
                                                      hn::Set(di, static_cast<int32_t>(y)))));
      se = hn::Add(se, hn::IfThenElseZero(keep, ex(LoadN(d, zr + i, n, -INFINITY))));
    }
    const double zy = zr[y];
    const double s_not_y = ReduceSumF(d, se);
    // The label's term exactly as the loop would have computed it (same lanes, same ops).
    const double e_y = hn::GetLane(ex(hn::Set(d, zr[y])));
    const double sum = s_not_y + e_y;
    const double lse = static_cast<double>(m) + std::log(sum);
    loss[r] =
        (1.0 - eps) * (lse - zy) +
        (eps != 0.0f ? eps * (lse - static_cast<double>(ReduceSumF(d, sz)) / static_cast<double>(V))
                     : 0.0);
    // Gradient: (softmax - eps / V) / valid, minus (1 - eps) / valid at the label. Front to
    // back, each vector loaded before its store: a 16-bit row 0 written over its own f32 row
    // only ever overwrites values already read.
    const auto vl = hn::Set(d, static_cast<float>(lse));
    const auto off = hn::Set(d, eps / static_cast<float>(V));
    const auto sc = hn::Set(d, inv_valid);
    for (int64_t i = 0; i < V; i += L) {
      const int64_t n = std::min(L, V - i);
      const auto p = FastExp<5>(d, hn::Max(hn::Sub(LoadN(d, zr + i, n), vl), lo));
      StoreN(d, hn::Mul(hn::Sub(p, off), sc), gr + i, n);
    }
    // (p_y - eps / V - (1 - eps)) / valid with p_y - 1 = -s_not_y / sum.
    const float gy = static_cast<float>(
        (-s_not_y / sum + static_cast<double>(eps) * (1.0 - 1.0 / static_cast<double>(V))) *
        static_cast<double>(inv_valid));
    StoreN(d, hn::Set(d, gy), gr + y, 1);
  }
}

// Rows [0, rows) of z (rows, V) f32: loss[r] and d loss / d z in dtype gt, over z's own
// memory: f32 row r over row r; a 16-bit gradient packed at the start of the block (its row r
// at byte 2·r·V, over f32 row r / 2), so the block needs no second buffer. The packed rows run
// in waves [0, 1), [1, 2), [2, 4), [4, 8), ...: a wave's gradients overwrite only f32 rows the
// wave before read, and its rows are read before the next wave writes over them.
void XentRows(float* z, DType gt, double* loss, const int32_t* labels, int64_t rows, int64_t V,
              int64_t ignore_index, float eps, float inv_valid, int threads, bool ftz) {
  auto run = [&](auto tag, int64_t w0, int64_t w1) {
    using T = decltype(tag);
    parallel_for(threads, w1 - w0, 1, ftz, [&](int64_t r0, int64_t r1) {
      XentRowRange(z, reinterpret_cast<T*>(z), loss, labels, w0 + r0, w0 + r1, V, ignore_index, eps,
                   inv_valid);
    });
  };
  if (gt == DType::kF32) return run(float{}, 0, rows);
  for (int64_t w0 = 0; w0 < rows; w0 = std::max<int64_t>(1, 2 * w0)) {
    const int64_t w1 = std::min(rows, std::max<int64_t>(1, 2 * w0));
    if (gt == DType::kBF16)
      run(bf16_t{}, w0, w1);
    else
      run(f16_t{}, w0, w1);
  }
}

}  // namespace tboost::kernels::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace tboost::kernels {
HWY_EXPORT(XentRows);

int64_t cross_entropy_max_chunk_rows(int64_t V, int64_t requested) {
  // ~40 MiB of f32 logits by default: at GPT-2's vocabulary, 5 chunks of 205 rows for T = 1024
  // (5x less than the whole logits). Fewer, larger chunks pay the products' per-call cost (the
  // head re-packed by oneDNN, dW's f32 read and write) fewer times.
  if (requested > 0) return requested;
  return std::clamp<int64_t>((int64_t{40} << 20) / (std::max<int64_t>(V, 1) * 4), 16, 4096);
}

int64_t cross_entropy_chunk_rows(int64_t M, int64_t V, int64_t requested) {
  if (M <= 0) return 1;
  const int64_t cap = cross_entropy_max_chunk_rows(V, requested);
  const int64_t n = (M + cap - 1) / cap;
  // The same n chunks with the largest as small as it can be: no runt of a few rows paying a
  // whole chunk's per-call cost (1024 rows at cap 208: 4 x 205 + 204, not 4 x 208 + 192).
  return (M + n - 1) / n;
}

void cross_entropy_rows(float* z, DType grad_dtype, double* loss, const int32_t* labels,
                        int64_t rows, int64_t V, int64_t ignore_index, float label_smoothing,
                        float grad_scale, int threads, bool ftz) {
  if (grad_dtype != DType::kF32 && grad_dtype != DType::kBF16 && grad_dtype != DType::kF16)
    throw Error(ErrorCode::kInvalidArgument,
                std::string("cross_entropy_rows: gradient dtype must be f32, bf16 or f16, got ") +
                    dtype_name(grad_dtype));
  HWY_DYNAMIC_DISPATCH(XentRows)
  (z, grad_dtype, loss, labels, rows, V, ignore_index, label_smoothing, grad_scale, threads, ftz);
}

double linear_cross_entropy(const LinearCrossEntropyArgs& a) {
  const int64_t M = a.M, K = a.K, V = a.V;
  // Labels first: a bad one is an error before anything is written.
  int64_t valid = 0;
  for (int64_t r = 0; r < M; ++r) {
    const int64_t y = a.labels[r];
    if (y == a.ignore_index) continue;
    if (y < 0 || y >= V)
      throw Error(ErrorCode::kInvalidArgument,
                  "linear_cross_entropy: label " + std::to_string(y) + " at row " +
                      std::to_string(r) + " is outside [0, " + std::to_string(V) +
                      ") and is not ignore_index (" + std::to_string(a.ignore_index) + ")");
    ++valid;
  }
  if (!(a.label_smoothing >= 0.0f && a.label_smoothing <= 1.0f))
    throw Error(ErrorCode::kInvalidArgument,
                "linear_cross_entropy: label_smoothing must be in [0, 1], got " +
                    std::to_string(a.label_smoothing));
  const size_t xe = dtype_size(a.dtype);
  if (valid == 0) {  // no target: zero loss and gradients
    if (a.dx) {
      std::vector<float> z(static_cast<size_t>(K), 0.0f);
      for (int64_t r = 0; r < M; ++r)
        convert(static_cast<char*>(a.dx) + static_cast<size_t>(r * K) * xe, a.dtype, z.data(),
                DType::kF32, K);
    }
    return 0.0;
  }
  // The head's weight once in f32 when oneDNN has no matmul for its dtype (AVX2 bf16): the
  // three products of every chunk then run in f32 without re-widening it.
  std::vector<float> w32;
  const void* w = a.w;
  DType wt = a.w_dtype.value_or(a.dtype);
  if (wt != DType::kF32 && !gemm_has_native(wt)) {
    w32.resize(static_cast<size_t>(V * K));
    convert(w32.data(), DType::kF32, a.w, wt, V * K);
    w = w32.data(), wt = DType::kF32;
  }
  const int64_t chunk = cross_entropy_chunk_rows(M, V, a.chunk_rows);
  // The chunk's f32 logits; their gradient goes over them in the head's dtype (XentRows), so
  // with a native 16-bit matmul both products read it natively and no second block exists.
  std::vector<float> z(static_cast<size_t>(chunk * V));
  std::vector<double> loss(static_cast<size_t>(M));
  const float inv_valid = a.grad_scale / static_cast<float>(valid);
  for (int64_t r0 = 0; r0 < M; r0 += chunk) {
    const int64_t c = std::min(chunk, M - r0);
    const char* xc = static_cast<const char*>(a.x) + static_cast<size_t>(r0 * K) * xe;
    GemmArgs g;  // z = x_c · Wᵀ
    g.y = z.data(), g.ldy = V, g.y_dtype = DType::kF32;
    g.a = xc, g.lda = K, g.a_dtype = a.dtype;
    g.b = w, g.ldb = K, g.b_dtype = wt, g.trans_b = true;
    g.M = c, g.N = V, g.K = K, g.threads = a.threads;
    gemm(g);
    cross_entropy_rows(z.data(), wt, loss.data() + r0, a.labels + r0, c, V, a.ignore_index,
                       a.label_smoothing, inv_valid, a.threads, a.ftz);
    const void* G = z.data();
    if (a.dx) {  // dx_c = G · W
      GemmArgs gx;
      gx.y = static_cast<char*>(a.dx) + static_cast<size_t>(r0 * K) * xe, gx.ldy = K;
      gx.y_dtype = a.dtype;
      gx.a = G, gx.lda = V, gx.a_dtype = wt;
      gx.b = w, gx.ldb = K, gx.b_dtype = wt;
      gx.M = c, gx.N = K, gx.K = V, gx.threads = a.threads;
      gemm(gx);
    }
    if (a.dw) {  // dW += Gᵀ · x_c
      GemmArgs gw;
      gw.y = a.dw, gw.ldy = K, gw.y_dtype = DType::kF32;
      gw.a = G, gw.lda = V, gw.a_dtype = wt, gw.trans_a = true;
      gw.b = xc, gw.ldb = K, gw.b_dtype = a.dtype;
      gw.M = V, gw.N = K, gw.K = c, gw.accumulate = true, gw.threads = a.threads;
      gemm(gw);
    }
  }
  double total = 0.0;
  for (double l : loss) total += l;
  return total / static_cast<double>(valid);
}

}  // namespace tboost::kernels
#endif
