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
// rounding store. Threads split N into contiguous ranges (deterministic: each output's sum
// order never depends on the thread count).
// clang-format off: Highway's per-target re-inclusion needs this exact order.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "src/kernels/cpu/gemv.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
// clang-format on

#include <algorithm>
#include <vector>

#include "hwy/highway.h"
#include "src/core/parallel.h"
#include "src/kernels/cpu/hwy_util-inl.h"
#include "src/kernels/cpu/kernels.h"

HWY_BEFORE_NAMESPACE();
namespace tboost::kernels::HWY_NAMESPACE {

// kM rows of x (f32, stride ldx) against kR weight rows; sums[m * 16 + r] += dots.
template <int kM, int kR, class TW>
HWY_INLINE void DotBlock(const float* x, int64_t ldx, const TW* w, int64_t ldw, int64_t K,
                         float* sums) {
  const hn::ScalableTag<float> d;
  const int64_t L = static_cast<int64_t>(hn::Lanes(d));
  using V = hn::Vec<decltype(d)>;
  V acc[kM][kR];
  for (int m = 0; m < kM; ++m)
    for (int r = 0; r < kR; ++r) acc[m][r] = hn::Zero(d);
  int64_t k = 0;
  for (; k + L <= K; k += L) {
    V wv[kR];
    for (int r = 0; r < kR; ++r) wv[r] = LoadF(d, w + r * ldw + k);
    for (int m = 0; m < kM; ++m) {
      const V xv = hn::LoadU(d, x + m * ldx + k);
      for (int r = 0; r < kR; ++r) acc[m][r] = hn::MulAdd(xv, wv[r], acc[m][r]);
    }
  }
  if (k < K) {
    const auto n = static_cast<size_t>(K - k);
    V wv[kR];
    for (int r = 0; r < kR; ++r) wv[r] = LoadTailF(d, w + r * ldw + k, n);
    for (int m = 0; m < kM; ++m) {
      const V xv = LoadTailF(d, x + m * ldx + k, n);
      for (int r = 0; r < kR; ++r) acc[m][r] = hn::MulAdd(xv, wv[r], acc[m][r]);
    }
  }
  for (int m = 0; m < kM; ++m)
    for (int r = 0; r < kR; ++r) sums[m * 16 + r] = ReduceSumF(d, acc[m][r]);
}

// Dots of kM rows of x with weight rows [n0, n0 + cnt), cnt <= 16, into sums[m * 16 + j].
// Independent FMA chains: kM * kR accumulators + kR weight vectors + 1 x vector stay in the
// 16 ymm registers of AVX2 (kM 1-2: 4 rows; kM 3-4: 2 rows).
template <int kM, class TW>
HWY_INLINE void DotRows(const float* x, int64_t ldx, const TW* w, int64_t ldw, int64_t K,
                        int64_t cnt, float* sums) {
  constexpr int kR = kM <= 2 ? 4 : 2;
  int64_t j = 0;
  for (; j + kR <= cnt; j += kR) {
    float s[kM * 16];
    DotBlock<kM, kR>(x, ldx, w + j * ldw, ldw, K, s);
    for (int m = 0; m < kM; ++m)
      for (int r = 0; r < kR; ++r) sums[m * 16 + j + r] = s[m * 16 + r];
  }
  for (; j < cnt; ++j) {
    float s[kM * 16];
    DotBlock<kM, 1>(x, ldx, w + j * ldw, ldw, K, s);
    for (int m = 0; m < kM; ++m) sums[m * 16 + j] = s[m * 16];
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

template <class TW, class TY, ops::ActivationType kAct, bool kHasAct>
void GemvTyped(const GemvArgs& a, const float* xf) {
  constexpr int64_t kBlock = 16;  // outputs gathered per epilogue call (2 AVX2 vectors)
  const int64_t blocks = (a.N + kBlock - 1) / kBlock;
  const TW* w = static_cast<const TW*>(a.w);
  // ~32 KiB of weights per thread at least: below that a fork/join costs more than the work.
  const int64_t min_blocks =
      std::max<int64_t>(1, (32 << 10) / std::max<int64_t>(1, kBlock * a.K * sizeof(TW)));
  parallel_for(a.threads, blocks, min_blocks, a.ftz, [&](int64_t b0, int64_t b1) {
    HWY_ALIGN float sums[4 * 16];
    for (int64_t b = b0; b < b1; ++b) {
      const int64_t n0 = b * kBlock;
      const int64_t cnt = std::min(kBlock, a.N - n0);
      const TW* wb = w + n0 * a.ldw;
      // x rows in groups of up to 4 (each group streams this weight block once more; the
      // block, 16 rows, is L1/L2 resident after the first group).
      for (int64_t m0 = 0; m0 < a.M; m0 += 4) {
        const int64_t mc = std::min<int64_t>(4, a.M - m0);
        const float* xm = xf + m0 * a.K;
        switch (mc) {
          case 1:
            DotRows<1>(xm, a.K, wb, a.ldw, a.K, cnt, sums);
            break;
          case 2:
            DotRows<2>(xm, a.K, wb, a.ldw, a.K, cnt, sums);
            break;
          case 3:
            DotRows<3>(xm, a.K, wb, a.ldw, a.K, cnt, sums);
            break;
          default:
            DotRows<4>(xm, a.K, wb, a.ldw, a.K, cnt, sums);
            break;
        }
        Epilogue<kAct, kHasAct, TY>(a, sums, m0, mc, n0, cnt);
      }
    }
  });
}

template <class TW, class TY>
void GemvAct(const GemvArgs& a, const float* xf) {
  using ops::ActivationType;
  if (!a.has_act) return GemvTyped<TW, TY, ActivationType::kRelu, false>(a, xf);
  switch (a.act) {
    case ActivationType::kRelu:
      return GemvTyped<TW, TY, ActivationType::kRelu, true>(a, xf);
    case ActivationType::kGeluErf:
      return GemvTyped<TW, TY, ActivationType::kGeluErf, true>(a, xf);
    case ActivationType::kGeluTanh:
      return GemvTyped<TW, TY, ActivationType::kGeluTanh, true>(a, xf);
    default:
      return GemvTyped<TW, TY, ActivationType::kSilu, true>(a, xf);
  }
}

template <class TW>
void GemvW(const GemvArgs& a, const float* xf) {
  switch (a.y_dtype) {
    case DType::kBF16:
      return GemvAct<TW, bf16_t>(a, xf);
    case DType::kF16:
      return GemvAct<TW, f16_t>(a, xf);
    default:
      return GemvAct<TW, float>(a, xf);
  }
}

void GemvForward(const GemvArgs& a) {
  if (a.M <= 0 || a.N <= 0) return;
  // x converted to contiguous f32 once (M * K floats: a few KiB to a few tens of KiB).
  thread_local std::vector<float> xbuf;
  xbuf.resize(static_cast<size_t>(a.M * a.K));
  for (int64_t m = 0; m < a.M; ++m) {
    const char* src =
        static_cast<const char*>(a.x) + static_cast<size_t>(m * a.ldx) * dtype_size(a.x_dtype);
    convert(xbuf.data() + m * a.K, DType::kF32, src, a.x_dtype, a.K);
  }
  switch (a.w_dtype) {
    case DType::kBF16:
      return GemvW<bf16_t>(a, xbuf.data());
    case DType::kF16:
      return GemvW<f16_t>(a, xbuf.data());
    default:
      return GemvW<float>(a, xbuf.data());
  }
}

}  // namespace tboost::kernels::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace tboost::kernels {
HWY_EXPORT(GemvForward);
void gemv_forward(const GemvArgs& a) { HWY_DYNAMIC_DISPATCH(GemvForward)(a); }
}  // namespace tboost::kernels
#endif
