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
// Decode (DecodeTask): with few query tokens per sequence (Sq <= DecodeTokenCap: 8; on AVX-512
// without AMX prefill 16, or 32 for a bf16 model on AVX512_BF16) a tile of Br queries of one
// head would be mostly padding and the products would be bound by broadcasts, so each key row
// is instead streamed once and dotted with every query row of its kv head (GQA heads share the
// read; more rows than a task takes, kMaxDecodeRows, 32 in lanes or on AMX, go in groups, a task
// each). The keys of each (sequence, kv head) are split into chunks (flash-decoding) so that
// batch-1 decode keeps every thread busy; the chunks' partial results (max, sum, unnormalized
// output) are merged by log-sum-exp, by the last chunk task of each group of rows to finish.
//
// Tasks go to threads through an atomic counter, heaviest first (causal tiles near the end of
// the sequence see the most keys). Every task is computed by one thread in a fixed order, so
// results do not depend on the thread count or on timing.
// clang-format off: Highway's per-target re-inclusion needs this exact order.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "src/kernels/cpu/attention.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
// clang-format on

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <type_traits>
#include <utility>
#include <vector>

#include "hwy/highway.h"
#include "src/kernels/cpu/amx.h"
#include "src/kernels/cpu/attention-inl.h"
#include "src/kernels/cpu/hwy_util-inl.h"
#include "src/kernels/cpu/kernels.h"
#include "tboost/core/cpu_features.h"

HWY_BEFORE_NAMESPACE();
namespace tboost::kernels::HWY_NAMESPACE {

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

// ---- bf16 pair products -----------------------------------------------------------------------
// With bf16 q, k and v the two products run on pairs of bf16 values in one u32 lane (the even
// element in the low half): vdpbf16ps (AVX512_BF16) does twice the multiply-adds of an f32 FMA
// per instruction, accumulating in f32. QK pairs run over the head dim (a K row's pair is
// broadcast straight from the cache row; Qt2 holds the tile's query pairs), PV pairs over the
// keys (P is rounded to bf16 pairs after the softmax, as flash attention does on GPUs; V is
// interleaved two rows at a time into V2 once per block). Elsewhere the same layouts run on
// an emulation of it (two FMAs on the halves, in the instruction's order), which tests force so the
// path is checked on any CPU.
// DU, VU, PairDotEmu and PairDotNative: attention-inl.h.

// St[r][q] = scale · sum_p K32[r·ldk + p] · Qt2[p][q] for R keys (rows of u32 pairs).
template <int R, class Dot>
TBOOST_PAIR_ATTR HWY_NOINLINE void QkPair(const uint32_t* HWY_RESTRICT K, int64_t ldk,
                                          const uint32_t* HWY_RESTRICT Qt2, int64_t P, float scale,
                                          float* HWY_RESTRICT St) {
  const DF d;
  const DU du;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  const int64_t br = kV * N;
  VF acc[R][kV];
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < kV; ++v) acc[r][v] = hn::Zero(d);
  for (int64_t p = 0; p < P; ++p) {
    VU b[kV];
    for (int v = 0; v < kV; ++v) b[v] = hn::Load(du, Qt2 + p * br + v * N);
    for (int r = 0; r < R; ++r) {
      const VU a = hn::Set(du, K[r * ldk + p]);
      for (int v = 0; v < kV; ++v) acc[r][v] = Dot::Apply(acc[r][v], a, b[v]);
    }
  }
  const VF sc = hn::Set(d, scale);
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < kV; ++v) hn::Store(hn::Mul(acc[r][v], sc), d, St + r * br + v * N);
}

// O[q][x] = O[q][x]·alpha[q] + sum_p P2[p][q] · V2[p][x] for kQ queries and W whole vectors.
template <int W, class Dot>
TBOOST_PAIR_ATTR HWY_NOINLINE void PvPair(const uint32_t* HWY_RESTRICT P2,
                                          const uint32_t* HWY_RESTRICT V2, int64_t ldv, int64_t P,
                                          const float* HWY_RESTRICT alpha, float* HWY_RESTRICT O,
                                          int64_t ldo) {
  const DF d;
  const DU du;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  const int64_t br = kV * N;
  VF acc[kQ][W];
  for (int q = 0; q < kQ; ++q) {
    const VF al = hn::Set(d, alpha[q]);
    for (int w = 0; w < W; ++w) acc[q][w] = hn::Mul(hn::Load(d, O + q * ldo + w * N), al);
  }
  for (int64_t p = 0; p < P; ++p) {
    VU b[W];
    for (int w = 0; w < W; ++w) b[w] = hn::Load(du, V2 + p * ldv + w * N);
    for (int q = 0; q < kQ; ++q) {
      const VU a = hn::Set(du, P2[p * br + q]);
      for (int w = 0; w < W; ++w) acc[q][w] = Dot::Apply(acc[q][w], a, b[w]);
    }
  }
  for (int q = 0; q < kQ; ++q)
    for (int w = 0; w < W; ++w) hn::Store(acc[q][w], d, O + q * ldo + w * N);
}

template <class Dot>
struct PairKernels {
  using QkFn = void (*)(const uint32_t*, int64_t, const uint32_t*, int64_t, float, float*);
  template <int... I>
  static constexpr std::array<QkFn, sizeof...(I)> Qk(std::integer_sequence<int, I...>) {
    return {&QkPair<I + 1, Dot>...};
  }

  // St (nk x Br) = scale · K pairs (rows [0, nk), ldk u32 apart) · Qt2 (P x Br).
  static void QkBlock(const uint32_t* K, int64_t ldk, int64_t nk, const uint32_t* Qt2, int64_t P,
                      float scale, float* St) {
    static constexpr auto tails = Qk(std::make_integer_sequence<int, kR>());
    const int64_t br = Br();
    int64_t r = 0;
    for (; r + kR <= nk; r += kR) QkPair<kR, Dot>(K + r * ldk, ldk, Qt2, P, scale, St + r * br);
    if (r < nk)
      tails[static_cast<size_t>(nk - r - 1)](K + r * ldk, ldk, Qt2, P, scale, St + r * br);
  }

  // O (Br x ldo) = O·alpha + P2ᵀ · V2 (P pairs of keys, ldo = ldv = Dv rounded up to N).
  static void PvBlock(const uint32_t* P2, const uint32_t* V2, int64_t P, int64_t ldo,
                      const float* alpha, float* O) {
    const int64_t N = static_cast<int64_t>(hn::Lanes(DF()));
    const int64_t br = Br();
    for (int64_t x = 0; x < ldo;) {
      const int64_t vecs = (ldo - x) / N;
      const int64_t w = vecs == 4 ? 2 : std::min<int64_t>(vecs, 3);
      for (int64_t q = 0; q < br; q += kQ) {
        if (w == 1) PvPair<1, Dot>(P2 + q, V2 + x, ldo, P, alpha + q, O + q * ldo + x, ldo);
        if (w == 2) PvPair<2, Dot>(P2 + q, V2 + x, ldo, P, alpha + q, O + q * ldo + x, ldo);
        if (w == 3) PvPair<3, Dot>(P2 + q, V2 + x, ldo, P, alpha + q, O + q * ldo + x, ldo);
      }
      x += w * N;
    }
  }
};

// P2[p][q] = bf16 pair (P[2p][q], P[2p+1][q]) of the softmax weights in St (nk rows; an odd last
// row pairs with 0), rounded to nearest even.
inline void PackP(const float* St, int64_t nk, uint32_t* P2) {
  const DF d;
  const DU du;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  const int64_t br = Br();
  const auto bits = [&](VF x) {  // x finite and >= 0
    const VU u = hn::BitCast(du, x);
    return hn::ShiftRight<16>(
        hn::Add(u, hn::Add(hn::Set(du, 0x7fffu), hn::And(hn::ShiftRight<16>(u), hn::Set(du, 1u)))));
  };
  for (int64_t p = 0; p < (nk + 1) / 2; ++p)
    for (int64_t v = 0; v < kV; ++v) {
      const VU lo = bits(hn::Load(d, St + 2 * p * br + v * N));
      const VU hi =
          2 * p + 1 < nk ? bits(hn::Load(d, St + (2 * p + 1) * br + v * N)) : hn::Zero(du);
      hn::Store(hn::Or(lo, hn::ShiftLeft<16>(hi)), du, P2 + p * br + v * N);
    }
}

// V2[p][x] = (V[2p][x], V[2p+1][x]) for value rows [j0, j0+n) of a bf16 cache; ld u32 per pair
// row, features past Dv and a missing odd row are 0.
inline void PackV2(const KvRows& v, int64_t j0, int64_t n, int64_t ld, uint32_t* V2) {
  const int64_t Dv = v.cols;
  std::fill(V2, V2 + (n + 1) / 2 * ld, 0u);
  v.spans(j0, j0 + n, [&](const char* row, int64_t m, int64_t j) {
    for (int64_t t = 0; t < m; ++t) {
      const int64_t k = j - j0 + t;
      const uint16_t* src = reinterpret_cast<const uint16_t*>(row + t * v.row_bytes);
      uint32_t* dst = V2 + (k / 2) * ld;
      const int shift = static_cast<int>(k % 2) * 16;
      for (int64_t x = 0; x < Dv; ++x) dst[x] |= static_cast<uint32_t>(src[x]) << shift;
    }
  });
}

// K rows [j0, j0+n) of a bf16 cache as u32 pairs with a uniform leading dimension (u32): the
// rows themselves when evenly spaced on 4-byte boundaries, else copied into scratch.
inline const uint32_t* RowsPairs(const KvRows& k, int64_t j0, int64_t n, uint32_t* scratch,
                                 int64_t* ld) {
  const bool one_span = !k.table || (j0 % k.block_size) + n <= k.block_size;
  if (one_span && k.row_bytes % 4 == 0) {
    const uint32_t* p = nullptr;
    k.spans(j0, j0 + n, [&](const char* row, int64_t, int64_t) {
      if (reinterpret_cast<uintptr_t>(row) % 4 == 0) p = reinterpret_cast<const uint32_t*>(row);
    });
    if (p) {
      *ld = k.row_bytes / 4;
      return p;
    }
  }
  const int64_t words = k.cols / 2;
  k.spans(j0, j0 + n, [&](const char* row, int64_t m, int64_t j) {
    for (int64_t t = 0; t < m; ++t)
      std::memcpy(scratch + (j - j0 + t) * words, row + t * k.row_bytes,
                  static_cast<size_t>(words) * 4);
  });
  *ld = words;
  return scratch;
}

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
  float* p2;     // (Bcp/2 + 1) x Br u32 pairs of P (bf16 pair path)
  float* v2;     // (Bcp/2 + 1) x Dvp u32 pairs of V rows (bf16 pair path)
};

struct FlashDims {
  int64_t D, Dv, Bc, Bcp, Dvp, tiles;
  FlashDims(int64_t d, int64_t dv, int64_t bc)
      : D(d),
        Dv(dv),
        Bc(bc),
        Bcp(RoundUp(bc, kR)),
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
  take(&FlashScratch::p2, z(f.Bcp / 2 + 1) * br * fl);
  take(&FlashScratch::v2, z((f.Bcp / 2 + 1) * f.Dvp) * fl);
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
inline void MaskTile(const Masker& mk, int64_t i0, int64_t nq, int64_t jb, int64_t nk, float* St) {
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
      for (int64_t jj = 0; jj < nk; ++jj) St[jj * br + ii] += MaskLog2(mrow[jj]);
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

// Output and log-sum-exp of queries [c0, c0 + nq): row r of ot (ldo apart) divided by l[r];
// m[r] is its running max (log2 units).
inline void WriteRows(const Problem& pb, int64_t c0, int64_t nq, int64_t Dv, const float* ot,
                      int64_t ldo, const float* m, const float* l, float* row, DType dtype) {
  for (int64_t r = 0; r < nq; ++r) {
    const int64_t q = c0 + r;
    const float inv = l[r] > 0.0f ? 1.0f / l[r] : 0.0f;
    for (int64_t x = 0; x < Dv; ++x) row[x] = ot[r * ldo + x] * inv;
    convert(pb.o + q * pb.o_row, dtype, row, DType::kF32, Dv);
    pb.lse[q * pb.lse_row] = l[r] > 0.0f ? (m[r] + std::log2(l[r])) * kLn2 : kNegInf;
  }
}

// Queries [c0, c0 + nq) of one problem, nq <= tiles·Br: tiles of Br sharing each K/V block.
// pairs: bf16 q, k, v run the bf16 pair products (native: with vdpbf16ps).
void FlashChunk(const Problem& pb, const Masker& mk, int64_t c0, int64_t max_tiles,
                const FlashDims& f, float qscale, DType dtype, bool pairs, bool native,
                const FlashScratch& s) {
  const int64_t br = Br(), D = f.D, Dv = f.Dv;
  const int64_t nq = std::min(max_tiles * br, pb.sq - c0);
  const int64_t tiles = (nq + br - 1) / br;
  int64_t lo[kMaxTiles] = {}, hi[kMaxTiles] = {}, full_lo[kMaxTiles] = {}, full_hi[kMaxTiles] = {},
          nqt[kMaxTiles] = {};
  for (int64_t t = 0; t < tiles; ++t) {
    const int64_t i0 = c0 + t * br;
    nqt[t] = std::min(br, c0 + nq - i0);
    float* qt = s.qt + t * D * br;
    std::fill(qt, qt + D * br, 0.0f);
    for (int64_t i = 0; i < nqt[t]; ++i) {
      const char* qrow = pb.q + (i0 + i) * pb.q_row;
      if (pairs) {  // Qt2[p][i] = (q[2p], q[2p+1]), unscaled (the product is scaled)
        uint32_t* qt2 = reinterpret_cast<uint32_t*>(qt);
        for (int64_t x = 0; x < D / 2; ++x) std::memcpy(qt2 + x * br + i, qrow + 4 * x, 4);
        continue;
      }
      convert(s.row, DType::kF32, qrow, dtype, D);
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
  // Blocks on a grid anchored at key 0, whatever the chunk: results then do not depend on how
  // queries were split into tasks (which follows the thread count).
  const int64_t jlo = lo[0] / f.Bc * f.Bc, jhi = hi[tiles - 1] + 1;
  const bool extra = mk.slope2 != 0.0f || mk.mask != nullptr;
  PrefetchRows(pb.k, jlo, std::min(jhi, jlo + f.Bc));
  PrefetchRows(pb.v, jlo, std::min(jhi, jlo + f.Bc));
  for (int64_t jb = jlo; jb < jhi; jb += f.Bc) {
    const int64_t nk = std::min(f.Bc, jhi - jb);
    PrefetchRows(pb.k, jb + nk, std::min(jhi, jb + nk + f.Bc));
    PrefetchRows(pb.v, jb + nk, std::min(jhi, jb + nk + f.Bc));
    int64_t ldk = 0, ldv = 0;
    const float *K = nullptr, *V = nullptr;
    const uint32_t* K2 = nullptr;
    uint32_t* V2 = reinterpret_cast<uint32_t*>(s.v2);
    uint32_t* P2 = reinterpret_cast<uint32_t*>(s.p2);
    if (pairs) {
      K2 = RowsPairs(pb.k, jb, nk, reinterpret_cast<uint32_t*>(s.kbuf), &ldk);
      PackV2(pb.v, jb, nk, f.Dvp, V2);
    } else {
      K = RowsF32(pb.k, jb, nk, s.kbuf, &ldk);
      V = RowsF32(pb.v, jb, nk, s.vbuf, &ldv);
    }
    for (int64_t t = 0; t < tiles; ++t) {
      if (jb > hi[t] || jb + nk - 1 < lo[t]) continue;
      const int64_t nkt = std::min(nk, hi[t] + 1 - jb);
      const float* qt = s.qt + t * D * br;
      float* ot = s.ot + t * br * f.Dvp;
      if (!pairs) {
        QkBlock(K, ldk, nkt, qt, D, s.st);
      } else if (native) {
#if TBOOST_ATTN_BF16_NATIVE
        PairKernels<PairDotNative>::QkBlock(K2, ldk, nkt, reinterpret_cast<const uint32_t*>(qt),
                                            D / 2, qscale, s.st);
#endif
      } else {
        PairKernels<PairDotEmu>::QkBlock(K2, ldk, nkt, reinterpret_cast<const uint32_t*>(qt), D / 2,
                                         qscale, s.st);
      }
      const bool inside = jb >= full_lo[t] && jb + nkt - 1 <= full_hi[t];
      if (!inside || extra) {
        Masker m2 = mk;
        if (inside) m2.vis.left = m2.vis.right = -1;
        MaskTile(m2, c0 + t * br, nqt[t], jb, nkt, s.st);
      }
      SoftmaxStep(nkt, s.st, s.m + t * br, s.l + t * br, s.alpha);
      if (!pairs) {
        PvBlock(s.st, V, ldv, nkt, Dv, s.alpha, ot, f.Dvp);
        continue;
      }
      PackP(s.st, nkt, P2);
      if (native) {
#if TBOOST_ATTN_BF16_NATIVE
        PairKernels<PairDotNative>::PvBlock(P2, V2, (nkt + 1) / 2, f.Dvp, s.alpha, ot);
#endif
      } else {
        PairKernels<PairDotEmu>::PvBlock(P2, V2, (nkt + 1) / 2, f.Dvp, s.alpha, ot);
      }
    }
  }
  WriteRows(pb, c0, nq, Dv, s.ot, f.Dvp, s.m, s.l, s.row, dtype);
}

// ---- AMX prefill (bf16) ---------------------------------------------------------------------
// With bf16 q, k and v on a CPU with AMX tiles (amx.h), both products of a (query tile, key
// block) run on the tile unit, which does 16 x 16 x 32 bf16 multiply-adds per instruction
// (2.6 TFLOP/s on one Xeon core against 212 for f32 FMAs): the vector work around them (the
// softmax and the packing) is then most of the time. The layout turns with it: tiles multiply
// rows by pair-interleaved columns, so
//   S (Br x Bc) = Q (Br x D, the tile's rows in place of Qt) · K2, K2 = the block's keys as
//                 (D/2 x Bc) bf16 pairs (packed once per block, shared by the chunk's tiles)
//   online softmax per query row (a row's visible keys are one interval of the block)
//   O (Br x Dv) = O·alpha + P (Br x Bc, bf16) · V2, V2 = (Bc/2 x Dv) pairs, as the pair path's.
// The head dim, the value dim and the block are padded to multiples of 32 with zeros (zero
// columns of Q and rows of K2 add nothing; P is 0 past a row's last visible key and V2's
// padding rows are 0, so no garbage can reach O).
#if TBOOST_ATTN_BF16_NATIVE
// Queries per tile: Br on AVX-512, two AMX row tiles.
constexpr int64_t kAmxRows = 32;

struct AmxDims {
  int64_t D, Dv, Dp, Dvp, Bc, Bcp, tiles;
  explicit AmxDims(const FlashDims& f)
      : D(f.D),
        Dv(f.Dv),
        Dp(RoundUp(f.D, 32)),
        Dvp(RoundUp(f.Dv, 32)),
        Bc(f.Bc),
        Bcp(RoundUp(f.Bc, 32)),
        tiles(f.tiles) {}
};

struct AmxScratch {
  uint16_t* qb;  // tiles x Br x Dp: the chunk's queries, bf16
  float* st;     // Br x Bcp: one tile's scores
  uint16_t* pb;  // Br x Bcp: its softmax weights, bf16
  uint32_t* k2;  // Dp/2 x Bcp pairs of the block's keys
  uint32_t* v2;  // Bcp/2 x Dvp pairs of its value rows
  float* ot;     // tiles x Br x Dvp
  float* m;      // tiles x Br
  float* l;      // tiles x Br
  float* row;    // max(D, Dv)
};

// Carves the scratch from base (64-byte aligned pieces); bytes gets the total (base may be 0
// to size it).
inline AmxScratch CarveAmx(char* base, const AmxDims& f, size_t* bytes) {
  uintptr_t p = (reinterpret_cast<uintptr_t>(base) + 63) & ~uintptr_t{63};
  const uintptr_t start = p;
  const auto take = [&](auto* type, int64_t n) {
    using T = std::remove_pointer_t<decltype(type)>;
    T* r = reinterpret_cast<T*>(p);
    p += Align64(static_cast<size_t>(n) * sizeof(T));
    return r;
  };
  const int64_t br = kAmxRows;
  AmxScratch s;
  s.qb = take(static_cast<uint16_t*>(nullptr), f.tiles * br * f.Dp);
  s.st = take(static_cast<float*>(nullptr), br * f.Bcp);
  s.pb = take(static_cast<uint16_t*>(nullptr), br * f.Bcp);
  s.k2 = take(static_cast<uint32_t*>(nullptr), f.Dp / 2 * f.Bcp);
  s.v2 = take(static_cast<uint32_t*>(nullptr), f.Bcp / 2 * f.Dvp);
  s.ot = take(static_cast<float*>(nullptr), f.tiles * br * f.Dvp);
  s.m = take(static_cast<float*>(nullptr), f.tiles * br);
  s.l = take(static_cast<float*>(nullptr), f.tiles * br);
  s.row = take(static_cast<float*>(nullptr), std::max(f.D, f.Dv));
  if (bytes) *bytes = static_cast<size_t>(p - start) + 64;
  return s;
}

// K2[p][j] = (k[2p], k[2p+1]) of key j in rows [j0, j0+n) of a bf16 cache, ld u32 per pair row:
// the keys transposed into the tile unit's B layout. All `rows` pair rows are written, those
// past the head dim and the columns past n with 0.
inline void PackK2(const KvRows& k, int64_t j0, int64_t n, int64_t rows, int64_t ld, uint32_t* K2) {
  std::fill(K2, K2 + rows * ld, 0u);
  const int64_t D = k.cols, whole = D / 2;
  k.spans(j0, j0 + n, [&](const char* row, int64_t m, int64_t j) {
    for (int64_t t = 0; t < m; ++t) {
      const char* r = row + t * k.row_bytes;
      uint32_t* dst = K2 + (j - j0 + t);
      for (int64_t p = 0; p < whole; ++p) std::memcpy(dst + p * ld, r + 4 * p, 4);
      if (D % 2) {
        uint16_t last;
        std::memcpy(&last, r + 2 * (D - 1), 2);
        dst[whole * ld] = last;
      }
    }
  });
}

// One query row of an AMX tile over local keys [0, ncol) of its block (ncol a multiple of 32):
// s holds the unscaled scores; the row sees local keys [a, b), a < b. rel0 is the query's
// position minus the block's first key (ALiBi), mrow its custom mask at that key (or null). The
// online softmax step in log2 units: prow gets p = 2^(x - m) rounded to bf16 (0 outside
// [a, b)), m and l are updated. Returns alpha, the factor the row's earlier output must be
// scaled by (1 when the max did not move). Without ALiBi or a mask the scores are not scaled
// in place: the max is taken unscaled (scale > 0) and the scale folds into the exponent's FMA.
TBOOST_PAIR_ATTR inline float AmxSoftmaxRow(float* s, int64_t ncol, int64_t a, int64_t b,
                                            float qscale, float slope2, int64_t rel0,
                                            const float* mrow, float* m, float* l, uint16_t* prow) {
  const DF d;
  const hn::RebindToSigned<DF> di;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  const int64_t c0 = a / N * N, c1 = RoundUp(b, N);
  const bool plain = slope2 == 0.0f && mrow == nullptr && qscale > 0.0f;
  const VF ninf = hn::Set(d, kNegInf);
  const auto alo = hn::Set(di, static_cast<int32_t>(a - 1)),
             ahi = hn::Set(di, static_cast<int32_t>(b));
  const auto inside = [&](int64_t c) {
    const auto col = hn::Iota(di, static_cast<int32_t>(c));
    return hn::RebindMask(d, hn::And(hn::Gt(col, alo), hn::Lt(col, ahi)));
  };
  const auto partial = [&](int64_t c) { return c < a || c + N > b; };
  VF mx = ninf;
  float rowmax;
  if (plain) {
    for (int64_t c = c0; c < c1; c += N) {
      const VF x = hn::LoadU(d, s + c);
      mx = hn::Max(mx, partial(c) ? hn::IfThenElse(inside(c), x, ninf) : x);
    }
    rowmax = ReduceMaxF(d, mx) * qscale;
  } else {
    const VF qs = hn::Set(d, qscale);
    for (int64_t c = c0; c < c1; c += N)
      hn::StoreU(hn::IfThenElse(inside(c), hn::Mul(hn::LoadU(d, s + c), qs), ninf), d, s + c);
    for (int64_t j = a; j < b; ++j) {  // ALiBi and the custom mask, on the visible keys only
      if (slope2 != 0.0f) s[j] -= slope2 * static_cast<float>(std::llabs(rel0 - j));
      if (mrow) s[j] += MaskLog2(mrow[j]);
    }
    for (int64_t c = c0; c < c1; c += N) mx = hn::Max(mx, hn::LoadU(d, s + c));
    rowmax = ReduceMaxF(d, mx);
  }
  const float mold = *m;
  const float mnew = std::max(mold, rowmax);
  const float msafe = mnew == kNegInf ? 0.0f : mnew;
  const float alpha = mnew == mold ? 1.0f : mold == kNegInf ? 0.0f : std::exp2(mold - msafe);
  const VF mul = hn::Set(d, plain ? qscale : 1.0f), off = hn::Set(d, -msafe);
  VF sum = hn::Zero(d);
  const auto weights = [&](int64_t c) {
    if (c < c0 || c >= c1) return hn::Zero(d);
    VF p = Exp2Scalef(hn::MulAdd(hn::LoadU(d, s + c), mul, off));
    if (partial(c)) p = hn::IfThenElseZero(inside(c), p);
    sum = hn::Add(sum, p);
    return p;
  };
  for (int64_t c = 0; c < ncol; c += 2 * N) {
    const VF p0 = weights(c), p1 = weights(c + N);
    _mm512_storeu_si512(prow + c, (__m512i)_mm512_cvtne2ps_pbh(p1.raw, p0.raw));
  }
  *l = *l * alpha + ReduceSumF(d, sum);
  *m = mnew;
  return alpha;
}

// FlashChunk on the tile unit: queries [c0, c0 + nq) of one problem (bf16 q, k, v).
void FlashChunkAmx(const Problem& pb, const Masker& mk, int64_t c0, int64_t max_tiles,
                   const AmxDims& f, float qscale, const AmxScratch& s) {
  const int64_t br = kAmxRows, D = f.D, Dp = f.Dp, Dvp = f.Dvp;
  const int64_t nq = std::min(max_tiles * br, pb.sq - c0);
  const int64_t tiles = (nq + br - 1) / br;
  int64_t lo[kMaxTiles] = {}, hi[kMaxTiles] = {};
  for (int64_t t = 0; t < tiles; ++t) {
    const int64_t i0 = c0 + t * br, nqt = std::min(br, c0 + nq - i0);
    for (int64_t i = 0; i < br; ++i) {
      uint16_t* dst = s.qb + (t * br + i) * Dp;
      const int64_t have = i < nqt ? D : 0;
      if (have) std::memcpy(dst, pb.q + (i0 + i) * pb.q_row, static_cast<size_t>(D) * 2);
      std::fill(dst + have, dst + Dp, uint16_t{0});
    }
    lo[t] = std::max<int64_t>(0, mk.vis.lo(i0));
    hi[t] = mk.vis.hi(i0 + nqt - 1, pb.sk);
  }
  std::fill(s.m, s.m + nq, kNegInf);
  std::fill(s.l, s.l + nq, 0.0f);
  std::fill(s.ot, s.ot + tiles * br * Dvp, 0.0f);
  // The same block grid as FlashChunk's (anchored at key 0).
  const int64_t jlo = lo[0] / f.Bc * f.Bc, jhi = hi[tiles - 1] + 1;
  PrefetchRows(pb.k, jlo, std::min(jhi, jlo + f.Bc));
  PrefetchRows(pb.v, jlo, std::min(jhi, jlo + f.Bc));
  amx_begin();
  for (int64_t jb = jlo; jb < jhi; jb += f.Bc) {
    const int64_t nk = std::min(f.Bc, jhi - jb);
    PrefetchRows(pb.k, jb + nk, std::min(jhi, jb + nk + f.Bc));
    PrefetchRows(pb.v, jb + nk, std::min(jhi, jb + nk + f.Bc));
    PackK2(pb.k, jb, nk, Dp / 2, f.Bcp, s.k2);
    PackV2(pb.v, jb, nk, Dvp, s.v2);
    std::fill(s.v2 + (nk + 1) / 2 * Dvp, s.v2 + RoundUp(nk, 32) / 2 * Dvp, 0u);
    for (int64_t t = 0; t < tiles; ++t) {
      if (jb > hi[t] || jb + nk - 1 < lo[t]) continue;
      const int64_t i0 = c0 + t * br, nqt = std::min(br, c0 + nq - i0);
      const int64_t nkt = std::min(nk, hi[t] + 1 - jb), ncol = RoundUp(nkt, 32);
      float* ot = s.ot + t * br * Dvp;
      amx_gemm(s.qb + t * br * Dp, Dp * 2, 2, s.k2, f.Bcp * 4, ncol / 16, Dp, s.st, f.Bcp, false);
      for (int64_t i = 0; i < br; ++i) {
        uint16_t* prow = s.pb + i * f.Bcp;
        const int64_t q = i0 + i;
        const int64_t a = i < nqt ? std::max<int64_t>({0, mk.vis.lo(q), jb}) - jb : 0;
        const int64_t b = i < nqt ? std::min(mk.vis.hi(q, pb.sk) + 1, jb + nkt) - jb : 0;
        if (a >= b) {
          std::fill(prow, prow + ncol, uint16_t{0});
          continue;
        }
        const float* mrow = mk.mask ? mk.mask + q * mk.mask_row + jb : nullptr;
        const float alpha =
            AmxSoftmaxRow(s.st + i * f.Bcp, ncol, a, b, qscale, mk.slope2, q + mk.vis.offset - jb,
                          mrow, s.m + t * br + i, s.l + t * br + i, prow);
        if (alpha != 1.0f) {
          const DF d;
          const int64_t N = static_cast<int64_t>(hn::Lanes(d));
          const VF al = hn::Set(d, alpha);
          float* orow = ot + i * Dvp;
          for (int64_t x = 0; x < Dvp; x += N)
            hn::Store(hn::Mul(hn::Load(d, orow + x), al), d, orow + x);
        }
      }
      amx_gemm(s.pb, f.Bcp * 2, 2, s.v2, Dvp * 4, Dvp / 16, ncol, ot, Dvp, true);
    }
  }
  amx_end();
  WriteRows(pb, c0, nq, f.Dv, s.ot, Dvp, s.m, s.l, s.row, DType::kBF16);
}
#endif  // TBOOST_ATTN_BF16_NATIVE

// ---- driver -------------------------------------------------------------------------------

// Whole micro-kernel row groups per key block (a user-set MM_BLOCK_SIZE need not be one).
int64_t AttentionKvBlock(int64_t head_dim, int64_t v_head_dim);
inline int64_t EffBlock(const AttentionArgs& a) {
  const int64_t bc = a.kv_block > 0 ? a.kv_block : AttentionKvBlock(a.head_dim, a.v_head_dim);
  return std::max<int64_t>(kR, bc / kR * kR);
}

// The same for every context length up to a.sk and every sq up to a.sq, so setup can size the
// workspace before the data says which path a call takes.
inline size_t PerThreadBytes(const AttentionArgs& a) {
  const FlashDims dims(a.head_dim, a.v_head_dim, EffBlock(a));
  size_t bytes = std::max(FlashScratchBytes(dims), DecodeScratchBytes(a));
#if TBOOST_ATTN_BF16_NATIVE
  size_t amx = 0;
  CarveAmx(nullptr, AmxDims(dims), &amx);
  bytes = std::max(bytes, amx);
#endif
  return bytes;
}

size_t AttentionWorkspace(const AttentionArgs& a) {
  // Decode partials only where the decode path may run: they grow with the context length.
  const bool decode = UseDecode(a) || a.sq_is_bound;
  return static_cast<size_t>(std::max(1, a.threads)) * PerThreadBytes(a) +
         (decode ? PartialBytes(a) : 0);
}

void FlashForward(const AttentionArgs& a, char* ws) {
  const int64_t br = Br(), D = a.head_dim, Dv = a.v_head_dim;
  // Whole micro-kernel row groups per block (a user-set MM_BLOCK_SIZE need not be a multiple).
  const FlashDims dims(D, Dv, EffBlock(a));
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
  const bool bf16 = a.dtype == DType::kBF16 && a.kv_dtype == DType::kBF16;
  // The forced pair emulation (tests) comes first, then AMX, then vdpbf16ps pairs.
  const bool amx = TBOOST_ATTN_BF16_NATIVE && bf16 && !a.force_bf16_pairs && a.allow_amx &&
                   attention_prefill_bf16_amx();
  const bool native = TBOOST_ATTN_BF16_NATIVE && attention_prefill_bf16_dot();
  const bool pairs = bf16 && D % 2 == 0 && !amx && (native || a.force_bf16_pairs);
  RunTasks(
      a.threads, a.ftz, static_cast<int64_t>(tasks.size()), ws, per, [&](int64_t t, char* mine) {
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
#if TBOOST_ATTN_BF16_NATIVE
        if (amx) {
          const AmxDims ad(dims);
          FlashChunkAmx(pb, mk, tk.i0, tiles, ad, qscale, CarveAmx(mine, ad, nullptr));
          return;
        }
#endif
        FlashChunk(pb, mk, tk.i0, tiles, dims, qscale, a.dtype, pairs, native,
                   CarveFlash(mine, dims));
      });
}

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
    DecodeForward(a, ws, PerThreadBytes(a));
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

// Whether the prefill dots bf16 pairs with vdpbf16ps (where the CPU has it) rather than
// widening bf16 K/V to f32 for FMAs. Not on Intel: on an Intel Xeon with AMX vdpbf16ps ran at
// half the FMA rate (bench-ops limits: 211 against 424 GFLOP/s on 2 cores), and bf16 prefill
// at T = 2048 ran at 0.66-0.69x of f32 with it against 1.01-1.05x widened (bench/RESULTS.md,
// "Intel AMX, eighteenth session"). On Zen 4 and Zen 5 it is the faster path (1.5-1.8x f32). On
// Intel, decode and the backward pass keep vdpbf16ps: MHA decode read its cache at 0.91 of the DRAM
// floor with it against 0.77 widened, and the backward pass ran 1.2-1.6x faster.
bool attention_prefill_bf16_dot() {
  const CpuFeatures& f = cpu_features();
  return f.avx512_bf16 && f.vendor != "GenuineIntel";
}

// AMX where the process may use it (amx.h): bf16 prefill at T = 2048 then ran at
// 3.4x of f32 on an Intel Xeon with AMX, 2.0-4.0x over the shapes benchmarked (bench/RESULTS.md,
// "Intel AMX, nineteenth session"); the widened path had run at 1.01-1.07x.
bool attention_prefill_bf16_amx() { return amx_bf16_usable(); }

// From 2 rows, on contiguous caches and pages of 64 keys or more (attention_decode.cc says why).
bool attention_decode_bf16_amx(int64_t rows, int64_t block_size) {
  return amx_bf16_usable() && rows >= 2 && (block_size == 0 || block_size >= 64);
}

bool attention_decode_streams_into_l2() {
  const CpuFeatures& f = cpu_isa();
  return f.vendor == "AuthenticAMD" && f.family == 0x19 && f.avx512f;
}

bool attention_amx_allowed() {
  const char* env = std::getenv("TBOOST_ATTN_AMX");
  return !(env && std::strcmp(env, "0") == 0);
}

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
