// Optimizer kernels for training: the global gradient norm (for clipping and for finding
// inf/NaN under loss scaling) and a fused AdamW step over f32 master weights.
//
// One pass per tensor: AdamW reads p, m, v, g and writes p, m, v (and optionally the bf16 copy
// the next forward computes with), the memory floor of the update. The sum of squares is taken
// in fixed 4096-element chunks with f64 partials added in chunk order, so the norm, and the
// clipping factor derived from it, has the same bits for any thread count.
// clang-format off: Highway's per-target re-inclusion needs this exact order.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "src/kernels/cpu/optimizer.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
// clang-format on

#include <algorithm>
#include <cmath>
#include <vector>

#include "hwy/highway.h"
#include "src/core/parallel.h"
#include "src/kernels/cpu/hwy_util-inl.h"
#include "src/kernels/cpu/kernels.h"

HWY_BEFORE_NAMESPACE();
namespace tboost::kernels::HWY_NAMESPACE {

constexpr int64_t kNormChunk = 4096;

double SumSquares(const float* g, int64_t n, int threads) {
  if (n <= 0) return 0.0;
  const hn::ScalableTag<float> d;
  const int64_t L = static_cast<int64_t>(hn::Lanes(d));
  const int64_t chunks = (n + kNormChunk - 1) / kNormChunk;
  std::vector<double> part(static_cast<size_t>(chunks));
  parallel_for(threads, chunks, 16, true, [&](int64_t c0, int64_t c1) {
    for (int64_t c = c0; c < c1; ++c) {
      const int64_t b = c * kNormChunk, e = std::min(n, b + kNormChunk);
      // f32 lanes over blocks of 128 squares (a few ulp of error at worst), added in f64.
      double sum = 0.0;
      for (int64_t bb = b; bb < e; bb += 128) {
        const int64_t be = std::min(e, bb + 128);
        auto acc = hn::Zero(d);
        for (int64_t i = bb; i < be; i += L) {
          const auto v = LoadN(d, g + i, std::min(L, be - i));
          acc = hn::MulAdd(v, v, acc);
        }
        sum += static_cast<double>(ReduceSumF(d, acc));
      }
      part[static_cast<size_t>(c)] = sum;
    }
  });
  double s = 0.0;
  for (double p : part) s += p;
  return s;
}

void AdamWStep(const AdamWArgs& a) {
  const hn::ScalableTag<float> d;
  const int64_t L = static_cast<int64_t>(hn::Lanes(d));
  // PyTorch's AdamW order: p *= 1 - lr * wd; m, v updated; p -= lr / bc1 * m / (sqrt(v) / sqrt(bc2)
  // + eps), with bc1 = 1 - beta1^t, bc2 = 1 - beta2^t.
  const double t = static_cast<double>(a.step);
  const double bc1 = 1.0 - std::pow(static_cast<double>(a.beta1), t);
  const double bc2 = 1.0 - std::pow(static_cast<double>(a.beta2), t);
  const auto decay = hn::Set(d, 1.0f - a.lr * a.weight_decay);
  const auto b1 = hn::Set(d, a.beta1), b2 = hn::Set(d, a.beta2);
  const auto nb1 = hn::Set(d, 1.0f - a.beta1), nb2 = hn::Set(d, 1.0f - a.beta2);
  const auto step = hn::Set(d, static_cast<float>(a.lr / bc1));
  const auto inv_sbc2 = hn::Set(d, static_cast<float>(1.0 / std::sqrt(bc2)));
  const auto eps = hn::Set(d, a.eps), gs = hn::Set(d, a.grad_scale);
  parallel_for(a.threads, (a.n + L - 1) / L, 2048, a.ftz, [&](int64_t v0, int64_t v1) {
    for (int64_t i = v0 * L; i < std::min(a.n, v1 * L); i += L) {
      const int64_t n = std::min(L, a.n - i);
      const auto g = hn::Mul(LoadN(d, a.g + i, n), gs);
      auto p = hn::Mul(LoadN(d, a.p + i, n), decay);
      const auto m = hn::MulAdd(b1, LoadN(d, a.m + i, n), hn::Mul(nb1, g));
      const auto v = hn::MulAdd(b2, LoadN(d, a.v + i, n), hn::Mul(hn::Mul(nb2, g), g));
      const auto denom = hn::MulAdd(hn::Sqrt(v), inv_sbc2, eps);
      p = hn::NegMulAdd(step, hn::Div(m, denom), p);
      StoreN(d, p, a.p + i, n);
      StoreN(d, m, a.m + i, n);
      StoreN(d, v, a.v + i, n);
      if (a.p16) StoreN(d, p, a.p16 + i, n);
    }
  });
}

}  // namespace tboost::kernels::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace tboost::kernels {
HWY_EXPORT(SumSquares);
HWY_EXPORT(AdamWStep);
double sum_squares(const float* g, int64_t n, int threads) {
  return HWY_DYNAMIC_DISPATCH(SumSquares)(g, n, threads);
}
void adamw_step(const AdamWArgs& a) {
  if (a.n > 0) HWY_DYNAMIC_DISPATCH(AdamWStep)(a);
}
}  // namespace tboost::kernels
#endif
