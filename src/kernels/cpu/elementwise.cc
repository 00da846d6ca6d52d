// Elementwise binary (add, sub, mul, div, pow, max, min, with broadcasting) and unary (scale,
// neg, sqrt, rsqrt, reciprocal, exp, tanh, erf, sigmoid, abs) kernels on the CPU (Highway).
//
// The op flattens the output into rows of its last dim; each input row is located through
// its own RowView (broadcast dims have stride 0) and its last dim is either contiguous or a
// broadcast scalar (col stride 0). That covers bias rows, per-token scalars and full tensors
// with one inner loop. The operation is a template parameter, so each loop body is straight
// code (as in the activations); one switch per call picks the instantiation.
//
// Accuracy (f32 compute): add/sub/mul/div/sqrt/abs/neg/max/min are IEEE-exact roundings;
// rsqrt rounds twice. exp, tanh, erf and sigmoid build on the shared fast vector math
// (FastExp with its degree-5 polynomial, relative error ~1.7e-7; the A&S erf) plus what each
// needs to hold over the whole f32 range: exp handles overflow (inf), underflow (0) and NaN;
// sigmoid divides exactly (1 at +large, not 0.99999994); tanh and erf switch to their Taylor
// series near 0, where the logistic / A&S forms lose relative accuracy. A few ulp overall
// (tests/ops/elementwise_test.cc measures it).
// clang-format off: Highway's per-target re-inclusion needs this exact order.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "src/kernels/cpu/elementwise.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
// clang-format on

#include <algorithm>
#include <cmath>

#include "hwy/cache_control.h"
#include "hwy/highway.h"
#include "src/core/parallel.h"
#include "src/kernels/cpu/hwy_util-inl.h"
#include "src/kernels/cpu/kernels.h"

HWY_BEFORE_NAMESPACE();
namespace tboost::kernels::HWY_NAMESPACE {

// NaN-propagating result of max/min: x86's max/min return the second operand when either is
// NaN, and Highway leaves it to the target; numpy and torch propagate.
template <class D, class V>
HWY_INLINE V KeepNaN(D d, V a, V b, V r) {
  return hn::IfThenElse(hn::IsNaN(a), a, hn::IfThenElse(hn::IsNaN(b), b, r));
}

template <BinaryOp kOp, class D, class V>
HWY_INLINE V ApplyBinary(D d, V a, V b) {
  switch (kOp) {
    case BinaryOp::kAdd:
      return hn::Add(a, b);
    case BinaryOp::kSub:
      return hn::Sub(a, b);
    case BinaryOp::kMul:
      return hn::Mul(a, b);
    case BinaryOp::kDiv:
      return hn::Div(a, b);
    case BinaryOp::kMax:
      return KeepNaN(d, a, b, hn::Max(a, b));
    case BinaryOp::kMin:
      return KeepNaN(d, a, b, hn::Min(a, b));
    case BinaryOp::kPow:  // scalar path (PowRows)
      break;
  }
  return a;
}

template <class T, BinaryOp kOp, bool kStream>
void BinaryRows(const BinaryArgs& a, int64_t r0, int64_t r1) {
  const hn::ScalableTag<float> d;
  const int64_t L = static_cast<int64_t>(hn::Lanes(d));
  const int64_t C = a.y_rows.cols;
  if (C == 0) return;  // empty rows: nothing to read, not even the broadcast scalar
  const bool sa = a.a_col_stride == 0, sb = a.b_col_stride == 0;
  for (int64_t r = r0; r < r1; ++r) {
    const T* pa = static_cast<const T*>(a.a) + a.a_rows.offset(r);
    const T* pb = static_cast<const T*>(a.b) + a.b_rows.offset(r);
    T* y = static_cast<T*>(a.y) + a.y_rows.offset(r);
    const auto ca = hn::Set(d, to_f32(pa[0])), cb = hn::Set(d, to_f32(pb[0]));
    int64_t i = 0;
    for (; i + L <= C; i += L) {
      const auto va = sa ? ca : LoadF(d, pa + i);
      const auto vb = sb ? cb : LoadF(d, pb + i);
      StoreOut<kStream>(d, ApplyBinary<kOp>(d, va, vb), y + i);
    }
    if (i < C) {
      const auto n = static_cast<size_t>(C - i);
      const auto va = sa ? ca : LoadTailF(d, pa + i, n);
      const auto vb = sb ? cb : LoadTailF(d, pb + i, n);
      StoreTailF(d, ApplyBinary<kOp>(d, va, vb), y + i, n);
    }
  }
  if constexpr (kStream) hwy::FlushStream();
}

// pow with a tensor (or unusual scalar) exponent: std::pow per element, in f32. Not worth a
// vector polynomial: graphs raise to 2, 0.5 or -1 (the unary forms) almost exclusively.
template <class T>
void PowRows(const BinaryArgs& a, int64_t r0, int64_t r1) {
  const int64_t C = a.y_rows.cols;
  for (int64_t r = r0; r < r1; ++r) {
    const T* pa = static_cast<const T*>(a.a) + a.a_rows.offset(r);
    const T* pb = static_cast<const T*>(a.b) + a.b_rows.offset(r);
    T* y = static_cast<T*>(a.y) + a.y_rows.offset(r);
    for (int64_t i = 0; i < C; ++i)
      y[i] = from_f32<T>(std::pow(to_f32(pa[i * a.a_col_stride]), to_f32(pb[i * a.b_col_stride])));
  }
}

template <class T, bool kStream>
void BinaryTyped(const BinaryArgs& a, int64_t r0, int64_t r1) {
  switch (a.op) {
    case BinaryOp::kAdd:
      return BinaryRows<T, BinaryOp::kAdd, kStream>(a, r0, r1);
    case BinaryOp::kMul:
      return BinaryRows<T, BinaryOp::kMul, kStream>(a, r0, r1);
    case BinaryOp::kSub:
      return BinaryRows<T, BinaryOp::kSub, kStream>(a, r0, r1);
    case BinaryOp::kDiv:
      return BinaryRows<T, BinaryOp::kDiv, kStream>(a, r0, r1);
    case BinaryOp::kMax:
      return BinaryRows<T, BinaryOp::kMax, kStream>(a, r0, r1);
    case BinaryOp::kMin:
      return BinaryRows<T, BinaryOp::kMin, kStream>(a, r0, r1);
    case BinaryOp::kPow:
      return PowRows<T>(a, r0, r1);
  }
}

void BinaryForward(const BinaryArgs& a) {
  // std::pow costs ~20-40 ns: split pow over threads at far fewer elements.
  const int64_t grain = a.op == BinaryOp::kPow ? 1024 : 16384;
  ParallelRowsStreamed(a.dtype, a.threads, a.y, a.y_rows, a.y == a.a || a.y == a.b, grain, a.ftz,
                       [&](auto tag, auto stream, int64_t r0, int64_t r1) {
                         BinaryTyped<decltype(tag), decltype(stream)::value>(a, r0, r1);
                       });
}

// e^x over the whole f32 range: 0 below -87.3 (results under 2^-126 flush, as with FTZ), inf
// above 88.72, NaN stays NaN. FastExp needs n = round(x·log2 e) <= 127, i.e. x < 88.37, so
// above 88 it computes e^(x-1)·e (x - 1 is exact there: both lie in [64, 128)).
template <class D, class V>
HWY_INLINE V ExpF(D d, V x) {
  const auto hi = hn::Gt(x, hn::Set(d, 88.0f));
  const V xs = hn::IfThenElse(hi, hn::Sub(x, hn::Set(d, 1.0f)), x);
  const V xc = hn::Min(hn::Max(xs, hn::Set(d, -87.3f)), hn::Set(d, 88.3f));
  V e = FastExp<5>(d, xc);
  e = hn::IfThenElse(hi, hn::Mul(e, hn::Set(d, 2.71828182845904524f)), e);
  e = hn::IfThenZeroElse(hn::Lt(x, hn::Set(d, -87.3f)), e);
  return hn::IfThenElse(hn::IsNaN(x), x, e);
}

// Horner in z = x² of the odd series x·(c0 + c1·z + ...), coefficients highest first.
template <size_t kN, class D, class V>
HWY_INLINE V OddSeries(D d, V x, const float (&c)[kN]) {
  const V z = hn::Mul(x, x);
  V p = hn::Set(d, c[0]);
  for (size_t k = 1; k < kN; ++k) p = hn::MulAdd(p, z, hn::Set(d, c[k]));
  return hn::Mul(x, p);
}

// sigmoid: 1 / (1 + e^-x) with ExpF (full range: 0 and 1 at the limits, NaN kept) and a true
// division (the activations' approximate reciprocal gives 0.99999994 for 1 / 1).
template <class D, class V>
HWY_INLINE V SigmoidF(D d, V x) {
  const V one = hn::Set(d, 1.0f);
  return hn::Div(one, hn::Add(one, ExpF(d, hn::Neg(x))));
}

// tanh: its Taylor series to x^13 below |x| = 0.3 (truncation < 1e-10 relative), else
// 2·sigmoid(2x) - 1, the logistic form GELU-tanh uses.
template <class D, class V>
HWY_INLINE V TanhF(D d, V x) {
  static constexpr float kTaylor[] = {21844.0f / 6081075.0f,
                                      -1382.0f / 155925.0f,
                                      62.0f / 2835.0f,
                                      -17.0f / 315.0f,
                                      2.0f / 15.0f,
                                      -1.0f / 3.0f,
                                      1.0f};
  const V big = hn::MulSub(hn::Set(d, 2.0f), SigmoidF(d, hn::Add(x, x)), hn::Set(d, 1.0f));
  return hn::IfThenElse(hn::Lt(hn::Abs(x), hn::Set(d, 0.3f)), OddSeries(d, x, kTaylor), big);
}

// erf: (2/√π)·x·(1 - x²/3 + x⁴/10 - ...) to x^13 below |x| = 0.5 (truncation < 1e-9
// relative), else Abramowitz–Stegun (absolute error < 1.5e-7, relative < 3e-7 there) on x
// clamped to ±10 (erf is ±1 in f32 long before; the clamp keeps inf out of its reciprocal).
template <class D, class V>
HWY_INLINE V ErfF(D d, V x) {
  constexpr float k = 1.1283791670955126f;  // 2/√π
  static constexpr float kTaylor[] = {k / 9360.0f, -k / 1320.0f, k / 216.0f, -k / 42.0f,
                                      k / 10.0f,   -k / 3.0f,    k};
  const V xc = hn::Min(hn::Max(x, hn::Set(d, -10.0f)), hn::Set(d, 10.0f));
  const V e =
      hn::IfThenElse(hn::Lt(hn::Abs(x), hn::Set(d, 0.5f)), OddSeries(d, x, kTaylor), Erf<5>(d, xc));
  return hn::IfThenElse(hn::IsNaN(x), x, e);  // the clamp drops NaN on x86
}

template <UnaryOp kOp, class D, class V>
HWY_INLINE V ApplyUnary(D d, V x, V alpha) {
  switch (kOp) {
    case UnaryOp::kScale:
      return hn::Mul(x, alpha);
    case UnaryOp::kNeg:
      return hn::Neg(x);
    case UnaryOp::kSqrt:
      return hn::Sqrt(x);
    case UnaryOp::kRsqrt:
      return hn::Div(hn::Set(d, 1.0f), hn::Sqrt(x));
    case UnaryOp::kReciprocal:
      return hn::Div(hn::Set(d, 1.0f), x);
    case UnaryOp::kExp:
      return ExpF(d, x);
    case UnaryOp::kTanh:
      return TanhF(d, x);
    case UnaryOp::kErf:
      return ErfF(d, x);
    case UnaryOp::kSigmoid:
      return SigmoidF(d, x);
    case UnaryOp::kAbs:
      return hn::Abs(x);
    case UnaryOp::kSquare:
      return hn::Mul(x, x);
    case UnaryOp::kIdentity:
      break;
  }
  return x;
}

template <class T, UnaryOp kOp, bool kStream>
void UnaryRows(const UnaryArgs& a, int64_t r0, int64_t r1) {
  const hn::ScalableTag<float> d;
  const int64_t L = static_cast<int64_t>(hn::Lanes(d));
  const int64_t C = a.y_rows.cols;
  const auto alpha = hn::Set(d, a.alpha);
  for (int64_t r = r0; r < r1; ++r) {
    const T* x = static_cast<const T*>(a.x) + a.x_rows.offset(r);
    T* y = static_cast<T*>(a.y) + a.y_rows.offset(r);
    int64_t i = 0;
    // Two independent vectors per step: the exp / divide chains are latency bound.
    for (; i + 2 * L <= C; i += 2 * L) {
      const auto v0 = ApplyUnary<kOp>(d, LoadF(d, x + i), alpha);
      const auto v1 = ApplyUnary<kOp>(d, LoadF(d, x + i + L), alpha);
      StoreOut<kStream>(d, v0, y + i);
      StoreOut<kStream>(d, v1, y + i + L);
    }
    for (; i < C; i += L) {
      const int64_t n = std::min(L, C - i);
      StoreN(d, ApplyUnary<kOp>(d, LoadN(d, x + i, n, 1.0f), alpha), y + i, n);
    }
  }
  if constexpr (kStream) hwy::FlushStream();
}

template <class T, bool kStream>
void UnaryTyped(const UnaryArgs& a, int64_t r0, int64_t r1) {
  switch (a.op) {
    case UnaryOp::kScale:
      return UnaryRows<T, UnaryOp::kScale, kStream>(a, r0, r1);
    case UnaryOp::kNeg:
      return UnaryRows<T, UnaryOp::kNeg, kStream>(a, r0, r1);
    case UnaryOp::kSqrt:
      return UnaryRows<T, UnaryOp::kSqrt, kStream>(a, r0, r1);
    case UnaryOp::kRsqrt:
      return UnaryRows<T, UnaryOp::kRsqrt, kStream>(a, r0, r1);
    case UnaryOp::kReciprocal:
      return UnaryRows<T, UnaryOp::kReciprocal, kStream>(a, r0, r1);
    case UnaryOp::kExp:
      return UnaryRows<T, UnaryOp::kExp, kStream>(a, r0, r1);
    case UnaryOp::kTanh:
      return UnaryRows<T, UnaryOp::kTanh, kStream>(a, r0, r1);
    case UnaryOp::kErf:
      return UnaryRows<T, UnaryOp::kErf, kStream>(a, r0, r1);
    case UnaryOp::kSigmoid:
      return UnaryRows<T, UnaryOp::kSigmoid, kStream>(a, r0, r1);
    case UnaryOp::kAbs:
      return UnaryRows<T, UnaryOp::kAbs, kStream>(a, r0, r1);
    case UnaryOp::kSquare:
      return UnaryRows<T, UnaryOp::kSquare, kStream>(a, r0, r1);
    case UnaryOp::kIdentity:
      return UnaryRows<T, UnaryOp::kIdentity, kStream>(a, r0, r1);
  }
}

void UnaryForward(const UnaryArgs& a) {
  ParallelRowsStreamed(a.dtype, a.threads, a.y, a.y_rows, a.y == a.x, 16384, a.ftz,
                       [&](auto tag, auto stream, int64_t r0, int64_t r1) {
                         UnaryTyped<decltype(tag), decltype(stream)::value>(a, r0, r1);
                       });
}

}  // namespace tboost::kernels::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace tboost::kernels {
HWY_EXPORT(BinaryForward);
HWY_EXPORT(UnaryForward);
void binary_forward(const BinaryArgs& a) { HWY_DYNAMIC_DISPATCH(BinaryForward)(a); }
void unary_forward(const UnaryArgs& a) { HWY_DYNAMIC_DISPATCH(UnaryForward)(a); }
}  // namespace tboost::kernels
#endif
