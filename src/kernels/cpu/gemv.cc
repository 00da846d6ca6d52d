// Weight-streaming GEMV for decode (M <= kGemvMaxRows rows of x against W (N, K)).
//
// Why our own: at M = 1..8 a GEMM library's blocking buys nothing (every weight is used M
// times), and oneDNN 2.6 streams weights at well below DRAM speed at these shapes (PERF.md:
// 25-50 GB/s of 63). Decode time is weight bytes / bandwidth, so the kernel's only job is to
// read each weight row once, sequentially, with enough independent FMA chains to keep up:
// kRows weight rows at a time, each dotted with all M rows of x (converted to f32 once, kept in
// L1/L2), f32 accumulators, one horizontal sum per output. bf16/f16 weights are widened in
// registers, so a bf16 model reads half the bytes. Outputs are gathered per vector of N and
// finished with the fused epilogue (bias, activation, residual add or multiply) before one
// rounding store. Threads split N into blocks of 16 outputs, each computed whole by one thread
// (deterministic: each output's sum order never depends on the threads), and a thread that
// finishes its share first takes the other's last blocks (parallel_for_balanced).
// clang-format off: Highway's per-target re-inclusion needs this exact order.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "src/kernels/cpu/gemv.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
// clang-format on

#include <algorithm>
#include <cstring>
#include <type_traits>
#include <vector>

#include "hwy/highway.h"
#include "src/core/parallel.h"
#include "src/kernels/cpu/hwy_util-inl.h"
#include "src/kernels/cpu/kernels.h"
#include "tboost/core/cpu_features.h"

HWY_BEFORE_NAMESPACE();
namespace tboost::kernels::HWY_NAMESPACE {

// How far ahead of its loads the weight stream asks for lines (StreamAhead): 2 KiB on AVX2.
// On Zen 3 the best distance moved with the host's memory: in one session 1 KiB beat 4 KiB
// (llama-110m f32 0.63-0.72 -> 0.74-0.89 of its floor, llama-1b bf16 13.2-13.7 -> 15.5-16.3
// tokens/s) and 2 KiB was within the noise of 1 KiB; in a later one, with slower reads
// (26-36 GB/s), whole-model decode alternated in one process ran 1.3-1.6x faster at 2 KiB than
// at 1 KiB and 1.1-1.3x faster than at 1.5, 2.5, 3 or 4 KiB; twenty minutes later 1 and 2 KiB
// were equal (bench/RESULTS.md, "Zen 3, fifteenth session").
constexpr int64_t kGemvAheadBytes = HWY_TARGET == HWY_AVX2 ? 2048 : kStreamAheadBytes;

// One weight row against kM rows of x (f32, stride ldx): out[m * 16] = x_m · w. The row is
// read front to back with kU independent accumulators per x row, so the whole weight matrix is
// one sequential stream (rows are contiguous): the hardware prefetcher follows it, which it
// does not for several short rows read side by side (K = 768 bf16 is 24 cache lines). Every
// weight load also asks for the line 4 KiB ahead (StreamAhead): the hardware prefetcher alone
// fell behind the host's faster memory mode (bench/RESULTS.md, "stream prefetch").
template <int kM, int kU, class TW>
HWY_INLINE void DotRow(const float* x, int64_t ldx, const TW* w, int64_t K, float* out) {
  const hn::ScalableTag<float> d;
  const int64_t L = static_cast<int64_t>(hn::Lanes(d));
  using V = hn::Vec<decltype(d)>;
  V acc[kM][kU];
  for (int m = 0; m < kM; ++m)
    for (int u = 0; u < kU; ++u) acc[m][u] = hn::Zero(d);
  int64_t k = 0;
  for (; k + kU * L <= K; k += kU * L) {
    for (int u = 0; u < kU; ++u) {
      StreamAheadAt(w, k + u * L, kGemvAheadBytes);
      const V wv = LoadF(d, w + k + u * L);
      for (int m = 0; m < kM; ++m)
        acc[m][u] = hn::MulAdd(hn::LoadU(d, x + m * ldx + k + u * L), wv, acc[m][u]);
    }
  }
  for (; k < K; k += L) {
    const auto n = static_cast<size_t>(std::min(L, K - k));
    const V wv = LoadTailF(d, w + k, n);
    for (int m = 0; m < kM; ++m)
      acc[m][0] = hn::MulAdd(LoadTailF(d, x + m * ldx + k, n), wv, acc[m][0]);
  }
  for (int m = 0; m < kM; ++m) {
    V t = acc[m][0];
    for (int u = 1; u < kU; ++u) t = hn::Add(t, acc[m][u]);
    out[m * 16] = ReduceSumF(d, t);
  }
}

// One x row (M = 1, the decode case) reads one weight row at a time, except that a matrix of
// 8 blocks or more takes GemvFarStreams (AVX2, AVX-512), and on AVX2 f32 and bf16 rows of at least
// kSideBySideMinBytes (smaller matrices, the far streams' last item) 4 rows side by side
// (DotRowN, DotRowBf16PairsN), each asking for lines kGroupAheadBytes ahead with
// AskGroupAhead. Before the far streams, on Zen 3, medians over
// alternated rounds of a chain of the models' GEMVs, as fractions of a read of their weights
// timed in turn (bench/RESULTS.md, "Zen 3, sixteenth session"):
// - llama-1b f32 (rows of 8 and 22 KiB): 1.11 at 256 or 512 bytes ahead, 1.07 at 768, against
//   0.93 for 4 rows asking 2 KiB ahead of each row alone and 0.88 for one row at a time;
// - llama-1b bf16 (4 and 11 KiB): 0.97-0.98 at 256-512 bytes, 0.91 at 1 KiB, against 0.77 one
//   row at a time;
// - llama-110m f32 (3 and 8 KiB): 0.88-0.89 against 0.84-0.87;
// - llama-110m bf16's 1.5 KiB rows side by side: 0.70-0.75 against 0.84, so they stay one at
//   a time.
// Not measured on AVX-512, where a 4-row M = 1 loop over llama-110m's bf16 rows with per-row
// distances had run at 0.61-0.68 of the read against 0.90-0.95 one row at a time.
// On AVX2 the batched path (2+ x rows, rows of kMultiRowMinBytes or more; since the far
// streams, 5-8 x rows and matrices under 8 blocks) asks the same way:
// llama-1b's chain at M = 2 f32 1.03 against 0.89 with per-row distances, bf16 0.80 against
// 0.68; M = 4 f32 0.94 against 0.80, bf16 0.79 against 0.64; M = 8 bf16 (bound by its FMAs)
// 0.39 against 0.37.
constexpr bool kSideBySide = HWY_TARGET == HWY_AVX2;
constexpr int64_t kSideBySideMinBytes = 3072;
constexpr int64_t kGroupAheadBytes = 512;
// For kR weight rows read side by side (one x row and rows of kSideBySideMinBytes or more, or
// the batched path's rows):
// asks, once per line, for each row's line kGroupAheadBytes past the loads at element k, or,
// past the row's end, for the same place in the row kR below it, which the next group of
// rows reads next. A distance relative to each row alone (StreamAheadAt) ran past the row's
// end into the row the group was reading anyway, so every group started its rows cold.
template <int kR, class TW>
HWY_INLINE void AskGroupAhead(const TW* w, int64_t ldw, int64_t k, int64_t K) {
  constexpr int64_t kSize = static_cast<int64_t>(sizeof(TW));
  if (((k * kSize) & 63) != 0) return;
  int64_t at = k + kGroupAheadBytes / kSize;
  if (at >= K) at += kR * ldw - K;
#pragma GCC unroll 16
  for (int r = 0; r < kR; ++r) __builtin_prefetch(w + r * ldw + at, 0, 3);
}

// kR weight rows (ldw apart) against kM rows of x: each x vector is loaded once for all kR
// rows, and the kR·kM accumulators are independent FMA chains. With one row at a time and
// several x rows, each weight vector fed kM FMAs behind kM x loads: at M = 4 the weight stream
// ran at half the speed of M = 1 (bench/RESULTS.md, "batched decode").
// kRowAhead: how each row asks for its lines (without kGroupAhead; StreamAheadAs).
template <int kR, int kM, bool kGroupAhead = false, int64_t kRowAhead = kGemvAheadBytes, class TW>
HWY_INLINE void DotRowN(const float* x, int64_t ldx, const TW* w, int64_t ldw, int64_t K,
                        float* out) {
  const hn::ScalableTag<float> d;
  const int64_t L = static_cast<int64_t>(hn::Lanes(d));
  using V = hn::Vec<decltype(d)>;
  V acc[kR][kM];
#pragma GCC unroll 16
  for (int r = 0; r < kR; ++r)
#pragma GCC unroll 16
    for (int m = 0; m < kM; ++m) acc[r][m] = hn::Zero(d);
  int64_t k = 0;
  for (; k + L <= K; k += L) {
    V wv[kR];
    if constexpr (kGroupAhead) AskGroupAhead<kR>(w, ldw, k, K);
#pragma GCC unroll 16
    for (int r = 0; r < kR; ++r) {
      if constexpr (!kGroupAhead) StreamAheadAsAt<kRowAhead>(w + r * ldw, k);
      wv[r] = LoadF(d, w + r * ldw + k);
    }
#pragma GCC unroll 16
    for (int m = 0; m < kM; ++m) {
      const V xv = hn::LoadU(d, x + m * ldx + k);
#pragma GCC unroll 16
      for (int r = 0; r < kR; ++r) acc[r][m] = hn::MulAdd(xv, wv[r], acc[r][m]);
    }
  }
  if (k < K) {
    const auto n = static_cast<size_t>(K - k);
    for (int m = 0; m < kM; ++m) {
      const V xv = LoadTailF(d, x + m * ldx + k, n);
      for (int r = 0; r < kR; ++r)
        acc[r][m] = hn::MulAdd(xv, LoadTailF(d, w + r * ldw + k, n), acc[r][m]);
    }
  }
  for (int r = 0; r < kR; ++r)
    for (int m = 0; m < kM; ++m) out[m * 16 + r] = ReduceSumF(d, acc[r][m]);
}

// Weight rows per DotRowN call for kM x rows: as many of 4, 2, 1 as keep the accumulators, the
// weight vectors and an x vector in registers (32 on AVX-512, 16 elsewhere).
#undef TBOOST_GEMV_REGS  // this file is compiled once per target
#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
#define TBOOST_GEMV_REGS 32
#else
#define TBOOST_GEMV_REGS 16
#endif
// Rows of at least this many bytes take DotRowN for 2+ rows of x. Shorter rows read side by
// side lose the hardware prefetchers (Zen 4, M = 2 to 4: K = 768 f32 rows ran 1.3-1.5x slower
// that way, bf16 ones 1.4-1.6x).
constexpr int64_t kMultiRowMinBytes = 4096;
// kWVecs vectors per weight row and kXVecs per x row (DotRowN: 1, 1; the pair split: 2, 2).
constexpr int RowsAtOnce(int kM, int kWVecs = 1, int kXVecs = 1) {
  for (int r : {4, 2}) {
    if (r * kM + r * kWVecs + kXVecs + 2 <= TBOOST_GEMV_REGS) return r;
  }
  return 1;
}

// fn(std::integral_constant<int, kR>(), j) for the weight rows from j in groups of kR, then
// fn(std::integral_constant<int, 1>(), j) for each row left of [0, cnt).
template <int kR, class Fn>
HWY_INLINE void InRowGroups(int64_t cnt, const Fn& fn) {
  int64_t j = 0;
  for (; j + kR <= cnt; j += kR) fn(std::integral_constant<int, kR>(), j);
  for (; j < cnt; ++j) fn(std::integral_constant<int, 1>(), j);
}

// bf16 weights, K a multiple of 2 * Lanes: each load holds Lanes pairs of bf16 (WidenPairs). x was
// stored
// pair-split per 2 * Lanes chunk (even elements, then odd ones), so no cross-lane shuffle is
// needed: two ALU ops widen 2 * Lanes weights, where PromoteTo costs a shuffle per Lanes.
template <int kM, int kU>
HWY_INLINE void DotRowBf16Pairs(const float* x, int64_t ldx, const bf16_t* w, int64_t K,
                                float* out) {
  const hn::ScalableTag<float> d;
  const int64_t L = static_cast<int64_t>(hn::Lanes(d));
  using V = hn::Vec<decltype(d)>;
  V acc[kM][kU];
  for (int m = 0; m < kM; ++m)
    for (int u = 0; u < kU; ++u) acc[m][u] = hn::Zero(d);
  auto step = [&](int64_t k, int u) HWY_ATTR {
    V we, wo;
    StreamAheadAt(w, k, kGemvAheadBytes);
    WidenPairs(d, w + k, &we, &wo);
    for (int m = 0; m < kM; ++m) {
      acc[m][u] = hn::MulAdd(hn::LoadU(d, x + m * ldx + k), we, acc[m][u]);
      acc[m][u] = hn::MulAdd(hn::LoadU(d, x + m * ldx + k + L), wo, acc[m][u]);
    }
  };
  int64_t k = 0;
  for (; k + kU * 2 * L <= K; k += kU * 2 * L) {
    for (int u = 0; u < kU; ++u) step(k + u * 2 * L, u);
  }
  for (; k < K; k += 2 * L) step(k, 0);
  for (int m = 0; m < kM; ++m) {
    V t = acc[m][0];
    for (int u = 1; u < kU; ++u) t = hn::Add(t, acc[m][u]);
    out[m * 16] = ReduceSumF(d, t);
  }
}

// kR weight rows at once (see DotRowN) on the pair-split layout of DotRowBf16Pairs.
template <int kR, int kM, bool kGroupAhead = false, int64_t kRowAhead = kGemvAheadBytes>
HWY_INLINE void DotRowBf16PairsN(const float* x, int64_t ldx, const bf16_t* w, int64_t ldw,
                                 int64_t K, float* out) {
  const hn::ScalableTag<float> d;
  const int64_t L = static_cast<int64_t>(hn::Lanes(d));
  using V = hn::Vec<decltype(d)>;
  V acc[kR][kM];
#pragma GCC unroll 16
  for (int r = 0; r < kR; ++r)
#pragma GCC unroll 16
    for (int m = 0; m < kM; ++m) acc[r][m] = hn::Zero(d);
  for (int64_t k = 0; k < K; k += 2 * L) {
    V we[kR], wo[kR];
    if constexpr (kGroupAhead) AskGroupAhead<kR>(w, ldw, k, K);
#pragma GCC unroll 16
    for (int r = 0; r < kR; ++r) {
      if constexpr (!kGroupAhead) StreamAheadAsAt<kRowAhead>(w + r * ldw, k);
      WidenPairs(d, w + r * ldw + k, &we[r], &wo[r]);
    }
#pragma GCC unroll 16
    for (int m = 0; m < kM; ++m) {
      const V xe = hn::LoadU(d, x + m * ldx + k), xo = hn::LoadU(d, x + m * ldx + k + L);
#pragma GCC unroll 16
      for (int r = 0; r < kR; ++r) {
        acc[r][m] = hn::MulAdd(xe, we[r], acc[r][m]);
        acc[r][m] = hn::MulAdd(xo, wo[r], acc[r][m]);
      }
    }
  }
  for (int r = 0; r < kR; ++r)
    for (int m = 0; m < kM; ++m) out[m * 16 + r] = ReduceSumF(d, acc[r][m]);
}

// bf16 x and weights on CPUs with AVX512_BF16: vdpbf16ps multiplies 32 bf16 pairs and adds
// into 16 f32 lanes in one instruction, with x and w loaded as they are stored (no widening,
// no pair split). The products of bf16 values are exact in f32, so only the summation order
// differs from the widened path. Used only when x itself is bf16 (a bf16 model's activations).
#if TBOOST_HAS_BF16_DOT
template <int kM, int kU>
TBOOST_BF16_DOT_ATTR HWY_NOINLINE void DotRowsBf16Dp(const uint32_t* x2, int64_t ldx2,
                                                     const bf16_t* w, int64_t ldw, int64_t K,
                                                     int64_t cnt, float* sums) {
  const int64_t P = K / 2;  // u32 pairs per row, a multiple of 16
  for (int64_t j = 0; j < cnt; ++j) {
    const uint32_t* wr = reinterpret_cast<const uint32_t*>(w + j * ldw);
    __m512 acc[kM][kU];
    for (int m = 0; m < kM; ++m)
      for (int u = 0; u < kU; ++u) acc[m][u] = _mm512_setzero_ps();
    int64_t p = 0;
    for (; p + kU * 16 <= P; p += kU * 16)
      for (int u = 0; u < kU; ++u) {
        StreamAhead(wr + p + u * 16);
        const __m512i wv = _mm512_loadu_si512(wr + p + u * 16);
        for (int m = 0; m < kM; ++m)
          acc[m][u] = _mm512_dpbf16_ps(
              acc[m][u], (__m512bh)_mm512_loadu_si512(x2 + m * ldx2 + p + u * 16), (__m512bh)wv);
      }
    for (; p < P; p += 16) {
      StreamAhead(wr + p);
      const __m512i wv = _mm512_loadu_si512(wr + p);
      for (int m = 0; m < kM; ++m)
        acc[m][0] = _mm512_dpbf16_ps(acc[m][0], (__m512bh)_mm512_loadu_si512(x2 + m * ldx2 + p),
                                     (__m512bh)wv);
    }
    for (int m = 0; m < kM; ++m) {
      __m512 t = acc[m][0];
      for (int u = 1; u < kU; ++u) t = _mm512_add_ps(t, acc[m][u]);
      sums[m * 16 + j] = _mm512_reduce_add_ps(t);
    }
  }
}

// kR weight rows at once (see DotRowN): each x vector loaded once for all of them, each weight
// line asked for as StreamAheadAs<kAhead> says.
template <int kR, int kM, int64_t kAhead = kStreamAheadBytes>
TBOOST_BF16_DOT_ATTR HWY_INLINE void DotRowsBf16DpN(const uint32_t* x2, int64_t ldx2,
                                                    const bf16_t* w, int64_t ldw, int64_t K,
                                                    float* sums) {
  const int64_t P = K / 2;  // u32 pairs per row, a multiple of 16
  const uint32_t* wr[kR];
  for (int r = 0; r < kR; ++r) wr[r] = reinterpret_cast<const uint32_t*>(w + r * ldw);
  __m512 acc[kR][kM];
  for (int r = 0; r < kR; ++r)
    for (int m = 0; m < kM; ++m) acc[r][m] = _mm512_setzero_ps();
  for (int64_t p = 0; p < P; p += 16) {
    __m512i wv[kR];
    for (int r = 0; r < kR; ++r) {
      StreamAheadAs<kAhead>(wr[r] + p);
      wv[r] = _mm512_loadu_si512(wr[r] + p);
    }
    for (int m = 0; m < kM; ++m) {
      const __m512bh xv = (__m512bh)_mm512_loadu_si512(x2 + m * ldx2 + p);
      for (int r = 0; r < kR; ++r) acc[r][m] = _mm512_dpbf16_ps(acc[r][m], xv, (__m512bh)wv[r]);
    }
  }
  for (int r = 0; r < kR; ++r)
    for (int m = 0; m < kM; ++m) sums[m * 16 + r] = _mm512_reduce_add_ps(acc[r][m]);
}
template <int kR, int kM>
TBOOST_BF16_DOT_ATTR HWY_NOINLINE void DotRowsBf16DpRows(const uint32_t* x2, int64_t ldx2,
                                                         const bf16_t* w, int64_t ldw, int64_t K,
                                                         int64_t cnt, float* sums) {
  int64_t j = 0;
  for (; j + kR <= cnt; j += kR) DotRowsBf16DpN<kR, kM>(x2, ldx2, w + j * ldw, ldw, K, sums + j);
  for (; j < cnt; ++j) DotRowsBf16DpN<1, kM>(x2, ldx2, w + j * ldw, ldw, K, sums + j);
}
#endif

// How x is stored for the dots: f32 rows; f32 rows pair-split per 2·Lanes chunk (bf16
// weights, DotRowBf16Pairs); or bf16 rows as given, dotted with vdpbf16ps (DotRowsBf16Dp).
enum class XLayout { kF32, kF32PairSplit, kBf16 };

// Dots of kM rows of x with weight rows [0, cnt) (cnt <= 16) into sums[m * 16 + j]: one weight
// row at a time for one x row (long rows on AVX2 aside: kSideBySide) or short rows (kM * kU
// accumulators, within AVX2's 16 registers), RowsAtOnce(kM) rows at a time otherwise (DotRowN,
// DotRowsBf16DpN). Not inlined: one copy per (kM, TW) serves every output type and epilogue
// (inlined, the 45 GemvTyped instantiations each carried all four, and gemv.cc was the
// second-longest compile of the library). A call per block of 16 weight rows costs nothing
// measurable.
template <int kM, class TW>
HWY_NOINLINE void DotRows(const float* x, int64_t ldx, const TW* w, int64_t ldw, int64_t K,
                          int64_t cnt, float* sums, XLayout xl) {
  constexpr int kU = kM <= 2 ? 4 : 2;
  // One x row against bf16 rows read one at a time on AVX2 (those under kSideBySideMinBytes):
  // 8 accumulators, 256 bytes of weights per step (as 4 do with AVX-512's vectors). On Zen 3,
  // before long rows went side by side, medians over alternated rounds: llama-1b bf16's GEMV
  // chain at 0.87-0.92 of a read of its weights timed in turn against 0.78-0.85 with 4,
  // llama-110m's at 0.89-0.95 against 0.83-0.90; llama-110m bf16 decode at 0.82-0.87 of its
  // floor against 0.70-0.78 (bench/RESULTS.md, "Zen 3, sixteenth session"). f32 rows gained
  // nothing from 8 (0.88 against 0.89).
  constexpr int kUPairs = kM == 1 && HWY_TARGET == HWY_AVX2 ? 8 : kU;
  constexpr int kR = RowsAtOnce(kM);
  // Rows side by side ask for lines per group (AskGroupAhead) on AVX2; f16 rows were not
  // measured and keep the per-row distance.
  constexpr bool kGroupAsk = kSideBySide && !std::is_same_v<TW, f16_t>;
  const int64_t row_bytes = K * static_cast<int64_t>(sizeof(TW));
  const bool pairs = xl == XLayout::kF32PairSplit;
  // Several weight rows at once: for several x rows over rows of kMultiRowMinBytes, and with
  // kGroupAsk for one x row over f32 or pair-split bf16 rows of kSideBySideMinBytes.
  const bool multi = kM > 1 ? row_bytes >= kMultiRowMinBytes
                            : kGroupAsk && row_bytes >= kSideBySideMinBytes &&
                                  (pairs || !std::is_same_v<TW, bf16_t>);
#if TBOOST_HAS_BF16_DOT
  if constexpr (std::is_same_v<TW, bf16_t>) {
    if (xl == XLayout::kBf16) {  // x holds bf16 rows of K / 2 u32 pairs (ldx counts u32s)
      const auto* x2 = reinterpret_cast<const uint32_t*>(x);
      if (!multi) return DotRowsBf16Dp<kM, 4>(x2, ldx, w, ldw, K, cnt, sums);
      return DotRowsBf16DpRows<kR, kM>(x2, ldx, w, ldw, K, cnt, sums);
    }
  }
#endif
  if (multi) {
    if constexpr (std::is_same_v<TW, bf16_t>) {
      if (pairs)
        return InRowGroups<RowsAtOnce(kM, 2, 2)>(cnt, [&](auto rows, int64_t j) HWY_ATTR {
          DotRowBf16PairsN<rows(), kM, kGroupAsk>(x, ldx, w + j * ldw, ldw, K, sums + j);
        });
    }
    return InRowGroups<kR>(cnt, [&](auto rows, int64_t j) HWY_ATTR {
      DotRowN<rows(), kM, kGroupAsk>(x, ldx, w + j * ldw, ldw, K, sums + j);
    });
  }
  for (int64_t j = 0; j < cnt; ++j) {
    if constexpr (std::is_same_v<TW, bf16_t>) {
      if (pairs) {
        DotRowBf16Pairs<kM, kUPairs>(x, ldx, w + j * ldw, K, sums + j);
        continue;
      }
    }
    DotRow<kM, kU>(x, ldx, w + j * ldw, K, sums + j);
  }
}

template <ops::ActivationType kAct, bool kHasAct, class TY>
void Epilogue(const GemvArgs& a, const float* sums, int64_t m0, int64_t mcount, int64_t n0,
              int64_t cnt) {
  const hn::ScalableTag<float> d;
  const int64_t L = static_cast<int64_t>(hn::Lanes(d));
  for (int64_t m = 0; m < mcount; ++m) {
    TY* y = static_cast<TY*>(a.y) + (m0 + m) * a.ldy;
    const TY* res = a.residual ? static_cast<const TY*>(a.residual) + (m0 + m) * a.ldr : nullptr;
    for (int64_t j = 0; j < cnt; j += L) {
      const int64_t n = std::min(L, cnt - j);
      auto v = LoadN(d, sums + m * 16 + j, n);
      if (a.bias) {
        if (a.bias_dtype == DType::kF32)
          v = hn::Add(v, LoadN(d, static_cast<const float*>(a.bias) + n0 + j, n));
        else if (a.bias_dtype == DType::kBF16)
          v = hn::Add(v, LoadN(d, static_cast<const bf16_t*>(a.bias) + n0 + j, n));
        else
          v = hn::Add(v, LoadN(d, static_cast<const f16_t*>(a.bias) + n0 + j, n));
      }
      if constexpr (kHasAct) v = ApplyActivation<kAct>(d, v);
      if (res) {
        const auto r = LoadN(d, res + n0 + j, n);
        v = a.residual_mul ? hn::Mul(v, r) : hn::Add(v, r);
      }
      StoreN(d, v, y + n0 + j, n);
    }
  }
}

constexpr int64_t kBlock = 16;  // outputs gathered per epilogue call (2 AVX2 vectors)

// 1-4 x rows on AVX2 and AVX-512 (8 blocks or more): each thread reads kS streams at once
// (RowsAtOnce: 4 for one x row; on AVX2 4 for 2 f32 rows and 2 otherwise, on AVX-512's 32
// registers 4 for up to 4 rows), the matrix's kS parts apart. Item i
// holds the blocks i, i + Q, ..., i + (kS - 1)·Q (Q items); its j-th rows, one per block, are
// dotted side by side (DotRowN, DotRowBf16PairsN on pair-split x, DotRowsBf16DpN on bf16 x with
// vdpbf16ps), so each stream is a run of whole consecutive rows read front to back, however short
// the rows. Each row asks for its line kFarStreamAheadBytes ahead, which past the row's end is the
// next row of the same stream. Threads take items as the blocks path takes blocks
// (parallel_for_balanced), so a thread's range is kS runs of Q / 2 blocks. Why: rows one at a time
// are one stream per thread, and it left DRAM idle; adjacent rows side by side are several streams
// only while a row lasts (1.5 KiB rows: 0.70-0.75 of a read against 0.84 one at a time). On Zen 3,
// alternated in one process against the paths before (adjacent rows side by side from 3 KiB for one
// x row, from 4 KiB for several, else one at a time), as fractions of a read of the same weights
// timed in turn (bench/RESULTS.md, "Zen 3, seventeenth session"):
// - whole-model decode: llama-110m bf16 1.02 against 0.78, f32 0.96 against 0.84; llama-1b
//   bf16 1.02 against 0.93, f32 1.06 against 1.01;
// - GEMV chains of the models' shapes, one x row: llama-110m bf16 1.22 against 0.83, f32 1.14
//   against 0.90, f16 0.99 against 0.83; llama-1b bf16 1.16 against 0.96, f32 1.03 against
//   1.04, f16 1.06 against 0.80;
// - 2 x rows: llama-110m bf16 0.89 against 0.71, f32 1.02 against 0.86; llama-1b bf16 0.90
//   against 0.74, f32 1.09 against 1.07; 3: llama-1b bf16 0.89 against 0.72, f32 1.02 against
//   0.92; 4: llama-110m bf16 0.74 against 0.69, f32 0.90 against 0.74; llama-1b bf16 0.79
//   against 0.64, f32 0.95 against 0.95;
// - 0.5, 1, 1.5 and 2 KiB ahead all gained over the old paths (llama-110m decode, 4-20%).
// On AVX-512 (an Intel Xeon with AMX, 2 cores), against the blocks path, new and old binaries
// alternated (bench/RESULTS.md, "Intel AMX, eighteenth session"):
// - whole-model decode, fractions of the read floor before 4806f7f (one stream per thread):
//   llama-110m f32 0.98-1.05 against 0.84-0.89, bf16 0.95-1.00 against 0.83-0.94; llama-1b f32
//   1.01-1.10 against 0.76-0.80, bf16 1.02-1.07 against 0.94-0.99;
// - bench-ops GEMVs (fractions of that read timed in turn): 2048x5632 f32 1.08-1.10 against
//   0.77-0.78, bf16 1.06-1.08 against 0.96-0.98; 4 x rows f32 1.11-1.13 against 0.94-0.95,
//   bf16 1.06-1.07 against 0.85-0.86.
// AMD's AVX-512 cores take the far streams too, without software requests for 1-2 x rows
// (FarStreamsAskAhead below); 5-8 x rows keep the blocks path.
constexpr bool kFarStreams = HWY_TARGET == HWY_AVX2 || TBOOST_GEMV_REGS == 32;
constexpr int64_t kFarStreamAheadBytes = 1024;
// Whether the far streams ask for their lines ahead in software at all. Not on AMD's AVX-512
// cores: on Zen 5 (2 cores, weights on 2 MiB pages) the hardware prefetchers kept the far streams
// fed, and the requests slowed them (bench/RESULTS.md, "Zen 5, twenty-sixth session"):
// - whole-model decode alternated in one process, GB/s of weights, asking against not: llama-110m
//   bf16 (4 KiB ahead) medians 47.6 against 50.3 with the host's memory in its slow mode (24
//   rounds), 62.4 against 70.8 in its fast mode (10); llama-1b bf16 61.6 against 71.0 (fast, one
//   round); llama-110m f32 (1 KiB ahead) within ±2% in the slow mode, 67.7-72.1 against 72.2-76.1
//   in the fast mode (24 rounds); llama-1b f32 73.0-75.2 against 78.6-80.8 (fast, 5 rounds);
// - `tboost bench`, binaries in turn: llama-110m bf16 279-293 against 315-319 tokens/s (fast
//   mode), llama-110m f32 114.5-115.2 against 113.6-113.8 (slow mode), llama-1b bf16 41.8 against
//   47.1-47.2 (fast mode).
// On Zen 4 (llama-110m, `tboost bench -p 16 -n 128 -r 3`, one build with the three ways switched
// by the environment, in turn; fractions of the read
// timed with each run; bench/RESULTS.md, twenty-ninth session) the quiet streams (with the
// per-step choice of prefetchnta) read at a median 0.90 (bf16, 18 runs) and 0.96 (f32, 9),
// requests 4 KiB ahead (bf16) or 1 KiB (f32) into L1 at 0.89 and 0.96 (0.82-0.83 in f32's
// fast-mode round), the same requests into L2 at 0.94 and 0.96, with the memory modes spread
// unevenly over the runs: no clear gain, so Zen 4 keeps the quiet streams. AVX2 machines (Zen 3)
// and Intel keep the requests, measured to gain there (above).
// From 3 x rows they keep asking: with 3 or 4 dots per weight vector the loop falls behind
// the hardware prefetchers (bench-ops GEMV 2048x5632, asking against not: 4 rows 0.90-0.92 of
// the read against 0.80-0.83 in the slow mode, 0.64-0.72 against 0.55-0.58 in the fast mode;
// 3 rows 0.68 against 0.63 (f32, fast), 0.91-0.97 against 0.89-0.93 (slow); 2 rows 0.81-0.82
// against 0.84-0.85 (fast), 0.94-1.00 against 0.96-1.01 (slow)).
constexpr int kFarQuietMaxRows = 2;
inline bool FarStreamsAskAhead() { return !weight_stream_hint_applies(); }

// The sums of one whole item of kS blocks (kM x rows): block s's x row m at sums[s·64 + m·16 +
// j] (Epilogue's layout). Not inlined, and templated on neither the output type nor the
// epilogue (see DotRows): inlined into every GemvTyped instantiation, the far streams took
// gemv.cc's compile from 27 s to 161; 32 s like this.
// Row j of each of an item's kS blocks, from t[m·16 + s] (DotRowN's layout) into sums.
template <int kM, int kS>
HWY_INLINE void ScatterItemRow(const float* t, int64_t j, float* sums) {
  for (int s = 0; s < kS; ++s)
    for (int m = 0; m < kM; ++m) sums[s * 64 + m * 16 + j] = t[m * 16 + s];
}

// kAhead: how each stream asks for its lines (StreamAheadAs; FarPlanOf).
template <int kM, int kS, XLayout kXL, class TW, int64_t kAhead>
HWY_NOINLINE void FarItemDots(const float* xf, int64_t ldx, const TW* wi, int64_t ldw,
                              int64_t apart, int64_t K, float* sums) {
  for (int64_t j = 0; j < kBlock; ++j) {
    HWY_ALIGN float t[64];  // t[m·16 + s]
    if constexpr (kXL == XLayout::kF32PairSplit)
      DotRowBf16PairsN<kS, kM, false, kAhead>(xf, ldx, wi + j * ldw, apart, K, t);
    else
      DotRowN<kS, kM, false, kAhead>(xf, ldx, wi + j * ldw, apart, K, t);
    ScatterItemRow<kM, kS>(t, j, sums);
  }
}

#if TBOOST_HAS_BF16_DOT
// FarItemDots for bf16 x rows dotted with vdpbf16ps (XLayout::kBf16; ldx counts u32 pairs).
template <int kM, int kS, int64_t kAhead>
TBOOST_BF16_DOT_ATTR HWY_NOINLINE void FarItemDotsBf16Dp(const float* xf, int64_t ldx,
                                                         const bf16_t* wi, int64_t ldw,
                                                         int64_t apart, int64_t K, float* sums) {
  for (int64_t j = 0; j < kBlock; ++j) {
    HWY_ALIGN float t[64];  // t[m·16 + s]
    DotRowsBf16DpN<kS, kM, kAhead>(reinterpret_cast<const uint32_t*>(xf), ldx, wi + j * ldw, apart,
                                   K, t);
    ScatterItemRow<kM, kS>(t, j, sums);
  }
}
#endif

// The item kernel for kM x rows and its stream count: as many streams as DotRowN,
// DotRowBf16PairsN or DotRowsBf16DpN keep in registers for kM rows (RowsAtOnce).
template <class TW>
struct FarPlan {
  void (*dots)(const float*, int64_t, const TW*, int64_t, int64_t, int64_t, float*);
  int64_t streams;
};
// Each stream asks for its lines kAhead bytes ahead (kAheadDp for vdpbf16ps rows; 0: not at all).
template <int kM, class TW, int64_t kAhead, int64_t kAheadDp>
FarPlan<TW> FarPlanAt(XLayout xl) {
  if constexpr (std::is_same_v<TW, bf16_t>) {
    constexpr int kS = RowsAtOnce(kM, 2, 2);
    if (xl == XLayout::kF32PairSplit)
      return {&FarItemDots<kM, kS, XLayout::kF32PairSplit, TW, kAhead>, kS};
#if TBOOST_HAS_BF16_DOT
    constexpr int kSd = RowsAtOnce(kM);
    if (xl == XLayout::kBf16) return {&FarItemDotsBf16Dp<kM, kSd, kAheadDp>, kSd};
#endif
  }
  constexpr int kS = RowsAtOnce(kM);
  return {&FarItemDots<kM, kS, XLayout::kF32, TW, kAhead>, kS};
}
// Up to kFarQuietMaxRows x rows, the streams leave their lines to the hardware prefetchers
// where FarStreamsAskAhead says so, or with `nta` (weight_stream_nta) ask for each line
// kFarNtaAheadBytes ahead with prefetchnta; more rows always ask.
// The second way, measured on Zen 5 against the first (`tboost bench -p 1 -n 128`, runs in
// turn): with the host's memory in its slow mode (plain reads of 48-56 GB/s) llama-110m f32
// 116.2-116.9 tokens/s (0.99 of the read) against 112.2-114.2 (0.92-0.93), SmolLM2-135M bf16
// 0.87-0.92 against 0.84-0.85; in its fast mode (70-98 GB/s) llama-110m f32 157.5 (0.93) against
// 163.4 (1.01), SmolLM2 bf16 0.76-0.79 against 0.84. The small ops between the GEMVs run 5-12%
// faster with it (the weights no longer push their data out of the caches), which a timing of
// the GEMVs alone does not see: the choice is made per decode step (step_ways.h).
constexpr int64_t kFarNtaAheadBytes = 1024;
template <int kM, class TW>
FarPlan<TW> FarPlanOf(XLayout xl, bool nta) {
  if constexpr (kM <= kFarQuietMaxRows)
    if (!FarStreamsAskAhead())
      return nta ? FarPlanAt<kM, TW, -kFarNtaAheadBytes, -kFarNtaAheadBytes>(xl)
                 : FarPlanAt<kM, TW, 0, 0>(xl);
  return FarPlanAt<kM, TW, kFarStreamAheadBytes, kStreamAheadBytes>(xl);
}

// DotRows for 1-4 x rows given at run time.
template <class TW>
void DotRowsUpTo4(int64_t M, const float* x, int64_t ldx, const TW* w, int64_t ldw, int64_t K,
                  int64_t cnt, float* sums, XLayout xl) {
  switch (M) {
    case 1:
      return DotRows<1>(x, ldx, w, ldw, K, cnt, sums, xl);
    case 2:
      return DotRows<2>(x, ldx, w, ldw, K, cnt, sums, xl);
    case 3:
      return DotRows<3>(x, ldx, w, ldw, K, cnt, sums, xl);
    default:
      return DotRows<4>(x, ldx, w, ldw, K, cnt, sums, xl);
  }
}

template <class TW, class TY, ops::ActivationType kAct, bool kHasAct>
void GemvFarStreams(const GemvArgs& a, const float* xf, XLayout xl, int64_t ldx, int64_t blocks,
                    int64_t min_blocks) {
  const bool nta = weight_stream_nta();
  const FarPlan<TW> plan = a.M == 1   ? FarPlanOf<1, TW>(xl, nta)
                           : a.M == 2 ? FarPlanOf<2, TW>(xl, nta)
                           : a.M == 3 ? FarPlanOf<3, TW>(xl, nta)
                                      : FarPlanOf<4, TW>(xl, nta);
  const int64_t kS = plan.streams;
  const TW* w = static_cast<const TW*>(a.w);
  const int64_t Q = (blocks + kS - 1) / kS;
  const int64_t apart = Q * kBlock * a.ldw;  // elements from a stream's row to the next stream's
  auto rows = [&](int64_t b) { return std::min(kBlock, a.N - b * kBlock); };
  auto body = [&](int64_t i0, int64_t i1) {
    HWY_ALIGN float sums[4 * 64];
    for (int64_t i = i0; i < i1; ++i) {
      const int64_t nb = std::min<int64_t>(kS, (blocks - i + Q - 1) / Q);  // blocks of item i
      if (nb == kS && rows(i + (kS - 1) * Q) == kBlock) {
        plan.dots(xf, ldx, w + i * kBlock * a.ldw, a.ldw, apart, a.K, sums);
      } else {  // the last item of a matrix whose last block is short or missing
        for (int64_t s = 0; s < nb; ++s) {
          const int64_t b = i + s * Q;
          DotRowsUpTo4(a.M, xf, ldx, w + b * kBlock * a.ldw, a.ldw, a.K, rows(b), sums + s * 64,
                       xl);
        }
      }
      for (int64_t s = 0; s < nb; ++s) {
        const int64_t b = i + s * Q;
        Epilogue<kAct, kHasAct, TY>(a, sums + s * 64, 0, a.M, b * kBlock, rows(b));
      }
    }
  };
  parallel_for_balanced(a.threads, Q, (min_blocks + kS - 1) / kS, a.ftz, body);
}

template <class TW, class TY, ops::ActivationType kAct, bool kHasAct>
void GemvTyped(const GemvArgs& a, const float* xf, XLayout xl, int64_t ldx) {
  const int64_t blocks = (a.N + kBlock - 1) / kBlock;
  const TW* w = static_cast<const TW*>(a.w);
  // ~32 KiB of weights per thread at least: below that a fork/join costs more than the work.
  const int64_t min_blocks =
      std::max<int64_t>(1, (32 << 10) / std::max<int64_t>(1, kBlock * a.K * sizeof(TW)));
  if constexpr (kFarStreams) {  // not instantiated for the other targets
    if (blocks >= 8 && a.M <= 4)
      return GemvFarStreams<TW, TY, kAct, kHasAct>(a, xf, xl, ldx, blocks, min_blocks);
  }
  auto body = [&](int64_t b0, int64_t b1) {
    HWY_ALIGN float sums[4 * 16];
    for (int64_t b = b0; b < b1; ++b) {
      const int64_t n0 = b * kBlock;
      const int64_t cnt = std::min(kBlock, a.N - n0);
      const TW* wb = w + n0 * a.ldw;
      // x rows in groups of up to 4 (each group streams this weight block once more; the
      // block, 16 rows, is L1/L2 resident after the first group).
      for (int64_t m0 = 0; m0 < a.M; m0 += 4) {
        const int64_t mc = std::min<int64_t>(4, a.M - m0);
        const float* xm = xf + m0 * ldx;
        DotRowsUpTo4(mc, xm, ldx, wb, a.ldw, a.K, cnt, sums, xl);
        Epilogue<kAct, kHasAct, TY>(a, sums, m0, mc, n0, cnt);
      }
    }
  };
  // Any thread may compute any block: each output is one block's (parallel_for_balanced).
  parallel_for_balanced(a.threads, blocks, min_blocks, a.ftz, body);
}

template <class TW, class TY>
void GemvAct(const GemvArgs& a, const float* xf, XLayout xl, int64_t ldx) {
  using ops::ActivationType;
  if (!a.has_act) return GemvTyped<TW, TY, ActivationType::kRelu, false>(a, xf, xl, ldx);
  switch (a.act) {
    case ActivationType::kRelu:
      return GemvTyped<TW, TY, ActivationType::kRelu, true>(a, xf, xl, ldx);
    case ActivationType::kGeluErf:
      return GemvTyped<TW, TY, ActivationType::kGeluErf, true>(a, xf, xl, ldx);
    case ActivationType::kGeluTanh:
      return GemvTyped<TW, TY, ActivationType::kGeluTanh, true>(a, xf, xl, ldx);
    default:
      return GemvTyped<TW, TY, ActivationType::kSilu, true>(a, xf, xl, ldx);
  }
}

template <class TW>
void GemvW(const GemvArgs& a, const float* xf, XLayout xl, int64_t ldx) {
  switch (a.y_dtype) {
    case DType::kBF16:
      return GemvAct<TW, bf16_t>(a, xf, xl, ldx);
    case DType::kF16:
      return GemvAct<TW, f16_t>(a, xf, xl, ldx);
    default:
      return GemvAct<TW, float>(a, xf, xl, ldx);
  }
}

void GemvForward(const GemvArgs& a) {
  if (a.M <= 0 || a.N <= 0) return;
  const hn::ScalableTag<float> d;
  const auto L = static_cast<int64_t>(hn::Lanes(d));
  // bf16 weights with K a multiple of 2 * Lanes take the pair-split path: x is stored with
  // each 2 * Lanes chunk split into its even and odd elements (see DotBlockBf16Pairs).
  const bool pairs = a.w_dtype == DType::kBF16 && a.K % (2 * L) == 0;
  thread_local std::vector<float> xbuf, tmp;
#if TBOOST_HAS_BF16_DOT
  // bf16 x and w where the CPU has vdpbf16ps: x rows copied as they are (K / 2 u32 pairs).
  if (pairs && a.x_dtype == DType::kBF16 && a.K % 32 == 0 && cpu_features().avx512_bf16) {
    const int64_t ldx2 = a.K / 2;
    xbuf.resize(static_cast<size_t>(a.M * ldx2));
    for (int64_t m = 0; m < a.M; ++m)
      std::memcpy(xbuf.data() + m * ldx2, static_cast<const bf16_t*>(a.x) + m * a.ldx,
                  static_cast<size_t>(a.K) * sizeof(bf16_t));
    return GemvW<bf16_t>(a, xbuf.data(), XLayout::kBf16, ldx2);
  }
#endif
  // x converted to contiguous f32 once (M * K floats: a few KiB to a few tens of KiB).
  xbuf.resize(static_cast<size_t>(a.M * a.K));
  tmp.resize(static_cast<size_t>(a.K));
  for (int64_t m = 0; m < a.M; ++m) {
    const char* src =
        static_cast<const char*>(a.x) + static_cast<size_t>(m * a.ldx) * dtype_size(a.x_dtype);
    float* dst = xbuf.data() + m * a.K;
    convert(pairs ? tmp.data() : dst, DType::kF32, src, a.x_dtype, a.K);
    if (pairs)
      for (int64_t c = 0; c < a.K; c += 2 * L)
        for (int64_t i = 0; i < L; ++i) {
          dst[c + i] = tmp[static_cast<size_t>(c + 2 * i)];
          dst[c + L + i] = tmp[static_cast<size_t>(c + 2 * i + 1)];
        }
  }
  switch (a.w_dtype) {
    case DType::kBF16:
      return GemvW<bf16_t>(a, xbuf.data(), pairs ? XLayout::kF32PairSplit : XLayout::kF32, a.K);
    case DType::kF16:
      return GemvW<f16_t>(a, xbuf.data(), XLayout::kF32, a.K);
    default:
      return GemvW<float>(a, xbuf.data(), XLayout::kF32, a.K);
  }
}

}  // namespace tboost::kernels::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace tboost::kernels {
HWY_EXPORT(GemvForward);
void gemv_forward(const GemvArgs& a) { HWY_DYNAMIC_DISPATCH(GemvForward)(a); }
namespace {
thread_local bool t_weight_stream_nta = false;
}
void set_weight_stream_nta(bool on) { t_weight_stream_nta = on; }
bool weight_stream_nta() { return t_weight_stream_nta; }
bool weight_stream_hint_applies() {  // the CPUs whose far streams are quiet (FarStreamsAskAhead)
  static const bool amd_avx512 = cpu_features().vendor == "AuthenticAMD" && cpu_features().avx512f;
  return amd_avx512;
}
}  // namespace tboost::kernels
#endif
