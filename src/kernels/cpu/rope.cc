// Rope (rotary position embedding) forward on the CPU (Highway).
//
// Memory bound: DRAM traffic is read x + write y, the memcpy floor, provided the cos/sin of a
// token are computed once and reused by every head. So tokens are processed in blocks of
// plan.tok_block: for a block the kernel first builds each token's cos/sin table (r/2 values,
// or r lanes in the interleaved form; a few KiB that stay in L1), then sweeps every
// (head, token) row of the block, two heads at a time so each table vector loaded serves two
// rows. kBSND visits token-major (the H rows of a token are adjacent); kBNSD visits head-major
// (for each head the block's rows are adjacent), so both stream contiguous memory and neither
// needs a workspace. Threads take contiguous ranges of blocks (parallel_for); every element
// is computed the same way whatever the partition, so results are bitwise independent of the
// thread count.
//
// Angles: pair i at position p has angle (p / scaling) · inv_freq[i], inv_freq[i] =
// theta^(-2i/r) in f64 (from the op, computed once at setup). Positions reach 1e6 and more,
// where one ulp of an f32 angle is 0.06 rad, so the angle is formed, reduced and fed to the
// sin/cos polynomials in f64 vectors (SinCosTable; reduction error ~|angle|·2^-52, 1e-10 at
// 1e6); only the finished cos/sin are narrowed to f32. That is about 40 f64 vector ops per 4
// pairs (AVX2), once per token, against H·D elements of data.
//
// bf16 rows skip widening and narrowing shuffles altogether (RopeRowsBf16): the even and odd
// elements of a u32 lane are rotated as two f32 vectors, which for the interleaved rotation
// are exactly the pairs. Large out-of-place outputs are written with non-temporal stores
// (StreamRow), so the DRAM traffic matches memcpy's instead of paying a read for ownership of
// every line of y.
//
// In place (y == x) is supported: every element of a pair is loaded before either is stored.
// A y that overlaps x without being the same view is not (the op rejects it).
// clang-format off: Highway's per-target re-inclusion needs this exact order.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "src/kernels/cpu/rope.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
// clang-format on

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "hwy/aligned_allocator.h"
#include "hwy/cache_control.h"
#include "hwy/highway.h"
#include "src/core/parallel.h"
#include "src/kernels/cpu/hwy_util-inl.h"
#include "src/kernels/cpu/kernels.h"

HWY_BEFORE_NAMESPACE();
namespace tboost::kernels::HWY_NAMESPACE {

inline int64_t RoundUp(int64_t n, int64_t m) { return (n + m - 1) / m * m; }

// Copies n elements from the (L1-resident) staging row to y with non-temporal stores, whole
// aligned vectors in address order so each line is written in one go: interleaving partial
// lines of several rows (or of a row's two halves) makes the write-combining buffers flush
// early, which measured up to 3x slower than plain stores. Unaligned ends store normally.
template <class T>
HWY_INLINE void StreamRow(T* dst, const T* src, int64_t n) {
  size_t bytes = static_cast<size_t>(n) * sizeof(T);
  auto* d = reinterpret_cast<uint8_t*>(dst);
  const auto* s = reinterpret_cast<const uint8_t*>(src);
#if HWY_ARCH_X86 && HWY_TARGET != HWY_EMU128 && HWY_TARGET != HWY_SCALAR
  const hn::ScalableTag<uint8_t> d8;
  const size_t V = hn::Lanes(d8);
  const size_t head = std::min(bytes, (V - (reinterpret_cast<uintptr_t>(d) & (V - 1))) & (V - 1));
  std::memcpy(d, s, head);
  d += head;
  s += head;
  bytes -= head;
  for (; bytes >= V; bytes -= V, d += V, s += V) hn::Stream(hn::LoadU(d8, s), d8, d);
#endif
  std::memcpy(d, s, bytes);
}

// How a token's cos/sin are laid out in the table (per row of `width` floats each):
//  kHalf:      c[i], s[i] for pair i (rotate-half).
//  kExpanded:  r lanes, c[i] twice and (-s[i], s[i]) at 2i, 2i+1 (interleaved, x·c + swap(x)·s).
//  kHalfSplit: rotate-half for bf16 rows split into even/odd elements (RopeRowsBf16): per
//              chunk of 2L pairs, the L even pairs' values, then the L odd pairs'.
// bf16 interleaved uses kHalf: its even/odd split is exactly the pair split.
enum class TableKind { kHalf, kExpanded, kHalfSplit };

// Per-call constants and the per-worker table layout.
struct RopePlan {
  int64_t half = 0;       // r / 2 pairs
  int64_t half_pad = 0;   // half rounded up to two f32 vectors
  int64_t width = 0;      // floats per token of cos (and of sin) in the table
  int64_t tok_block = 1;  // tokens per block
  TableKind kind = TableKind::kHalf;
  bool inverse = false;          // rotate by -angle (the backward pass: R(a)^T = R(-a))
  std::vector<double> inv_freq;  // half_pad entries, zero padded (angle 0: cos 1, sin 0)
};

// cos and sin of (p / scaling) · inv_freq[i] for i < half_pad, in f64 lanes, narrowed to f32.
// The angle is reduced by the nearest multiple of pi/2 (k) with a two-part pi/2, so |red| <=
// pi/4, where degree 9/10 Taylor polynomials are within 2e-9; the quadrant k mod 4 then swaps
// and negates them. Beyond |angle| ~ 2^52 (positions / scaling that large) no f64 reduction
// is meaningful; the clamp keeps such outputs finite.
void SinCosTable(const RopePlan& plan, double p, float* cos_h, float* sin_h) {
  const hn::ScalableTag<double> dd;
  const hn::Rebind<float, decltype(dd)> dfh;  // one f32 lane per f64 lane
  const int64_t Ld = static_cast<int64_t>(hn::Lanes(dd));
  const auto vp = hn::Set(dd, p);
  const auto two_over_pi = hn::Set(dd, 0.63661977236758134308);
  const auto pio2_hi = hn::Set(dd, 1.5707963267948966);     // nearest double to pi/2
  const auto pio2_lo = hn::Set(dd, 6.123233995736766e-17);  // pi/2 - pio2_hi
  const auto one = hn::Set(dd, 1.0), two = hn::Set(dd, 2.0), three = hn::Set(dd, 3.0);
  for (int64_t i = 0; i < plan.half_pad; i += Ld) {
    const auto a = hn::Mul(vp, hn::LoadU(dd, plan.inv_freq.data() + i));
    const auto k = hn::Round(hn::Mul(a, two_over_pi));
    auto red = hn::NegMulAdd(k, pio2_lo, hn::NegMulAdd(k, pio2_hi, a));
    red = hn::Min(hn::Max(red, hn::Neg(one)), one);
    const auto q = hn::NegMulAdd(hn::Set(dd, 4.0), hn::Floor(hn::Mul(k, hn::Set(dd, 0.25))), k);
    const auto r2 = hn::Mul(red, red);
    auto ps = hn::Set(dd, 1.0 / 362880.0);
    ps = hn::MulAdd(ps, r2, hn::Set(dd, -1.0 / 5040.0));
    ps = hn::MulAdd(ps, r2, hn::Set(dd, 1.0 / 120.0));
    ps = hn::MulAdd(ps, r2, hn::Set(dd, -1.0 / 6.0));
    ps = hn::MulAdd(ps, r2, one);
    const auto sr = hn::Mul(ps, red);
    auto pc = hn::Set(dd, -1.0 / 3628800.0);
    pc = hn::MulAdd(pc, r2, hn::Set(dd, 1.0 / 40320.0));
    pc = hn::MulAdd(pc, r2, hn::Set(dd, -1.0 / 720.0));
    pc = hn::MulAdd(pc, r2, hn::Set(dd, 1.0 / 24.0));
    pc = hn::MulAdd(pc, r2, hn::Set(dd, -0.5));
    const auto cr = hn::MulAdd(pc, r2, one);
    // angle = k·pi/2 + red: sin = (sr, cr, -sr, -cr)[q], cos = (cr, -sr, -cr, sr)[q].
    const auto odd = hn::Or(hn::Eq(q, one), hn::Eq(q, three));
    const auto s = hn::IfThenElse(odd, cr, sr);
    const auto c = hn::IfThenElse(odd, sr, cr);
    const auto s_neg = hn::Ge(q, two);
    const auto c_neg = hn::Or(hn::Eq(q, one), hn::Eq(q, two));
    const auto sv = hn::IfThenElse(s_neg, hn::Neg(s), s);
    hn::StoreU(hn::DemoteTo(dfh, plan.inverse ? hn::Neg(sv) : sv), dfh, sin_h + i);
    hn::StoreU(hn::DemoteTo(dfh, hn::IfThenElse(c_neg, hn::Neg(c), c)), dfh, cos_h + i);
  }
}

// cos/sin of every pair of the tokens [s0, s1) of batch b, into cos_t/sin_t (width each per
// token), laid out as plan.kind says.
template <class P>
void BuildTable(const RopeArgs& a, const RopePlan& plan, int64_t b, int64_t s0, int64_t s1,
                float* scratch, float* cos_t, float* sin_t) {
  const P* pos = static_cast<const P*>(a.positions);
  for (int64_t s = s0; s < s1; ++s) {
    const double p = static_cast<double>(pos[a.pos_rows.offset(b * a.seq + s)]) / a.scaling;
    float* c = cos_t + (s - s0) * plan.width;
    float* sn = sin_t + (s - s0) * plan.width;
    if (plan.kind == TableKind::kHalf) {
      SinCosTable(plan, p, c, sn);
      continue;
    }
    float* ch = scratch;
    float* sh = scratch + plan.half_pad;
    SinCosTable(plan, p, ch, sh);
#if HWY_TARGET == HWY_SCALAR
    for (int64_t i = 0; i < plan.half; ++i) {  // kExpanded only: no split on one lane
      c[2 * i] = c[2 * i + 1] = ch[i];
      sn[2 * i] = -sh[i];
      sn[2 * i + 1] = sh[i];
    }
#else
    const hn::ScalableTag<float> df;
    const int64_t Lf = static_cast<int64_t>(hn::Lanes(df));
    if (plan.kind == TableKind::kHalfSplit) {
      for (int64_t j = 0; j < plan.width; j += 2 * Lf) {
        const auto c0 = hn::LoadU(df, ch + j), c1 = hn::LoadU(df, ch + j + Lf);
        const auto s0v = hn::LoadU(df, sh + j), s1v = hn::LoadU(df, sh + j + Lf);
        hn::StoreU(hn::ConcatEven(df, c1, c0), df, c + j);
        hn::StoreU(hn::ConcatOdd(df, c1, c0), df, c + j + Lf);
        hn::StoreU(hn::ConcatEven(df, s1v, s0v), df, sn + j);
        hn::StoreU(hn::ConcatOdd(df, s1v, s0v), df, sn + j + Lf);
      }
      continue;
    }
    // kExpanded: each f32 zero-extended into a u64 lane and or-ed with itself shifted gives
    // (v, v); flipping bit 31 negates the even (low) one. Reads stay below half_pad.
    const hn::Repartition<uint64_t, decltype(df)> d64;
    const hn::Rebind<uint32_t, decltype(d64)> d32h;
    const auto sign_even = hn::Set(d64, uint64_t{0x80000000u});
    for (int64_t j = 0; j < plan.width; j += Lf) {
      const auto vc =
          hn::PromoteTo(d64, hn::LoadU(d32h, reinterpret_cast<const uint32_t*>(ch) + j / 2));
      const auto vs =
          hn::PromoteTo(d64, hn::LoadU(d32h, reinterpret_cast<const uint32_t*>(sh) + j / 2));
      hn::StoreU(hn::BitCast(df, hn::Or(vc, hn::ShiftLeft<32>(vc))), df, c + j);
      hn::StoreU(hn::BitCast(df, hn::Xor(hn::Or(vs, hn::ShiftLeft<32>(vs)), sign_even)), df,
                 sn + j);
    }
#endif
  }
}

#if HWY_TARGET != HWY_SCALAR
// bf16 rows without any lane shuffle: a u32 lane holds elements (2m, 2m+1); shifting the low
// one up (even) and masking the high one (odd) gives both as f32 exactly. After the rotation
// each is rounded to nearest even in its f32 bits and the two halves are or-ed back into one
// u32 lane. Per 2L elements: one load, one store and a handful of integer ops, instead of a
// widening load, a narrowing pack and a cross-block permute per L elements.
//
// Rounding: u + 0x7fff + lsb, then the high half. StoreF(bf16) also guards NaN, since a NaN
// whose payload sits in the low 16 bits would carry into the exponent and become Inf (or,
// with an all-ones payload, into the sign). Here no such NaN can arise: IEEE arithmetic
// returns either an operand NaN, quieted with its payload kept, or a default NaN whose low
// half is zero, and the only NaN operands are x's, widened from bf16 with the low 16 bits
// zero (the table is always finite). A zero low half plus 0x8000 never carries, so the guard
// (two of the six ops per vector) is left out; RopeOp.NonFiniteInputsStayNonFinite checks.
template <class D>
HWY_INLINE hn::Vec<hn::RebindToUnsigned<D>> RoundBf16Bits(D d, hn::Vec<D> v) {
  const hn::RebindToUnsigned<D> du;
  const auto u = hn::BitCast(du, v);
  return hn::Add(u, hn::Add(hn::Set(du, 0x7fffu), hn::And(hn::ShiftRight<16>(u), hn::Set(du, 1u))));
}

// Elements x[0..2L) (or, unless kFull, the first n through a zeroed buffer) as even and odd
// f32 vectors.
template <bool kFull, class D>
HWY_INLINE void LoadBf16Pairs(D d, const bf16_t* x, int64_t n, hn::Vec<D>& even, hn::Vec<D>& odd) {
  const hn::RebindToUnsigned<D> du;
  const hn::Repartition<uint16_t, D> d16;
  const auto* src = reinterpret_cast<const uint16_t*>(x);
  hn::Vec<decltype(du)> w;
  if constexpr (kFull) {
    w = hn::BitCast(du, hn::LoadU(d16, src));
  } else {
    HWY_ALIGN uint16_t buf[hn::MaxLanes(d16)] = {};
    std::memcpy(buf, src, static_cast<size_t>(n) * sizeof(uint16_t));
    w = hn::BitCast(du, hn::Load(d16, buf));
  }
  even = hn::BitCast(d, hn::ShiftLeft<16>(w));
  odd = hn::BitCast(d, hn::And(w, hn::Set(du, 0xffff0000u)));
}

template <bool kFull, class D>
HWY_INLINE void StoreBf16Pairs(D d, hn::Vec<D> even, hn::Vec<D> odd, bf16_t* y, int64_t n) {
  const hn::Repartition<uint16_t, D> d16;
  // Odd results keep their high half in place, even ones move it down: one 16-bit blend.
  const auto out = hn::OddEven(hn::BitCast(d16, RoundBf16Bits(d, odd)),
                               hn::BitCast(d16, hn::ShiftRight<16>(RoundBf16Bits(d, even))));
  auto* dst = reinterpret_cast<uint16_t*>(y);
  if constexpr (kFull) {
    hn::StoreU(out, d16, dst);
  } else {
    HWY_ALIGN uint16_t buf[hn::MaxLanes(d16)];
    hn::Store(out, d16, buf);
    std::memcpy(dst, buf, static_cast<size_t>(n) * sizeof(uint16_t));
  }
}

template <int NR>
HWY_INLINE void RopeRowsBf16(const RopeArgs& a, const RopePlan& plan, const bf16_t* const* x,
                             bf16_t* const* y, const float* cos_t, const float* sin_t) {
  const hn::ScalableTag<float> d;
  const int64_t L = static_cast<int64_t>(hn::Lanes(d));
  const int64_t r = a.rotary_dim;
  const int64_t h = plan.half;
  // Whole chunks of 2L elements, then one partial chunk through a buffer.
  auto chunks = [&](int64_t len, auto&& chunk) {
    int64_t j = 0;
    for (; j + 2 * L <= len; j += 2 * L) chunk(j, 2 * L, std::true_type());
    if (j < len) chunk(j, len - j, std::false_type());
  };
  if (a.rotation == ops::RopeRotation::kRotateHalf) {
    // Chunk j of each half: pairs (j + 2m, h + j + 2m) and (j + 2m + 1, h + j + 2m + 1) sit in
    // lane m of the even and of the odd vectors of both halves; the table is split alike.
    chunks(h, [&](int64_t j, int64_t n, auto full) {
      constexpr bool kFull = decltype(full)::value;
      const auto ce = hn::LoadU(d, cos_t + j), co = hn::LoadU(d, cos_t + j + L);
      const auto se = hn::LoadU(d, sin_t + j), so = hn::LoadU(d, sin_t + j + L);
      for (int k = 0; k < NR; ++k) {
        hn::Vec<decltype(d)> ae, ao, be, bo;
        LoadBf16Pairs<kFull>(d, x[k] + j, n, ae, ao);  // both halves read before any write
        LoadBf16Pairs<kFull>(d, x[k] + h + j, n, be, bo);
        StoreBf16Pairs<kFull>(d, hn::NegMulAdd(be, se, hn::Mul(ae, ce)),
                              hn::NegMulAdd(bo, so, hn::Mul(ao, co)), y[k] + j, n);
        StoreBf16Pairs<kFull>(d, hn::MulAdd(ae, se, hn::Mul(be, ce)),
                              hn::MulAdd(ao, so, hn::Mul(bo, co)), y[k] + h + j, n);
      }
    });
  } else {
    // Interleaved pairs are exactly (even, odd) of a lane; pair index j/2 + m.
    chunks(r, [&](int64_t j, int64_t n, auto full) {
      constexpr bool kFull = decltype(full)::value;
      const auto c = hn::LoadU(d, cos_t + j / 2), s = hn::LoadU(d, sin_t + j / 2);
      for (int k = 0; k < NR; ++k) {
        hn::Vec<decltype(d)> ae, ao;
        LoadBf16Pairs<kFull>(d, x[k] + j, n, ae, ao);
        StoreBf16Pairs<kFull>(d, hn::NegMulAdd(ao, s, hn::Mul(ae, c)),
                              hn::MulAdd(ae, s, hn::Mul(ao, c)), y[k] + j, n);
      }
    });
  }
  for (int k = 0; k < NR; ++k)
    if (r < a.head_dim && y[k] != x[k])
      std::memcpy(y[k] + r, x[k] + r, static_cast<size_t>(a.head_dim - r) * sizeof(bf16_t));
}
#endif

// bf16 rows take the even/odd split path (RopeRowsBf16) wherever lanes can pair up.
template <class T>
constexpr bool kSplitBf16 = std::is_same_v<T, bf16_t> && (HWY_TARGET != HWY_SCALAR);

// NR rows of one token (NR heads): y = rope(x) with the token's table, loaded once per chunk
// for all NR rows (the table loads would otherwise match the data loads one for one);
// features past r are copied.
template <int NR, class T>
HWY_INLINE void RopeRows(const RopeArgs& a, const RopePlan& plan, const T* const* x, T* const* y,
                         const float* cos_t, const float* sin_t) {
  const hn::ScalableTag<float> d;
  const int64_t L = static_cast<int64_t>(hn::Lanes(d));
  const int64_t r = a.rotary_dim;
  const int64_t h = plan.half;
  if (a.rotation == ops::RopeRotation::kRotateHalf) {
    int64_t i = 0;
    for (; i + L <= h; i += L) {
      const auto c = hn::LoadU(d, cos_t + i);
      const auto s = hn::LoadU(d, sin_t + i);
      for (int k = 0; k < NR; ++k) {
        const auto xa = LoadF(d, x[k] + i);
        const auto xb = LoadF(d, x[k] + h + i);
        StoreF(d, hn::NegMulAdd(xb, s, hn::Mul(xa, c)), y[k] + i);
        StoreF(d, hn::MulAdd(xa, s, hn::Mul(xb, c)), y[k] + h + i);
      }
    }
    if (i < h) {
      const size_t n = static_cast<size_t>(h - i);
      const auto c = hn::LoadU(d, cos_t + i);
      const auto s = hn::LoadU(d, sin_t + i);
      for (int k = 0; k < NR; ++k) {
        const auto xa = LoadTailF(d, x[k] + i, n);
        const auto xb = LoadTailF(d, x[k] + h + i, n);
        StoreTailF(d, hn::NegMulAdd(xb, s, hn::Mul(xa, c)), y[k] + i, n);
        StoreTailF(d, hn::MulAdd(xa, s, hn::Mul(xb, c)), y[k] + h + i, n);
      }
    }
  } else {
#if HWY_TARGET == HWY_SCALAR
    // One lane: pairs cannot be swapped inside a vector.
    for (int k = 0; k < NR; ++k)
      for (int64_t i = 0; i < r; i += 2) {
        const float x0 = to_f32(x[k][i]), x1 = to_f32(x[k][i + 1]);
        y[k][i] = from_f32<T>(x0 * cos_t[i] + x1 * sin_t[i]);
        y[k][i + 1] = from_f32<T>(x1 * cos_t[i + 1] + x0 * sin_t[i + 1]);
      }
#else
    // Lanes are even and r is even, so a vector (or tail) always holds whole pairs.
    int64_t i = 0;
    for (; i + L <= r; i += L) {
      const auto c = hn::LoadU(d, cos_t + i);
      const auto s = hn::LoadU(d, sin_t + i);
      for (int k = 0; k < NR; ++k) {
        const auto v = LoadF(d, x[k] + i);
        StoreF(d, hn::MulAdd(v, c, hn::Mul(hn::Reverse2(d, v), s)), y[k] + i);
      }
    }
    if (i < r) {
      const size_t n = static_cast<size_t>(r - i);
      const auto c = hn::LoadU(d, cos_t + i);
      const auto s = hn::LoadU(d, sin_t + i);
      for (int k = 0; k < NR; ++k) {
        const auto v = LoadTailF(d, x[k] + i, n);
        StoreTailF(d, hn::MulAdd(v, c, hn::Mul(hn::Reverse2(d, v), s)), y[k] + i, n);
      }
    }
#endif
  }
  for (int k = 0; k < NR; ++k)
    if (r < a.head_dim && y[k] != x[k])
      std::memcpy(y[k] + r, x[k] + r, static_cast<size_t>(a.head_dim - r) * sizeof(T));
}

template <int NR, class T>
HWY_INLINE void RopeRowsAny(const RopeArgs& a, const RopePlan& plan, const T* const* x, T* const* y,
                            const float* cos_t, const float* sin_t) {
#if HWY_TARGET != HWY_SCALAR
  if constexpr (kSplitBf16<T>) return RopeRowsBf16<NR>(a, plan, x, y, cos_t, sin_t);
#endif
  RopeRows<NR, T>(a, plan, x, y, cos_t, sin_t);
}

template <bool kStream, class T, class P>
void RopeBlocks(const RopeArgs& a, const RopePlan& plan, int64_t B, int64_t S) {
  const int64_t H = a.heads, D = a.head_dim;
  const bool bnsd = a.layout == ops::QkvLayout::kBNSD;
  const int64_t nsb = (S + plan.tok_block - 1) / plan.tok_block;
  const int64_t units = B * nsb;
  const int64_t per_unit = plan.tok_block * H * D;
  // ~32K elements per thread at least: below that a fork/join costs more than it saves.
  const int64_t min_units =
      std::max<int64_t>(1, (32768 + per_unit - 1) / std::max<int64_t>(1, per_unit));
  parallel_for(a.threads, units, min_units, a.ftz, [&](int64_t u0, int64_t u1) {
    // Vector aligned (hwy::AllocateAligned), so no load or store of the table or the staged
    // rows splits a cache line; zero filled: table lanes past r (read by full vectors, never
    // stored) stay finite.
    const size_t buf_n = static_cast<size_t>(2 * plan.half_pad + 2 * plan.tok_block * plan.width);
    auto buf = hwy::AllocateAligned<float>(buf_n);
    std::fill(buf.get(), buf.get() + buf_n, 0.0f);
    float* scratch = buf.get();  // 2 · half_pad
    float* cos_t = scratch + 2 * plan.half_pad;
    float* sin_t = cos_t + plan.tok_block * plan.width;
    // Rows before StreamRow (Highway's allocator asserts on zero bytes: one element otherwise).
    auto stage = hwy::AllocateAligned<T>(kStream ? static_cast<size_t>(2 * D) : 1);
    const T* xb = static_cast<const T*>(a.x);
    T* yb = static_cast<T*>(a.y);
    const int64_t row_bytes = D * static_cast<int64_t>(sizeof(T));
    const bool prefetch = a.x_rows.count * row_bytes >= kStreamBytes;
    for (int64_t u = u0; u < u1; ++u) {
      const int64_t b = u / nsb;
      const int64_t s0 = (u % nsb) * plan.tok_block;
      const int64_t s1 = std::min(S, s0 + plan.tok_block);
      BuildTable<P>(a, plan, b, s0, s1, scratch, cos_t, sin_t);
      // Heads hd and hd + 1 of token s (or hd alone), sharing the token's table. Inlined, with
      // the row pointers formed one by one: out of line, GCC stored them one at a time and
      // reloaded them as one 16-byte vector, a store-forwarding stall on every pair of rows
      // (f32 rope ran at ~0.6x of a copy on Zen 4).
      auto rows = [&](int64_t s, int64_t hd, bool two) TBOOST_INLINE_LAMBDA {
        const int64_t k = (s - s0) * plan.width;
        const int64_t rr0 = bnsd ? (b * H + hd) * S + s : s * H + hd;
        const int64_t rr1 = bnsd ? rr0 + S : rr0 + 1;
        const T* xr[2] = {xb + a.x_rows.offset(rr0), two ? xb + a.x_rows.offset(rr1) : nullptr};
        T* yr[2] = {yb + a.y_rows.offset(rr0), two ? yb + a.y_rows.offset(rr1) : nullptr};
        // The rows are read below at two places each (the halves, or the pairs) and side by
        // side; one front-to-back touch first keeps the DRAM reads in order (TouchLines). It
        // replaced a 4 KiB software prefetch: f32 rope 0.50-0.96x (mean 0.73) -> 0.65-1.24x
        // (mean 0.91) of a copy, eleven alternated runs on Zen 4 in both of its memory modes.
        // Large inputs are also prefetched to L2 16 KiB ahead of each row: f32 rope went from
        // 0.74-0.86x to 1.00-1.18x of a copy in Zen 4's fast memory mode and from ~1.13x to
        // ~1.32x (means of 12 rounds) in the slow one; bf16 stayed within the noise.
        if (prefetch) {
          PrefetchRangeL2(reinterpret_cast<const char*>(xr[0]) + kPrefetchAheadBytes, row_bytes);
          if (two)
            PrefetchRangeL2(reinterpret_cast<const char*>(xr[1]) + kPrefetchAheadBytes, row_bytes);
        }
        TouchLines(xr[0], row_bytes);
        if (two) TouchLines(xr[1], row_bytes);
        const int nr = two ? 2 : 1;
        T* out[2] = {yr[0], yr[1]};
        if constexpr (kStream) {
          out[0] = stage.get();
          out[1] = stage.get() + D;
        }
        if (two) {
          RopeRowsAny<2, T>(a, plan, xr, out, cos_t + k, sin_t + k);
        } else {
          RopeRowsAny<1, T>(a, plan, xr, out, cos_t + k, sin_t + k);
        }
        if constexpr (kStream)
          for (int j = 0; j < nr; ++j) StreamRow(yr[j], out[j], D);
      };
      if (bnsd) {
        for (int64_t hd = 0; hd < H; hd += 2)
          for (int64_t s = s0; s < s1; ++s) rows(s, hd, hd + 1 < H);
      } else {
        for (int64_t s = s0; s < s1; ++s)
          for (int64_t hd = 0; hd < H; hd += 2) rows(s, hd, hd + 1 < H);
      }
    }
    if constexpr (kStream) hwy::FlushStream();  // order the streamed stores before the join
  });
}

template <class T, class P>
void RopeTyped(const RopeArgs& a) {
  const hn::ScalableTag<float> df;
  const int64_t Lf = static_cast<int64_t>(hn::Lanes(df));
  const int64_t H = a.heads, D = a.head_dim, r = a.rotary_dim;
  const int64_t rows = a.x_rows.count;
  if (rows == 0 || H == 0) return;
  const bool bnsd = a.layout == ops::QkvLayout::kBNSD;
  // kBSND is one "batch" of T tokens; kBNSD has B batches of S tokens.
  const int64_t S = bnsd ? a.seq : rows / H;
  const int64_t B = bnsd ? rows / (H * S) : 1;
  if (r == 0) {  // nothing rotates: a copy (or nothing, in place)
    parallel_for(a.threads, rows, std::max<int64_t>(1, 16384 / std::max<int64_t>(1, D)), a.ftz,
                 [&](int64_t r0, int64_t r1) {
                   for (int64_t row = r0; row < r1; ++row) {
                     const T* x = static_cast<const T*>(a.x) + a.x_rows.offset(row);
                     T* y = static_cast<T*>(a.y) + a.y_rows.offset(row);
                     if (y != x) std::memcpy(y, x, static_cast<size_t>(D) * sizeof(T));
                   }
                 });
    return;
  }

  RopePlan plan;
  plan.inverse = a.inverse;
  plan.half = r / 2;
  plan.half_pad = RoundUp(plan.half, 2 * Lf);
  const bool interleaved = a.rotation == ops::RopeRotation::kInterleaved;
  if constexpr (kSplitBf16<T>) {
    plan.kind = interleaved ? TableKind::kHalf : TableKind::kHalfSplit;
    plan.width = plan.half_pad;
  } else {
    // Interleaved rows hold r expanded lanes, rounded up to whole vectors.
    plan.kind = interleaved ? TableKind::kExpanded : TableKind::kHalf;
    plan.width = interleaved ? RoundUp(r, Lf) : plan.half_pad;
  }
  // Tokens per block: at most ~16 KiB of table (L1 sized) and 64 tokens (kBNSD: runs of
  // tok_block rows per head, long enough for the prefetchers), but small enough to give every
  // thread about four blocks, so a few hundred tokens with many heads still use all cores.
  const int64_t by_cache = std::max<int64_t>(4, 16384 / (8 * plan.width));
  const int64_t blocks_per_batch = (4 * std::max(1, a.threads) + B - 1) / B;
  const int64_t by_threads = (S + blocks_per_batch - 1) / blocks_per_batch;
  plan.tok_block = std::clamp<int64_t>(std::min(by_cache, by_threads), 1, 64);
  plan.inv_freq.assign(static_cast<size_t>(plan.half_pad), 0.0);
  for (int64_t i = 0; i < plan.half; ++i) plan.inv_freq[static_cast<size_t>(i)] = a.inv_freq[i];

  // Stream y when it is far larger than the caches (it would be evicted before any reuse)
  // and is not x itself (in place, the line was just read: a plain store costs no extra read),
  // on targets that have streamed stores (elsewhere the staging row would be a plain copy).
  const int64_t y_bytes = rows * D * static_cast<int64_t>(sizeof(T));
  const bool stream = kHasStreamStores && a.y != a.x && y_bytes >= kStreamBytes;
  if (stream) return RopeBlocks<true, T, P>(a, plan, B, S);
  RopeBlocks<false, T, P>(a, plan, B, S);
}

template <class T>
void RopeDispatchPos(const RopeArgs& a) {
  if (a.pos_dtype == DType::kI64) return RopeTyped<T, int64_t>(a);
  return RopeTyped<T, int32_t>(a);
}

void RopeForward(const RopeArgs& a) {
  switch (a.dtype) {
    case DType::kF32:
      return RopeDispatchPos<float>(a);
    case DType::kBF16:
      return RopeDispatchPos<bf16_t>(a);
    default:
      return RopeDispatchPos<f16_t>(a);
  }
}

}  // namespace tboost::kernels::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace tboost::kernels {
HWY_EXPORT(RopeForward);
void rope_forward(const RopeArgs& a) { HWY_DYNAMIC_DISPATCH(RopeForward)(a); }
}  // namespace tboost::kernels
#endif
