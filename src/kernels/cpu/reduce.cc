// Reduce (sum, mean, max, min over any set of dims, any strides) on the CPU (Highway).
//
// The kept and the reduced dims are each flattened first (kernels::coalesce_dims), then one of
// three loops runs, chosen by where x is contiguous:
//  - rows: the innermost reduced dim has stride 1 (ReduceMean over the hidden dim, a sum over
//    the last axis): each output walks its contiguous runs with four vector accumulators;
//  - columns: the innermost kept dim has stride 1 (a sum over the batch or the tokens): a tile
//    of up to 512 neighbouring outputs is accumulated in L1 while walking the reduced dims;
//  - otherwise a scalar walk with strides.
// Every path accumulates in f32 and splits the work over outputs only (never one output's sum
// over threads), so the result does not depend on the thread count. max/min propagate NaN.
// clang-format off: Highway's per-target re-inclusion needs this exact order.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "src/kernels/cpu/reduce.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
// clang-format on

#include <algorithm>
#include <cmath>
#include <limits>

#include "hwy/highway.h"
#include "src/core/parallel.h"
#include "src/kernels/cpu/hwy_util-inl.h"
#include "src/kernels/cpu/kernels.h"

HWY_BEFORE_NAMESPACE();
namespace tboost::kernels::HWY_NAMESPACE {

// Offset of flat index i (row-major over dims[0..n)) under `strides`.
HWY_INLINE int64_t OffsetOf(int64_t i, int n, const int64_t* dims, const int64_t* strides) {
  int64_t off = 0;
  for (int d = n - 1; d >= 0; --d) {
    off += (i % dims[d]) * strides[d];
    i /= dims[d];
  }
  return off;
}

// Row-major walk over n dims that keeps the running offset (no division per step).
struct Odometer {
  int n = 0;
  const int64_t* dims = nullptr;
  const int64_t* strides = nullptr;
  int64_t idx[8] = {};
  int64_t off = 0;
  void next() {
    for (int d = n - 1; d >= 0; --d) {
      off += strides[d];
      if (++idx[d] < dims[d]) return;
      off -= strides[d] * dims[d];
      idx[d] = 0;
    }
  }
};

// One reduction step in vector lanes: acc = acc + x (sum, mean) or max/min(acc, x); for
// max/min `nan` collects the lanes that saw a NaN (x86 max/min would drop it).
template <ReduceOp kOp>
struct Step {
  static constexpr bool kSum = kOp == ReduceOp::kSum || kOp == ReduceOp::kMean;
  static float identity() {
    constexpr float inf = std::numeric_limits<float>::infinity();
    return kSum ? 0.0f : kOp == ReduceOp::kMax ? -inf : inf;
  }
  template <class D, class V>
  static HWY_INLINE V add(D d, V acc, V x, V& nan) {
    if constexpr (kSum) return hn::Add(acc, x);
    nan = hn::Or(nan, hn::VecFromMask(d, hn::IsNaN(x)));
    return kOp == ReduceOp::kMax ? hn::Max(acc, x) : hn::Min(acc, x);
  }
  // Per lane: the final value (mean divides by the count), NaN where one was seen.
  template <class D, class V>
  static HWY_INLINE V lanes(D d, V acc, V nan, int64_t count) {
    if constexpr (kSum)
      return kOp == ReduceOp::kMean ? hn::Div(acc, hn::Set(d, static_cast<float>(count))) : acc;
    return hn::IfThenElse(hn::MaskFromVec(nan), hn::Set(d, std::numeric_limits<float>::quiet_NaN()),
                          acc);
  }
  template <class D, class V>
  static HWY_INLINE float total(D d, V acc, V nan, int64_t count) {
    if constexpr (kSum) {
      const float s = ReduceSumF(d, acc);
      return kOp == ReduceOp::kMean ? s / static_cast<float>(count) : s;
    }
    if (!hn::AllFalse(d, hn::MaskFromVec(nan))) return std::numeric_limits<float>::quiet_NaN();
    return kOp == ReduceOp::kMax ? ReduceMaxF(d, acc) : hn::GetLane(hn::MinOfLanes(d, acc));
  }
};

// Rows: outputs [o0, o1); each reduces red_dims with the innermost contiguous.
template <class T, ReduceOp kOp>
void ReduceRows(const ReduceArgs& a, int64_t o0, int64_t o1) {
  using S = Step<kOp>;
  const hn::ScalableTag<float> d;
  using V = hn::Vec<decltype(d)>;
  const int64_t L = static_cast<int64_t>(hn::Lanes(d));
  const int64_t run = a.red_dims[a.red - 1];
  int64_t runs = 1;
  for (int i = 0; i + 1 < a.red; ++i) runs *= a.red_dims[i];
  const float fill = S::identity();
  for (int64_t o = o0; o < o1; ++o) {
    const T* x = static_cast<const T*>(a.x) + OffsetOf(o, a.kept, a.kept_dims, a.x_kept_strides);
    // Four independent accumulators: the add latency, not the loads, would bound one.
    V s0 = hn::Set(d, fill), s1 = s0, s2 = s0, s3 = s0;
    V n0 = hn::Zero(d), n1 = n0, n2 = n0, n3 = n0;
    Odometer walk{a.red - 1, a.red_dims, a.x_red_strides};
    for (int64_t j = 0; j < runs; ++j, walk.next()) {
      const T* p = x + walk.off;
      int64_t i = 0;
      for (; i + 4 * L <= run; i += 4 * L) {
        s0 = S::add(d, s0, LoadF(d, p + i), n0);
        s1 = S::add(d, s1, LoadF(d, p + i + L), n1);
        s2 = S::add(d, s2, LoadF(d, p + i + 2 * L), n2);
        s3 = S::add(d, s3, LoadF(d, p + i + 3 * L), n3);
      }
      for (; i + L <= run; i += L) s0 = S::add(d, s0, LoadF(d, p + i), n0);
      if (i < run) s1 = S::add(d, s1, LoadTailF(d, p + i, static_cast<size_t>(run - i), fill), n1);
    }
    s0 = S::add(d, S::add(d, s0, s1, n0), S::add(d, s2, s3, n2), n0);
    T* y = static_cast<T*>(a.y) + OffsetOf(o, a.kept, a.kept_dims, a.y_kept_strides);
    *y = from_f32<T>(S::total(d, s0, hn::Or(hn::Or(n0, n1), hn::Or(n2, n3)), runs * run));
  }
}

// Outputs per column tile: their f32 partial results (and NaN flags) stay in L1 (2 x 2 KiB)
// while the reduced rows of x stream through, each read as 2 KiB of contiguous memory.
constexpr int64_t kColumnTile = 512;

// Columns: items [t0, t1) are tiles of up to kColumnTile neighbouring outputs along the
// innermost kept dim (stride 1 in x); each tile walks all reduced dims in order.
template <class T, ReduceOp kOp>
void ReduceColumns(const ReduceArgs& a, int64_t tiles_per_row, int64_t t0, int64_t t1) {
  using S = Step<kOp>;
  const hn::ScalableTag<float> d;
  const int64_t L = static_cast<int64_t>(hn::Lanes(d));
  const int64_t inner = a.kept_dims[a.kept - 1];
  const int64_t ys = a.y_kept_strides[a.kept - 1];
  int64_t count = 1;
  for (int i = 0; i < a.red; ++i) count *= a.red_dims[i];
  const float fill = S::identity();
  HWY_ALIGN float acc[kColumnTile];
  HWY_ALIGN float nan[kColumnTile];
  for (int64_t t = t0; t < t1; ++t) {
    const int64_t row = t / tiles_per_row, c0 = (t % tiles_per_row) * kColumnTile;
    const int64_t width = std::min(kColumnTile, inner - c0);
    const T* x =
        static_cast<const T*>(a.x) + OffsetOf(row, a.kept - 1, a.kept_dims, a.x_kept_strides) + c0;
    for (int64_t k = 0; k < width; k += L) {
      hn::Store(hn::Set(d, fill), d, acc + k);
      hn::Store(hn::Zero(d), d, nan + k);
    }
    Odometer walk{a.red, a.red_dims, a.x_red_strides};
    for (int64_t j = 0; j < count; ++j, walk.next()) {
      const T* p = x + walk.off;
      for (int64_t k = 0; k < width; k += L) {
        auto nv = hn::Load(d, nan + k);
        const auto v = LoadN(d, p + k, std::min(L, width - k), fill);
        hn::Store(S::add(d, hn::Load(d, acc + k), v, nv), d, acc + k);
        if constexpr (!S::kSum) hn::Store(nv, d, nan + k);
      }
    }
    for (int64_t k = 0; k < width; k += L)
      hn::Store(S::lanes(d, hn::Load(d, acc + k), hn::Load(d, nan + k), count), d, acc + k);
    T* y =
        static_cast<T*>(a.y) + OffsetOf(row, a.kept - 1, a.kept_dims, a.y_kept_strides) + c0 * ys;
    for (int64_t i = 0; i < width; ++i) y[i * ys] = from_f32<T>(acc[i]);
  }
}

// Anything else: one output at a time, one scalar accumulator, strided loads.
template <class T, ReduceOp kOp>
void ReduceStrided(const ReduceArgs& a, int64_t o0, int64_t o1) {
  constexpr bool kSum = kOp == ReduceOp::kSum || kOp == ReduceOp::kMean;
  int64_t count = 1;
  for (int i = 0; i < a.red; ++i) count *= a.red_dims[i];
  const float init = Step<kOp>::identity();
  for (int64_t o = o0; o < o1; ++o) {
    const T* x = static_cast<const T*>(a.x) + OffsetOf(o, a.kept, a.kept_dims, a.x_kept_strides);
    float acc = init;
    bool nan = false;
    Odometer walk{a.red, a.red_dims, a.x_red_strides};
    for (int64_t j = 0; j < count; ++j, walk.next()) {
      const float v = to_f32(x[walk.off]);
      if constexpr (kSum) {
        acc += v;
      } else {
        nan |= std::isnan(v);
        acc = kOp == ReduceOp::kMax ? std::max(acc, v) : std::min(acc, v);
      }
    }
    if (kOp == ReduceOp::kMean) acc /= static_cast<float>(count);
    if (nan) acc = std::numeric_limits<float>::quiet_NaN();
    T* y = static_cast<T*>(a.y) + OffsetOf(o, a.kept, a.kept_dims, a.y_kept_strides);
    *y = from_f32<T>(acc);
  }
}

template <ReduceOp kOp>
void ReduceTyped(const ReduceArgs& a, int64_t n_out, int64_t n_red) {
  const bool rows = a.red > 0 && a.x_red_strides[a.red - 1] == 1;
  const bool columns = !rows && a.kept > 0 && a.x_kept_strides[a.kept - 1] == 1;
  if (columns) {
    const int64_t W = std::min(kColumnTile, a.kept_dims[a.kept - 1]);
    const int64_t per_row = (a.kept_dims[a.kept - 1] + kColumnTile - 1) / kColumnTile;
    const int64_t tiles = n_out / a.kept_dims[a.kept - 1] * per_row;
    ParallelRowsTyped(a.dtype, a.threads, tiles, W * n_red, 32768, a.ftz,
                      [&](auto tag, int64_t t0, int64_t t1) {
                        ReduceColumns<decltype(tag), kOp>(a, per_row, t0, t1);
                      });
    return;
  }
  ParallelRowsTyped(a.dtype, a.threads, n_out, n_red, 32768, a.ftz,
                    [&](auto tag, int64_t o0, int64_t o1) {
                      if (rows)
                        ReduceRows<decltype(tag), kOp>(a, o0, o1);
                      else
                        ReduceStrided<decltype(tag), kOp>(a, o0, o1);
                    });
}

void ReduceForward(const ReduceArgs& in) {
  ReduceArgs a = in;
  int64_t* kept_strides[2] = {a.x_kept_strides, a.y_kept_strides};
  int64_t* red_strides[1] = {a.x_red_strides};
  int64_t n_out = 1, n_red = 1;
  for (int i = 0; i < a.kept; ++i) n_out *= a.kept_dims[i];
  for (int i = 0; i < a.red; ++i) n_red *= a.red_dims[i];
  if (n_out == 0) return;
  a.kept = coalesce_dims(a.kept, a.kept_dims, kept_strides, 2);
  a.red = coalesce_dims(a.red, a.red_dims, red_strides, 1);
  if (n_red == 0) {  // empty reduction: 0 for sum, NaN for mean (the op rejects max/min)
    const float v = a.op == ReduceOp::kSum ? 0.0f : std::numeric_limits<float>::quiet_NaN();
    const size_t es = dtype_size(a.dtype);
    for (int64_t o = 0; o < n_out; ++o)
      convert(static_cast<char*>(a.y) +
                  OffsetOf(o, a.kept, a.kept_dims, a.y_kept_strides) * static_cast<int64_t>(es),
              a.dtype, &v, DType::kF32, 1);
    return;
  }
  switch (a.op) {
    case ReduceOp::kSum:
      return ReduceTyped<ReduceOp::kSum>(a, n_out, n_red);
    case ReduceOp::kMean:
      return ReduceTyped<ReduceOp::kMean>(a, n_out, n_red);
    case ReduceOp::kMax:
      return ReduceTyped<ReduceOp::kMax>(a, n_out, n_red);
    case ReduceOp::kMin:
      return ReduceTyped<ReduceOp::kMin>(a, n_out, n_red);
  }
}

}  // namespace tboost::kernels::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace tboost::kernels {
HWY_EXPORT(ReduceForward);
void reduce_forward(const ReduceArgs& a) { HWY_DYNAMIC_DISPATCH(ReduceForward)(a); }
}  // namespace tboost::kernels
#endif
