// RmsNorm / LayerNorm forward on the CPU (Highway), with the residual add fused in.
//
// Per row: a first pass reads x (+ residual) from DRAM, writes the PRENORM sum and accumulates
// the statistics; the output pass re-reads the row from L1/L2 (a row of 16K f32 is 64 KiB) and
// writes y. So DRAM traffic is the floor: read x (+ residual), write y (+ sum). Statistics
// accumulate in f32. With PRENORM the output pass normalizes the stored sum (rounded to the
// storage type, as the next layer will see it), so `sum` may alias the residual (in place).
// clang-format off: Highway's per-target re-inclusion needs this exact order.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "src/kernels/cpu/norm.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
// clang-format on

#include <algorithm>
#include <cmath>
#include <new>
#include <optional>
#include <type_traits>
#include <vector>

#include "hwy/aligned_allocator.h"
#include "hwy/cache_control.h"
#include "hwy/highway.h"
#include "src/core/parallel.h"
#include "src/kernels/cpu/hwy_util-inl.h"
#include "src/kernels/cpu/kernels.h"
#include "tboost/core/error.h"

HWY_BEFORE_NAMESPACE();
namespace tboost::kernels::HWY_NAMESPACE {

// One row's pointers.
template <class T>
struct NormRow {
  const T* x;
  const T* res;
  T* sum;
  T* y;
};

template <class T>
HWY_INLINE NormRow<T> RowAt(const NormArgs& a, int64_t r) {
  return {static_cast<const T*>(a.x) + a.x_rows.offset(r),
          a.residual ? static_cast<const T*>(a.residual) + a.res_rows.offset(r) : nullptr,
          a.sum ? static_cast<T*>(a.sum) + a.sum_rows.offset(r) : nullptr,
          static_cast<T*>(a.y) + a.y_rows.offset(r)};
}

// x (+ residual) of one row at [i, i + n); tail lanes are zero.
template <bool kRes, class D, class T>
HWY_INLINE hn::Vec<D> RowVec(D d, const NormRow<T>& p, int64_t i, int64_t n) {
  auto v = LoadN(d, p.x + i, n);
  if constexpr (kRes) v = hn::Add(v, LoadN(d, p.res + i, n));
  return v;
}

// Running mean and sum of squared deviations per lane (Chan et al.'s pairwise update), so
// LayerNorm gets a numerically stable variance in the same single pass that reads the row:
// each step folds a chunk of two elements per lane (mean m_c, M2_c = (v0 - v1)^2 / 2) into
// the lane's running (mean, M2) over the 2k elements seen so far. No E[x^2] - mean^2
// cancellation, and no second pass that would leave DRAM idle.
// f[k] = 1 / (k + 1) = 2 / (n + 2) and g[k] = 2k / (k + 1) = n·2 / (n + 2) for n = 2k.
struct MomentTables {
  std::vector<float> f, g;
  explicit MomentTables(int64_t n) : f(static_cast<size_t>(n)), g(static_cast<size_t>(n)) {
    for (size_t k = 0; k < f.size(); ++k) {
      f[k] = static_cast<float>(1.0 / static_cast<double>(k + 1));
      g[k] = static_cast<float>(2.0 * static_cast<double>(k) / static_cast<double>(k + 1));
    }
  }
};

template <class D>
struct Moments {
  // M2 = within-chunk part + between-chunk part, kept in separate accumulators so the loop
  // carries two short dependency chains instead of one long one.
  hn::Vec<D> mean, m2, within;
  int64_t k = 0;  // chunks folded per lane
  explicit Moments(D d) : mean(hn::Zero(d)), m2(hn::Zero(d)), within(hn::Zero(d)) {}
  // f[k] = 1 / (k + 1) = 2 / (n + 2) and g[k] = 2k / (k + 1) = n·2 / (n + 2), from a table
  // so no divide sits in the loop's dependency chain.
  HWY_INLINE void add(D d, hn::Vec<D> v0, hn::Vec<D> v1, const float* f, const float* g) {
    const auto half = hn::Set(d, 0.5f);
    const auto mc = hn::Mul(hn::Add(v0, v1), half);
    const auto dv = hn::Sub(v0, v1);
    const auto delta = hn::Sub(mc, mean);
    mean = hn::MulAdd(delta, hn::Set(d, f[k]), mean);
    within = hn::MulAdd(dv, dv, within);  // x 0.5 at the end
    m2 = hn::MulAdd(hn::Mul(delta, delta), hn::Set(d, g[k]), m2);
    ++k;
  }
  // Merges the lanes and then `n_tail` single values (in f64), giving mean and variance.
  void finish(D d, const float* tail, int64_t n_tail, int64_t count, float* mean_out,
              float* var_out) const {
    HWY_ALIGN float mb[hn::MaxLanes(D())], qb[hn::MaxLanes(D())];
    hn::Store(mean, d, mb);
    hn::Store(hn::MulAdd(within, hn::Set(d, 0.5f), m2), d, qb);
    // Every lane holds the same count nl, so the merge needs no division per lane: the mean is
    // the lanes' average and M2 adds nl · (lane mean - mean)^2 per lane.
    double n = 0.0, mu = 0.0, q = 0.0;
    const double nl = 2.0 * static_cast<double>(k);
    const size_t lanes = hn::Lanes(d);
    if (k > 0) {
      for (size_t i = 0; i < lanes; ++i) mu += mb[i];
      mu /= static_cast<double>(lanes);
      for (size_t i = 0; i < lanes; ++i) {
        const double delta = mb[i] - mu;
        q += qb[i] + nl * delta * delta;
      }
      n = nl * static_cast<double>(lanes);
    }
    for (int64_t i = 0; i < n_tail; ++i) {
      n += 1.0;
      const double delta = tail[i] - mu;
      mu += delta / n;
      q += delta * (tail[i] - mu);
    }
    *mean_out = static_cast<float>(mu);
    *var_out = static_cast<float>(q / static_cast<double>(count));
  }
};

// The rows are software-pipelined: one loop reads row r+1 from DRAM (accumulating its
// statistics and writing its PRENORM sum) while it writes row r's output from the cached copy
// of row r. A plain two-pass row (stats, then output) alternates a pure read phase with a pure
// write phase and reached only ~0.6-0.7x the speed of a copy, which keeps both streams busy.
// kRms, kRes (a residual is added), kSum (the PRENORM sum is written) are template flags: at
// Zen 5's bandwidth (~80 GB/s for a copy on huge pages) the per-vector tests of these
// loop-invariant flags were a measurable part of the row loop.
template <class T, bool kRms, bool kRes, bool kSum, bool kStream>
void NormRowsImpl(const NormArgs& a, int64_t r0, int64_t r1) {
  static_assert(!kSum || kRes, "the PRENORM sum needs a residual");
  const hn::ScalableTag<float> d;
  using D = decltype(d);
  using V = hn::Vec<D>;
  const int64_t L = static_cast<int64_t>(hn::Lanes(d));
  const int64_t C = a.x_rows.cols;
  const int64_t C2 = C / (2 * L) * (2 * L);              // part done two vectors at a time
  const float* w = static_cast<const float*>(a.weight);  // widened by NormForward
  const float* b = static_cast<const float*>(a.bias);
  const V one = hn::Set(d, a.plus_one ? 1.0f : 0.0f);
  // The step factors depend only on the step index: one table for the process covers rows
  // up to 2·Lanes·kSteps columns (64K on AVX2); longer rows build their own once per call.
  // (Computing them per call was ~30% of a decode-sized LayerNorm row.)
  constexpr int64_t kSteps = 4096;
  static const MomentTables shared(kSteps);
  const int64_t steps = kRms ? 0 : C2 / (2 * L);
  std::optional<MomentTables> own;
  if (steps >= kSteps) own.emplace(steps + 1);
  const MomentTables& tab = own ? *own : shared;

  // First-pass state of one row: sum of squares (RmsNorm) or running moments (LayerNorm).
  struct Pass {
    V q0, q1;
    Moments<D> mom;
    HWY_ALIGN float tail[2 * hn::MaxLanes(D())];
    int64_t ntail = 0;
    explicit Pass(D dd) : q0(hn::Zero(dd)), q1(hn::Zero(dd)), mom(dd) {}
  };
  // Reads [j, j + 2L) of row p: writes its PRENORM sum, folds it into the statistics.
  auto absorb2 = [&](Pass& st, const NormRow<T>& p, int64_t j) TBOOST_INLINE_LAMBDA {
    const V v0 = RowVec<kRes>(d, p, j, L), v1 = RowVec<kRes>(d, p, j + L, L);
    if constexpr (kSum) {
      StoreF(d, v0, p.sum + j);
      StoreF(d, v1, p.sum + j + L);
    }
    if constexpr (kRms) {
      st.q0 = hn::MulAdd(v0, v0, st.q0);
      st.q1 = hn::MulAdd(v1, v1, st.q1);
    } else {
      st.mom.add(d, v0, v1, tab.f.data(), tab.g.data());
    }
  };
  auto absorb_tail = [&](Pass& st, const NormRow<T>& p, int64_t j, int64_t n) TBOOST_INLINE_LAMBDA {
    const V v = RowVec<kRes>(d, p, j, n);  // lanes past n are zero
    if constexpr (kSum) StoreN(d, v, p.sum + j, n);
    if constexpr (kRms) {
      st.q0 = hn::MulAdd(v, v, st.q0);
    } else {
      HWY_ALIGN float buf[hn::MaxLanes(D())];
      hn::Store(v, d, buf);
      for (int64_t i = 0; i < n; ++i) st.tail[st.ntail++] = buf[i];
    }
  };
  auto finish = [&](const Pass& st, int64_t r, float* mean, float* rstd) {
    float var;
    if constexpr (kRms) {
      *mean = 0.0f;
      var = ReduceSumF(d, hn::Add(st.q0, st.q1)) / static_cast<float>(C);
    } else {
      st.mom.finish(d, st.tail, st.ntail, C, mean, &var);
    }
    *rstd = 1.0f / std::sqrt(var + a.eps);
    if (a.mean) a.mean[a.stats_rows.offset(r)] = *mean;
    if (a.rstd) a.rstd[a.stats_rows.offset(r)] = *rstd;
  };
  // The output pass reads the PRENORM sum back when there is one: `sum` may be the residual
  // (or x) itself, updated in place, so x + residual is no longer there to re-read.
  auto output = [&](const NormRow<T>& p, V vm, V vr, int64_t j, int64_t n) TBOOST_INLINE_LAMBDA {
    V s;
    if constexpr (kSum)
      s = LoadN(d, static_cast<const T*>(p.sum) + j, n);
    else
      s = RowVec<kRes>(d, p, j, n);
    V v = hn::Mul(hn::Sub(s, vm), vr);
    v = hn::Mul(v, hn::Add(LoadN(d, w + j, n), one));
    if (b) v = hn::Add(v, LoadN(d, b + j, n));
    if (n == L)
      StoreOut<kStream>(d, v, p.y + j);
    else
      StoreN(d, v, p.y + j, n);
  };

  // Large inputs with contiguous rows are prefetched to L2 kPrefetchAheadBytes ahead. The
  // hardware prefetchers alone fell behind: on Zen 4 at 4096 f32 columns (rows re-read from
  // L2 in the output pass while the next row streams in) RmsNorm went from 0.65-0.72x to
  // 0.88-0.92x of a copy and LayerNorm from 0.50-0.53x to 0.82-0.85x in the fast memory mode;
  // in the slow mode 1.06-1.10x -> 1.13-1.35x and 0.85-0.88x -> 1.25-1.33x. At 256-1024
  // columns it changed RmsNorm within the noise and sped LayerNorm up 5-15%.
  constexpr int64_t kStepBytes = static_cast<int64_t>(2 * hn::MaxLanes(d) * sizeof(T));
  const int64_t row_bytes = C * static_cast<int64_t>(sizeof(T));
  const bool prefetch = a.x_rows.uniform_stride == C && (!kRes || a.res_rows.uniform_stride == C) &&
                        a.x_rows.count * row_bytes >= kStreamBytes;
  // Prologue: the first row's first pass alone.
  NormRow<T> cur = RowAt<T>(a, r0);
  Pass st(d);
  for (int64_t j = 0; j < C2; j += 2 * L) absorb2(st, cur, j);
  for (int64_t j = C2; j < C; j += L) absorb_tail(st, cur, j, std::min(L, C - j));
  for (int64_t r = r0; r < r1; ++r) {
    float mean, rstd;
    finish(st, r, &mean, &rstd);
    const V vm = hn::Set(d, mean), vr = hn::Set(d, rstd);
    if (r + 1 < r1) {
      // Row r+1 streams in from DRAM while row r's output streams out.
      const NormRow<T> next = RowAt<T>(a, r + 1);
      Pass nst(d);
      auto sweep = [&](auto prefetch) TBOOST_INLINE_LAMBDA {
        for (int64_t j = 0; j < C2; j += 2 * L) {
          if constexpr (decltype(prefetch)::value) {
            const char* px = reinterpret_cast<const char*>(next.x + j) + kPrefetchAheadBytes;
            PrefetchRangeL2(px, kStepBytes);
            if constexpr (kRes) {
              const char* pr = reinterpret_cast<const char*>(next.res + j) + kPrefetchAheadBytes;
              PrefetchRangeL2(pr, kStepBytes);
            }
          }
          absorb2(nst, next, j);
          output(cur, vm, vr, j, L);
          output(cur, vm, vr, j + L, L);
        }
      };
      if (prefetch)
        sweep(std::true_type{});
      else
        sweep(std::false_type{});
      for (int64_t j = C2; j < C; j += L) {
        const int64_t n = std::min(L, C - j);
        absorb_tail(nst, next, j, n);
        output(cur, vm, vr, j, n);
      }
      st = nst;
      cur = next;
    } else {
      for (int64_t j = 0; j < C; j += L) output(cur, vm, vr, j, std::min(L, C - j));
    }
  }
  if constexpr (kStream) hwy::FlushStream();
}

template <class T>
void NormRows(const NormArgs& a, bool stream, int64_t r0, int64_t r1) {
  const bool res = a.residual != nullptr, sum = a.sum != nullptr;  // sum implies res
  auto go = [&](auto rms) {
    WithStream(stream, [&](auto s) {
      constexpr bool kRms = decltype(rms)::value, kStream = decltype(s)::value;
      if (sum) return NormRowsImpl<T, kRms, true, true, kStream>(a, r0, r1);
      if (res) return NormRowsImpl<T, kRms, true, false, kStream>(a, r0, r1);
      return NormRowsImpl<T, kRms, false, false, kStream>(a, r0, r1);
    });
  };
  if (a.rms)
    go(std::true_type{});
  else
    go(std::false_type{});
}

template <class T>
void NormTyped(const NormArgs& a) {
  // A row of 4 KiB or more is worth one thread; smaller rows are batched.
  const int64_t min_rows = std::max<int64_t>(1, 4096 / std::max<int64_t>(1, a.x_rows.cols));
  // y is streamed out of place only: in place, row r's lines were just read, and a plain
  // store costs no read for ownership.
  const bool stream = a.y != a.x && a.y != a.residual && StreamOutput(a.dtype, a.y, a.y_rows);
  parallel_for(a.threads, a.x_rows.count, min_rows, a.ftz,
               [&](int64_t r0, int64_t r1) { NormRows<T>(a, stream, r0, r1); });
}

// n weights (or biases) of dtype dt as f32 (the library's vectorized convert), vector aligned.
hwy::AlignedFreeUniquePtr<float[]> WidenToF32(const void* v, DType dt, int64_t n) {
  auto out = hwy::AllocateAligned<float>(static_cast<size_t>(std::max<int64_t>(n, 1)));
  if (!out) throw std::bad_alloc();  // Highway's allocator returns null
  convert(out.get(), DType::kF32, v, dt, n);
  return out;
}

// The row kernel is instantiated per storage type only, not per (storage, weight) pair:
// bf16 or f16 weights and biases are widened to f32 once per call here (C values, against
// the rows' rows·C). That and the PRENORM sum always coming with a residual halved the
// instantiations (240 -> 108 over the three targets); norm.cc had taken 4 of the 6.5 minutes
// of a two-core release build and over 12 under the sanitizers.
void NormForward(const NormArgs& args) {
  if (args.sum && !args.residual)
    throw Error(ErrorCode::kInvalidArgument,
                "norm_forward: a sum output (PRENORM) needs a residual input; got a sum and "
                "no residual");
  NormArgs a = args;
  const int64_t C = a.x_rows.cols;
  hwy::AlignedFreeUniquePtr<float[]> wf, bf;
  if (a.wdtype != DType::kF32) {
    wf = WidenToF32(a.weight, a.wdtype, C);
    if (a.bias) bf = WidenToF32(a.bias, a.wdtype, C);
    a.weight = wf.get(), a.bias = bf.get(), a.wdtype = DType::kF32;
  }
  switch (a.dtype) {
    case DType::kF32:
      return NormTyped<float>(a);
    case DType::kBF16:
      return NormTyped<bf16_t>(a);
    default:
      return NormTyped<f16_t>(a);
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
