// Attention forward on the CPU (Highway): flash attention for prefill, split-KV decoding.
//
// Prefill (FlashChunk): one task is one (sequence, q head, chunk of tiles of Br queries).
// Each tile's queries are packed transposed, Qt (D x Br), pre-multiplied by scale·log2(e) so
// the softmax runs on exp2. Keys are visited in blocks of Bc (kv_block); each block of K and
// V is read in place (any row stride: layouts and paged blocks only change row addresses;
// non-f32 or page-straddling rows are first converted into a per-thread f32 copy) and serves
// all the chunk's tiles while it is in L2:
//   St (Bc x Br) = K · Qt          register-blocked: kR keys x kV vectors of queries
//   mask / ALiBi / custom mask     only on blocks that cross a boundary
//   online softmax                 vectorized over the queries (one lane per query)
//   O (Br x Dv) = O·alpha + Ptᵀ · V   register-blocked: kQ queries x 2-3 vectors of features
// Per-thread memory is the chunk's Qt and output rows (sized from L2) and one f32 K/V
// block: O(tiles·Br·(D + Dv) + Bc·(D + Dv)), independent of the sequence length; the T x T
// scores never exist. Measured on AVX2: sharing each block among up to 32 tiles (512
// queries) instead of 1 raised the f32 rate from ~35% to ~50% of the FMA peak, because K and
// V then stream from L3 once per chunk rather than once per tile.
//
// Why our own micro-kernels rather than oneDNN: a library call per (Br x Bc) tile costs more
// than the tile's arithmetic, and the online softmax must sit between the two products.
//
// Decode (DecodeTask): with few query rows per kv head (Sq · Hq/Hkv <= kMaxDecodeRows) a
// tile of Br queries would be mostly padding and the products would be bound by broadcasts,
// so each key row is instead streamed once and dotted with every query row of its kv head
// (GQA heads share the read). The keys of each (sequence, kv head) are split into chunks
// (flash-decoding) so that batch-1 decode keeps every thread busy; the chunks' partial
// results (max, sum, unnormalized output) are merged by log-sum-exp at the end.
//
// Tasks go to threads through an atomic counter, heaviest first (causal tiles near the end of
// the sequence see the most keys). Every task is computed by one thread in a fixed order, so
// results do not depend on the thread count or on timing.
// clang-format off: Highway's per-target re-inclusion needs this exact order.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "src/kernels/cpu/attention.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
// clang-format on

#include <omp.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <utility>
#include <vector>

#include "hwy/highway.h"
#include "src/core/parallel.h"
#include "src/kernels/cpu/hwy_util-inl.h"
#include "src/kernels/cpu/kernels.h"
#include "tboost/core/cpu_features.h"

HWY_BEFORE_NAMESPACE();
namespace tboost::kernels::HWY_NAMESPACE {

using DF = hn::ScalableTag<float>;
using VF = hn::Vec<DF>;

// Register blocking: kR rows (keys in K·Qt, features in Vᵀ·Pt) x kV vectors of queries.
// AVX2 has 16 vector registers: 6 x 2 accumulators + 2 loads + 1 broadcast. AVX-512 has 32.
#if HWY_TARGET <= HWY_AVX3
constexpr int kR = 8;
#else
constexpr int kR = 6;
#endif
constexpr int kV = 2;
constexpr int64_t kMaxDecodeRows = 8;  // query rows per kv head handled by the decode path
constexpr int64_t kDecodeSub = 128;    // keys scored at once in a decode task
// Keys per decode chunk: fixed, so the split (and the rounding of the merge) depends on the
// context length only, never on the thread count.
constexpr int64_t kDecodeChunk = 512;
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

inline int64_t Br() { return kV * static_cast<int64_t>(hn::Lanes(DF())); }
inline int64_t RoundUp(int64_t n, int64_t m) { return (n + m - 1) / m * m; }
inline size_t Align64(size_t n) { return (n + 63) & ~size_t{63}; }

// 2^x for x <= 0 (scores minus their running max); exactly 0 below -126, so -inf (a masked
// score) contributes nothing. Degree-6 polynomial of e^r, r = f·ln2, |f| <= 1/2: relative
// error ~1.2e-7.
HWY_INLINE VF Exp2(DF d, VF x) {
  const hn::RebindToSigned<DF> di;
  const VF xc = hn::Max(x, hn::Set(d, -127.0f));
  const VF shifter = hn::Set(d, 12582912.0f);  // 1.5·2^23: adding it rounds to an integer
  const VF t = hn::Add(xc, shifter);
  const VF n = hn::Sub(t, shifter);
  const VF r = hn::Mul(hn::Sub(xc, n), hn::Set(d, kLn2));
  VF p = hn::Set(d, 1.0f / 720.0f);
  p = hn::MulAdd(p, r, hn::Set(d, 1.0f / 120.0f));
  p = hn::MulAdd(p, r, hn::Set(d, 1.0f / 24.0f));
  p = hn::MulAdd(p, r, hn::Set(d, 1.0f / 6.0f));
  p = hn::MulAdd(p, r, hn::Set(d, 0.5f));
  p = hn::MulAdd(p, r, hn::Set(d, 1.0f));
  p = hn::MulAdd(p, r, hn::Set(d, 1.0f));
  const auto bits = hn::ShiftLeft<23>(hn::Add(hn::BitCast(di, t), hn::Set(di, 127 - 0x4B400000)));
  return hn::IfThenZeroElse(hn::Lt(x, hn::Set(d, -126.0f)), hn::Mul(p, hn::BitCast(d, bits)));
}

// ---- micro-kernels --------------------------------------------------------------------------
// Neither product packs its operands: K and V are read in their own row layout (any row
// stride), so a block costs no copy; only the tile's queries are packed (Qt), once per task.

// St[r][q] = sum_k K[r·ldk + k] · Qt[k][q] for R keys (rows of K) and Br = kV·N queries.
template <int R>
HWY_NOINLINE void QkMicro(const float* HWY_RESTRICT K, int64_t ldk, const float* HWY_RESTRICT Qt,
                          int64_t D, float* HWY_RESTRICT St) {
  const DF d;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  const int64_t br = kV * N;
  VF acc[R][kV];
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < kV; ++v) acc[r][v] = hn::Zero(d);
  for (int64_t k = 0; k < D; ++k) {
    VF b[kV];
    for (int v = 0; v < kV; ++v) b[v] = hn::Load(d, Qt + k * br + v * N);
    for (int r = 0; r < R; ++r) {
      const VF a = hn::Set(d, K[r * ldk + k]);
      for (int v = 0; v < kV; ++v) acc[r][v] = hn::MulAdd(a, b[v], acc[r][v]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < kV; ++v) hn::Store(acc[r][v], d, St + r * br + v * N);
}

using QkFn = void (*)(const float*, int64_t, const float*, int64_t, float*);
template <int... I>
constexpr std::array<QkFn, sizeof...(I)> QkTable(std::integer_sequence<int, I...>) {
  return {&QkMicro<I + 1>...};
}

// St (nk x Br) = K rows [0, nk) (ldk apart) · Qt (D x Br).
inline void QkBlock(const float* K, int64_t ldk, int64_t nk, const float* Qt, int64_t D,
                    float* St) {
  static constexpr auto tails = QkTable(std::make_integer_sequence<int, kR>());
  const int64_t br = Br();
  int64_t r = 0;
  for (; r + kR <= nk; r += kR) QkMicro<kR>(K + r * ldk, ldk, Qt, D, St + r * br);
  if (r < nk) tails[static_cast<size_t>(nk - r - 1)](K + r * ldk, ldk, Qt, D, St + r * br);
}

// Queries x feature vectors of one PV micro-tile: kQ x kD accumulators (12 of AVX2's 16
// registers, 24 of AVX-512's 32).
// kQ divides Br = kV·N on every target (the portable SCALAR target has N = 1, Br = 2).
#if HWY_TARGET <= HWY_AVX3
constexpr int kQ = 8;
#elif HWY_TARGET == HWY_SCALAR
constexpr int kQ = 2;
#else
constexpr int kQ = 4;
#endif
static_assert(kQ <= kV * static_cast<int>(hn::MaxLanes(DF())), "a PV micro-tile spans tiles");
constexpr int kD = 3;

// O[q][x] = O[q][x]·alpha[q] + sum_k Pt[k][q] · V[k·ldv + x] for kQ queries and W vectors of
// features; the last vector holds `last` features (N for whole vectors), so no load or store
// passes the end of a row.
template <int W>
HWY_NOINLINE void PvMicro(const float* HWY_RESTRICT Pt, const float* HWY_RESTRICT V, int64_t ldv,
                          int64_t nk, const float* HWY_RESTRICT alpha, float* HWY_RESTRICT O,
                          int64_t ldo, int64_t last) {
  const DF d;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  const int64_t br = kV * N;
  const bool whole = last == N;
  VF acc[kQ][W];
  for (int q = 0; q < kQ; ++q) {
    const VF al = hn::Set(d, alpha[q]);
    for (int w = 0; w < W; ++w) acc[q][w] = hn::Mul(hn::Load(d, O + q * ldo + w * N), al);
  }
  for (int64_t k = 0; k < nk; ++k) {
    const float* vr = V + k * ldv;
    VF b[W];
    for (int w = 0; w < W; ++w)
      b[w] = (w + 1 < W || whole) ? hn::LoadU(d, vr + w * N) : LoadTailF(d, vr + w * N, last);
    const float* p = Pt + k * br;
    for (int q = 0; q < kQ; ++q) {
      const VF a = hn::Set(d, p[q]);
      for (int w = 0; w < W; ++w) acc[q][w] = hn::MulAdd(a, b[w], acc[q][w]);
    }
  }
  for (int q = 0; q < kQ; ++q)
    for (int w = 0; w < W; ++w) hn::Store(acc[q][w], d, O + q * ldo + w * N);
}

// O (Br x ldo, ldo = Dv rounded up to N) = O·alpha + Ptᵀ (Br x nk) · V rows [0, nk).
inline void PvBlock(const float* Pt, const float* V, int64_t ldv, int64_t nk, int64_t Dv,
                    const float* alpha, float* O, int64_t ldo) {
  const int64_t N = static_cast<int64_t>(hn::Lanes(DF()));
  const int64_t br = Br();
  // Feature slices outer, query groups inner: a slice of the V block (nk x kD·N) stays in L1
  // while every query group reads it.
  int64_t x = 0;
  for (; x + kD * N <= Dv && Dv - x != 4 * N; x += kD * N)
    for (int64_t q = 0; q < br; q += kQ)
      PvMicro<kD>(Pt + q, V + x, ldv, nk, alpha + q, O + q * ldo + x, ldo, N);
  // The remaining vectors in groups of 2 and 3 (a 1-vector group would leave the FMA units
  // waiting on loads): 16 vectors (D = 128 on AVX2) run as 3+3+3+3+2+2.
  while (x < Dv) {
    const int64_t vecs = (Dv - x + N - 1) / N;
    const int64_t w = vecs == 4 ? 2 : std::min<int64_t>(vecs, 3);
    const int64_t last = std::min(N, Dv - x - (w - 1) * N);
    for (int64_t q = 0; q < br; q += kQ) {
      if (w == 1) PvMicro<1>(Pt + q, V + x, ldv, nk, alpha + q, O + q * ldo + x, ldo, last);
      if (w == 2) PvMicro<2>(Pt + q, V + x, ldv, nk, alpha + q, O + q * ldo + x, ldo, last);
      if (w == 3) PvMicro<3>(Pt + q, V + x, ldv, nk, alpha + q, O + q * ldo + x, ldo, last);
    }
    x += w * N;
  }
}

// ---- addressing -----------------------------------------------------------------------------

// The keys (or values) of one (sequence, kv head): row j at base + j*row (non-paged) or in
// the block table's pages.
struct KvRows {
  const char* base = nullptr;  // kv head and (non-paged) sequence already applied
  int64_t row_bytes = 0, page_bytes = 0, block_size = 0;
  const int32_t* table = nullptr;  // null: not paged
  DType dtype = DType::kF32;
  int64_t cols = 0;
  // Calls fn(first_row_ptr, n, j) for maximal runs of rows [j0, j1) that are evenly spaced.
  template <class Fn>
  void spans(int64_t j0, int64_t j1, const Fn& fn) const {
    if (!table) {
      if (j0 < j1) fn(base + j0 * row_bytes, j1 - j0, j0);
      return;
    }
    for (int64_t j = j0; j < j1;) {
      const int64_t off = j % block_size;
      const int64_t n = std::min(j1 - j, block_size - off);
      fn(base + table[j / block_size] * page_bytes + off * row_bytes, n, j);
      j += n;
    }
  }
};

// Asks for rows [j0, j1) to be brought into L2 while the current block computes: the packing
// reads each row once, so without this every K and V row's first touch stalls the core.
inline void PrefetchRows(const KvRows& kv, int64_t j0, int64_t j1) {
  const int64_t bytes = kv.cols * static_cast<int64_t>(dtype_size(kv.dtype));
  kv.spans(j0, j1, [&](const char* row, int64_t n, int64_t) {
    for (int64_t t = 0; t < n; ++t)
      for (int64_t b = 0; b < bytes; b += 64) __builtin_prefetch(row + t * kv.row_bytes + b, 0, 2);
  });
}

// Rows [j0, j0+n) as f32 with a uniform leading dimension: a pointer into the tensor itself
// when the rows are f32 and evenly spaced, else converted into `scratch` (n x cols).
inline const float* RowsF32(const KvRows& kv, int64_t j0, int64_t n, float* scratch,
                            int64_t* ld) {
  if (kv.dtype == DType::kF32 && (!kv.table || (j0 % kv.block_size) + n <= kv.block_size)) {
    const float* p = nullptr;
    kv.spans(j0, j0 + n, [&](const char* row, int64_t, int64_t) {
      p = reinterpret_cast<const float*>(row);
    });
    *ld = kv.row_bytes / static_cast<int64_t>(sizeof(float));
    return p;
  }
  kv.spans(j0, j0 + n, [&](const char* row, int64_t m, int64_t j) {
    for (int64_t t = 0; t < m; ++t)
      convert(scratch + (j - j0 + t) * kv.cols, DType::kF32, row + t * kv.row_bytes, kv.dtype,
              kv.cols);
  });
  *ld = kv.cols;
  return scratch;
}

// One (sequence, head) problem.
struct Problem {
  const char* q = nullptr;  // row i at q + i*q_row
  int64_t q_row = 0;
  char* o = nullptr;
  int64_t o_row = 0;
  float* lse = nullptr;
  int64_t lse_row = 0;
  KvRows k, v;
  int64_t sq = 0, sk = 0;
  float slope = 0.0f;              // alibi (0: none)
  const float* mask = nullptr;     // row i at mask + i*mask_row
  int64_t mask_row = 0;
};

// Visible key range [lo(i), hi(i)] of query i (both non-decreasing in i).
struct Visibility {
  int64_t offset = 0, left = -1, right = -1;  // right: -1 unbounded (causal: 0)
  int64_t lo(int64_t i) const { return left < 0 ? 0 : i + offset - left; }
  int64_t hi(int64_t i, int64_t sk) const {
    return right < 0 ? sk - 1 : std::min(sk - 1, i + offset + right);
  }
};

inline Visibility VisibilityOf(const AttentionArgs& a, int64_t sq, int64_t sk) {
  Visibility vis;
  vis.offset = sk - sq;
  vis.left = a.window_left;
  vis.right = a.window_right;
  if (a.causal) vis.right = vis.right < 0 ? 0 : std::min<int64_t>(vis.right, 0);
  return vis;
}

// Scores (log2 units) of keys [jb, jb+nk) for queries whose lanes are i0 + lane: invisible
// keys become -inf, ALiBi and the custom mask are added. `stride` is the distance between
// consecutive keys' score vectors, `qstride` between consecutive queries (one of them is 1).
struct Masker {
  Visibility vis;
  float slope2 = 0.0f;  // alibi slope · log2 e
  const float* mask = nullptr;
  int64_t mask_row = 0;
  bool bounded() const { return vis.left >= 0 || vis.right >= 0; }
};

// ---- prefill ------------------------------------------------------------------------------

// Tiles per task: up to kMaxTiles tiles of Br queries share each K and V block, so a block is
// fetched from L3 or DRAM once for all of them; the tiles' Qt and output rows are sized to
// stay within L2 (FlashDims::tiles).
constexpr int64_t kMaxTiles = 32;

struct FlashScratch {
  float* qt;     // tiles x D x Br
  float* st;     // Bcp x Br
  float* ot;     // tiles x Br x Dvp (row-major: query rows of Dvp = Dv rounded up to N)
  float* m;      // tiles x Br
  float* l;      // tiles x Br
  float* alpha;  // Br
  float* kbuf;   // Bc x D (rows converted to f32 when needed)
  float* vbuf;   // Bc x Dv
  float* row;    // max(D, Dv)
};

struct FlashDims {
  int64_t D, Dv, Bc, Bcp, Dvp, tiles;
  FlashDims(int64_t d, int64_t dv, int64_t bc)
      : D(d), Dv(dv), Bc(bc), Bcp(RoundUp(bc, kR)),
        Dvp(RoundUp(dv, static_cast<int64_t>(hn::Lanes(DF())))) {
    // Qt and output rows of all tiles about the size of L2: each tile's rows are touched
    // once per block and may come from L3, but the more tiles share a block, the fewer times
    // K and V stream in (measured: 32 tiles of 16 queries at D = 128 beat 16 by ~5%).
    const int64_t per_tile = (D + Dvp) * Br() * static_cast<int64_t>(sizeof(float));
    tiles = std::clamp<int64_t>(cpu_features().l2_bytes / per_tile, 1, kMaxTiles);
  }
};

template <class Fn>
inline void FlashLayout(const FlashDims& f, const Fn& take) {
  const size_t br = static_cast<size_t>(Br()), fl = sizeof(float);
  const auto z = [](int64_t v) { return static_cast<size_t>(v); };
  take(&FlashScratch::qt, z(f.tiles * f.D) * br * fl);
  take(&FlashScratch::st, z(f.Bcp) * br * fl);
  take(&FlashScratch::ot, z(f.tiles * f.Dvp) * br * fl);
  take(&FlashScratch::m, z(f.tiles) * br * fl);
  take(&FlashScratch::l, z(f.tiles) * br * fl);
  take(&FlashScratch::alpha, br * fl);
  take(&FlashScratch::kbuf, z(f.Bc * f.D) * fl);
  take(&FlashScratch::vbuf, z(f.Bc * f.Dv) * fl);
  take(&FlashScratch::row, z(std::max(f.D, f.Dv)) * fl);
}

inline size_t FlashScratchBytes(const FlashDims& f) {
  size_t total = 64;
  FlashLayout(f, [&](float* FlashScratch::*, size_t bytes) { total += Align64(bytes); });
  return total;
}

inline FlashScratch CarveFlash(char* p, const FlashDims& f) {
  p = reinterpret_cast<char*>((reinterpret_cast<uintptr_t>(p) + 63) & ~uintptr_t{63});
  FlashScratch s;
  FlashLayout(f, [&](float* FlashScratch::*field, size_t bytes) {
    s.*field = reinterpret_cast<float*>(p);
    p += Align64(bytes);
  });
  return s;
}

// Applies the visibility mask, ALiBi and the custom mask to St rows [jb, jb+nk) of the tile
// whose first query is i0 (nq valid queries).
inline void MaskTile(const Masker& mk, int64_t i0, int64_t nq, int64_t jb, int64_t nk,
                     float* St) {
  const DF d;
  const hn::RebindToSigned<DF> di;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  const int64_t br = Br();
  const bool bounded = mk.bounded();
  const auto iota = hn::Iota(di, 0);
  // visible: rel = pos - j >= -right (j <= pos + right) and rel <= left (j >= pos - left).
  // (Highway 1.0 has no integer Ge/Le: rel > -right - 1, rel < left + 1.)
  const int64_t min_rel = mk.vis.right < 0 ? -(int64_t{1} << 30) : -mk.vis.right;
  const int64_t max_rel = mk.vis.left < 0 ? (int64_t{1} << 30) : mk.vis.left;
  const auto lo = hn::Set(di, static_cast<int32_t>(min_rel - 1));
  const auto hi = hn::Set(di, static_cast<int32_t>(max_rel + 1));
  for (int64_t jj = 0; jj < nk; ++jj) {
    const int64_t j = jb + jj;
    float* s = St + jj * br;
    for (int64_t v = 0; v < kV; ++v) {
      // pos - j for the lanes' queries, in int32 (the op keeps lengths below 2^30).
      const auto rel =
          hn::Add(iota, hn::Set(di, static_cast<int32_t>(i0 + v * N + mk.vis.offset - j)));
      VF x = hn::Load(d, s + v * N);
      if (mk.slope2 != 0.0f)
        x = hn::NegMulAdd(hn::Set(d, mk.slope2), hn::ConvertTo(d, hn::Abs(rel)), x);
      if (bounded) {
        const auto ok = hn::And(hn::Gt(rel, lo), hn::Lt(rel, hi));
        x = hn::IfThenElse(hn::RebindMask(d, ok), x, hn::Set(d, kNegInf));
      }
      hn::Store(x, d, s + v * N);
    }
  }
  if (mk.mask) {
    for (int64_t ii = 0; ii < nq; ++ii) {
      const float* mrow = mk.mask + (i0 + ii) * mk.mask_row + jb;
      for (int64_t jj = 0; jj < nk; ++jj) St[jj * br + ii] += mrow[jj] * kLog2e;
    }
  }
}

// Online softmax of St rows [0, nk) (one lane per query): St becomes P, m and l are updated,
// alpha gets the factor the tile's earlier output must be scaled by.
inline void SoftmaxStep(int64_t nk, float* St, float* m, float* l, float* alpha) {
  const DF d;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  const int64_t br = Br();
  for (int64_t v = 0; v < kV; ++v) {
    VF mb = hn::Set(d, kNegInf);
    for (int64_t jj = 0; jj < nk; ++jj) mb = hn::Max(mb, hn::Load(d, St + jj * br + v * N));
    const VF mold = hn::Load(d, m + v * N);
    const VF mnew = hn::Max(mold, mb);
    const VF msafe = hn::IfThenZeroElse(hn::Eq(mnew, hn::Set(d, kNegInf)), mnew);
    VF sum = hn::Zero(d);
    for (int64_t jj = 0; jj < nk; ++jj) {
      const VF p = Exp2(d, hn::Sub(hn::Load(d, St + jj * br + v * N), msafe));
      hn::Store(p, d, St + jj * br + v * N);
      sum = hn::Add(sum, p);
    }
    const VF al = Exp2(d, hn::Sub(mold, msafe));
    hn::Store(hn::MulAdd(hn::Load(d, l + v * N), al, sum), d, l + v * N);
    hn::Store(mnew, d, m + v * N);
    hn::Store(al, d, alpha + v * N);
  }
}

// Queries [c0, c0 + nq) of one problem, nq <= tiles·Br: tiles of Br sharing each K/V block.
void FlashChunk(const Problem& pb, const Masker& mk, int64_t c0, int64_t max_tiles,
                const FlashDims& f, float qscale, DType dtype, const FlashScratch& s) {
  const int64_t br = Br(), D = f.D, Dv = f.Dv;
  const int64_t nq = std::min(max_tiles * br, pb.sq - c0);
  const int64_t tiles = (nq + br - 1) / br;
  int64_t lo[kMaxTiles] = {}, hi[kMaxTiles] = {}, full_lo[kMaxTiles] = {},
          full_hi[kMaxTiles] = {}, nqt[kMaxTiles] = {};
  for (int64_t t = 0; t < tiles; ++t) {
    const int64_t i0 = c0 + t * br;
    nqt[t] = std::min(br, c0 + nq - i0);
    float* qt = s.qt + t * D * br;
    std::fill(qt, qt + D * br, 0.0f);
    for (int64_t i = 0; i < nqt[t]; ++i) {
      convert(s.row, DType::kF32, pb.q + (i0 + i) * pb.q_row, dtype, D);
      for (int64_t x = 0; x < D; ++x) qt[x * br + i] = s.row[x] * qscale;
    }
    std::fill(s.m + t * br, s.m + (t + 1) * br, kNegInf);
    std::fill(s.l + t * br, s.l + (t + 1) * br, 0.0f);
    std::fill(s.ot + t * f.Dvp * br, s.ot + (t + 1) * f.Dvp * br, 0.0f);
    // Keys some query of the tile sees, and the range every query of it sees.
    lo[t] = std::max<int64_t>(0, mk.vis.lo(i0));
    hi[t] = mk.vis.hi(i0 + nqt[t] - 1, pb.sk);
    full_lo[t] = mk.vis.lo(i0 + nqt[t] - 1);
    full_hi[t] = mk.vis.hi(i0, pb.sk);
  }
  const int64_t jlo = lo[0], jhi = hi[tiles - 1] + 1;
  const bool extra = mk.slope2 != 0.0f || mk.mask != nullptr;
  PrefetchRows(pb.k, jlo, std::min(jhi, jlo + f.Bc));
  PrefetchRows(pb.v, jlo, std::min(jhi, jlo + f.Bc));
  for (int64_t jb = jlo; jb < jhi; jb += f.Bc) {
    const int64_t nk = std::min(f.Bc, jhi - jb);
    PrefetchRows(pb.k, jb + nk, std::min(jhi, jb + nk + f.Bc));
    PrefetchRows(pb.v, jb + nk, std::min(jhi, jb + nk + f.Bc));
    int64_t ldk = 0, ldv = 0;
    const float* K = RowsF32(pb.k, jb, nk, s.kbuf, &ldk);
    const float* V = RowsF32(pb.v, jb, nk, s.vbuf, &ldv);
    for (int64_t t = 0; t < tiles; ++t) {
      if (jb > hi[t] || jb + nk - 1 < lo[t]) continue;
      const int64_t nkt = std::min(nk, hi[t] + 1 - jb);
      QkBlock(K, ldk, nkt, s.qt + t * D * br, D, s.st);
      const bool inside = jb >= full_lo[t] && jb + nkt - 1 <= full_hi[t];
      if (!inside || extra) {
        Masker m2 = mk;
        if (inside) m2.vis.left = m2.vis.right = -1;
        MaskTile(m2, c0 + t * br, nqt[t], jb, nkt, s.st);
      }
      SoftmaxStep(nkt, s.st, s.m + t * br, s.l + t * br, s.alpha);
      PvBlock(s.st, V, ldv, nkt, Dv, s.alpha, s.ot + t * br * f.Dvp, f.Dvp);
    }
  }
  // Normalize, write out, lse.
  for (int64_t t = 0; t < tiles; ++t) {
    for (int64_t i = 0; i < nqt[t]; ++i) {
      const int64_t q = c0 + t * br + i;
      const float l = s.l[t * br + i];
      const float inv = l > 0.0f ? 1.0f / l : 0.0f;
      const float* orow = s.ot + (t * br + i) * f.Dvp;
      for (int64_t x = 0; x < Dv; ++x) s.row[x] = orow[x] * inv;
      convert(pb.o + q * pb.o_row, dtype, s.row, DType::kF32, Dv);
      pb.lse[q * pb.lse_row] = l > 0.0f ? (s.m[t * br + i] + std::log2(l)) * kLn2 : kNegInf;
    }
  }
}

// ---- decode -------------------------------------------------------------------------------

// Partial result of one decode chunk for G query rows: m, l, then Dv unnormalized outputs.
inline int64_t PartialFloats(int64_t Dv) { return Dv + 2; }

struct DecodeScratch {
  float* qs;  // G x Dp
  float* s;   // G x kDecodeSub
  float* row;
};

// Decode is bound by DRAM: the row ~kPrefetchBytes ahead of the one being read is requested
// while it is processed (the hardware prefetchers stop at every 4 KiB page, which left the
// cores waiting on each new row). Prefetching past a span's end is harmless (no fault).
constexpr int64_t kPrefetchBytes = 8 << 10;
HWY_INLINE int64_t PrefetchDistance(int64_t row_bytes) {
  return std::max<int64_t>(4, kPrefetchBytes / std::max<int64_t>(1, row_bytes));
}
HWY_INLINE void PrefetchRow(const char* row, int64_t bytes) {
  for (int64_t b = 0; b < bytes; b += 64) __builtin_prefetch(row + b, 0, 2);
}

// Keys dotted at once for G query rows: G·KK accumulators (at most 8, so they, the KK key
// vectors and one query vector fit AVX2's 16 registers) and independent FMA chains.
constexpr int KeysAtOnce(int G) { return G <= 2 ? 4 : G <= 4 ? 2 : 1; }

// Scores of KK consecutive key rows (row_bytes apart) against G query rows (Dp-padded, zeros
// past D): out[g·ostride + kk].
template <class TK, int G, int KK>
HWY_INLINE void DotKeys(const char* HWY_RESTRICT row, int64_t row_bytes, int64_t D, int64_t Dp,
                        const float* HWY_RESTRICT qs, float* HWY_RESTRICT out, int64_t ostride) {
  const DF d;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  const TK* k[KK];
  for (int kk = 0; kk < KK; ++kk) k[kk] = reinterpret_cast<const TK*>(row + kk * row_bytes);
  VF acc[G][KK];
  for (int g = 0; g < G; ++g)
    for (int kk = 0; kk < KK; ++kk) acc[g][kk] = hn::Zero(d);
  for (int64_t x = 0; x < D; x += N) {
    VF kv[KK];
    if (x + N <= D) {
      for (int kk = 0; kk < KK; ++kk) kv[kk] = LoadF(d, k[kk] + x);
    } else {
      for (int kk = 0; kk < KK; ++kk) kv[kk] = LoadTailF(d, k[kk] + x, static_cast<size_t>(D - x));
    }
    for (int g = 0; g < G; ++g) {
      const VF q = hn::Load(d, qs + g * Dp + x);
      for (int kk = 0; kk < KK; ++kk) acc[g][kk] = hn::MulAdd(q, kv[kk], acc[g][kk]);
    }
  }
  for (int g = 0; g < G; ++g)
    for (int kk = 0; kk < KK; ++kk) out[g * ostride + kk] = ReduceSumF(d, acc[g][kk]);
}

// Scores of n consecutive key rows against G query rows.
template <class TK, int G>
HWY_NOINLINE void DotSpan(const char* row, int64_t row_bytes, int64_t n, int64_t D, int64_t Dp,
                          const float* qs, float* out, int64_t ostride) {
  constexpr int KK = KeysAtOnce(G);
  const int64_t bytes = D * static_cast<int64_t>(sizeof(TK)), ahead = PrefetchDistance(bytes);
  int64_t t = 0;
  for (; t + KK <= n; t += KK) {
    for (int kk = 0; kk < KK; ++kk)
      PrefetchRow(row + (t + kk + ahead) * row_bytes, bytes);
    DotKeys<TK, G, KK>(row + t * row_bytes, row_bytes, D, Dp, qs, out + t, ostride);
  }
  for (; t < n; ++t) DotKeys<TK, G, 1>(row + t * row_bytes, row_bytes, D, Dp, qs, out + t, ostride);
}

// os[g·ostride + :] += sum over KK consecutive value rows j of p[g·pstride + j] · vrow_j for
// G rows: the KK rows' vectors are loaded once and shared by every query row, and two
// vectors of each output row stay in registers across the KK rows.
template <class TK, int KK>
HWY_INLINE void AxpyKeys(const char* HWY_RESTRICT row, int64_t row_bytes, int64_t Dv, int64_t G,
                         const float* HWY_RESTRICT p, int64_t pstride, float* HWY_RESTRICT os,
                         int64_t ostride) {
  const DF d;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  const TK* v[KK];
  for (int kk = 0; kk < KK; ++kk) v[kk] = reinterpret_cast<const TK*>(row + kk * row_bytes);
  int64_t x = 0;
  for (; x + 2 * N <= Dv; x += 2 * N) {
    VF a0[KK], a1[KK];
    for (int kk = 0; kk < KK; ++kk) {
      a0[kk] = LoadF(d, v[kk] + x);
      a1[kk] = LoadF(d, v[kk] + x + N);
    }
    for (int64_t g = 0; g < G; ++g) {
      float* o = os + g * ostride + x;
      VF o0 = hn::LoadU(d, o), o1 = hn::LoadU(d, o + N);
      for (int kk = 0; kk < KK; ++kk) {
        const VF pg = hn::Set(d, p[g * pstride + kk]);
        o0 = hn::MulAdd(pg, a0[kk], o0);
        o1 = hn::MulAdd(pg, a1[kk], o1);
      }
      hn::StoreU(o0, d, o);
      hn::StoreU(o1, d, o + N);
    }
  }
  for (; x < Dv; x += N) {  // at most two vectors; the last may be partial (rows hold
    const int64_t w = std::min(N, Dv - x);  // RoundUp(Dv, N) floats)
    VF a[KK];
    for (int kk = 0; kk < KK; ++kk) a[kk] = LoadN(d, v[kk] + x, w);
    for (int64_t g = 0; g < G; ++g) {
      float* o = os + g * ostride + x;
      VF o0 = hn::LoadU(d, o);
      for (int kk = 0; kk < KK; ++kk) o0 = hn::MulAdd(hn::Set(d, p[g * pstride + kk]), a[kk], o0);
      hn::StoreU(o0, d, o);
    }
  }
}

template <class TK>
HWY_NOINLINE void AxpySpan(const char* row, int64_t row_bytes, int64_t n, int64_t Dv, int64_t G,
                           const float* p, int64_t pstride, float* os, int64_t ostride) {
  const int64_t bytes = Dv * static_cast<int64_t>(sizeof(TK)), ahead = PrefetchDistance(bytes);
  int64_t t = 0;
  for (; t + 4 <= n; t += 4) {
    for (int64_t kk = 0; kk < 4; ++kk) PrefetchRow(row + (t + kk + ahead) * row_bytes, bytes);
    AxpyKeys<TK, 4>(row + t * row_bytes, row_bytes, Dv, G, p + t, pstride, os, ostride);
  }
  for (; t < n; ++t)
    AxpyKeys<TK, 1>(row + t * row_bytes, row_bytes, Dv, G, p + t, pstride, os, ostride);
}

template <class TK>
using DotFn = void (*)(const char*, int64_t, int64_t, int64_t, int64_t, const float*, float*,
                       int64_t);
template <class TK, int... I>
constexpr std::array<DotFn<TK>, sizeof...(I)> DotTable(std::integer_sequence<int, I...>) {
  return {&DotSpan<TK, I + 1>...};
}

// Decode task: query rows r = hl·sq + i (hl: q head within the kv head's group) of one
// (sequence, kv head), keys [c0, c1). Writes G partials (m, l, O) at `part`.
struct DecodeRowInfo {
  const char* q;
  int64_t pos;     // the query's position on the key axis
  int64_t lo, hi;  // visible keys
  float slope2;
  const float* mask;
};

template <class TK>
void DecodeTask(const KvRows& kr, const KvRows& vr, const DecodeRowInfo* rows, int64_t G,
                int64_t D, int64_t Dv, int64_t c0, int64_t c1, float qscale, DType qdtype,
                const DecodeScratch& sc, float* part) {
  static constexpr auto dots = DotTable<TK>(std::make_integer_sequence<int, kMaxDecodeRows>());
  const DF d;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  const int64_t Dp = RoundUp(D, N), Dvp = RoundUp(Dv, N);
  const int64_t P = PartialFloats(Dvp);
  for (int64_t g = 0; g < G; ++g) {
    convert(sc.row, DType::kF32, rows[g].q, qdtype, D);
    float* q = sc.qs + g * Dp;
    for (int64_t x = 0; x < Dp; ++x) q[x] = x < D ? sc.row[x] * qscale : 0.0f;
    float* pr = part + g * P;
    pr[0] = kNegInf;
    pr[1] = 0.0f;
    std::fill(pr + 2, pr + 2 + Dvp, 0.0f);
  }
  // Keys any row may see.
  int64_t lo = c1, hi = c0 - 1;
  for (int64_t g = 0; g < G; ++g) {
    lo = std::min(lo, rows[g].lo);
    hi = std::max(hi, rows[g].hi);
  }
  lo = std::max(lo, c0);
  hi = std::min(hi, c1 - 1);
  for (int64_t s0 = lo; s0 <= hi; s0 += kDecodeSub) {
    const int64_t s1 = std::min(hi + 1, s0 + kDecodeSub);
    const int64_t ns = s1 - s0;
    kr.spans(s0, s1, [&](const char* row, int64_t n, int64_t j) {
      dots[static_cast<size_t>(G - 1)](row, kr.row_bytes, n, D, Dp, sc.qs, sc.s + (j - s0),
                                       kDecodeSub);
    });
    // Mask, then the online softmax per row (vectorized over keys).
    for (int64_t g = 0; g < G; ++g) {
      float* s = sc.s + g * kDecodeSub;
      const DecodeRowInfo& ri = rows[g];
      for (int64_t jj = 0; jj < ns; ++jj) {
        const int64_t j = s0 + jj;
        if (j < ri.lo || j > ri.hi) {
          s[jj] = kNegInf;
          continue;
        }
        if (ri.slope2 != 0.0f)
          s[jj] -= ri.slope2 * static_cast<float>(std::llabs(ri.pos - j));
        if (ri.mask) s[jj] += ri.mask[j] * kLog2e;
      }
      float* pr = part + g * P;
      VF mb = hn::Set(d, kNegInf);
      int64_t jj = 0;
      for (; jj + N <= ns; jj += N) mb = hn::Max(mb, hn::LoadU(d, s + jj));
      if (jj < ns) mb = hn::Max(mb, LoadTailF(d, s + jj, static_cast<size_t>(ns - jj), kNegInf));
      const float mnew = std::max(pr[0], ReduceMaxF(d, mb));
      const float msafe = mnew == kNegInf ? 0.0f : mnew;
      const float alpha = pr[0] == kNegInf ? 0.0f : std::exp2(pr[0] - msafe);
      VF sum = hn::Zero(d);
      const VF ms = hn::Set(d, msafe);
      for (jj = 0; jj + N <= ns; jj += N) {
        const VF p = Exp2(d, hn::Sub(hn::LoadU(d, s + jj), ms));
        hn::StoreU(p, d, s + jj);
        sum = hn::Add(sum, p);
      }
      if (jj < ns) {
        const VF p = Exp2(d, hn::Sub(LoadTailF(d, s + jj, static_cast<size_t>(ns - jj), kNegInf), ms));
        StoreTailF(d, p, s + jj, static_cast<size_t>(ns - jj));
        sum = hn::Add(sum, p);
      }
      pr[0] = mnew;
      pr[1] = pr[1] * alpha + ReduceSumF(d, sum);
      if (alpha != 1.0f) {
        const VF al = hn::Set(d, alpha);
        for (int64_t x = 0; x < Dvp; x += N)
          hn::StoreU(hn::Mul(hn::LoadU(d, pr + 2 + x), al), d, pr + 2 + x);
      }
    }
    vr.spans(s0, s1, [&](const char* row, int64_t n, int64_t j) {
      AxpySpan<TK>(row, vr.row_bytes, n, Dv, G, sc.s + (j - s0), kDecodeSub, part + 2, P);
    });
  }
}


// ---- driver -------------------------------------------------------------------------------

struct Seq {
  int64_t sq, sk;
};

inline Seq SeqOf(const AttentionArgs& a, int64_t b) {
  Seq s;
  s.sq = a.cu_q ? a.cu_q[b + 1] - a.cu_q[b] : a.sq;
  s.sk = a.context_lens ? a.context_lens[b] : a.cu_k ? a.cu_k[b + 1] - a.cu_k[b] : a.sk;
  return s;
}

inline KvRows KvOf(const AttentionArgs& a, bool is_v, int64_t b, int64_t kvh) {
  KvRows r;
  const int64_t es = static_cast<int64_t>(dtype_size(a.kv_dtype));
  const char* base = static_cast<const char*>(is_v ? a.v : a.k);
  const int64_t sb = is_v ? a.v_sb : a.k_sb, sh = is_v ? a.v_sh : a.k_sh,
                ss = is_v ? a.v_ss : a.k_ss;
  r.dtype = a.kv_dtype;
  r.cols = is_v ? a.v_head_dim : a.head_dim;
  r.row_bytes = ss * es;
  if (a.block_table) {
    r.base = base + kvh * sh * es;
    r.table = a.block_table + b * a.bt_stride;
    r.page_bytes = sb * es;
    r.block_size = a.block_size;
  } else {
    r.base = base + ((a.cu_k ? a.cu_k[b] * ss : b * sb) + kvh * sh) * es;
  }
  return r;
}

inline int64_t QOff(const AttentionArgs& a, int64_t b, int64_t h, int64_t sb, int64_t sh,
                    int64_t ss) {
  return (a.cu_q ? a.cu_q[b] * ss : b * sb) + h * sh;
}

inline int64_t Group(const AttentionArgs& a) { return a.heads / a.kv_heads; }
inline bool UseDecode(const AttentionArgs& a) { return a.sq * Group(a) <= kMaxDecodeRows; }
inline int64_t DecodeChunks(const AttentionArgs& a) {
  return std::max<int64_t>(1, (a.sk + kDecodeChunk - 1) / kDecodeChunk);
}
inline size_t DecodeScratchBytes(const AttentionArgs& a) {
  const int64_t N = static_cast<int64_t>(hn::Lanes(DF()));
  const int64_t G = kMaxDecodeRows, f = sizeof(float);
  return Align64(static_cast<size_t>(G * RoundUp(a.head_dim, N) * f)) +
         Align64(static_cast<size_t>(G * kDecodeSub * f)) +
         Align64(static_cast<size_t>(std::max(a.head_dim, a.v_head_dim) * f)) + 64;
}
inline size_t PartialBytes(const AttentionArgs& a) {
  const int64_t N = static_cast<int64_t>(hn::Lanes(DF()));
  const int64_t rows = std::min(Group(a) * a.sq, kMaxDecodeRows);
  return static_cast<size_t>(a.batch * a.kv_heads * DecodeChunks(a) * rows *
                             PartialFloats(RoundUp(a.v_head_dim, N))) *
             sizeof(float) + 64;
}

// Whole micro-kernel row groups per key block (a user-set MM_BLOCK_SIZE need not be one).
inline int64_t EffBlock(int64_t bc) { return std::max<int64_t>(kR, bc / kR * kR); }

// The same for every context length up to a.sk and every sq up to a.sq, so setup can size the
// workspace before the data says which path a call takes.
inline size_t PerThreadBytes(const AttentionArgs& a) {
  return std::max(FlashScratchBytes(FlashDims(a.head_dim, a.v_head_dim, EffBlock(a.kv_block))),
                  DecodeScratchBytes(a));
}

size_t AttentionWorkspace(const AttentionArgs& a) {
  // Decode partials only where the decode path may run: they grow with the context length.
  const bool decode = UseDecode(a) || a.sq_is_bound;
  return static_cast<size_t>(std::max(1, a.threads)) * PerThreadBytes(a) +
         (decode ? PartialBytes(a) : 0);
}

// Runs fn(task, thread_scratch) for tasks [0, n) on up to `threads` threads, each task on one
// thread; tasks are handed out in index order through an atomic counter.
template <class Fn>
void RunTasks(int threads, bool ftz, int64_t n, char* ws, size_t per_thread, const Fn& fn) {
  const int nt = static_cast<int>(std::min<int64_t>(threads, n));
  if (nt <= 1) {
    DenormalGuard g(ftz);
    for (int64_t t = 0; t < n; ++t) fn(t, ws);
    return;
  }
  std::atomic<int64_t> next{0};
#pragma omp parallel num_threads(nt)
  {
    DenormalGuard g(ftz);
    char* mine = ws + static_cast<size_t>(omp_get_thread_num()) * per_thread;
    for (int64_t t = next.fetch_add(1); t < n; t = next.fetch_add(1)) fn(t, mine);
  }
}

void FlashForward(const AttentionArgs& a, char* ws) {
  const int64_t br = Br(), D = a.head_dim, Dv = a.v_head_dim, Bc = a.kv_block;
  // Whole micro-kernel row groups per block (a user-set MM_BLOCK_SIZE need not be a multiple).
  const FlashDims dims(D, Dv, EffBlock(Bc));
  // Fewer tiles per task when that is what it takes to give every thread several tasks.
  int64_t all_tiles = 0;
  for (int64_t b = 0; b < a.batch; ++b) all_tiles += (SeqOf(a, b).sq + br - 1) / br * a.heads;
  const int64_t tiles =
      std::clamp<int64_t>(all_tiles / (4 * std::max(1, a.threads)), 1, dims.tiles);
  const int64_t g = Group(a);
  const int64_t qes = static_cast<int64_t>(dtype_size(a.dtype));
  struct Task {
    int64_t b, h, i0, cost;
  };
  std::vector<Task> tasks;
  for (int64_t b = 0; b < a.batch; ++b) {
    const Seq s = SeqOf(a, b);
    const Visibility vis = VisibilityOf(a, s.sq, s.sk);
    for (int64_t i0 = 0; i0 < s.sq; i0 += tiles * br) {
      const int64_t last = std::min(s.sq, i0 + tiles * br) - 1;
      const int64_t cost =
          std::max<int64_t>(0, vis.hi(last, s.sk) - std::max<int64_t>(0, vis.lo(i0)) + 1) + 1;
      for (int64_t h = 0; h < a.heads; ++h) tasks.push_back({b, h, i0, cost});
    }
  }
  std::stable_sort(tasks.begin(), tasks.end(),
                   [](const Task& x, const Task& y) { return x.cost > y.cost; });
  const float qscale = a.scale * kLog2e;
  const size_t per = PerThreadBytes(a);
  RunTasks(a.threads, a.ftz, static_cast<int64_t>(tasks.size()), ws, per,
           [&](int64_t t, char* mine) {
             const Task& tk = tasks[static_cast<size_t>(t)];
             const Seq s = SeqOf(a, tk.b);
             Problem pb;
             pb.q = static_cast<const char*>(a.q) + QOff(a, tk.b, tk.h, a.q_sb, a.q_sh, a.q_ss) * qes;
             pb.q_row = a.q_ss * qes;
             pb.o = static_cast<char*>(a.o) + QOff(a, tk.b, tk.h, a.o_sb, a.o_sh, a.o_ss) * qes;
             pb.o_row = a.o_ss * qes;
             pb.lse = a.lse + QOff(a, tk.b, tk.h, a.lse_sb, a.lse_sh, a.lse_ss);
             pb.lse_row = a.lse_ss;
             pb.k = KvOf(a, false, tk.b, tk.h / g);
             pb.v = KvOf(a, true, tk.b, tk.h / g);
             pb.sq = s.sq;
             pb.sk = s.sk;
             Masker mk;
             mk.vis = VisibilityOf(a, s.sq, s.sk);
             mk.slope2 = a.alibi ? a.alibi[tk.h] * kLog2e : 0.0f;
             mk.mask = a.mask ? a.mask + tk.b * a.mask_sb : nullptr;
             mk.mask_row = a.mask_si;
             FlashChunk(pb, mk, tk.i0, tiles, dims, qscale, a.dtype, CarveFlash(mine, dims));
           });
}

void DecodeForward(const AttentionArgs& a, char* ws) {
  const DF d;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  const int64_t D = a.head_dim, Dv = a.v_head_dim, g = Group(a);
  const int64_t Gmax = g * a.sq, Dvp = RoundUp(Dv, N), P = PartialFloats(Dvp);
  const int64_t chunks = DecodeChunks(a);
  const int64_t qes = static_cast<int64_t>(dtype_size(a.dtype));
  const size_t per = PerThreadBytes(a);
  float* parts = reinterpret_cast<float*>(
      (reinterpret_cast<uintptr_t>(ws + static_cast<size_t>(std::max(1, a.threads)) * per) + 63) &
      ~uintptr_t{63});
  const float qscale = a.scale * kLog2e;
  auto rows_of = [&](int64_t b, int64_t kvh, const Seq& s, DecodeRowInfo* rows) {
    const Visibility vis = VisibilityOf(a, s.sq, s.sk);
    for (int64_t hl = 0; hl < g; ++hl) {
      const int64_t h = kvh * g + hl;
      for (int64_t i = 0; i < s.sq; ++i) {
        DecodeRowInfo& r = rows[hl * s.sq + i];
        r.q = static_cast<const char*>(a.q) +
              (QOff(a, b, h, a.q_sb, a.q_sh, a.q_ss) + i * a.q_ss) * qes;
        r.pos = i + vis.offset;
        r.lo = std::max<int64_t>(0, vis.lo(i));
        r.hi = vis.hi(i, s.sk);
        r.slope2 = a.alibi ? a.alibi[h] * kLog2e : 0.0f;
        r.mask = a.mask ? a.mask + b * a.mask_sb + i * a.mask_si : nullptr;
      }
    }
  };
  const int64_t ntasks = a.batch * a.kv_heads * chunks;
  RunTasks(a.threads, a.ftz, ntasks, ws, per, [&](int64_t t, char* mine) {
    const int64_t c = t % chunks, bk = t / chunks, kvh = bk % a.kv_heads, b = bk / a.kv_heads;
    const Seq s = SeqOf(a, b);
    DecodeRowInfo rows[kMaxDecodeRows];
    rows_of(b, kvh, s, rows);
    const int64_t G = g * s.sq;
    float* part = parts + t * Gmax * P;
    const int64_t c0 = std::min(s.sk, c * kDecodeChunk), c1 = std::min(s.sk, c0 + kDecodeChunk);
    char* p = reinterpret_cast<char*>((reinterpret_cast<uintptr_t>(mine) + 63) & ~uintptr_t{63});
    DecodeScratch sc;
    sc.qs = reinterpret_cast<float*>(p);
    p += Align64(static_cast<size_t>(kMaxDecodeRows * RoundUp(D, N)) * sizeof(float));
    sc.s = reinterpret_cast<float*>(p);
    p += Align64(static_cast<size_t>(kMaxDecodeRows * kDecodeSub) * sizeof(float));
    sc.row = reinterpret_cast<float*>(p);
    if (G == 0) return;
    const KvRows kr = KvOf(a, false, b, kvh), vr = KvOf(a, true, b, kvh);
    switch (a.kv_dtype) {
      case DType::kF32:
        return DecodeTask<float>(kr, vr, rows, G, D, Dv, c0, c1, qscale, a.dtype, sc, part);
      case DType::kBF16:
        return DecodeTask<bf16_t>(kr, vr, rows, G, D, Dv, c0, c1, qscale, a.dtype, sc, part);
      default:
        return DecodeTask<f16_t>(kr, vr, rows, G, D, Dv, c0, c1, qscale, a.dtype, sc, part);
    }
  });
  // Merge the chunks of each (sequence, kv head) by log-sum-exp.
  parallel_for(a.threads, a.batch * a.kv_heads, 1, a.ftz, [&](int64_t r0, int64_t r1) {
    std::vector<float> out(static_cast<size_t>(Dvp));
    for (int64_t bk = r0; bk < r1; ++bk) {
      const int64_t b = bk / a.kv_heads, kvh = bk % a.kv_heads;
      const Seq s = SeqOf(a, b);
      for (int64_t hl = 0; hl < g; ++hl) {
        const int64_t h = kvh * g + hl;
        for (int64_t i = 0; i < s.sq; ++i) {
          const int64_t r = hl * s.sq + i;
          float M = kNegInf;
          for (int64_t c = 0; c < chunks; ++c)
            M = std::max(M, parts[((bk * chunks + c) * Gmax + r) * P]);
          std::fill(out.begin(), out.end(), 0.0f);
          float L = 0.0f;
          if (M != kNegInf) {
            for (int64_t c = 0; c < chunks; ++c) {
              const float* pr = parts + ((bk * chunks + c) * Gmax + r) * P;
              if (pr[0] == kNegInf) continue;
              const float w = std::exp2(pr[0] - M);
              L += pr[1] * w;
              for (int64_t x = 0; x < Dv; ++x) out[static_cast<size_t>(x)] += pr[2 + x] * w;
            }
          }
          const float inv = L > 0.0f ? 1.0f / L : 0.0f;
          for (int64_t x = 0; x < Dv; ++x) out[static_cast<size_t>(x)] *= inv;
          convert(static_cast<char*>(a.o) + (QOff(a, b, h, a.o_sb, a.o_sh, a.o_ss) + i * a.o_ss) * qes,
                  a.dtype, out.data(), DType::kF32, Dv);
          a.lse[QOff(a, b, h, a.lse_sb, a.lse_sh, a.lse_ss) + i * a.lse_ss] =
              L > 0.0f ? (M + std::log2(L)) * kLn2 : kNegInf;
        }
      }
    }
  });
}

// Keys per block from the cache sizes: St (Bc x Br f32) within a quarter of L1, beside the
// tile's Qt and output rows, and one K and V block (Bc x (D + Dv) f32) within a quarter of L2,
// so the block stays cached while all the tiles of a task read it; a multiple of kR.
int64_t AttentionKvBlock(int64_t head_dim, int64_t v_head_dim) {
  const CpuFeatures& f = cpu_features();
  const int64_t br = Br(), fl = sizeof(float);
  const int64_t by_l1 = f.l1d_bytes / 4 / (br * fl);
  const int64_t by_l2 = f.l2_bytes / 4 / ((head_dim + v_head_dim) * fl);
  return std::clamp<int64_t>(std::min(by_l1, by_l2), 4 * kR, 512) / kR * kR;
}

void AttentionForward(const AttentionArgs& a, void* workspace) {
  char* ws = static_cast<char*>(workspace);
  if (UseDecode(a)) {
    DecodeForward(a, ws);
  } else {
    FlashForward(a, ws);
  }
}

}  // namespace tboost::kernels::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace tboost::kernels {
HWY_EXPORT(AttentionWorkspace);
HWY_EXPORT(AttentionForward);
HWY_EXPORT(AttentionKvBlock);

int64_t attention_kv_block(int64_t head_dim, int64_t v_head_dim) {
  if (const char* env = std::getenv("MM_BLOCK_SIZE")) {
    char* end = nullptr;
    const long long v = std::strtoll(env, &end, 10);
    if (end != env && *end == '\0' && v >= 1 && v <= 65536) return v;
  }
  return HWY_DYNAMIC_DISPATCH(AttentionKvBlock)(head_dim, v_head_dim);
}

size_t attention_workspace(const AttentionArgs& a) {
  return HWY_DYNAMIC_DISPATCH(AttentionWorkspace)(a);
}
void attention_forward(const AttentionArgs& a, void* workspace) {
  HWY_DYNAMIC_DISPATCH(AttentionForward)(a, workspace);
}
}  // namespace tboost::kernels
#endif
