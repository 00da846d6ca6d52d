// Highway helpers shared by the CPU kernels: load any float storage type as f32 lanes, store
// f32 lanes back with round-to-nearest-even, tail handling through a small stack buffer, and
// the fast vector math (reciprocal, exp, sigmoid, erf) of the activations and elementwise ops.
//
// Why our own bf16 store: Highway 1.0's DemoteTo(bf16) truncates; we need round to nearest
// even (DESIGN.md numerics), and NaN must stay NaN rather than round into Inf.
// Included once per Highway target (the usual -inl.h toggle).

// For a kernel's per-vector lambdas: GCC may leave a lambda that takes the loop's state by
// reference out of line, and that state then lives on the stack, with a store and reload every
// iteration. On Zen 5 that kept the norm rows at ~0.7x of a copy.
#ifndef TBOOST_INLINE_LAMBDA
#define TBOOST_INLINE_LAMBDA __attribute__((always_inline))
#endif

#ifndef TBOOST_KERNELS_HWY_UTIL_ONCE_H_
#define TBOOST_KERNELS_HWY_UTIL_ONCE_H_
#include <cstdint>
namespace tboost::kernels {
// Outputs of at least this many bytes are written with non-temporal stores (StoreOut): a
// normal store first reads the line it writes (read for ownership), so y costs 1.5x its size
// in DRAM traffic where a streaming copy pays 1x. From this size on y is well past the L2 of
// every core and half of a typical server L3, so its consumer could not find it in cache.
constexpr int64_t kStreamBytes = int64_t{16} << 20;
// How far ahead of its reads a streaming kernel prefetches its input to L2 (PrefetchRangeL2):
// norms, gated activations and rope.
constexpr int64_t kPrefetchAheadBytes = int64_t{16} << 10;
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;
}  // namespace tboost::kernels
#endif

#if defined(TBOOST_KERNELS_HWY_UTIL_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef TBOOST_KERNELS_HWY_UTIL_INL_H_
#undef TBOOST_KERNELS_HWY_UTIL_INL_H_
#else
#define TBOOST_KERNELS_HWY_UTIL_INL_H_
#endif

#include <algorithm>
#include <cstring>
#include <type_traits>

#include "hwy/highway.h"
#include "src/core/parallel.h"
#include "src/kernels/cpu/kernels.h"
#include "tboost/core/dtype.h"
#include "tboost/ops/activation.h"

// The AVX-512 object's functions that use AVX512_BF16 (vdpbf16ps) carry this attribute; callers
// check cpu_features().avx512_bf16 before calling them. TBOOST_HAS_BF16_DOT says whether this
// target's object holds such functions.
#undef TBOOST_HAS_BF16_DOT
#undef TBOOST_BF16_DOT_ATTR
#if HWY_TARGET == HWY_AVX3
#define TBOOST_HAS_BF16_DOT 1
#define TBOOST_BF16_DOT_ATTR \
  __attribute__((target("avx2,fma,avx512f,avx512vl,avx512dq,avx512bw,avx512bf16")))
#else
#define TBOOST_HAS_BF16_DOT 0
#define TBOOST_BF16_DOT_ATTR
#endif

HWY_BEFORE_NAMESPACE();
namespace tboost::kernels::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

template <class D>
HWY_INLINE hn::Vec<D> LoadF(D d, const float* p) {
  return hn::LoadU(d, p);
}
template <class D>
HWY_INLINE hn::Vec<D> LoadF(D d, const bf16_t* p) {
  const hn::Rebind<hwy::bfloat16_t, D> db;
  return hn::PromoteTo(d, hn::LoadU(db, reinterpret_cast<const hwy::bfloat16_t*>(p)));
}
// The 2·Lanes bf16 values at p as two f32 vectors, the even elements and the odd ones: as u32
// lanes, (v << 16) is the even element and (v & 0xFFFF0000) the odd one (no cross-lane shuffle).
template <class D>
HWY_INLINE void WidenPairs(D d, const bf16_t* p, hn::Vec<D>* even, hn::Vec<D>* odd) {
  const hn::RebindToUnsigned<D> du;
  const auto v = hn::LoadU(du, reinterpret_cast<const uint32_t*>(p));
  *even = hn::BitCast(d, hn::ShiftLeft<16>(v));
  *odd = hn::BitCast(d, hn::And(v, hn::Set(du, 0xFFFF0000u)));
}

// Highway 1.0's emulated f16 conversions (the portable EMU128/SCALAR targets) turn Inf into a
// large finite number and truncate; on those targets f16 goes through our scalar conversion.
// x86 (F16C / AVX-512) and NEON convert in hardware, correctly.
#if HWY_TARGET == HWY_EMU128 || HWY_TARGET == HWY_SCALAR
#define TBOOST_HWY_SOFT_F16 1
#else
#define TBOOST_HWY_SOFT_F16 0
#endif

template <class D>
HWY_INLINE hn::Vec<D> LoadF(D d, const f16_t* p) {
#if TBOOST_HWY_SOFT_F16
  HWY_ALIGN float buf[hn::MaxLanes(D())];
  for (size_t i = 0; i < hn::Lanes(d); ++i) buf[i] = f16_to_f32(p[i]);
  return hn::Load(d, buf);
#else
  const hn::Rebind<hwy::float16_t, D> dh;
  return hn::PromoteTo(d, hn::LoadU(dh, reinterpret_cast<const hwy::float16_t*>(p)));
#endif
}

template <class D>
HWY_INLINE void StoreF(D d, hn::Vec<D> v, float* p) {
  hn::StoreU(v, d, p);
}
// f32 lanes to bf16 bits, round to nearest even; NaN stays NaN (quieted).
template <class D>
HWY_INLINE hn::Vec<hn::Rebind<uint16_t, D>> Bf16Bits(D d, hn::Vec<D> v) {
  const hn::RebindToUnsigned<D> du;
  const hn::RebindToSigned<D> di;
  const hn::Rebind<uint16_t, D> d16;
  const auto u = hn::BitCast(du, v);
  const auto rounded =
      hn::Add(u, hn::Add(hn::Set(du, 0x7fffu), hn::And(hn::ShiftRight<16>(u), hn::Set(du, 1u))));
  const auto quiet = hn::Or(u, hn::Set(du, 0x00400000u));
  const auto bits = hn::IfThenElse(hn::RebindMask(du, hn::IsNaN(v)), quiet, rounded);
  return hn::DemoteTo(d16, hn::BitCast(di, hn::ShiftRight<16>(bits)));
}
template <class D>
HWY_INLINE void StoreF(D d, hn::Vec<D> v, bf16_t* p) {
  const hn::Rebind<uint16_t, D> d16;
  hn::StoreU(Bf16Bits(d, v), d16, reinterpret_cast<uint16_t*>(p));
}
template <class D>
HWY_INLINE void StoreF(D d, hn::Vec<D> v, f16_t* p) {
#if TBOOST_HWY_SOFT_F16
  HWY_ALIGN float buf[hn::MaxLanes(D())];
  hn::Store(v, d, buf);
  for (size_t i = 0; i < hn::Lanes(d); ++i) p[i] = f32_to_f16(buf[i]);
#else
  const hn::Rebind<hwy::float16_t, D> dh;
  hn::StoreU(hn::DemoteTo(dh, v), dh, reinterpret_cast<hwy::float16_t*>(p));
#endif
}

// A full-vector store of the output. kStream: a non-temporal store (p aligned to the vector):
// the line is written without being read first (no read for ownership) and displaces no
// cached data, for outputs far larger than the caches. f16 is never streamed (StreamOutput).
template <bool kStream, class D, class T>
HWY_INLINE void StoreOut(D d, hn::Vec<D> v, T* p) {
  if constexpr (kStream && std::is_same_v<T, float>) {
    hn::Stream(v, d, p);
  } else if constexpr (kStream && std::is_same_v<T, bf16_t>) {
    const hn::Rebind<uint16_t, D> d16;
    hn::Stream(Bf16Bits(d, v), d16, reinterpret_cast<uint16_t*>(p));
  } else {
    StoreF(d, v, p);
  }
}

// Calls fn(std::bool_constant<stream>{}): one instantiation per store kind, chosen once per call.
template <class Fn>
HWY_INLINE void WithStream(bool stream, const Fn& fn) {
  if (stream)
    fn(std::true_type{});
  else
    fn(std::false_type{});
}

// Whether this target's objects write large outputs with non-temporal stores: x86 targets with
// real vectors only. Elsewhere (the portable targets, other architectures) a "streamed" store
// would be a plain one, and rope's staging row an extra copy.
constexpr bool kHasStreamStores =
    HWY_ARCH_X86 && HWY_TARGET != HWY_EMU128 && HWY_TARGET != HWY_SCALAR;

// Whether an output y of dtype dt, rows as in y_rows, is streamed: at least kStreamBytes, every
// row start aligned to a whole vector (Stream needs it), f32 or bf16, and kHasStreamStores. On
// Zen 4 (64 MiB f32, 4096 columns, slow memory mode, alternated runs) this took RmsNorm from
// 25-30 to 33-41 GB/s, LayerNorm from 23-27 to 27-34 and SiLU from ~1.0x to 1.3-1.5x the speed
// of a plain copy.
HWY_INLINE bool StreamOutput(DType dt, const void* y, const RowView& y_rows) {
  if (!kHasStreamStores) return false;
  if ((dt != DType::kF32 && dt != DType::kBF16) || y_rows.uniform_stride < 0) return false;
  const int64_t es = static_cast<int64_t>(dtype_size(dt));
  const int64_t vb = static_cast<int64_t>(hn::Lanes(hn::ScalableTag<float>())) * es;
  if ((y_rows.uniform_stride * es) % vb != 0) return false;
  if (reinterpret_cast<uintptr_t>(y) % static_cast<uintptr_t>(vb) != 0) return false;
  return y_rows.count * y_rows.cols * es >= kStreamBytes;
}

// Requests the `bytes` at p into L2 (prefetcht1), one request per 64-byte line. A prefetch
// past the end of a buffer is harmless: it never faults.
HWY_INLINE void PrefetchRangeL2(const char* p, int64_t bytes) {
  for (int64_t k = 0; k < bytes; k += 64) __builtin_prefetch(p + k, 0, 2);
}

// Streams that compute on what they read (decode's weight GEMVs, with per-CPU distances and
// none on AMD's AVX-512 cores for 1-2 x rows, gemv.cc; its attention over the KV cache asks the
// same way through KvAhead, attention_decode.cc, into L2 on Zen 4) ask for each 64-byte line
// kStreamAheadBytes before they load it, one prefetcht0 next to the load of each line. The
// hardware prefetchers alone fall behind such a stream: on Zen 5 a loop with 8 FMAs per line read
// 0.57-0.72 of a plain read's bandwidth when the host's memory was in its fast mode, 0.79-0.92 with
// this; chains of llama-110m's bf16 GEMVs ran 6-36% faster in 11 of 12 runs (bench/RESULTS.md,
// "stream prefetch"). Sent as bursts of whole rows instead (PrefetchRow), the same requests changed
// nothing or cost up to 14% in decode attention. A prefetch past the end of a buffer is harmless:
// it never faults. `ahead` overrides the distance (the GEMVs' per-CPU distances, gemv.cc).
constexpr int64_t kStreamAheadBytes = 4096;
HWY_INLINE void StreamAhead(const void* p, int64_t ahead = kStreamAheadBytes) {
  __builtin_prefetch(static_cast<const char*>(p) + ahead, 0, 3);
}
// StreamAhead for the load at element `i` of a row of T, once per 64 bytes of the row (for
// loads narrower than a line).
template <class T>
HWY_INLINE void StreamAheadAt(const T* row, int64_t i, int64_t ahead = kStreamAheadBytes) {
  if (((i * static_cast<int64_t>(sizeof(T))) & 63) == 0) StreamAhead(row + i, ahead);
}
// The weight streams' distance template argument (gemv.cc): > 0 asks for each line that many
// bytes ahead (StreamAhead), < 0 asks -ahead bytes ahead without temporal locality
// (prefetchnta: the line is not kept in the outer caches), 0 leaves the lines to the hardware.
template <int64_t kAhead, class T>
HWY_INLINE void StreamAheadAs(const T* p) {
  if constexpr (kAhead > 0) StreamAhead(p, kAhead);
  if constexpr (kAhead < 0) __builtin_prefetch(reinterpret_cast<const char*>(p) - kAhead, 0, 0);
}
// StreamAheadAs for the load at element `i` of a row of T, once per 64 bytes (StreamAheadAt).
template <int64_t kAhead, class T>
HWY_INLINE void StreamAheadAsAt(const T* row, int64_t i) {
  if (((i * static_cast<int64_t>(sizeof(T))) & 63) == 0) StreamAheadAs<kAhead>(row + i);
}

// Partial vectors: the n < Lanes(d) remaining elements go through a stack buffer, so no
// load or store ever touches memory past the end of a row.
template <class D, class T>
HWY_INLINE hn::Vec<D> LoadTailF(D d, const T* p, size_t n, float fill = 0.0f) {
  HWY_ALIGN float buf[hn::MaxLanes(D())];
  for (size_t i = 0; i < hn::Lanes(d); ++i) buf[i] = i < n ? to_f32(p[i]) : fill;
  return hn::Load(d, buf);
}
template <class D, class T>
HWY_INLINE void StoreTailF(D d, hn::Vec<D> v, T* p, size_t n) {
  HWY_ALIGN T buf[hn::MaxLanes(D())];
  StoreF(d, v, buf);
  std::memcpy(p, buf, n * sizeof(T));
}

// n elements, n <= Lanes(d): a full vector or a tail (lanes past n load as `fill`).
template <class D, class T>
HWY_INLINE hn::Vec<D> LoadN(D d, const T* p, int64_t n, float fill = 0.0f) {
  return n == static_cast<int64_t>(hn::Lanes(d)) ? LoadF(d, p)
                                                 : LoadTailF(d, p, static_cast<size_t>(n), fill);
}
template <class D, class T>
HWY_INLINE void StoreN(D d, hn::Vec<D> v, T* p, int64_t n) {
  if (n == static_cast<int64_t>(hn::Lanes(d))) {
    StoreF(d, v, p);
  } else {
    StoreTailF(d, v, p, static_cast<size_t>(n));
  }
}

// Reads one byte of every cache line of [p, p + bytes), front to back. A kernel that reads
// several places of a row at once (rope's two halves, two rows side by side) shows the
// hardware prefetchers an order they do not follow; touching the rows in order first keeps the
// DRAM stream sequential, and the kernel's own loads then hit L1. On Zen 4 (slow memory mode)
// a read-only test of 16 rows of 512 B read side by side ran at 38-41 GB/s with this touch,
// 20-27 GB/s with software prefetches ahead instead, 17-23 GB/s with neither, and 37-47 GB/s
// reading the rows one after the other (bench/RESULTS.md, "memory access order").
HWY_INLINE void TouchLines(const void* p, int64_t bytes) {
  const uintptr_t end = reinterpret_cast<uintptr_t>(p) + static_cast<uintptr_t>(bytes);
  for (uintptr_t a = reinterpret_cast<uintptr_t>(p) & ~uintptr_t{63}; a < end; a += 64)
    (void)*reinterpret_cast<const volatile char*>(a);
}

// The two halves of our fast exponentials (FastExp below, Exp2 for attention).
// ShiftedRound: x + 1.5·2^23 holds round(x) in its low mantissa bits (for |x| < 2^22), so
// n = t - 1.5·2^23 is round(x) as a float and Pow2FromShifted(t) is 2^n built in the exponent
// bits, without a float-to-int conversion. Valid for n in [-126, 127].
constexpr float kShifter = 12582912.0f;
template <class D>
HWY_INLINE hn::Vec<D> Pow2FromShifted(D d, hn::Vec<D> t) {
  const hn::RebindToSigned<D> di;
  return hn::BitCast(d,
                     hn::ShiftLeft<23>(hn::Add(hn::BitCast(di, t), hn::Set(di, 127 - 0x4B400000))));
}
// e^r for |r| <= ln2/2 by a polynomial of kDegree, Horner form: 1 + c1·r + ... + ck·r^k with
// c1..ck fitted to the least maximum relative error on that interval (Lawson's weighted least
// squares, float64). Evaluated in f32 (2M random r), the relative error is 2.9e-6 (degree 4)
// and 1.7e-7 (degree 5), against the Taylor polynomials of one degree more that were used
// before: 3.3e-6 (degree 5) and 2.4e-7 (degree 6). One FMA less for the same accuracy.
// kNeg: e^(-r) instead, the same polynomial in -r (odd coefficients negated), so a caller
// that wants e^(-z) needs no negation of its argument.
// kBase2: 2^r (or 2^(-r)) for |r| <= 1/2, the same polynomial in r·ln2 (ck scaled by ln2^k at
// compile time), so a caller reducing in base 2 needs no multiply by ln2 either.
template <int kDegree, bool kNeg = false, bool kBase2 = false, class D>
HWY_INLINE hn::Vec<D> ExpPoly(D d, hn::Vec<D> r) {
  static_assert(kDegree == 4 || kDegree == 5, "degree 4 or 5");
  static constexpr double c4[] = {1.0, 9.9996683629e-01, 5.0003013660e-01, 1.6787473802e-01,
                                  4.1513848108e-02};
  static constexpr double c5[] = {1.0,
                                  9.9999970719e-01,
                                  4.9999149525e-01,
                                  1.6667636200e-01,
                                  4.1897930046e-02,
                                  8.2903147257e-03};
  constexpr auto coef = [](int k) {
    double c = kDegree == 5 ? c5[k] : c4[k];
    for (int i = 0; i < k && kBase2; ++i) c *= 0.6931471805599453;
    return static_cast<float>(kNeg && (k & 1) ? -c : c);
  };
  // constexpr values, so the coefficients are folded at compile time at every optimization level.
  constexpr float k1 = coef(1), k2 = coef(2), k3 = coef(3), k4 = coef(4);
  constexpr float k5 = kDegree == 5 ? coef(5) : 0.0f;
  hn::Vec<D> p = hn::Set(d, kDegree == 5 ? k5 : k4);
  if constexpr (kDegree == 5) p = hn::MulAdd(p, r, hn::Set(d, k4));
  p = hn::MulAdd(p, r, hn::Set(d, k3));
  p = hn::MulAdd(p, r, hn::Set(d, k2));
  p = hn::MulAdd(p, r, hn::Set(d, k1));
  return hn::MulAdd(p, r, hn::Set(d, 1.0f));
}

// 1/x as the approximate reciprocal plus one Newton step: relative error ~1.4e-7, where a
// divide costs 3-5x more on x86.
template <class D, class V>
HWY_INLINE V Recip(D d, V x) {
  const V r = hn::ApproximateReciprocal(x);
  return hn::Mul(r, hn::NegMulAdd(x, r, hn::Set(d, 2.0f)));  // r·(2 - x·r): one Newton step
}

// e^x for x in [-87.3, 88.3] (callers clamp). Why not Highway's Exp: its polynomial is accurate
// to ~1 ulp and costs ~20 instructions, which made SiLU compute bound at ~0.45x copy speed.
// Here: n = round(x·log2 e), r = x - n·ln2 (two-part ln2), e^r by ExpPoly of kDegree (4:
// relative error 2.9e-6, 170x below the f32 tolerance 2^-11; 5: 1.7e-7, a few ulp), times 2^n
// built in the exponent bits. 9 instructions at degree 4.
template <int kDegree = 4, class D, class V>
HWY_INLINE V FastExp(D d, V x) {
  const V shifter = hn::Set(d, kShifter);
  const V t = hn::MulAdd(x, hn::Set(d, 1.44269504088896341f), shifter);  // n = round(x·log2 e)
  const V n = hn::Sub(t, shifter);
  V r = hn::NegMulAdd(n, hn::Set(d, 0.693145751953125f), x);
  r = hn::NegMulAdd(n, hn::Set(d, 1.428606765330187e-06f), r);
  return hn::Mul(ExpPoly<kDegree>(d, r), Pow2FromShifted(d, t));
}

// 2^(-v) for v in [-125, 125] (callers clamp), the exponential of the activations. Reduced in
// base 2: n = round(v) by the shifter, r = v - n exactly (one subtract, where e^x needs two
// FMAs against a two-part ln2), 2^(-r) by ExpPoly<kBase2>, and 2^(-n) applied by subtracting
// n from the result's exponent field instead of a multiply: t's bits are 0x4B400000 + n, and
// shifted left by 23 the constant part wraps to zero, leaving n << 23. The result's exponent
// stays normal for |n| <= 125. Callers fold log2 e into the arithmetic that forms v.
// Why: on Zen 4 the activations were bound by the FMA/multiply pipes (14 of 21 operations per
// vector for tanh-GELU); this form moves the reduction to the add pipes and the scaling to
// integer ops, leaving 10 of 19 there.
template <int kDegree = 4, class D, class V>
HWY_INLINE V Exp2Neg(D d, V v) {
  const hn::RebindToSigned<D> di;
  const V shifter = hn::Set(d, kShifter);
  const V t = hn::Add(v, shifter);
  const V r = hn::Sub(v, hn::Sub(t, shifter));
  const auto p = hn::BitCast(di, ExpPoly<kDegree, true, true>(d, r));
  return hn::BitCast(d, hn::Sub(p, hn::ShiftLeft<23>(hn::BitCast(di, t))));
}

// 1 / (1 + 2^(-v)), i.e. sigmoid(v·ln2); v clamped to ±120 so 2^(-v) stays a normal number
// (x·sigmoid(x) would otherwise give inf·0 = NaN). The clamp drops NaN on x86: callers that
// must propagate NaN check for it (x·sigmoid(x) does by itself).
template <class D, class V>
HWY_INLINE V SigmoidLog2(D d, V v) {
  const V vc = hn::Min(hn::Max(v, hn::Set(d, -120.0f)), hn::Set(d, 120.0f));
  return Recip(d, hn::Add(hn::Set(d, 1.0f), Exp2Neg(d, vc)));
}

// 1 / (1 + e^(-z)).
template <class D, class V>
HWY_INLINE V Sigmoid(D d, V z) {
  return SigmoidLog2(d, hn::Mul(z, hn::Set(d, kLog2e)));
}

// erf by Abramowitz–Stegun 7.1.26: |absolute error| < 1.5e-7 (relative error grows near 0,
// where erf(x) ~ 1.13·x: callers wanting relative accuracy there use the Taylor series).
template <int kDegree = 4, class D, class V>
HWY_INLINE V Erf(D d, V x) {
  const V ax = hn::Abs(x);
  const V t = Recip(d, hn::MulAdd(hn::Set(d, 0.3275911f), ax, hn::Set(d, 1.0f)));
  V p = hn::Set(d, 1.061405429f);
  p = hn::MulAdd(p, t, hn::Set(d, -1.453152027f));
  p = hn::MulAdd(p, t, hn::Set(d, 1.421413741f));
  p = hn::MulAdd(p, t, hn::Set(d, -0.284496736f));
  p = hn::MulAdd(p, t, hn::Set(d, 0.254829592f));
  p = hn::Mul(p, t);
  const V e = Exp2Neg<kDegree>(
      d, hn::Min(hn::Mul(hn::Mul(ax, hn::Set(d, kLog2e)), ax), hn::Set(d, 120.0f)));
  const V y = hn::NegMulAdd(p, e, hn::Set(d, 1.0f));
  return hn::CopySign(y, x);
}

// The activations on f32 lanes (gated types: the activation of the gate alone), shared by
// the Activation kernel and the Linear epilogues.
template <ops::ActivationType t, class D, class V>
HWY_INLINE V ApplyActivation(D d, V x) {
  using ops::ActivationType;
  switch (t) {
    case ActivationType::kRelu:  // not Max(x, 0): x86 max drops a NaN; NaN must propagate
      return hn::IfThenZeroElse(hn::Lt(x, hn::Zero(d)), x);
    case ActivationType::kSilu:
    case ActivationType::kSwiGlu:
      return hn::Mul(x, Sigmoid(d, x));
    case ActivationType::kGeluTanh:
    case ActivationType::kGeGluTanh: {
      // 0.5·x·(1 + tanh(u)) = x·sigmoid(2u), u = sqrt(2/pi)·(x + 0.044715·x³), so
      // 2u·log2 e = x·(c1 + c3·x²) with c1 = 2·sqrt(2/pi)·log2 e, c3 = 0.044715·c1: three
      // instructions, and SigmoidLog2 takes it as it is.
      constexpr double c1 = 2.0 * 0.7978845608028654 * 1.4426950408889634;
      const V x2 = hn::Mul(x, x);
      const V v = hn::Mul(x, hn::MulAdd(x2, hn::Set(d, static_cast<float>(0.044715 * c1)),
                                        hn::Set(d, static_cast<float>(c1))));
      return hn::Mul(x, SigmoidLog2(d, v));
    }
    case ActivationType::kGeluErf:
    case ActivationType::kGeGluErf: {
      const V half_x = hn::Mul(x, hn::Set(d, 0.5f));
      return hn::MulAdd(half_x, Erf(d, hn::Mul(x, hn::Set(d, 0.7071067811865476f))), half_x);
    }
  }
  return x;
}

template <class D>
HWY_INLINE float ReduceSumF(D d, hn::Vec<D> v) {
  return hn::GetLane(hn::SumOfLanes(d, v));
}
template <class D>
HWY_INLINE float ReduceMaxF(D d, hn::Vec<D> v) {
  return hn::GetLane(hn::MaxOfLanes(d, v));
}

// Row-parallel driver shared by the elementwise-style kernels: splits `count` rows over the
// threads (at least ~elems_per_thread elements each) and calls fn(tag, r0, r1) with a value of
// the storage type of `dtype` (float, bf16_t or f16_t) as tag.
template <class Fn>
HWY_INLINE void ParallelRowsTyped(DType dtype, int threads, int64_t count, int64_t cols,
                                  int64_t elems_per_thread, bool ftz, const Fn& fn) {
  const int64_t min_rows = std::max<int64_t>(1, elems_per_thread / std::max<int64_t>(1, cols));
  parallel_for(threads, count, min_rows, ftz, [&](int64_t r0, int64_t r1) {
    switch (dtype) {
      case DType::kF32:
        return fn(float{}, r0, r1);
      case DType::kBF16:
        return fn(bf16_t{}, r0, r1);
      default:
        return fn(f16_t{}, r0, r1);
    }
  });
}

// ParallelRowsTyped for row kernels whose output may be streamed: fn(tag, stream, r0, r1) with
// stream a std::bool_constant, decided once per call. Never in place: there y's lines were
// just read, and a plain store costs no read for ownership.
template <class Fn>
HWY_INLINE void ParallelRowsStreamed(DType dtype, int threads, const void* y, const RowView& y_rows,
                                     bool in_place, int64_t elems_per_thread, bool ftz,
                                     const Fn& fn) {
  WithStream(!in_place && StreamOutput(dtype, y, y_rows), [&](auto stream) {
    ParallelRowsTyped(dtype, threads, y_rows.count, y_rows.cols, elems_per_thread, ftz,
                      [&](auto tag, int64_t r0, int64_t r1) { fn(tag, stream, r0, r1); });
  });
}

}  // namespace tboost::kernels::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#undef TBOOST_HWY_SOFT_F16
#endif  // TBOOST_KERNELS_HWY_UTIL_INL_H_
