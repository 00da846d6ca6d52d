// Elementwise add / mul (with broadcasting) and scale on the CPU (Highway).
//
// The op flattens the output into rows of its last dim; each input row is located through
// its own RowView (broadcast dims have stride 0) and its last dim is either contiguous or a
// broadcast scalar (col stride 0). That covers bias rows, per-token scalars and full tensors
// with one inner loop.
// clang-format off: Highway's per-target re-inclusion needs this exact order.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "src/kernels/cpu/elementwise.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
// clang-format on

#include <algorithm>

#include "hwy/highway.h"
#include "src/core/parallel.h"
#include "src/kernels/cpu/hwy_util-inl.h"
#include "src/kernels/cpu/kernels.h"

HWY_BEFORE_NAMESPACE();
namespace tboost::kernels::HWY_NAMESPACE {

template <class T>
void BinaryRows(const BinaryArgs& a, int64_t r0, int64_t r1) {
  const hn::ScalableTag<float> d;
  const int64_t L = static_cast<int64_t>(hn::Lanes(d));
  const int64_t C = a.y_rows.cols;
  const bool add = a.op == BinaryOp::kAdd;
  if (C == 0) return;  // empty rows: nothing to read, not even the broadcast scalar
  for (int64_t r = r0; r < r1; ++r) {
    const T* pa = static_cast<const T*>(a.a) + a.a_rows.offset(r);
    const T* pb = static_cast<const T*>(a.b) + a.b_rows.offset(r);
    T* y = static_cast<T*>(a.y) + a.y_rows.offset(r);
    const bool sa = a.a_col_stride == 0, sb = a.b_col_stride == 0;
    const auto ca = hn::Set(d, to_f32(pa[0])), cb = hn::Set(d, to_f32(pb[0]));
    int64_t i = 0;
    for (; i + L <= C; i += L) {
      const auto va = sa ? ca : LoadF(d, pa + i);
      const auto vb = sb ? cb : LoadF(d, pb + i);
      StoreF(d, add ? hn::Add(va, vb) : hn::Mul(va, vb), y + i);
    }
    if (i < C) {
      const auto n = static_cast<size_t>(C - i);
      const auto va = sa ? ca : LoadTailF(d, pa + i, n);
      const auto vb = sb ? cb : LoadTailF(d, pb + i, n);
      StoreTailF(d, add ? hn::Add(va, vb) : hn::Mul(va, vb), y + i, n);
    }
  }
}

void BinaryForward(const BinaryArgs& a) {
  ParallelRowsTyped(
      a.dtype, a.threads, a.y_rows.count, a.y_rows.cols, 16384, a.ftz,
      [&](auto tag, int64_t r0, int64_t r1) { BinaryRows<decltype(tag)>(a, r0, r1); });
}

template <class T>
void ScaleRows(const ScaleArgs& a, int64_t r0, int64_t r1) {
  const hn::ScalableTag<float> d;
  const int64_t L = static_cast<int64_t>(hn::Lanes(d));
  const int64_t C = a.y_rows.cols;
  const auto s = hn::Set(d, a.alpha);
  for (int64_t r = r0; r < r1; ++r) {
    const T* x = static_cast<const T*>(a.x) + a.x_rows.offset(r);
    T* y = static_cast<T*>(a.y) + a.y_rows.offset(r);
    int64_t i = 0;
    for (; i + L <= C; i += L) StoreF(d, hn::Mul(LoadF(d, x + i), s), y + i);
    if (i < C) {
      const auto n = static_cast<size_t>(C - i);
      StoreTailF(d, hn::Mul(LoadTailF(d, x + i, n), s), y + i, n);
    }
  }
}

void ScaleForward(const ScaleArgs& a) {
  ParallelRowsTyped(a.dtype, a.threads, a.y_rows.count, a.y_rows.cols, 16384, a.ftz,
                    [&](auto tag, int64_t r0, int64_t r1) { ScaleRows<decltype(tag)>(a, r0, r1); });
}

}  // namespace tboost::kernels::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace tboost::kernels {
HWY_EXPORT(BinaryForward);
HWY_EXPORT(ScaleForward);
void binary_forward(const BinaryArgs& a) { HWY_DYNAMIC_DISPATCH(BinaryForward)(a); }
void scale_forward(const ScaleArgs& a) { HWY_DYNAMIC_DISPATCH(ScaleForward)(a); }
}  // namespace tboost::kernels
#endif
