// Flash attention backward on the CPU: dQ, dK, dV from Q, K, V, O, dO and the forward's
// log-sum-exp, with the scores recomputed tile by tile, so the T x T probabilities never exist.
//
// For a tile of Bq queries and a block of Bk keys (f32 scratch, ~4·Bq·Bk + (Bq + Bk)·(D + Dv)
// floats per thread):
//   S  = Q·Kᵀ                     P = exp(S·scale + bias - lse)   (masks as in the forward)
//   dP = dO·Vᵀ                    dS = P ∘ (dP - delta),  delta_i = dO_i · O_i
//   dV += Pᵀ·dO   dK += scale·dSᵀ·Q   dQ += scale·dS·K
// Determinism: a sum of tiles into one output row is always made by one task in a fixed
// order, never by racing threads. So the work runs as two passes that each own their outputs:
//   pass 1, one task per (sequence, kv head, key block): every query tile of every q head of
//           the group, in order, into that block's dK and dV (GQA's sum over heads included);
//   pass 2, one task per (sequence, q head, query tile): every key block, in order, into dQ.
// Pass 2 recomputes S, P and dP (7 products instead of 5): the price of outputs that no two
// threads share and of bits that do not depend on the thread count or on timing.
//
// The products are single-threaded oneDNN matmuls on the tiles (f32; bf16 rows are widened into
// scratch): at Bq = Bk = 128 a product is ~2 MFLOP, so the call costs little next to it, and
// oneDNN's AVX2/AVX-512 kernels are faster than a generic micro-kernel of ours would be.
// clang-format off: Highway's per-target re-inclusion needs this exact order.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "src/kernels/cpu/attention_backward.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
// clang-format on

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "hwy/highway.h"
#include "src/kernels/cpu/attention-inl.h"
#include "src/kernels/cpu/hwy_util-inl.h"
#include "src/kernels/cpu/kernels.h"
#include "tboost/core/error.h"

HWY_BEFORE_NAMESPACE();
namespace tboost::kernels::HWY_NAMESPACE {
namespace {

constexpr int64_t kBq = 128, kBk = 128;

// Per-thread f32 scratch of one task.
struct BwdScratch {
  float *q, *dout, *k, *v, *s, *dp, *acc, *acc_v, *lse2, *delta;
};
struct BwdSizes {
  int64_t D, Dv;
  size_t bytes() const {
    const int64_t n = kBq * D + kBq * Dv + kBk * D + kBk * Dv + 2 * kBq * kBk +
                      std::max(kBq, kBk) * D + kBk * Dv + 2 * kBq;
    return static_cast<size_t>(n) * sizeof(float) + 11 * 64;
  }
};
BwdScratch CarveBwd(char* p, int64_t D, int64_t Dv) {
  auto take = [&p](int64_t floats) {
    float* r = reinterpret_cast<float*>(p);
    p += Align64(static_cast<size_t>(floats) * sizeof(float));
    return r;
  };
  BwdScratch s;
  s.q = take(kBq * D);
  s.dout = take(kBq * Dv);
  s.k = take(kBk * D);
  s.v = take(kBk * Dv);
  s.s = take(kBq * kBk);
  s.dp = take(kBq * kBk);
  s.acc = take(std::max(kBq, kBk) * D);
  s.acc_v = take(kBk * Dv);
  s.lse2 = take(kBq);
  s.delta = take(kBq);
  return s;
}
size_t PerThreadBwd(const AttentionArgs& f) {
  const BwdSizes z{f.head_dim, f.v_head_dim};
  return Align64(z.bytes());
}

void Gemm(float* y, int64_t ldy, const float* a, int64_t lda, bool ta, const float* b, int64_t ldb,
          bool tb, int64_t M, int64_t N, int64_t K, bool acc) {
  GemmArgs g;
  g.y = y, g.ldy = ldy, g.a = a, g.lda = lda, g.trans_a = ta, g.b = b, g.ldb = ldb, g.trans_b = tb;
  g.M = M, g.N = N, g.K = K, g.accumulate = acc, g.threads = 1;
  gemm(g);
}

// The (sequence, head) addressing shared by both passes.
// Rows are read through the forward's KvRows / RowsF32 (f32 rows in place, others widened).
struct Head {
  KvRows q, dout, k, v;
  const char* o;
  int64_t o_row;
  const float* lse;
  int64_t lse_row;
  int64_t sq, sk;
  Visibility vis;
  float slope2;
  const float* mask;
  int64_t mask_row;
};

// One tile pair: queries [i0, i0+nq) (their q, dO in s.q/s.dout with lds lq, ldo; lse2 and
// delta in s.lse2/s.delta) against keys [j0, j0+nk) (k, v at lk, lv). Leaves P in s.s and dS
// (unscaled) in s.dp, both (nq x nk) with leading dimension kBk.
void TilePair(const Head& h, const float* q, int64_t lq, const float* dout, int64_t ldo,
              const float* k, int64_t lk, const float* v, int64_t lv, const BwdScratch& s,
              int64_t i0, int64_t nq, int64_t j0, int64_t nk, int64_t D, int64_t Dv,
              float qscale2) {
  const DF d;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  Gemm(s.s, kBk, q, lq, false, k, lk, true, nq, nk, D, false);
  Gemm(s.dp, kBk, dout, ldo, false, v, lv, true, nq, nk, Dv, false);
  const auto lanes = hn::Iota(d, 0.0f);
  for (int64_t r = 0; r < nq; ++r) {
    const int64_t i = i0 + r;
    float* P = s.s + r * kBk;
    float* dS = s.dp + r * kBk;
    // Visible keys of this row inside the block; the rest get P = dS = 0.
    const int64_t lo = std::max(j0, h.vis.lo(i)), hi = std::min(j0 + nk - 1, h.vis.hi(i, h.sk));
    const float lse2 = s.lse2[r];
    if (hi < lo || std::isinf(lse2)) {
      std::memset(P, 0, static_cast<size_t>(nk) * sizeof(float));
      std::memset(dS, 0, static_cast<size_t>(nk) * sizeof(float));
      continue;
    }
    for (int64_t c = 0; c < lo - j0; ++c) P[c] = dS[c] = 0.0f;
    for (int64_t c = hi - j0 + 1; c < nk; ++c) P[c] = dS[c] = 0.0f;
    const auto qs = hn::Set(d, qscale2), l2 = hn::Set(d, lse2), dl = hn::Set(d, s.delta[r]);
    const auto pos = hn::Set(d, static_cast<float>(i + h.vis.offset));
    const auto slope = hn::Set(d, h.slope2);
    const float* mrow = h.mask ? h.mask + i * h.mask_row : nullptr;
    for (int64_t j = lo; j <= hi; j += N) {
      const int64_t n = std::min(N, hi + 1 - j), c = j - j0;
      auto x = hn::MulSub(LoadN(d, P + c, n), qs, l2);
      if (h.slope2 != 0.0f) {
        const auto dist = hn::Abs(hn::Sub(pos, hn::Add(hn::Set(d, static_cast<float>(j)), lanes)));
        x = hn::NegMulAdd(slope, dist, x);
      }
      if (mrow) {
        alignas(64) float m[hn::MaxLanes(d)];
        for (int64_t t = 0; t < n; ++t) m[t] = MaskLog2(mrow[j + t]);
        x = hn::Add(x, LoadN(d, m, n));
      }
      // Scores at or above the row's lse (rounding) give p <= ~1; Exp2 wants x <= 0 only for
      // its underflow clamp, which is what matters here.
      const auto p = Exp2(d, hn::Min(x, hn::Zero(d)));
      StoreN(d, p, P + c, n);
      StoreN(d, hn::Mul(p, hn::Sub(LoadN(d, dS + c, n), dl)), dS + c, n);
    }
  }
}

// Loads the query tile's q and dO (as f32), lse in log2 units and delta = dO·O.
void LoadQueryTile(const Head& h, int64_t i0, int64_t nq, const AttentionArgs& f,
                   const BwdScratch& s, const float** q, int64_t* lq, const float** dout,
                   int64_t* ldo) {
  const DF d;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  const int64_t Dv = f.v_head_dim;
  *q = RowsF32(h.q, i0, nq, s.q, lq);
  *dout = RowsF32(h.dout, i0, nq, s.dout, ldo);
  for (int64_t r = 0; r < nq; ++r) {
    const float l = h.lse[(i0 + r) * h.lse_row];
    s.lse2[r] = std::isinf(l) ? l : l * kLog2e;
    // delta_i = dO_i · O_i (= rowsum(P ∘ dP)), O widened a vector at a time.
    const char* orow = h.o + (i0 + r) * h.o_row;
    const float* dor = *dout + r * *ldo;
    auto acc = hn::Zero(d);
    alignas(64) float ob[hn::MaxLanes(d)];
    for (int64_t c = 0; c < Dv; c += N) {
      const int64_t n = std::min(N, Dv - c);
      convert(ob, DType::kF32, orow + c * static_cast<int64_t>(dtype_size(f.dtype)), f.dtype, n);
      acc = hn::MulAdd(LoadN(d, dor + c, n), LoadN(d, ob, n), acc);
    }
    s.delta[r] = ReduceSumF(d, acc);
  }
}

// Writes f32 rows (n x cols, ld cols) times `mul` to a strided output of dtype t.
void StoreRows(char* base, int64_t row_bytes, DType t, float* src, int64_t n, int64_t cols,
               float mul) {
  const DF d;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  const auto m = hn::Set(d, mul);
  for (int64_t r = 0; r < n; ++r) {
    float* row = src + r * cols;
    if (mul != 1.0f)
      for (int64_t c = 0; c < cols; c += N) {
        const int64_t k = std::min(N, cols - c);
        StoreN(d, hn::Mul(LoadN(d, row + c, k), m), row + c, k);
      }
    convert(base + r * row_bytes, t, row, DType::kF32, cols);
  }
}

}  // namespace

size_t AttentionBackwardWorkspace(const AttentionBackwardArgs& a) {
  return static_cast<size_t>(std::max(1, a.f.threads)) * PerThreadBwd(a.f) + 64;
}

void AttentionBackward(const AttentionBackwardArgs& a, void* workspace) {
  const AttentionArgs& f = a.f;
  const int64_t D = f.head_dim, Dv = f.v_head_dim, g = Group(f);
  const int64_t qes = static_cast<int64_t>(dtype_size(f.dtype));
  const int64_t kes = static_cast<int64_t>(dtype_size(f.kv_dtype));
  const float qscale2 = f.scale * kLog2e;
  char* ws =
      reinterpret_cast<char*>((reinterpret_cast<uintptr_t>(workspace) + 63) & ~uintptr_t{63});
  const size_t per = PerThreadBwd(f);

  auto head = [&](int64_t b, int64_t hq) {
    const Seq sz = SeqOf(f, b);
    const int64_t kvh = hq / g;
    Head h;
    auto qrows = [&](const void* base, int64_t sb, int64_t sh, int64_t ss, int64_t cols) {
      KvRows r;
      r.base = static_cast<const char*>(base) + QOff(f, b, hq, sb, sh, ss) * qes;
      r.row_bytes = ss * qes, r.dtype = f.dtype, r.cols = cols;
      return r;
    };
    h.q = qrows(f.q, f.q_sb, f.q_sh, f.q_ss, D);
    h.dout = qrows(a.dout, a.do_sb, a.do_sh, a.do_ss, Dv);
    h.o = static_cast<const char*>(f.o) + QOff(f, b, hq, f.o_sb, f.o_sh, f.o_ss) * qes;
    h.o_row = f.o_ss * qes;
    h.k = KvOf(f, false, b, kvh);
    h.v = KvOf(f, true, b, kvh);
    h.lse = f.lse + QOff(f, b, hq, f.lse_sb, f.lse_sh, f.lse_ss);
    h.lse_row = f.lse_ss;
    h.sq = sz.sq, h.sk = sz.sk;
    h.vis = VisibilityOf(f, sz.sq, sz.sk);
    h.slope2 = f.alibi ? f.alibi[hq] * kLog2e : 0.0f;
    h.mask = f.mask ? f.mask + b * f.mask_sb : nullptr;
    h.mask_row = f.mask_si;
    return h;
  };
  // Whether the tile pair (queries [i0, i1), keys [j0, j1)) has a visible key at all.
  auto overlaps = [](const Head& h, int64_t i0, int64_t i1, int64_t j0, int64_t j1) {
    return h.vis.hi(i1 - 1, h.sk) >= j0 && h.vis.lo(i0) <= j1 - 1;
  };

  // ---- pass 1: dK, dV per (sequence, kv head, key block) ----
  struct KTask {
    int64_t b, kvh, j0;
  };
  std::vector<KTask> kt;
  for (int64_t b = 0; b < f.batch; ++b)
    for (int64_t j0 = 0; j0 < SeqOf(f, b).sk; j0 += kBk)
      for (int64_t kvh = 0; kvh < f.kv_heads; ++kvh) kt.push_back({b, kvh, j0});
  RunTasks(f.threads, f.ftz, static_cast<int64_t>(kt.size()), ws, per, [&](int64_t t, char* mine) {
    const KTask& tk = kt[static_cast<size_t>(t)];
    const BwdScratch s = CarveBwd(mine, D, Dv);
    const Head h0 = head(tk.b, tk.kvh * g);
    const int64_t nk = std::min(kBk, h0.sk - tk.j0);
    int64_t lk, lv;
    const float* k = RowsF32(h0.k, tk.j0, nk, s.k, &lk);
    const float* v = RowsF32(h0.v, tk.j0, nk, s.v, &lv);
    std::memset(s.acc, 0, static_cast<size_t>(nk * D) * sizeof(float));
    std::memset(s.acc_v, 0, static_cast<size_t>(nk * Dv) * sizeof(float));
    for (int64_t hq = tk.kvh * g; hq < (tk.kvh + 1) * g; ++hq) {
      const Head h = head(tk.b, hq);
      for (int64_t i0 = 0; i0 < h.sq; i0 += kBq) {
        const int64_t nq = std::min(kBq, h.sq - i0);
        if (!overlaps(h, i0, i0 + nq, tk.j0, tk.j0 + nk)) continue;
        const float *q, *dout;
        int64_t lq, ldo;
        LoadQueryTile(h, i0, nq, f, s, &q, &lq, &dout, &ldo);
        TilePair(h, q, lq, dout, ldo, k, lk, v, lv, s, i0, nq, tk.j0, nk, D, Dv, qscale2);
        Gemm(s.acc_v, Dv, s.s, kBk, true, dout, ldo, false, nk, Dv, nq, true);
        Gemm(s.acc, D, s.dp, kBk, true, q, lq, false, nk, D, nq, true);
      }
    }
    const int64_t koff = f.cu_k ? f.cu_k[tk.b] : 0;
    char* dk = static_cast<char*>(a.dk) +
               ((f.cu_k ? koff * a.dk_ss : tk.b * a.dk_sb) + tk.kvh * a.dk_sh) * kes;
    char* dv = static_cast<char*>(a.dv) +
               ((f.cu_k ? koff * a.dv_ss : tk.b * a.dv_sb) + tk.kvh * a.dv_sh) * kes;
    StoreRows(dk + tk.j0 * a.dk_ss * kes, a.dk_ss * kes, f.kv_dtype, s.acc, nk, D, f.scale);
    StoreRows(dv + tk.j0 * a.dv_ss * kes, a.dv_ss * kes, f.kv_dtype, s.acc_v, nk, Dv, 1.0f);
  });

  // ---- pass 2: dQ per (sequence, q head, query tile) ----
  struct QTask {
    int64_t b, hq, i0;
  };
  std::vector<QTask> qt;
  for (int64_t b = 0; b < f.batch; ++b)
    for (int64_t i0 = 0; i0 < SeqOf(f, b).sq; i0 += kBq)
      for (int64_t hq = 0; hq < f.heads; ++hq) qt.push_back({b, hq, i0});
  RunTasks(f.threads, f.ftz, static_cast<int64_t>(qt.size()), ws, per, [&](int64_t t, char* mine) {
    const QTask& tk = qt[static_cast<size_t>(t)];
    const BwdScratch s = CarveBwd(mine, D, Dv);
    const Head h = head(tk.b, tk.hq);
    const int64_t nq = std::min(kBq, h.sq - tk.i0);
    const float *q, *dout;
    int64_t lq, ldo;
    LoadQueryTile(h, tk.i0, nq, f, s, &q, &lq, &dout, &ldo);
    std::memset(s.acc, 0, static_cast<size_t>(nq * D) * sizeof(float));
    for (int64_t j0 = 0; j0 < h.sk; j0 += kBk) {
      const int64_t nk = std::min(kBk, h.sk - j0);
      if (!overlaps(h, tk.i0, tk.i0 + nq, j0, j0 + nk)) continue;
      int64_t lk, lv;
      const float* k = RowsF32(h.k, j0, nk, s.k, &lk);
      const float* v = RowsF32(h.v, j0, nk, s.v, &lv);
      TilePair(h, q, lq, dout, ldo, k, lk, v, lv, s, tk.i0, nq, j0, nk, D, Dv, qscale2);
      Gemm(s.acc, D, s.dp, kBk, false, k, lk, false, nq, D, nk, true);
    }
    char* dq = static_cast<char*>(a.dq) + QOff(f, tk.b, tk.hq, a.dq_sb, a.dq_sh, a.dq_ss) * qes;
    StoreRows(dq + tk.i0 * a.dq_ss * qes, a.dq_ss * qes, f.dtype, s.acc, nq, D, f.scale);
  });
}

}  // namespace tboost::kernels::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace tboost::kernels {
HWY_EXPORT(AttentionBackwardWorkspace);
HWY_EXPORT(AttentionBackward);

size_t attention_backward_workspace(const AttentionBackwardArgs& a) {
  return HWY_DYNAMIC_DISPATCH(AttentionBackwardWorkspace)(a);
}
void attention_backward(const AttentionBackwardArgs& a, void* workspace) {
  if (a.f.block_table)
    throw Error(ErrorCode::kUnsupported, "attention backward: paged K/V is not supported");
  if (a.f.context_lens)
    throw Error(ErrorCode::kUnsupported, "attention backward: context_lens is not supported");
  HWY_DYNAMIC_DISPATCH(AttentionBackward)(a, workspace);
}
}  // namespace tboost::kernels
#endif
