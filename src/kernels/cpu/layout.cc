// strided_copy: y = x between two views of one shape with any strides (Transpose, Concat, and
// the staging copies of MatMul), on the CPU. Plain C++: this is data movement, the compiler's
// memcpy and the cache behaviour matter, not vector arithmetic.
//
// After flattening (kernels::coalesce_dims), three loops:
//  - rows: the innermost dim is contiguous in both views: one memcpy (or one vectorized
//    `convert` when the dtypes differ) per row;
//  - strided rows: x's smallest stride is on the innermost dim anyway (a gather): an element
//    loop per row;
//  - tiles: a real transpose (x is contiguous, or densest, along another dim p than y's
//    innermost q): (p, q) is cut into 32 x 32 tiles, each read along p into an L1 buffer
//    (8 KiB at most) and written from it along q, so both sides stream whole cache lines.
// Work is split over rows or tiles; each element is written once, by one thread.
#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "src/core/parallel.h"
#include "src/kernels/cpu/kernels.h"
#include "tboost/core/error.h"

namespace tboost::kernels {
namespace {

constexpr int64_t kTile = 32;

// Element conversion: bit copies for one dtype, through f32 between float dtypes.
template <class TY, class TX>
inline TY cast_elem(TX v) {
  if constexpr (std::is_same_v<TY, TX>)
    return v;
  else
    return from_f32<TY>(to_f32(v));
}

// Calls fn(TY{}, TX{}) with the storage types of the two dtypes: same-size unsigned integers
// when they are equal (a copy needs no arithmetic), float types otherwise.
template <class Fn>
void with_types(DType ty, DType tx, const Fn& fn) {
  if (ty == tx) {
    switch (dtype_size(tx)) {
      case 1:
        return fn(uint8_t{}, uint8_t{});
      case 2:
        return fn(uint16_t{}, uint16_t{});
      case 4:
        return fn(uint32_t{}, uint32_t{});
      default:
        return fn(uint64_t{}, uint64_t{});
    }
  }
  auto with_x = [&](auto y) {
    switch (tx) {
      case DType::kF32:
        return fn(y, float{});
      case DType::kBF16:
        return fn(y, bf16_t{});
      case DType::kF16:
        return fn(y, f16_t{});
      default:
        TBOOST_THROW(ErrorCode::kInternal, "strided_copy: no conversion from ", dtype_name(tx),
                     " to ", dtype_name(ty));
    }
  };
  switch (ty) {
    case DType::kF32:
      return with_x(float{});
    case DType::kBF16:
      return with_x(bf16_t{});
    case DType::kF16:
      return with_x(f16_t{});
    default:
      TBOOST_THROW(ErrorCode::kInternal, "strided_copy: no conversion from ", dtype_name(tx),
                   " to ", dtype_name(ty));
  }
}

int64_t offset_of(int64_t i, int n, const int64_t* dims, const int64_t* strides) {
  int64_t off = 0;
  for (int d = n - 1; d >= 0; --d) {
    off += (i % dims[d]) * strides[d];
    i /= dims[d];
  }
  return off;
}

// Rows over dims [0, n-1), the innermost dim n-1 walked by `row(y, x)`.
template <class Row>
void for_rows(const CopyArgs& a, int n, const Row& row) {
  int64_t rows = 1;
  for (int d = 0; d + 1 < n; ++d) rows *= a.dims[d];
  const int64_t cols = a.dims[n - 1];
  const int64_t ey = static_cast<int64_t>(dtype_size(a.y_dtype));
  const int64_t ex = static_cast<int64_t>(dtype_size(a.x_dtype));
  // ~32K elements per thread before a fork pays for itself.
  parallel_for(
      a.threads, rows, std::max<int64_t>(1, 32768 / std::max<int64_t>(1, cols)), false,
      [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; ++r)
          row(static_cast<char*>(a.y) + offset_of(r, n - 1, a.dims, a.y_strides) * ey,
              static_cast<const char*>(a.x) + offset_of(r, n - 1, a.dims, a.x_strides) * ex);
      });
}

void copy_rows(const CopyArgs& a, int n) {
  const int64_t cols = a.dims[n - 1];
  if (a.x_strides[n - 1] == 1 && a.y_strides[n - 1] == 1) {
    const size_t bytes = static_cast<size_t>(cols) * dtype_size(a.x_dtype);
    if (a.x_dtype == a.y_dtype)
      for_rows(a, n, [&](char* y, const char* x) { std::memcpy(y, x, bytes); });
    else
      for_rows(a, n, [&](char* y, const char* x) { convert(y, a.y_dtype, x, a.x_dtype, cols); });
    return;
  }
  const int64_t sy = a.y_strides[n - 1], sx = a.x_strides[n - 1];
  with_types(a.y_dtype, a.x_dtype, [&](auto ty, auto tx) {
    using TY = decltype(ty);
    using TX = decltype(tx);
    for_rows(a, n, [&](char* yb, const char* xb) {
      TY* y = reinterpret_cast<TY*>(yb);
      const TX* x = reinterpret_cast<const TX*>(xb);
      for (int64_t i = 0; i < cols; ++i) y[i * sy] = cast_elem<TY>(x[i * sx]);
    });
  });
}

// One tile: x's elements read along p into a contiguous buffer, then written along q. Going
// through the buffer matters at power-of-two strides: rows 2^k bytes apart share an L1 set, so
// a direct tile walk that keeps 32 such rows open in x or y thrashes 8-way L1 (2 GB/s at
// 4096 x 4096 f32). kUnit: x is contiguous along p and y along q (the usual transpose), and
// kFull: a whole tile; with both the compiler sees constant strides and trip counts and emits
// vector moves (with a runtime count, GCC turns the row copy into a `rep movs`, slower than
// the loads it replaces).
template <bool kUnit, bool kFull, class TY, class TX>
void copy_tile(TY* y, int64_t yp, int64_t yq, const TX* x, int64_t xp, int64_t xq, int64_t np,
               int64_t nq) {
  TX buf[kTile][kTile];
  if constexpr (kUnit) xp = yq = 1;
  if constexpr (kFull) np = nq = kTile;
  for (int64_t j = 0; j < nq; ++j)
    for (int64_t i = 0; i < np; ++i) buf[j][i] = x[i * xp + j * xq];
  for (int64_t i = 0; i < np; ++i)
    for (int64_t j = 0; j < nq; ++j) y[i * yp + j * yq] = cast_elem<TY>(buf[j][i]);
}

// Tiles of dims p (x's densest) and q = n-1 (y's innermost); the other dims index the tiles.
void copy_tiles(const CopyArgs& a, int n, int p) {
  const int q = n - 1;
  int64_t odims[8], oys[8], oxs[8];
  int on = 0;
  for (int d = 0; d < n; ++d)
    if (d != p && d != q) {
      odims[on] = a.dims[d], oys[on] = a.y_strides[d], oxs[on] = a.x_strides[d];
      ++on;
    }
  int64_t outer = 1;
  for (int d = 0; d < on; ++d) outer *= odims[d];
  const int64_t np = a.dims[p], nq = a.dims[q];
  const int64_t tp = (np + kTile - 1) / kTile, tq = (nq + kTile - 1) / kTile;
  const int64_t yp = a.y_strides[p], yq = a.y_strides[q], xp = a.x_strides[p], xq = a.x_strides[q];
  const bool unit = xp == 1 && yq == 1;
  with_types(a.y_dtype, a.x_dtype, [&](auto ty, auto tx) {
    using TY = decltype(ty);
    using TX = decltype(tx);
    parallel_for(a.threads, outer * tp * tq, std::max<int64_t>(1, 32768 / (kTile * kTile)), false,
                 [&](int64_t t0, int64_t t1) {
                   for (int64_t t = t0; t < t1; ++t) {
                     const int64_t o = t / (tp * tq);
                     const int64_t p0 = (t / tq % tp) * kTile, q0 = t % tq * kTile;
                     TY* y =
                         static_cast<TY*>(a.y) + offset_of(o, on, odims, oys) + p0 * yp + q0 * yq;
                     const TX* x = static_cast<const TX*>(a.x) + offset_of(o, on, odims, oxs) +
                                   p0 * xp + q0 * xq;
                     const int64_t mp = std::min(kTile, np - p0), mq = std::min(kTile, nq - q0);
                     const bool full = mp == kTile && mq == kTile;
                     if (unit && full)
                       copy_tile<true, true>(y, yp, yq, x, xp, xq, mp, mq);
                     else if (unit)
                       copy_tile<true, false>(y, yp, yq, x, xp, xq, mp, mq);
                     else
                       copy_tile<false, false>(y, yp, yq, x, xp, xq, mp, mq);
                   }
                 });
  });
}

}  // namespace

void strided_copy(const CopyArgs& in) {
  CopyArgs a = in;
  for (int d = 0; d < a.ndim; ++d)
    if (a.dims[d] == 0) return;
  int64_t* strides[2] = {a.y_strides, a.x_strides};
  const int n = coalesce_dims(a.ndim, a.dims, strides, 2);
  if (n == 0) {  // one element
    a.dims[0] = 1, a.y_strides[0] = a.x_strides[0] = 1;
    return copy_rows(a, 1);
  }
  // x's densest dim other than y's innermost; a tile walk pays off only if it beats q's stride.
  int p = -1;
  for (int d = 0; d + 1 < n; ++d)
    if (p < 0 || std::abs(a.x_strides[d]) < std::abs(a.x_strides[p])) p = d;
  if (p < 0 || std::abs(a.x_strides[n - 1]) <= std::abs(a.x_strides[p])) return copy_rows(a, n);
  copy_tiles(a, n, p);
}

}  // namespace tboost::kernels
