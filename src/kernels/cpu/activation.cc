// Activation forward on the CPU (Highway): GELU (erf, tanh), SiLU, ReLU, SwiGLU / GeGLU.
//
// These are memory bound on large tensors only if the math stays under ~2 cycles per
// element per core, so: the logistic form 0.5·(1 + tanh(u)) = 1 / (1 + e^(-2u)) replaces
// tanh (one exp instead of tanh's two), erf uses Abramowitz–Stegun 7.1.26 (|error| < 1.5e-7,
// far below the f32 tolerance 2^-11), and 1 / (1 + e) is an approximate reciprocal refined by
// one Newton step (rel. error ~1e-7) instead of a divide, which is 3–5x slower on x86. The
// exponential is taken in base 2 (Exp2Neg: log2 e folded into the argument, the power of two
// subtracted from the exponent bits), its argument clamped to ±120 so it never overflows into
// inf·0 = NaN. Those helpers (Exp2Neg, Sigmoid, Erf, Recip) live in hwy_util-inl.h, shared
// with the elementwise and backward kernels.
// clang-format off: Highway's per-target re-inclusion needs this exact order.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "src/kernels/cpu/activation.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
// clang-format on

#include <algorithm>
#include <limits>
#include <type_traits>
#include <vector>

#include "hwy/cache_control.h"
#include "hwy/contrib/math/math-inl.h"
#include "hwy/highway.h"
#include "src/core/parallel.h"
#include "src/kernels/cpu/hwy_util-inl.h"
#include "src/kernels/cpu/kernels.h"

HWY_BEFORE_NAMESPACE();
namespace tboost::kernels::HWY_NAMESPACE {

// The activation is a template parameter so the loop body is one straight-line sequence the
// compiler can schedule across iterations (a switch per vector cost ~15% here).
template <class T, ops::ActivationType kType, bool kStream>
void ActRows(const ActivationArgs& a, int64_t r0, int64_t r1) {
  const hn::ScalableTag<float> d;
  const int64_t L = static_cast<int64_t>(hn::Lanes(d));
  const int64_t F = a.y_rows.cols;
  constexpr bool gated = ops::is_gated(kType);
  // Gated types read two places of each row at once (gate and up); with large outputs both
  // are prefetched to L2 about kPrefetchAheadBytes ahead. On Zen 4 in the fast memory mode
  // SwiGLU at 1024 columns went from 0.63-0.79x to 1.11-1.35x of a copy; single-stream
  // activations gained nothing from it and are left to the hardware prefetchers.
  // The prefetch targets the same place `ahead` rows further on (whole rows, at least
  // kPrefetchAheadBytes), not a fixed distance along the row: gate and up are the two halves
  // of a row, so at 4096 f32 columns a 16 KiB step from gate lands in this row's up half,
  // already being read, and nothing prefetched the next row's up half.
  constexpr int64_t kStep = static_cast<int64_t>(2 * hn::MaxLanes(d) * sizeof(T));
  const int64_t x_stride = a.x_rows.uniform_stride;  // elements; < 0: rows not evenly spaced
  const int64_t row_bytes = x_stride * static_cast<int64_t>(sizeof(T));
  const int64_t ahead = x_stride > 0  // elements: whole rows covering kPrefetchAheadBytes
                            ? x_stride * ((kPrefetchAheadBytes + row_bytes - 1) / row_bytes)
                            : kPrefetchAheadBytes / static_cast<int64_t>(sizeof(T));
  for (int64_t r = r0; r < r1; ++r) {
    const T* x = static_cast<const T*>(a.x) + a.x_rows.offset(r);
    const T* gate = gated && !a.gate_first ? x + F : x;
    const T* up = gated ? (a.gate_first ? x + F : x) : nullptr;
    T* y = static_cast<T*>(a.y) + a.y_rows.offset(r);
    int64_t i = 0;
    // Two independent vectors per step: the exp/reciprocal chains are latency bound.
    for (; i + 2 * L <= F; i += 2 * L) {
      if constexpr (kStream && gated) {
        PrefetchRangeL2(reinterpret_cast<const char*>(gate + i + ahead), kStep);
        PrefetchRangeL2(reinterpret_cast<const char*>(up + i + ahead), kStep);
      }
      auto v0 = ApplyActivation<kType>(d, LoadF(d, gate + i));
      auto v1 = ApplyActivation<kType>(d, LoadF(d, gate + i + L));
      if constexpr (gated) {
        v0 = hn::Mul(v0, LoadF(d, up + i));
        v1 = hn::Mul(v1, LoadF(d, up + i + L));
      }
      StoreOut<kStream>(d, v0, y + i);
      StoreOut<kStream>(d, v1, y + i + L);
    }
    for (; i + L <= F; i += L) {
      auto v = ApplyActivation<kType>(d, LoadF(d, gate + i));
      if constexpr (gated) v = hn::Mul(v, LoadF(d, up + i));
      StoreOut<kStream>(d, v, y + i);
    }
    if (i < F) {
      const auto n = static_cast<size_t>(F - i);
      auto v = ApplyActivation<kType>(d, LoadTailF(d, gate + i, n));
      if (up) v = hn::Mul(v, LoadTailF(d, up + i, n));
      StoreTailF(d, v, y + i, n);
    }
  }
  if constexpr (kStream) hwy::FlushStream();
}

template <class T, bool kStream>
void ActTyped(const ActivationArgs& a, int64_t r0, int64_t r1) {
  using ops::ActivationType;
  switch (a.type) {
    case ActivationType::kRelu:
      return ActRows<T, ActivationType::kRelu, kStream>(a, r0, r1);
    case ActivationType::kGeluErf:
      return ActRows<T, ActivationType::kGeluErf, kStream>(a, r0, r1);
    case ActivationType::kGeluTanh:
      return ActRows<T, ActivationType::kGeluTanh, kStream>(a, r0, r1);
    case ActivationType::kSilu:
      return ActRows<T, ActivationType::kSilu, kStream>(a, r0, r1);
    case ActivationType::kSwiGlu:
      return ActRows<T, ActivationType::kSwiGlu, kStream>(a, r0, r1);
    case ActivationType::kGeGluErf:
      return ActRows<T, ActivationType::kGeGluErf, kStream>(a, r0, r1);
    case ActivationType::kGeGluTanh:
      return ActRows<T, ActivationType::kGeGluTanh, kStream>(a, r0, r1);
  }
}

void ActivationForward(const ActivationArgs& a) {
  ParallelRowsStreamed(a.dtype, a.threads, a.y, a.y_rows, a.y == a.x, 8192, a.ftz,
                       [&](auto tag, auto stream, int64_t r0, int64_t r1) {
                         ActTyped<decltype(tag), decltype(stream)::value>(a, r0, r1);
                       });
}

// Softmax rows: max pass, exp pass (FastExp, rel. error < 2.5e-6; writes e^(x-max) and
// sums), scale pass; the row is in cache after the first pass, so DRAM sees one read of x
// and one write of y.
template <class T>
void SoftmaxRows(const SoftmaxArgs& a, int64_t r0, int64_t r1) {
  const hn::ScalableTag<float> d;
  const int64_t L = static_cast<int64_t>(hn::Lanes(d));
  const int64_t C = a.x_rows.cols;
  const auto vs = hn::Set(d, a.scale);
  const float ninf = -std::numeric_limits<float>::infinity();
  std::vector<float> scratch(std::is_same_v<T, float> ? 0 : static_cast<size_t>(C));
  for (int64_t r = r0; r < r1; ++r) {
    const T* x = static_cast<const T*>(a.x) + a.x_rows.offset(r);
    T* y = static_cast<T*>(a.y) + a.y_rows.offset(r);
    auto n_at = [&](int64_t i) { return std::min(L, C - i); };
    auto vmax = hn::Set(d, ninf);
    auto vnan = hn::Zero(d);  // x86 max drops NaN: track it so a NaN input gives a NaN row
    for (int64_t i = 0; i < C; i += L) {
      const auto v = hn::Mul(LoadN(d, x + i, n_at(i), ninf), vs);
      vmax = hn::Max(vmax, v);
      vnan = hn::Or(vnan, hn::VecFromMask(d, hn::IsNaN(v)));
    }
    const float m = ReduceMaxF(d, vmax);
    const bool has_nan = !hn::AllFalse(d, hn::MaskFromVec(vnan));
    if (m == ninf || has_nan) {  // fully masked row: defined output, zeros; NaN in: NaN out
      const auto fill = hn::Set(d, has_nan ? std::numeric_limits<float>::quiet_NaN() : 0.0f);
      for (int64_t i = 0; i < C; i += L) StoreN(d, fill, y + i, n_at(i));
      continue;
    }
    const auto vm = hn::Set(d, m);
    const auto lo = hn::Set(d, -87.0f);
    auto vsum = hn::Zero(d);
    // Exponentials go to y when T is f32, else to an f32 scratch row (L1/L2 resident), so a
    // 16-bit y is rounded once. z = x·scale - max <= 0; below -87 (e^z < 2^-125, and -inf for
    // masked entries) the result is exactly 0, as in the float64 reference.
    float* e_row = std::is_same_v<T, float> ? reinterpret_cast<float*>(y) : scratch.data();
    for (int64_t i = 0; i < C; i += L) {
      const auto z = hn::Sub(hn::Mul(LoadN(d, x + i, n_at(i), ninf), vs), vm);
      const auto e = hn::IfThenElseZero(hn::Ge(z, lo), FastExp(d, hn::Max(z, lo)));
      vsum = hn::Add(vsum, e);
      StoreN(d, e, e_row + i, n_at(i));
    }
    const auto inv = hn::Set(d, 1.0f / ReduceSumF(d, vsum));
    for (int64_t i = 0; i < C; i += L)
      StoreN(d, hn::Mul(LoadN(d, e_row + i, n_at(i)), inv), y + i, n_at(i));
  }
}

void SoftmaxForward(const SoftmaxArgs& a) {
  ParallelRowsTyped(
      a.dtype, a.threads, a.x_rows.count, a.x_rows.cols, 8192, a.ftz,
      [&](auto tag, int64_t r0, int64_t r1) { SoftmaxRows<decltype(tag)>(a, r0, r1); });
}

}  // namespace tboost::kernels::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace tboost::kernels {
HWY_EXPORT(ActivationForward);
HWY_EXPORT(SoftmaxForward);
void activation_forward(const ActivationArgs& a) { HWY_DYNAMIC_DISPATCH(ActivationForward)(a); }
void softmax_forward(const SoftmaxArgs& a) { HWY_DYNAMIC_DISPATCH(SoftmaxForward)(a); }
}  // namespace tboost::kernels
#endif
