// Measured machine limits: streaming bandwidth with normal stores and the f32 FMA peak.
//
// The FMA loop keeps 12 independent accumulator chains per thread: with 4-cycle FMA latency
// and two FMA pipes, 8 chains already saturate; 12 leave margin for the loop overhead. Each
// chain starts from its own value: chains that start equal compute equal values, and the
// compiler merges them into one (one latency-bound chain, counted as 12, overstated the peak
// 1.5x on Zen 5 and 3x on Zen 4). The bf16 peak is measured the same way with vdpbf16ps where
// the CPU has AVX512_BF16 (two products per f32 lane per instruction).
// clang-format off: Highway's per-target re-inclusion needs this exact order.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "bench/limits.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
// clang-format on

#include "hwy/cache_control.h"
#include "hwy/highway.h"
#include "src/kernels/cpu/hwy_util-inl.h"
#include "tboost/core/cpu_features.h"
#if HWY_ARCH_X86
#include <immintrin.h>
#endif

HWY_BEFORE_NAMESPACE();
namespace tboost::bench::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Returns flops done; the result feeds `sink` so nothing is optimized away.
double FmaLoop(int64_t iters, float* sink) {
  const hn::ScalableTag<float> d;
  auto a0 = hn::Set(d, 1.0f), a1 = hn::Set(d, 1.01f), a2 = hn::Set(d, 1.02f),
       a3 = hn::Set(d, 1.03f), a4 = hn::Set(d, 1.04f), a5 = hn::Set(d, 1.05f),
       a6 = hn::Set(d, 1.06f), a7 = hn::Set(d, 1.07f), a8 = hn::Set(d, 1.08f),
       a9 = hn::Set(d, 1.09f), a10 = hn::Set(d, 1.10f), a11 = hn::Set(d, 1.11f);
  const auto m = hn::Set(d, 0.999999f), c = hn::Set(d, 1e-7f);
  for (int64_t i = 0; i < iters; ++i) {
    a0 = hn::MulAdd(a0, m, c), a1 = hn::MulAdd(a1, m, c), a2 = hn::MulAdd(a2, m, c);
    a3 = hn::MulAdd(a3, m, c), a4 = hn::MulAdd(a4, m, c), a5 = hn::MulAdd(a5, m, c);
    a6 = hn::MulAdd(a6, m, c), a7 = hn::MulAdd(a7, m, c), a8 = hn::MulAdd(a8, m, c);
    a9 = hn::MulAdd(a9, m, c), a10 = hn::MulAdd(a10, m, c), a11 = hn::MulAdd(a11, m, c);
  }
  const auto s = hn::Add(hn::Add(hn::Add(a0, a1), hn::Add(a2, a3)),
                         hn::Add(hn::Add(hn::Add(a4, a5), hn::Add(a6, a7)),
                                 hn::Add(hn::Add(a8, a9), hn::Add(a10, a11))));
  *sink += hn::GetLane(s);
  return 2.0 * 12.0 * static_cast<double>(hn::Lanes(d)) * static_cast<double>(iters);
}

#if HWY_TARGET == HWY_AVX3
// vdpbf16ps: each f32 lane accumulates two bf16 products. 0 when the CPU lacks AVX512_BF16.
__attribute__((target("avx512f,avx512bf16"))) double Bf16DotLoopImpl(int64_t iters, float* sink) {
  __m512 acc[12];
  for (int k = 0; k < 12; ++k) acc[k] = _mm512_set1_ps(1.0f + 0.01f * static_cast<float>(k));
  const __m512bh m = (__m512bh)_mm512_set1_epi16(0x3f80);  // bf16 1.0
  const __m512bh c = (__m512bh)_mm512_set1_epi16(0x3380);  // bf16 ~6e-8
  for (int64_t i = 0; i < iters; ++i) {
    for (int k = 0; k < 12; ++k) acc[k] = _mm512_dpbf16_ps(acc[k], m, c);
  }
  __m512 s = acc[0];
  for (int k = 1; k < 12; ++k) s = _mm512_add_ps(s, acc[k]);
  *sink += _mm512_reduce_add_ps(s);
  return 2.0 * 2.0 * 12.0 * 16.0 * static_cast<double>(iters);
}
double Bf16DotLoop(int64_t iters, float* sink) {
  return cpu_features().avx512_bf16 ? Bf16DotLoopImpl(iters, sink) : 0.0;
}
#else
double Bf16DotLoop(int64_t, float*) { return 0.0; }
#endif

void Stream(float* const* outs, int writes, const float* const* ins, int reads, int64_t b,
            int64_t e) {
  const hn::ScalableTag<float> d;
  const int64_t L = static_cast<int64_t>(hn::Lanes(d));
  for (int64_t i = b; i + L <= e; i += L) {
    auto v = hn::LoadU(d, ins[0] + i);
    for (int k = 1; k < reads; ++k) v = hn::Add(v, hn::LoadU(d, ins[k] + i));
    for (int k = 0; k < writes; ++k) hn::StoreU(v, d, outs[k] + i);
  }
}

// A copy with non-temporal stores (out and in 64-byte aligned, [b, e) whole vectors): no read
// for ownership of the destination.
void CopyNonTemporal(float* out, const float* in, int64_t b, int64_t e) {
  const hn::ScalableTag<float> d;
  const int64_t L = static_cast<int64_t>(hn::Lanes(d));
  for (int64_t i = b; i + L <= e; i += L) hn::Stream(hn::Load(d, in + i), d, out + i);
  hwy::FlushStream();
}

// Sums floats [b, e) with four independent chains (a pure read stream); the result goes to
// *sink so the loads cannot be optimized away.
void ReadSum(const float* in, int64_t b, int64_t e, float* sink) {
  const hn::ScalableTag<float> d;
  const int64_t L = static_cast<int64_t>(hn::Lanes(d));
  auto s0 = hn::Zero(d), s1 = s0, s2 = s0, s3 = s0;
  int64_t i = b;
  for (; i + 4 * L <= e; i += 4 * L) {
    s0 = hn::Add(s0, hn::LoadU(d, in + i));
    s1 = hn::Add(s1, hn::LoadU(d, in + i + L));
    s2 = hn::Add(s2, hn::LoadU(d, in + i + 2 * L));
    s3 = hn::Add(s3, hn::LoadU(d, in + i + 3 * L));
  }
  *sink += hn::GetLane(hn::SumOfLanes(d, hn::Add(hn::Add(s0, s1), hn::Add(s2, s3))));
}

// The floor's read: [b, e) as two halves read side by side (two streams from one thread), each
// asking for its line 512 bytes ahead; the halves are whole multiples of 2 vectors, the rest
// read by ReadSum. On an Intel Xeon with AMX (2 cores, 256 MiB, best of ~20) plain ReadSum
// read at 30.1-30.6 GB/s, one stream asking 1 KiB ahead at 36.0-36.4, two streams 512 bytes
// ahead at 38.7-41.4, four at 38.5-38.6, two or four 2 KiB ahead at 35.1-38.2, 4 KiB ahead at
// 31.8-34.1, eight streams at 31.5-32.4 (bench/RESULTS.md, "Intel AMX, eighteenth session").
// Our GEMVs had run at up to 1.14x of the plain read: a floor a kernel can beat is no floor.
void ReadSumStreams(const float* in, int64_t b, int64_t e, float* sink) {
  constexpr int kS = 2;
  constexpr int64_t kAhead = 512;
  const hn::ScalableTag<float> d;
  const int64_t L = static_cast<int64_t>(hn::Lanes(d));
  const int64_t part = (e - b) / kS / (2 * L) * (2 * L);
  using V = hn::Vec<decltype(d)>;
  V acc[kS][2];
  for (int s = 0; s < kS; ++s) acc[s][0] = acc[s][1] = hn::Zero(d);
  for (int64_t i = 0; i < part; i += 2 * L) {
    for (int s = 0; s < kS; ++s) {
      const float* p = in + b + s * part;
      kernels::HWY_NAMESPACE::StreamAheadAt(p, i, kAhead);
      kernels::HWY_NAMESPACE::StreamAheadAt(p, i + L, kAhead);
      acc[s][0] = hn::Add(acc[s][0], hn::LoadU(d, p + i));
      acc[s][1] = hn::Add(acc[s][1], hn::LoadU(d, p + i + L));
    }
  }
  V t = hn::Zero(d);
  for (int s = 0; s < kS; ++s) t = hn::Add(t, hn::Add(acc[s][0], acc[s][1]));
  *sink += hn::GetLane(hn::SumOfLanes(d, t));
  ReadSum(in, b + kS * part, e, sink);
}

}  // namespace tboost::bench::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include <omp.h>

#include <cstring>
#include <vector>

#include "bench/bench.h"
#include "src/kernels/cpu/amx.h"
#include "tboost/core/cpu_features.h"
#include "tboost/core/tensor.h"

namespace tboost::bench {
HWY_EXPORT(FmaLoop);
HWY_EXPORT(Bf16DotLoop);
HWY_EXPORT(Stream);
HWY_EXPORT(ReadSumStreams);
HWY_EXPORT(CopyNonTemporal);

void stream_kernel(float* const* outs, int writes, const float* const* ins, int reads, int64_t n,
                   int threads) {
#pragma omp parallel num_threads(threads)
  {
    const int64_t t = omp_get_thread_num(), nt = omp_get_num_threads();
    // Split on 64-element boundaries so every thread's range is a vector multiple.
    const int64_t blocks = n / 64;
    HWY_DYNAMIC_DISPATCH(Stream)
    (outs, writes, ins, reads, blocks * t / nt * 64, blocks * (t + 1) / nt * 64);
  }
}

void read_kernel(const void* in, int64_t bytes, int threads) {
  const int64_t n = bytes / 4;
  const float* f = static_cast<const float*>(in);
#pragma omp parallel num_threads(threads)
  {
    const int64_t t = omp_get_thread_num(), nt = omp_get_num_threads();
    float sum = 0.0f;
    HWY_DYNAMIC_DISPATCH(ReadSumStreams)
    (f, n * t / nt / 64 * 64, t + 1 == nt ? n : n * (t + 1) / nt / 64 * 64, &sum);
    volatile float keep = sum;  // the loads feed a store the compiler must do
    (void)keep;
  }
}

void read_tensors(const std::vector<Tensor>& ts, int threads) {
  for (const Tensor& t : ts) read_kernel(t.data(), static_cast<int64_t>(t.nbytes()), threads);
}

// FLOPs of iters/2048 AMX products C (32 x 32) += A (32 x 256) · B on this thread's tiles, all in
// L1 (A and B 16 KiB each): the tile unit's rate with its operand loads, as the attention
// kernels run it.
double AmxLoop(int64_t iters, float* sink) {
  constexpr int64_t K = 256;
  struct alignas(64) Tiles {
    uint16_t a[32 * K];
    uint32_t b[K / 2 * 32];
    float c[32 * 32];
  };
  static thread_local Tiles t = [] {
    Tiles x{};
    std::fill(std::begin(x.a), std::end(x.a), uint16_t{0x3c00});  // bf16 2^-7
    std::fill(std::begin(x.b), std::end(x.b), 0x3c003c00u);
    return x;
  }();
  const int64_t calls = std::max<int64_t>(1, iters / 2048);
  kernels::amx_begin();
  for (int64_t i = 0; i < calls; ++i)
    kernels::amx_gemm(t.a, K * 2, 2, t.b, 32 * 4, 2, K, t.c, 32, i > 0);
  kernels::amx_end();
  sink[0] += t.c[0];
  return 2.0 * 32 * 32 * K * static_cast<double>(calls);
}

Limits measure_limits(int threads, bool quick) {
  Limits l;
  l.threads = threads;
  const int64_t n = (quick ? 64ll : 256ll) << 20 >> 2;  // floats per buffer
  auto a = aligned_buffer(static_cast<size_t>(n) * 4),
       b = aligned_buffer(static_cast<size_t>(n) * 4);
  uint32_t seed = 12345u;
  fill_random(static_cast<float*>(a.get()), n, &seed);  // never merged pages (see fill_random)
  std::memset(b.get(), 0, static_cast<size_t>(n) * 4);
  float* out = static_cast<float*>(b.get());
  const float* in = static_cast<const float*>(a.get());
  // Limits are ceilings: the best run counts (the fastest of ~20), not the median.
  const Timing tc = time_fn([&] { stream_kernel(&out, 1, &in, 1, n, threads); }, 0.8, 30);
  l.copy_gbps = 2.0 * 4.0 * static_cast<double>(n) / tc.min / 1e9;
  const Timing tn = time_fn(
      [&] {
#pragma omp parallel num_threads(threads)
        {
          const int64_t t = omp_get_thread_num(), nt = omp_get_num_threads(), blocks = n / 64;
          HWY_DYNAMIC_DISPATCH(CopyNonTemporal)
          (out, in, blocks * t / nt * 64, blocks * (t + 1) / nt * 64);
        }
      },
      0.8, 30);
  l.copy_nt_gbps = 2.0 * 4.0 * static_cast<double>(n) / tn.min / 1e9;
  const Timing tr = time_fn([&] { read_kernel(in, n * 4, threads); }, 0.8, 30);
  l.read_gbps = 4.0 * static_cast<double>(n) / tr.min / 1e9;

  std::vector<float> sink(static_cast<size_t>(threads) * 16, 0.0f);
  const int64_t iters = quick ? 2'000'000 : 10'000'000;
  // GFLOP/s of `loop` (it returns the flops it did) run on every thread at once; the fastest
  // of ~10 runs counts.
  auto peak = [&](auto loop) {
    double flops = 0;
    const Timing t = time_fn(
        [&] {
          double total = 0;
#pragma omp parallel num_threads(threads) reduction(+ : total)
          total += loop(iters, &sink[static_cast<size_t>(omp_get_thread_num()) * 16]);
          flops = total;
        },
        0.3, 10);
    return flops / t.min / 1e9;
  };
  l.fma_gflops = peak([](int64_t it, float* sk) { return HWY_DYNAMIC_DISPATCH(FmaLoop)(it, sk); });
  // Without AVX512_BF16, bf16 is widened to f32 and computed at the f32 rate.
  l.bf16_gflops = l.fma_gflops;
  if (cpu_features().avx512_bf16) {
    const double bf16 =
        peak([](int64_t it, float* sk) { return HWY_DYNAMIC_DISPATCH(Bf16DotLoop)(it, sk); });
    if (bf16 > 0) l.bf16_gflops = bf16;
  }
  if (kernels::amx_bf16_usable()) l.amx_bf16_gflops = peak(AmxLoop);
  return l;
}

}  // namespace tboost::bench
#endif
