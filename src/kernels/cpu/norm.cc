// RmsNorm / LayerNorm forward on the CPU (Highway), with the residual add fused in.
//
// Per row: pass 1 reads x (+ residual) from DRAM, writes the PRENORM sum and accumulates the
// statistics; pass 2 re-reads the row, now in L1/L2 (a row of 16K f32 is 64 KiB), and writes
// y. So DRAM traffic is the floor: read x (+ residual), write y (+ sum). LayerNorm takes the
// variance as mean((x - mean)^2) in a second in-cache pass rather than E[x^2] - mean^2, which
// cancels catastrophically for rows with a large mean. Statistics accumulate in f32 over four
// vector accumulators (pairwise-like error growth); the sum is recomputed from x + residual
// in f32 in pass 2 rather than read back, so bf16 rounding of `sum` never feeds y.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "src/kernels/cpu/norm.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep

#include <algorithm>
#include <cmath>

#include "hwy/highway.h"
#include "src/core/parallel.h"
#include "src/kernels/cpu/hwy_util-inl.h"
#include "src/kernels/cpu/kernels.h"

HWY_BEFORE_NAMESPACE();
namespace tboost::kernels::HWY_NAMESPACE {

template <class D, class T>
HWY_INLINE hn::Vec<D> Load(D d, const T* p, int64_t n) {
  return n == static_cast<int64_t>(hn::Lanes(d)) ? LoadF(d, p)
                                                 : LoadTailF(d, p, static_cast<size_t>(n));
}
template <class D, class T>
HWY_INLINE void Store(D d, hn::Vec<D> v, T* p, int64_t n) {
  if (n == static_cast<int64_t>(hn::Lanes(d))) {
    StoreF(d, v, p);
  } else {
    StoreTailF(d, v, p, static_cast<size_t>(n));
  }
}

template <class T, class W>
void NormRows(const NormArgs& a, int64_t r0, int64_t r1) {
  const hn::ScalableTag<float> d;
  const int64_t L = static_cast<int64_t>(hn::Lanes(d));
  const int64_t C = a.cols;
  const W* w = static_cast<const W*>(a.weight);
  const W* b = static_cast<const W*>(a.bias);
  const auto one = hn::Set(d, a.plus_one ? 1.0f : 0.0f);
  for (int64_t r = r0; r < r1; ++r) {
    const T* x = static_cast<const T*>(a.x) + a.x_rows.offset(r);
    const T* res = a.residual ? static_cast<const T*>(a.residual) + a.res_rows.offset(r) : nullptr;
    T* sum = a.sum ? static_cast<T*>(a.sum) + a.sum_rows.offset(r) : nullptr;
    T* y = static_cast<T*>(a.y) + a.y_rows.offset(r);
    auto row = [&](int64_t i, int64_t n) {
      auto v = Load(d, x + i, n);
      if (res) v = hn::Add(v, Load(d, res + i, n));
      return v;
    };
    // Pass 1: sum (LayerNorm) or sum of squares (RmsNorm); also writes the PRENORM sum.
    auto acc0 = hn::Zero(d), acc1 = hn::Zero(d), acc2 = hn::Zero(d), acc3 = hn::Zero(d);
    int64_t i = 0;
    for (; i + 4 * L <= C; i += 4 * L) {
      const auto v0 = row(i, L), v1 = row(i + L, L), v2 = row(i + 2 * L, L),
                 v3 = row(i + 3 * L, L);
      if (sum) {
        StoreF(d, v0, sum + i);
        StoreF(d, v1, sum + i + L);
        StoreF(d, v2, sum + i + 2 * L);
        StoreF(d, v3, sum + i + 3 * L);
      }
      if (a.rms) {
        acc0 = hn::MulAdd(v0, v0, acc0);
        acc1 = hn::MulAdd(v1, v1, acc1);
        acc2 = hn::MulAdd(v2, v2, acc2);
        acc3 = hn::MulAdd(v3, v3, acc3);
      } else {
        acc0 = hn::Add(acc0, v0);
        acc1 = hn::Add(acc1, v1);
        acc2 = hn::Add(acc2, v2);
        acc3 = hn::Add(acc3, v3);
      }
    }
    for (; i < C; i += L) {
      const int64_t n = std::min(L, C - i);
      const auto v = row(i, n);  // tail lanes are zero
      if (sum) Store(d, v, sum + i, n);
      acc0 = a.rms ? hn::MulAdd(v, v, acc0) : hn::Add(acc0, v);
    }
    const float s1 = ReduceSumF(d, hn::Add(hn::Add(acc0, acc1), hn::Add(acc2, acc3)));
    float mean = 0.0f, var;
    if (a.rms) {
      var = s1 / static_cast<float>(C);
    } else {
      mean = s1 / static_cast<float>(C);
      const auto vm = hn::Set(d, mean);
      auto q = hn::Zero(d);
      for (int64_t j = 0; j < C; j += L) {
        const int64_t n = std::min(L, C - j);
        auto dv = hn::Sub(row(j, n), vm);
        if (n < L) dv = hn::IfThenElseZero(hn::FirstN(d, static_cast<size_t>(n)), dv);
        q = hn::MulAdd(dv, dv, q);
      }
      var = ReduceSumF(d, q) / static_cast<float>(C);
    }
    const float rstd = 1.0f / std::sqrt(var + a.eps);
    if (a.mean) a.mean[a.stats_rows.offset(r)] = mean;
    if (a.rstd) a.rstd[a.stats_rows.offset(r)] = rstd;
    // Pass 2: y = (s - mean) * rstd * (w [+1]) [+ b], from the cached row. Meanwhile the
    // next row is prefetched, so DRAM stays busy while this row's output is computed (without
    // it, the read stream idles during the in-cache passes: ~0.6x copy speed for LayerNorm).
    const auto vr = hn::Set(d, rstd);
    const auto vm = hn::Set(d, mean);
    if (r + 1 < r1) {
      const char* nx = reinterpret_cast<const char*>(static_cast<const T*>(a.x) + a.x_rows.offset(r + 1));
      const char* nres = res ? reinterpret_cast<const char*>(static_cast<const T*>(a.residual) +
                                                             a.res_rows.offset(r + 1))
                             : nullptr;
      const int64_t bytes = C * static_cast<int64_t>(sizeof(T));
      for (int64_t off = 0; off < bytes; off += 64) {
        __builtin_prefetch(nx + off);
        if (nres) __builtin_prefetch(nres + off);
      }
    }
    for (int64_t j = 0; j < C; j += L) {
      const int64_t n = std::min(L, C - j);
      auto v = hn::Mul(hn::Sub(row(j, n), vm), vr);
      v = hn::Mul(v, hn::Add(Load(d, w + j, n), one));
      if (b) v = hn::Add(v, Load(d, b + j, n));
      Store(d, v, y + j, n);
    }
  }
}

template <class T, class W>
void NormTyped(const NormArgs& a) {
  // A row of 4 KiB or more is worth one thread; smaller rows are batched.
  const int64_t min_rows = std::max<int64_t>(1, 4096 / std::max<int64_t>(1, a.cols));
  parallel_for(a.threads, a.rows, min_rows, a.ftz,
               [&](int64_t r0, int64_t r1) { NormRows<T, W>(a, r0, r1); });
}

void NormForward(const NormArgs& a) {
  const bool wf = a.wdtype == DType::kF32;
  switch (a.dtype) {
    case DType::kF32: return NormTyped<float, float>(a);
    case DType::kBF16: return wf ? NormTyped<bf16_t, float>(a) : NormTyped<bf16_t, bf16_t>(a);
    default: return wf ? NormTyped<f16_t, float>(a) : NormTyped<f16_t, f16_t>(a);
  }
}

}  // namespace tboost::kernels::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace tboost::kernels {
HWY_EXPORT(NormForward);
void norm_forward(const NormArgs& a) { HWY_DYNAMIC_DISPATCH(NormForward)(a); }
}  // namespace tboost::kernels
#endif
