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
// That is the two-pass path. f32, and bf16 where pairs can be dotted, take the one-pass path
// below: 5 products on our own kernels (vdpbf16ps for bf16), 1.5-3x faster at training shapes.
// clang-format off: Highway's per-target re-inclusion needs this exact order.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "src/kernels/cpu/attention_backward.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
// clang-format on

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <type_traits>
#include <vector>

#include "hwy/highway.h"
#include "src/kernels/cpu/attention-inl.h"
#include "src/kernels/cpu/hwy_util-inl.h"
#include "src/kernels/cpu/kernels.h"
#include "tboost/core/cpu_features.h"
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

// Whether the tile pair (queries [i0, i1), keys [j0, j1)) has a visible key at all.
inline bool Overlaps(const Head& h, int64_t i0, int64_t i1, int64_t j0, int64_t j1) {
  return h.vis.hi(i1 - 1, h.sk) >= j0 && h.vis.lo(i0) <= j1 - 1;
}

// S (in P) and dP (in dS) of queries [i0, i0+nq) and keys [j0, j0+nk), rows ld apart, become
// P = exp(S·scale + bias - lse) and dS = P ∘ (dP - delta) (unscaled); lanes past the row's
// visible keys, up to `width`, are 0. lse2 (log2 units) and delta are the queries' own.
void ScoresToGrads(const Head& h, float* Pm, float* dSm, int64_t ld, int64_t width, int64_t i0,
                   int64_t nq, int64_t j0, int64_t nk, const float* lse2s, const float* deltas,
                   float qscale2) {
  const DF d;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  const auto lanes = hn::Iota(d, 0.0f);
  for (int64_t r = 0; r < nq; ++r) {
    const int64_t i = i0 + r;
    float* P = Pm + r * ld;
    float* dS = dSm + r * ld;
    // Visible keys of this row inside the block; the rest get P = dS = 0.
    const int64_t lo = std::max(j0, h.vis.lo(i)), hi = std::min(j0 + nk - 1, h.vis.hi(i, h.sk));
    const float lse2 = lse2s[r];
    if (hi < lo || std::isinf(lse2)) {
      std::memset(P, 0, static_cast<size_t>(width) * sizeof(float));
      std::memset(dS, 0, static_cast<size_t>(width) * sizeof(float));
      continue;
    }
    for (int64_t c = 0; c < lo - j0; ++c) P[c] = dS[c] = 0.0f;
    for (int64_t c = hi - j0 + 1; c < width; ++c) P[c] = dS[c] = 0.0f;
    const auto qs = hn::Set(d, qscale2), l2 = hn::Set(d, lse2), dl = hn::Set(d, deltas[r]);
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

// One tile pair of the two-pass path: queries [i0, i0+nq) (their q, dO in s.q/s.dout with lds lq,
// ldo; lse2 and delta in s.lse2/s.delta) against keys [j0, j0+nk) (k, v at lk, lv). Leaves P
// in s.s and dS (unscaled) in s.dp, both (nq x nk) with leading dimension kBk.
void TilePair(const Head& h, const float* q, int64_t lq, const float* dout, int64_t ldo,
              const float* k, int64_t lk, const float* v, int64_t lv, const BwdScratch& s,
              int64_t i0, int64_t nq, int64_t j0, int64_t nk, int64_t D, int64_t Dv,
              float qscale2) {
  Gemm(s.s, kBk, q, lq, false, k, lk, true, nq, nk, D, false);
  Gemm(s.dp, kBk, dout, ldo, false, v, lv, true, nq, nk, Dv, false);
  ScoresToGrads(h, s.s, s.dp, kBk, nk, i0, nq, j0, nk, s.lse2, s.delta, qscale2);
}

// Statistics of head h's queries [i0, i0+n): lse in log2 units and delta_i = dO_i · O_i
// (= rowsum(P ∘ dP)), f32 sums of the rows as stored (T).
template <class T>
void QueryStats(const Head& h, int64_t i0, int64_t n, int64_t Dv, float* lse2, float* delta) {
  const DF d;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  for (int64_t r = 0; r < n; ++r) {
    const int64_t i = i0 + r;
    const float l = h.lse[i * h.lse_row];
    lse2[r] = std::isinf(l) ? l : l * kLog2e;
    const T* orow = reinterpret_cast<const T*>(h.o + i * h.o_row);
    const T* drow = reinterpret_cast<const T*>(h.dout.base + i * h.dout.row_bytes);
    auto acc = hn::Zero(d);
    for (int64_t c = 0; c < Dv; c += N) {
      const int64_t m = std::min(N, Dv - c);
      acc = hn::MulAdd(LoadN(d, drow + c, m), LoadN(d, orow + c, m), acc);
    }
    delta[r] = ReduceSumF(d, acc);
  }
}

// Loads the query tile's q and dO (as f32), lse in log2 units and delta = dO·O.
void LoadQueryTile(const Head& h, int64_t i0, int64_t nq, const AttentionArgs& f,
                   const BwdScratch& s, const float** q, int64_t* lq, const float** dout,
                   int64_t* ldo) {
  *q = RowsF32(h.q, i0, nq, s.q, lq);
  *dout = RowsF32(h.dout, i0, nq, s.dout, ldo);
  switch (f.dtype) {
    case DType::kBF16:
      return QueryStats<bf16_t>(h, i0, nq, f.v_head_dim, s.lse2, s.delta);
    case DType::kF16:
      return QueryStats<f16_t>(h, i0, nq, f.v_head_dim, s.lse2, s.delta);
    default:
      return QueryStats<float>(h, i0, nq, f.v_head_dim, s.lse2, s.delta);
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

// ---- one-pass path ------------------------------------------------------------------------
// f32 q, k, v, or bf16 ones where bf16 pairs can be dotted (vdpbf16ps on AVX512_BF16, or its
// emulation when forced): the five products run on our register-blocked kernels straight from
// the rows, and the backward is one pass (FlashAttention-2's order): one task per (sequence, kv
// head) visits its key blocks in order and, for each, every query tile of every q head of the
// group. A product's reduction runs over steps: one f32 value, or one bf16 pair (u32):
//   S  = Q·Kᵀ, dP = dO·Vᵀ              steps over the head dim: Q, dO rows read in place, K, V
//                                      blocks packed transposed (Kt, Vt: steps x keys)
//   P, dS as in the two-pass path; bf16: then rounded to bf16, as flash attention does on GPUs
//   dVᵀ += dOᵀ·P, dKᵀ += Qᵀ·dS        steps over queries: the tile's Qᵀ, dOᵀ (packed once per
//                                      task); bf16: P and dS interleaved two query rows at a time
//   dQ += dS·K                         steps over keys: K rows (bf16: interleaved in pairs)
// dK, dV of a block are complete when its loop ends; dQ accumulates in f32 over the blocks,
// in block order, in the task's own buffer (g·sq·D floats: the price of 5 products instead of
// 7). One task owns every output it writes, so bits do not depend on the thread count. The
// two-pass path remains for mixed dtypes, bf16 without pair dots and huge row strides. At
// training shapes (T = 256, D = 64) it ran at ~36 GFLOP/s in bf16 on Zen 4 (20% of it widening
// tiles for oneDNN) and ~47 in f32; this path at ~125 and ~85.
constexpr int64_t kPq = 64, kPk = 64;  // queries per tile, keys per block (multiples of 2N)
// Micro-tile: rows x vectors. AVX-512: 24 accumulators of 32 registers; elsewhere 8 of 16.
#if HWY_TARGET <= HWY_AVX3
constexpr int kPr = 6, kPw = 4;
#else
constexpr int kPr = 4, kPw = 2;
#endif

// Pair p (elements 2p, 2p+1) of a bf16 row at any address.
HWY_INLINE uint32_t Word(const uint16_t* row, int64_t p) {
  uint32_t w;
  std::memcpy(&w, row + 2 * p, sizeof(w));
  return w;
}

// The two element types of the one-pass backward. A product's reduction runs over "steps": a
// bf16 pair (Pairs) or one f32 value (F32). A holds rows of steps (broadcast one at a time), B
// rows of vectors, one row per step.
template <class Dot>
struct Pairs {
  using A = uint16_t;                 // a row of bf16 values, read as pairs
  using B = uint32_t;                 // a vector of bf16 pairs
  static constexpr int64_t kPer = 2;  // elements per step
  static TBOOST_PAIR_ATTR HWY_INLINE VU Bcast(const A* row, int64_t p) {
    return hn::Set(DU(), Word(row, p));
  }
  static TBOOST_PAIR_ATTR HWY_INLINE VU Load(const B* p) { return hn::LoadU(DU(), p); }
  static TBOOST_PAIR_ATTR HWY_INLINE VF Madd(VF acc, VU a, VU b) { return Dot::Apply(acc, a, b); }
};
struct F32 {
  using A = float;
  using B = float;
  static constexpr int64_t kPer = 1;
  static HWY_INLINE VF Bcast(const A* row, int64_t p) { return hn::Set(DF(), row[p]); }
  static HWY_INLINE VF Load(const B* p) { return hn::LoadU(DF(), p); }
  static HWY_INLINE VF Madd(VF acc, VF a, VF b) { return hn::MulAdd(a, b, acc); }
};
// C (R x W vectors, ldc) = [C +] A · B: A's row r holds P steps at A + r·lda, B holds P rows of
// W vectors (ldb). The body is spelled once and compiled twice: the pair kernels carry the
// AVX512_BF16 attribute, which the f32 ones must not (a function with it cannot be inlined into
// one without, nor the other way round).
#define TBOOST_STEP_MM(NAME, ATTR)                                                               \
  template <int R, int W, class E>                                                               \
  ATTR HWY_NOINLINE void NAME(const typename E::A* HWY_RESTRICT A, int64_t lda,                  \
                              const typename E::B* HWY_RESTRICT B, int64_t ldb, int64_t P,       \
                              float* HWY_RESTRICT C, int64_t ldc, bool acc) {                    \
    const DF d;                                                                                  \
    const int64_t N = static_cast<int64_t>(hn::Lanes(d));                                        \
    using VB = decltype(E::Load(B));                                                             \
    VF c[R][W];                                                                                  \
    _Pragma("GCC unroll 8") for (int r = 0; r < R; ++r)                                          \
        _Pragma("GCC unroll 4") for (int w = 0; w < W; ++w) c[r][w] =                            \
            acc ? hn::LoadU(d, C + r * ldc + w * N) : hn::Zero(d);                               \
    for (int64_t p = 0; p < P; ++p) {                                                            \
      VB b[W];                                                                                   \
      _Pragma("GCC unroll 4") for (int w = 0; w < W; ++w) b[w] = E::Load(B + p * ldb + w * N);   \
      _Pragma("GCC unroll 8") for (int r = 0; r < R; ++r) {                                      \
        const VB a = E::Bcast(A + r * lda, p);                                                   \
        _Pragma("GCC unroll 4") for (int w = 0; w < W; ++w) c[r][w] = E::Madd(c[r][w], a, b[w]); \
      }                                                                                          \
    }                                                                                            \
    _Pragma("GCC unroll 8") for (int r = 0; r < R; ++r)                                          \
        _Pragma("GCC unroll 4") for (int w = 0; w < W; ++w)                                      \
            hn::StoreU(c[r][w], d, C + r * ldc + w * N);                                         \
  }
TBOOST_STEP_MM(StepMM, )
TBOOST_STEP_MM(PairMM, TBOOST_PAIR_ATTR)
#undef TBOOST_STEP_MM

template <class E>
struct StepMMs {
  using AT = typename E::A;
  using BT = typename E::B;
  using Fn = void (*)(const AT*, int64_t, const BT*, int64_t, int64_t, float*, int64_t, bool);
  template <int W, int R>
  static constexpr Fn One() {
    if constexpr (std::is_same_v<E, F32>) {
      return &StepMM<R, W, E>;
    } else {
      return &PairMM<R, W, E>;
    }
  }
  template <int W, int... R>
  static constexpr std::array<Fn, kPr> Row(std::integer_sequence<int, R...>) {
    return {One<W, R + 1>()...};
  }
  template <int... W>
  static constexpr std::array<std::array<Fn, kPr>, kPw> Table(std::integer_sequence<int, W...>) {
    return {Row<W + 1>(std::make_integer_sequence<int, kPr>())...};
  }
  // C (rows x vecs vectors) = [C +] A (rows x P steps) · B (P x vecs vectors).
  static void Run(const AT* A, int64_t lda, int64_t rows, const BT* B, int64_t ldb, int64_t P,
                  int64_t vecs, float* C, int64_t ldc, bool acc) {
    static constexpr auto t = Table(std::make_integer_sequence<int, kPw>());
    const int64_t N = static_cast<int64_t>(hn::Lanes(DF()));
    for (int64_t v = 0; v < vecs; v += kPw) {
      const auto& row = t[static_cast<size_t>(std::min<int64_t>(kPw, vecs - v) - 1)];
      int64_t r = 0;
      for (; r + kPr <= rows; r += kPr)
        row[kPr - 1](A + r * lda, lda, B + v * N, ldb, P, C + r * ldc + v * N, ldc, acc);
      if (r < rows)
        row[static_cast<size_t>(rows - r - 1)](A + r * lda, lda, B + v * N, ldb, P,
                                               C + r * ldc + v * N, ldc, acc);
    }
  }
};

// bf16 bits of each lane in the low half of a u32 lane (round to nearest even, NaN kept).
HWY_INLINE VU Bf16Low(VF v) {
  const DF d;
  const DU du;
  return hn::PromoteTo(du, Bf16Bits(d, v));
}

// Out[p][j] = bf16 pair (X[2p][j], X[2p+1][j]) for rows [0, n) of f32 X (lanes wide, ld lanes);
// a missing odd row is 0.
inline void PackRowPairs(const float* X, int64_t n, int64_t lanes, uint32_t* out) {
  const DF d;
  const DU du;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  for (int64_t p = 0; p < (n + 1) / 2; ++p) {
    const float* lo = X + 2 * p * lanes;
    for (int64_t j = 0; j < lanes; j += N) {
      VU w = Bf16Low(hn::LoadU(d, lo + j));
      if (2 * p + 1 < n) w = hn::Or(w, hn::ShiftLeft<16>(Bf16Low(hn::LoadU(d, lo + lanes + j))));
      hn::StoreU(w, du, out + p * lanes + j);
    }
  }
}

// Byte offsets of rows [r, r + N) (row_bytes apart) that are below n; 0 (row 0: readable) for
// the rest, whose lanes `valid` leaves out.
HWY_INLINE hn::Vec<hn::RebindToSigned<DU>> RowOffsets(int64_t r, int64_t n, int64_t row_bytes,
                                                      int64_t step, hn::Mask<DU>* valid) {
  const hn::RebindToSigned<DU> di;
  const auto rows = hn::Add(hn::Mul(hn::Iota(di, 0), hn::Set(di, static_cast<int32_t>(step))),
                            hn::Set(di, static_cast<int32_t>(r)));
  const auto in = hn::Lt(rows, hn::Set(di, static_cast<int32_t>(n)));
  *valid = hn::RebindMask(DU(), in);
  return hn::IfThenElseZero(in, hn::Mul(rows, hn::Set(di, static_cast<int32_t>(row_bytes))));
}

// The bf16 rows [r0, r0+n) of a head (row r at base + r·ld, cols wide, cols even) as pairs over
// the cols, transposed: Out[p][r - r0] (ld lanes, a multiple of N; rows past n are 0). One
// gather per N rows (byte offsets: any row stride below 2^31 / lanes bytes).
inline void PackPairsT(const uint16_t* base, int64_t ld, int64_t r0, int64_t n, int64_t cols,
                       int64_t lanes, uint32_t* out) {
  const DU du;
  const int64_t N = static_cast<int64_t>(hn::Lanes(du));
  const char* b0 = reinterpret_cast<const char*>(base + r0 * ld);
  for (int64_t r = 0; r < lanes; r += N) {
    hn::Mask<DU> valid;
    const auto off = RowOffsets(r, n, ld * 2, 1, &valid);
    for (int64_t p = 0; p < cols / 2; ++p) {
      const auto w = hn::GatherOffset(du, reinterpret_cast<const uint32_t*>(b0 + 4 * p), off);
      hn::StoreU(hn::IfThenElseZero(valid, w), du, out + p * lanes + r);
    }
  }
}

// Out[p][c] = (X[2p][c], X[2p+1][c]) for bf16 rows [r0, r0+n) (ld apart, cols wide); lanes
// per pair row, columns past cols and a missing odd row are 0.
inline void PackRowsInterleaved(const uint16_t* base, int64_t ld, int64_t r0, int64_t n,
                                int64_t cols, int64_t lanes, uint32_t* out) {
  const DU du;
  const hn::Rebind<uint16_t, DU> d16;
  const int64_t N = static_cast<int64_t>(hn::Lanes(du));
  for (int64_t p = 0; p < (n + 1) / 2; ++p) {
    const uint16_t* lo = base + (r0 + 2 * p) * ld;
    const uint16_t* hi = 2 * p + 1 < n ? lo + ld : nullptr;
    uint32_t* dst = out + p * lanes;
    int64_t c = 0;
    for (; c + N <= cols; c += N) {
      auto w = hn::PromoteTo(du, hn::LoadU(d16, lo + c));
      if (hi) w = hn::Or(w, hn::ShiftLeft<16>(hn::PromoteTo(du, hn::LoadU(d16, hi + c))));
      hn::StoreU(w, du, dst + c);
    }
    for (; c < cols; ++c) dst[c] = lo[c] | (hi ? static_cast<uint32_t>(hi[c]) << 16 : 0u);
    std::fill(dst + cols, dst + lanes, 0u);
  }
}

// The bf16 rows [r0, r0+n) transposed: Out[c][r - r0] (u16, lanes per row, a multiple of 2N;
// rows past n are 0; cols even). Gathers a column pair of N even and N odd rows at a time.
inline void PackT16(const uint16_t* base, int64_t ld, int64_t r0, int64_t n, int64_t cols,
                    int64_t lanes, uint16_t* out) {
  const DU du;
  const int64_t N = static_cast<int64_t>(hn::Lanes(du));
  const char* b0 = reinterpret_cast<const char*>(base + r0 * ld);
  const auto low = hn::Set(du, 0xFFFFu), high = hn::Set(du, 0xFFFF0000u);
  for (int64_t r = 0; r < lanes; r += 2 * N) {
    hn::Mask<DU> ve, vo;
    const auto oe = RowOffsets(r, n, ld * 2, 2, &ve), oo = RowOffsets(r + 1, n, ld * 2, 2, &vo);
    for (int64_t c = 0; c < cols; c += 2) {
      const uint32_t* col = reinterpret_cast<const uint32_t*>(b0 + 2 * c);
      const auto e = hn::IfThenElseZero(ve, hn::GatherOffset(du, col, oe));
      const auto o = hn::IfThenElseZero(vo, hn::GatherOffset(du, col, oo));
      hn::StoreU(hn::Or(hn::And(e, low), hn::ShiftLeft<16>(o)), du,
                 reinterpret_cast<uint32_t*>(out + c * lanes + r));
      hn::StoreU(hn::Or(hn::ShiftRight<16>(e), hn::And(o, high)), du,
                 reinterpret_cast<uint32_t*>(out + (c + 1) * lanes + r));
    }
  }
}

struct OnePassDims {
  int64_t g, sq, D, Dv, Dp, Dvp, tiles;  // sq: the longest sequence's queries
  size_t es;                             // bytes per element: 2 (bf16 pairs) or 4 (f32)
  explicit OnePassDims(const AttentionArgs& f)
      : g(Group(f)),
        sq(f.sq),
        D(f.head_dim),
        Dv(f.v_head_dim),
        Dp(RoundUp(f.head_dim, static_cast<int64_t>(hn::Lanes(DF())))),
        Dvp(RoundUp(f.v_head_dim, static_cast<int64_t>(hn::Lanes(DF())))),
        tiles((f.sq + kPq - 1) / kPq),
        es(dtype_size(f.dtype)) {}
};
// Packed operands are raw bytes: bf16 pairs (u32 words) or f32 values, per the path.
struct OnePassScratch {
  float *s, *dp, *dkt, *dvt, *lse2, *delta, *dq;
  void *kt, *vt, *kv, *qt, *dot;
  uint32_t *pi, *dsi;
  uint16_t* ds;
};
// Per-thread: the tiles (~100 KiB at D = 64 in bf16), then the task's per-query buffers.
// With p null only the size is computed.
OnePassScratch CarveOnePass(char* p, const OnePassDims& z, size_t* bytes = nullptr) {
  size_t off = 0;
  auto take = [&](int64_t n, size_t es) {
    char* r = p ? p + off : nullptr;
    off += Align64(static_cast<size_t>(n) * es);
    return r;
  };
  OnePassScratch s;
  s.s = reinterpret_cast<float*>(take(kPq * kPk, 4));
  s.dp = reinterpret_cast<float*>(take(kPq * kPk, 4));
  // Whole vectors of rows: the gathers of dK, dV rows read a last partial vector whole.
  s.dkt = reinterpret_cast<float*>(take(z.Dp * kPk, 4));
  s.dvt = reinterpret_cast<float*>(take(z.Dvp * kPk, 4));
  s.kt = take(z.D * kPk, z.es);
  s.vt = take(z.Dv * kPk, z.es);
  s.kv = take(kPk * z.Dp, z.es);
  const bool pairs = z.es == 2;
  s.pi = reinterpret_cast<uint32_t*>(take(pairs ? kPq / 2 * kPk : 0, 4));
  s.dsi = reinterpret_cast<uint32_t*>(take(pairs ? kPq / 2 * kPk : 0, 4));
  s.ds = reinterpret_cast<uint16_t*>(take(pairs ? kPq * kPk : 0, 2));
  const int64_t rows = z.g * z.tiles * kPq;
  s.lse2 = reinterpret_cast<float*>(take(rows, 4));
  s.delta = reinterpret_cast<float*>(take(rows, 4));
  s.dq = reinterpret_cast<float*>(take(rows * z.Dp, 4));
  s.qt = take(rows * z.D, z.es);
  s.dot = take(rows * z.Dv, z.es);
  if (bytes) *bytes = off;
  return s;
}
size_t PerThreadOnePass(const AttentionArgs& f) {
  size_t bytes = 0;
  CarveOnePass(nullptr, OnePassDims(f), &bytes);
  return bytes + 64;
}
// The one-pass path's dtypes: f32 everywhere, or bf16 everywhere with even head dims where pairs
// can be dotted (vdpbf16ps, or its emulation when forced).
bool OnePassDtypes(const AttentionArgs& f) {
  const bool native = TBOOST_ATTN_BF16_NATIVE && cpu_features().avx512_bf16;
  if (f.dtype != f.kv_dtype) return false;
  if (f.dtype == DType::kF32) return true;
  return f.dtype == DType::kBF16 && f.head_dim % 2 == 0 && f.v_head_dim % 2 == 0 &&
         (native || f.force_bf16_pairs);
}
// And the shape: at least two tasks (sequences x kv heads), else one core would do all the work;
// per-thread buffers (linear in the sequence length) up to 64 MiB; rows close enough that the
// gathers' 32-bit byte offsets reach a whole tile. Shape only, never the thread count, so the
// bits stay the same for any thread count.
bool OnePassFits(const AttentionArgs& f) {
  return OnePassDtypes(f) && f.batch * f.kv_heads >= 2 && PerThreadOnePass(f) <= (size_t{64} << 20);
}
bool UseOnePass(const AttentionBackwardArgs& a) {
  const AttentionArgs& f = a.f;
  const int64_t widest = std::max({f.q_ss, f.k_ss, f.v_ss, a.do_ss});
  return OnePassFits(f) && widest * 4 * std::max(kPq, kPk) < (int64_t{1} << 31);
}

// f32 rows [r0, r0+n) (ld floats apart, cols wide) copied with rows lanes wide (zeros past cols).
inline void PackRowsPadded(const float* base, int64_t ld, int64_t r0, int64_t n, int64_t cols,
                           int64_t lanes, float* out) {
  for (int64_t r = 0; r < n; ++r) {
    std::memcpy(out + r * lanes, base + (r0 + r) * ld, static_cast<size_t>(cols) * sizeof(float));
    std::fill(out + r * lanes + cols, out + (r + 1) * lanes, 0.0f);
  }
}

// One task of the one-pass path: sequence b, kv head kvh, whose g q heads are hs[0..g). E is
// the element policy (Pairs<Dot> for bf16, F32), T the tensors' element type.
template <class E, class T>
void OnePassTask(const AttentionBackwardArgs& a, const OnePassDims& z, const Head* hs, int64_t b,
                 int64_t kvh, const OnePassScratch& s) {
  using MM = StepMMs<E>;
  using AT = typename E::A;
  using BT = typename E::B;
  constexpr bool kPairs = E::kPer == 2;
  constexpr int64_t es = sizeof(T), per = E::kPer;
  // Rows viewed as u16 (two per f32 value): the packs below gather u32 words of them.
  constexpr int64_t h16 = es / 2;
  const AttentionArgs& f = a.f;
  const DF d;
  const hn::Rebind<uint16_t, DF> d16;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  const int64_t D = z.D, Dv = z.Dv, Dp = z.Dp, g = z.g, kvec = kPk / N;
  const float qscale2 = f.scale * kLog2e;
  const int64_t sq = hs[0].sq, sk = hs[0].sk, tiles = (sq + kPq - 1) / kPq;
  auto u16 = [](const KvRows& r) { return reinterpret_cast<const uint16_t*>(r.base); };
  auto rows = [](const KvRows& r) { return reinterpret_cast<const AT*>(r.base); };
  auto ld = [](const KvRows& r) { return r.row_bytes / static_cast<int64_t>(sizeof(AT)); };
  AT* qt = static_cast<AT*>(s.qt);
  AT* dot = static_cast<AT*>(s.dot);
  // The rows of a block (or tile) are far apart in packed layouts and touched once per task:
  // the next ones are asked for (PrefetchRows) while this one computes.
  // Transposed rows: bf16 values (pairs over the rows), or f32 values as u32 words.
  auto pack_t = [&](const KvRows& r, int64_t r0, int64_t n, int64_t cols, int64_t lanes, AT* out) {
    if constexpr (kPairs) {
      PackT16(u16(r), ld(r), r0, n, cols, lanes, out);
    } else {
      PackPairsT(u16(r), ld(r) * 2, r0, n, cols * 2, lanes, reinterpret_cast<uint32_t*>(out));
    }
  };
  // Per head: statistics, the tiles' Qᵀ and dOᵀ, dQ = 0. Head hl's rows start at hl·tiles·kPq.
  for (int64_t hl = 0; hl < g; ++hl) {
    const Head& h = hs[hl];
    const int64_t r0 = hl * tiles * kPq;
    QueryStats<T>(h, 0, sq, Dv, s.lse2 + r0, s.delta + r0);
    PrefetchRows(h.q, 0, std::min(kPq, sq));
    PrefetchRows(h.dout, 0, std::min(kPq, sq));
    for (int64_t t = 0; t < tiles; ++t) {
      const int64_t nq = std::min(kPq, sq - t * kPq);
      if (t + 1 < tiles) {
        PrefetchRows(h.q, (t + 1) * kPq, std::min(sq, (t + 2) * kPq));
        PrefetchRows(h.dout, (t + 1) * kPq, std::min(sq, (t + 2) * kPq));
      }
      pack_t(h.q, t * kPq, nq, D, kPq, qt + (r0 + t * kPq) * D);
      pack_t(h.dout, t * kPq, nq, Dv, kPq, dot + (r0 + t * kPq) * Dv);
    }
    std::fill(s.dq + r0 * Dp, s.dq + (r0 + sq) * Dp, 0.0f);
  }
  const int64_t koff = f.cu_k ? f.cu_k[b] : 0;
  char* dk =
      static_cast<char*>(a.dk) + ((f.cu_k ? koff * a.dk_ss : b * a.dk_sb) + kvh * a.dk_sh) * es;
  char* dv =
      static_cast<char*>(a.dv) + ((f.cu_k ? koff * a.dv_ss : b * a.dv_sb) + kvh * a.dv_sh) * es;
  const KvRows& K = hs[0].k;
  const KvRows& V = hs[0].v;
  BT* kt = static_cast<BT*>(s.kt);
  BT* vt = static_cast<BT*>(s.vt);
  BT* kv = static_cast<BT*>(s.kv);
  PrefetchRows(K, 0, std::min(kPk, sk));
  PrefetchRows(V, 0, std::min(kPk, sk));
  for (int64_t j0 = 0; j0 < sk; j0 += kPk) {
    const int64_t nk = std::min(kPk, sk - j0);
    if (j0 + kPk < sk) {
      PrefetchRows(K, j0 + kPk, std::min(sk, j0 + 2 * kPk));
      PrefetchRows(V, j0 + kPk, std::min(sk, j0 + 2 * kPk));
    }
    // Kᵀ, Vᵀ in steps over the head dim (S, dP); K rows in steps over the keys (dQ).
    PackPairsT(u16(K), ld(K) * h16, j0, nk, D * h16, kPk, reinterpret_cast<uint32_t*>(kt));
    PackPairsT(u16(V), ld(V) * h16, j0, nk, Dv * h16, kPk, reinterpret_cast<uint32_t*>(vt));
    if constexpr (kPairs) {
      PackRowsInterleaved(u16(K), ld(K), j0, nk, D, Dp, kv);
    } else {
      PackRowsPadded(rows(K), ld(K), j0, nk, D, Dp, kv);
    }
    std::fill(s.dkt, s.dkt + Dp * kPk, 0.0f);
    std::fill(s.dvt, s.dvt + z.Dvp * kPk, 0.0f);
    for (int64_t hl = 0; hl < g; ++hl) {
      const Head& h = hs[hl];
      const int64_t lq = ld(h.q), ldo = ld(h.dout);
      for (int64_t t = 0; t < tiles; ++t) {
        const int64_t i0 = t * kPq, nq = std::min(kPq, sq - i0), r0 = hl * tiles * kPq + i0;
        if (!Overlaps(h, i0, i0 + nq, j0, j0 + nk)) continue;
        MM::Run(rows(h.q) + i0 * lq, lq, nq, kt, kPk, D / per, kvec, s.s, kPk, false);
        MM::Run(rows(h.dout) + i0 * ldo, ldo, nq, vt, kPk, Dv / per, kvec, s.dp, kPk, false);
        ScoresToGrads(h, s.s, s.dp, kPk, kPk, i0, nq, j0, nk, s.lse2 + r0, s.delta + r0, qscale2);
        // dVᵀ += dOᵀ·P, dKᵀ += Qᵀ·dS (steps over the queries), dQ += dS·K (over the keys).
        const int64_t pq = (nq + per - 1) / per, pk = (nk + per - 1) / per;
        if constexpr (kPairs) {
          PackRowPairs(s.s, nq, kPk, s.pi);
          PackRowPairs(s.dp, nq, kPk, s.dsi);
          for (int64_t r = 0; r < nq; ++r)
            for (int64_t j = 0; j < kPk; j += N)
              hn::StoreU(Bf16Bits(d, hn::LoadU(d, s.dp + r * kPk + j)), d16, s.ds + r * kPk + j);
          MM::Run(dot + r0 * Dv, kPq, Dv, s.pi, kPk, pq, kvec, s.dvt, kPk, true);
          MM::Run(qt + r0 * D, kPq, D, s.dsi, kPk, pq, kvec, s.dkt, kPk, true);
          MM::Run(s.ds, kPk, nq, kv, Dp, pk, Dp / N, s.dq + r0 * Dp, Dp, true);
        } else {
          MM::Run(dot + r0 * Dv, kPq, Dv, s.s, kPk, pq, kvec, s.dvt, kPk, true);
          MM::Run(qt + r0 * D, kPq, D, s.dp, kPk, pq, kvec, s.dkt, kPk, true);
          MM::Run(s.dp, kPk, nq, kv, Dp, pk, Dp / N, s.dq + r0 * Dp, Dp, true);
        }
      }
    }
    // dK, dV rows: columns of dKᵀ, dVᵀ, gathered.
    const hn::RebindToSigned<DF> di;
    const auto cols = hn::Mul(hn::Iota(di, 0), hn::Set(di, static_cast<int32_t>(kPk)));
    const auto sc = hn::Set(d, f.scale);
    for (int64_t j = 0; j < nk; ++j) {
      T* kr = reinterpret_cast<T*>(dk + (j0 + j) * a.dk_ss * es);
      T* vr = reinterpret_cast<T*>(dv + (j0 + j) * a.dv_ss * es);
      for (int64_t c = 0; c < D; c += N)
        StoreN(d, hn::Mul(hn::GatherIndex(d, s.dkt + c * kPk + j, cols), sc), kr + c,
               std::min(N, D - c));
      for (int64_t c = 0; c < Dv; c += N)
        StoreN(d, hn::GatherIndex(d, s.dvt + c * kPk + j, cols), vr + c, std::min(N, Dv - c));
    }
  }
  for (int64_t hl = 0; hl < g; ++hl) {
    char* dq = static_cast<char*>(a.dq) + QOff(f, b, kvh * g + hl, a.dq_sb, a.dq_sh, a.dq_ss) * es;
    const float* src = s.dq + hl * tiles * kPq * Dp;
    const auto sc = hn::Set(d, f.scale);
    for (int64_t i = 0; i < sq; ++i) {
      T* row = reinterpret_cast<T*>(dq + i * a.dq_ss * es);
      for (int64_t c = 0; c < D; c += N)
        StoreN(d, hn::Mul(hn::LoadU(d, src + i * Dp + c), sc), row + c, std::min(N, D - c));
    }
  }
}

}  // namespace

size_t AttentionBackwardWorkspace(const AttentionBackwardArgs& a) {
  // Both paths' needs where the dtypes allow the one-pass path: the choice also depends on the
  // strides, which setup may not know yet (dO's).
  const size_t per =
      OnePassFits(a.f) ? std::max(PerThreadOnePass(a.f), PerThreadBwd(a.f)) : PerThreadBwd(a.f);
  return static_cast<size_t>(std::max(1, a.f.threads)) * per + 64;
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

  if (UseOnePass(a)) {
    const OnePassDims z(f);
    const size_t pper = PerThreadOnePass(f);
    const bool native = TBOOST_ATTN_BF16_NATIVE && cpu_features().avx512_bf16;
    RunTasks(f.threads, f.ftz, f.batch * f.kv_heads, ws, pper, [&](int64_t t, char* mine) {
      const int64_t b = t / f.kv_heads, kvh = t % f.kv_heads;
      const OnePassScratch s = CarveOnePass(mine, z);
      std::vector<Head> hs;
      for (int64_t hq = kvh * g; hq < (kvh + 1) * g; ++hq) hs.push_back(head(b, hq));
      if (f.dtype == DType::kF32) {
        OnePassTask<F32, float>(a, z, hs.data(), b, kvh, s);
      } else if (native) {
#if TBOOST_ATTN_BF16_NATIVE
        OnePassTask<Pairs<PairDotNative>, bf16_t>(a, z, hs.data(), b, kvh, s);
#endif
      } else {
        OnePassTask<Pairs<PairDotEmu>, bf16_t>(a, z, hs.data(), b, kvh, s);
      }
    });
    return;
  }

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
        if (!Overlaps(h, i0, i0 + nq, tk.j0, tk.j0 + nk)) continue;
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
      if (!Overlaps(h, tk.i0, tk.i0 + nq, j0, j0 + nk)) continue;
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
