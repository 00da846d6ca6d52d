// Shared per-target pieces of the attention kernels (attention.cc: prefill and the entry
// points; attention_decode.cc: split-KV decode): tile constants, exp2, K/V row addressing,
// masks, the per-sequence view of the arguments and the task runner.
// Included once per Highway target (the usual -inl.h toggle).
#if defined(TBOOST_KERNELS_ATTENTION_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef TBOOST_KERNELS_ATTENTION_INL_H_
#undef TBOOST_KERNELS_ATTENTION_INL_H_
#else
#define TBOOST_KERNELS_ATTENTION_INL_H_
#endif

#include <omp.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <limits>

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
// Query rows per kv head a decode task's row-by-row kernels compute at once (their widest
// case). A call with up to DecodeTokenCap query tokens per sequence takes the decode path
// whatever the group size: the g·Sq rows of a kv head are split into groups of at most this
// many rows (32 where they go in lanes or on AMX), one task each.
constexpr int64_t kMaxDecodeRows = 8;
// Query rows of all the kv heads a decode task takes at once (heads whose rows are near each
// other, as in a paged cache's pages: DecodeForward): its scratch holds this many rows.
constexpr int64_t kDecodeTaskRows = 32;
// Keys scored at once in a decode task: a whole chunk, so the task reads its K rows and then
// its V rows as two long sequential streams (with 128 it switched between them every 128 rows,
// and MHA decode read at 0.60-0.71 of a plain read in the host's fast memory mode, 0.69-0.78
// with 512).
constexpr int64_t kDecodeSub = 512;
// Keys per decode chunk: set by the shapes only (DecodeChunkFor), never by the thread count,
// so the split and the rounding of the merge do not change with the threads. 512 at least,
// which also bounds the partials' workspace (ChunksBound).
constexpr int64_t kDecodeChunk = 512;
// Contiguous caches take chunks of up to kDecodeChunkMax keys while the call still has
// kDecodeMinTasks tasks (sized for a few cores). A task's K and V streams then run on from one
// 512-key span to the next, each span's last KvAhead requests reaching the next one's first
// rows, where a new task had started both streams cold. Alternated in one process from DRAM
// (ctx 4096, caches over 1 GiB; 2048 against 512 keys): bf16 MHA 4-9% faster, bf16 GQA-4 7-10%
// with fast reads (64-69 GB/s) and 3.6-4.8% at ctx 16384, f32 GQA-4 6-8%, bf16 GQA-8 2-4%. Paged
// caches keep 512: their tasks take several heads per page, fewer with fewer chunks, and 2048
// made 16-token pages 6-8% slower.
// Each task costs about 1 us from DRAM beyond its bytes (its streams start cold), so fewer,
// longer tasks pay where there are few kv heads: 8 rather than 16 (two to four tasks per
// thread on 2-4 cores). Alternated in one process from DRAM at ctx 4096 (reads 73-84 GB/s),
// 8 against 16: Hkv = 3 at head dim 64 (1024-key chunks, 12 tasks, where 512 had made 24)
// bf16 0.51 -> 0.60-0.61 of a read, f32 0.59-0.60 -> 0.65-0.67; Hkv = 2 bf16 0.46-0.47 -> 0.51,
// f32 0.59-0.60 -> 0.64; Hkv = 4 (GQA-8, 2048 keys) bf16 0.61 -> 0.63, f32 0.61-0.63 ->
// 0.63-0.65. Six tasks (2048 keys at Hkv = 3) gave 0.65-0.67, but leave 4 cores unbalanced.
constexpr int64_t kDecodeChunkMax = 2048;
constexpr int64_t kDecodeMinTasks = 8;
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

inline int64_t Br() { return kV * static_cast<int64_t>(hn::Lanes(DF())); }
inline int64_t RoundUp(int64_t n, int64_t m) { return (n + m - 1) / m * m; }
inline size_t Align64(size_t n) { return (n + 63) & ~size_t{63}; }

// 2^x for x <= 0 (scores minus their running max); exactly 0 below -126, so -inf (a masked
// score) contributes nothing. Degree-5 polynomial of 2^f (ExpPoly in base 2), |f| <= 1/2:
// relative error ~1.7e-7.
HWY_INLINE VF Exp2(DF d, VF x) {
  const VF xc = hn::Max(x, hn::Set(d, -127.0f));
  const VF shifter = hn::Set(d, kShifter);
  const VF t = hn::Add(xc, shifter);  // n = round(x)
  const VF f = hn::Sub(xc, hn::Sub(t, shifter));
  const VF y = hn::Mul(ExpPoly<5, false, true>(d, f), Pow2FromShifted(d, t));
  return hn::IfThenZeroElse(hn::Lt(x, hn::Set(d, -126.0f)), y);
}
#if HWY_TARGET == HWY_AVX3
// 2^x for x <= 0, exactly 0 below -200 (so for -inf): 2^round(x) applied by vscalefps, 2^f by
// ExpPoly<4> (relative error 2.9e-6): for weights rounded to bf16 right after (the decode's AMX
// and pair P·V paths, its rows in lanes), where that error is far below the rounding. 8
// instructions against Exp2's 14. AVX-512 only.
HWY_INLINE VF Exp2Scalef(VF x) {
  // max(-200, x) with x second: vmaxps returns its second operand for a NaN, so NaN propagates.
  const __m512 xc = _mm512_max_ps(_mm512_set1_ps(-200.0f), x.raw);
  const __m512 n = _mm512_roundscale_ps(xc, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const VF p = ExpPoly<4, false, true>(DF(), VF{_mm512_sub_ps(xc, n)});
  return VF{_mm512_scalef_ps(p.raw, n)};
}
#endif
// ---- bf16 pairs ---------------------------------------------------------------------------
// Two bf16 values in one u32 lane (the even element in the low half), dotted by vdpbf16ps
// (AVX512_BF16) or by its emulation (prefill, attention.cc; backward, attention_backward.cc).
using DU = hn::RebindToUnsigned<DF>;
using VU = hn::Vec<DU>;

#undef TBOOST_ATTN_BF16_NATIVE  // this file is compiled once per target
#undef TBOOST_PAIR_ATTR
#define TBOOST_ATTN_BF16_NATIVE TBOOST_HAS_BF16_DOT
#define TBOOST_PAIR_ATTR TBOOST_BF16_DOT_ATTR

// acc + a.hi·b.hi + a.lo·b.lo per lane, in vdpbf16ps's order (products of bf16 values are
// exact in f32; the instruction also flushes denormals, which our kernels do via FTZ/DAZ).
struct PairDotEmu {
  static TBOOST_PAIR_ATTR HWY_INLINE VF Apply(VF acc, VU a, VU b) {
    const DF d;
    const DU du;
    const VU hi = hn::Set(du, 0xFFFF0000u);
    const VF alo = hn::BitCast(d, hn::ShiftLeft<16>(a)), blo = hn::BitCast(d, hn::ShiftLeft<16>(b));
    const VF ahi = hn::BitCast(d, hn::And(a, hi)), bhi = hn::BitCast(d, hn::And(b, hi));
    return hn::MulAdd(alo, blo, hn::MulAdd(ahi, bhi, acc));
  }
};
#if TBOOST_ATTN_BF16_NATIVE
struct PairDotNative {
  static TBOOST_PAIR_ATTR HWY_INLINE VF Apply(VF acc, VU a, VU b) {
    return VF{_mm512_dpbf16_ps(acc.raw, (__m512bh)a.raw, (__m512bh)b.raw)};
  }
};
#endif

// ---- addressing -----------------------------------------------------------------------------

// The keys (or values) of one (sequence, kv head): row j at base + j*row (non-paged) or in
// the block table's pages.
struct KvRows {
  const char* base = nullptr;  // kv head and (non-paged) sequence already applied
  int64_t row_bytes = 0, page_bytes = 0, block_size = 0;
  const int32_t* table = nullptr;  // null: not paged
  DType dtype = DType::kF32;
  int64_t cols = 0;
  // Row j.
  const char* row_at(int64_t j) const {
    return table ? base + table[j / block_size] * page_bytes + (j % block_size) * row_bytes
                 : base + j * row_bytes;
  }
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
// The cache lines of one row of `bytes`, into L2.
HWY_INLINE void PrefetchRow(const char* row, int64_t bytes) {
  for (int64_t b = 0; b < bytes; b += 64) __builtin_prefetch(row + b, 0, 2);
}
inline void PrefetchRows(const KvRows& kv, int64_t j0, int64_t j1) {
  const int64_t bytes = kv.cols * static_cast<int64_t>(dtype_size(kv.dtype));
  kv.spans(j0, j1, [&](const char* row, int64_t n, int64_t) {
    for (int64_t t = 0; t < n; ++t) PrefetchRow(row + t * kv.row_bytes, bytes);
  });
}

// Rows [j0, j0+n) as f32 with a uniform leading dimension: a pointer into the tensor itself
// when the rows are f32 and evenly spaced, else converted into `scratch` (n x cols).
inline const float* RowsF32(const KvRows& kv, int64_t j0, int64_t n, float* scratch, int64_t* ld) {
  if (kv.dtype == DType::kF32 && (!kv.table || (j0 % kv.block_size) + n <= kv.block_size)) {
    const float* p = nullptr;
    kv.spans(j0, j0 + n,
             [&](const char* row, int64_t, int64_t) { p = reinterpret_cast<const float*>(row); });
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
  float slope = 0.0f;           // alibi (0: none)
  const float* mask = nullptr;  // row i at mask + i*mask_row
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

// A custom mask value in the kernels' log2 units. Finite values stay finite (-FLT_MAX, the usual
// "masked" value of frameworks, would overflow to -inf and hide the key, which only -inf may).
inline float MaskLog2(float m) {
  const float v = m * kLog2e;
  return std::isinf(v) && std::isfinite(m) ? std::copysign(std::numeric_limits<float>::max(), v)
                                           : v;
}

// Partial result of one decode chunk for G query rows: m, l, then Dv unnormalized outputs.
inline int64_t PartialFloats(int64_t Dv) { return Dv + 2; }
// The outputs a decode partial holds: Dv rounded up to 32, the pair P·V's chunk of features
// (where Dv is an odd multiple of 16 its last chunk is half one, whose padding it writes too).
inline int64_t DecodeDvp(int64_t Dv) { return RoundUp(Dv, 32); }

inline int64_t Group(const AttentionArgs& a) { return a.heads / a.kv_heads; }
// Decode for up to DecodeTokenCap(a) query tokens per sequence, any group size. A flash tile
// holds Br queries of one head, so there a decode step (one query per head) would use 1 of its
// Br rows (MQA decode with 32 q heads ran at 0.01 of the DRAM read that way), and each q head of
// a GQA group reads K and V again. On AVX-512 (Br = 32), against long caches in L3 (Zen 5,
// bench/RESULTS.md, "twenty-first session"), the decode path (rows in lanes from 9 rows per kv
// head) was faster than the flash tiles:
// - bf16 q and cache on AVX512_BF16 (head dims multiples of 16): 1.15-4.3x at 9-32 tokens, MHA,
//   GQA-4, GQA-8, MQA, head dims 64 and 128; 2.1-2.3x at head dim 80 (16-32 tokens, ctx 2048,
//   MHA, GQA-4, MQA); up to 32 tokens;
// - f32: 1.4-1.9x at 9-16 tokens, but at 31 f32 MQA was 7% slower; up to 16, as for a bf16
//   model without the pair path (not measured separately).
// Elsewhere, and where bf16 prefill runs on AMX tiles (not measured there), up to
// kMaxDecodeRows.
// Whether a decode call can dot bf16 pairs with vdpbf16ps (DecodeTask's pair path): bf16 q and
// cache, head dims multiples of 16 (an odd multiple ends in a half vector of pairs, loaded
// masked), AVX512_BF16. The AMX decode (DecodeAmx, which also needs multiples of 32), rows in
// lanes (DecodeWide) and the token cap below all start from this.
inline bool DecodeBf16Pairs(const AttentionArgs& a) {
  return a.dtype == DType::kBF16 && a.kv_dtype == DType::kBF16 && a.head_dim % 16 == 0 &&
         a.v_head_dim % 16 == 0 && cpu_features().avx512_bf16;
}
inline int64_t DecodeTokenCap(const AttentionArgs& a) {
#if HWY_TARGET == HWY_AVX3
  const bool bf16 = a.dtype == DType::kBF16 && a.kv_dtype == DType::kBF16;
  if (bf16 && a.allow_amx && attention_prefill_bf16_amx()) return kMaxDecodeRows;
  return DecodeBf16Pairs(a) ? 4 * kMaxDecodeRows : 2 * kMaxDecodeRows;
#else
  (void)a;
  return kMaxDecodeRows;
#endif
}
inline bool UseDecode(const AttentionArgs& a) { return a.sq <= DecodeTokenCap(a); }
// Decode chunks of a sequence with n keys (at least one, so a row that sees nothing still
// gets its partial written).
inline int64_t ChunksOf(int64_t n, int64_t chunk = kDecodeChunk) {
  return std::max<int64_t>(1, (n + chunk - 1) / chunk);
}
// An upper bound of the chunks of all sequences: sk is each sequence's length, or (varlen)
// the packed total, whose sequences then have at most ceil(total / chunk) + batch chunks.
inline int64_t ChunksBound(const AttentionArgs& a) {
  return a.sq_is_bound ? ChunksOf(a.sk) + a.batch : a.batch * ChunksOf(a.sk);
}
// The AMX decode's scratch (attention_decode.cc, AVX-512 objects only): kv heads per task with
// 2+ rows each, keys per P·V piece, and the bf16 weights' row stride (a piece may read up to
// 32 past a span's keys, where they are 0).
constexpr int64_t kAmxDecodeHeads = kDecodeTaskRows / 2;
constexpr int64_t kAmxDecodeRows = 32;  // query rows per kv head and task: two column tiles
constexpr int64_t kAmxPiece = 64;
constexpr int64_t kAmxLdp = kDecodeSub + 32;
inline size_t AmxDecodeScratchBytes(int64_t D, int64_t Dv) {
#if HWY_TARGET == HWY_AVX3
  const size_t u = sizeof(uint32_t);
  return Align64(static_cast<size_t>(kAmxDecodeHeads * D / 2 * 16) * u) +             // q2t
         Align64(32 * 16 * sizeof(float)) +                                           // ct
         Align64(static_cast<size_t>(kAmxDecodeRows * kAmxLdp) * sizeof(uint16_t)) +  // pa
         Align64(static_cast<size_t>(kAmxPiece / 2 * Dv) * u) +                       // v2
         Align64(static_cast<size_t>(kAmxDecodeRows * Dv) * sizeof(float));           // acc
#else
  (void)D, (void)Dv;
  return 0;
#endif
}
inline size_t DecodeScratchBytes(const AttentionArgs& a) {
  const int64_t N = static_cast<int64_t>(hn::Lanes(DF()));
  const int64_t G = kDecodeTaskRows, f = sizeof(float);
  return Align64(static_cast<size_t>(G * RoundUp(a.head_dim, N) * f)) +
         Align64(static_cast<size_t>(G * kDecodeSub * f)) +
         Align64(static_cast<size_t>(2 * std::max(a.head_dim, a.v_head_dim) * f)) +
         Align64(static_cast<size_t>(G * kDecodeSub) * sizeof(uint16_t)) +
         AmxDecodeScratchBytes(a.head_dim, a.v_head_dim) + 64;
}
inline size_t PartialBytes(const AttentionArgs& a) {
  // Every query row of the decode path (at most DecodeTokenCap(a) tokens per sequence).
  const int64_t rows = Group(a) * std::min(a.sq, DecodeTokenCap(a));
  return static_cast<size_t>(ChunksBound(a) * a.kv_heads * rows *
                             PartialFloats(DecodeDvp(a.v_head_dim))) *
             sizeof(float) +
         64;
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

// Split-KV decode (attention_decode.cc). per_thread: the stride of the threads' scratch.
void DecodeForward(const AttentionArgs& a, char* ws, size_t per_thread);

}  // namespace tboost::kernels::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // TBOOST_KERNELS_ATTENTION_INL_H_
