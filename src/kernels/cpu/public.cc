// The public free-function kernels (include/tboost/kernels/cpu.h): thin wrappers that fill
// the internal argument structs for contiguous data.
#include "src/kernels/cpu/kernels.h"
#include "tboost/core/context.h"
#include "tboost/kernels/cpu.h"

namespace tboost::kernels::cpu {
namespace {
int threads_or_all(int t) { return t > 0 ? t : available_cores(); }

template <class T, class W>
void norm(T* y, T* sum, float* mean, float* rstd, const T* x, const T* res, const W* w, const W* b,
          float eps, int64_t rows, int64_t cols, bool rms, int threads) {
  NormArgs a;
  const RowView rv = RowView::contiguous(rows, cols);
  a.y = y, a.y_rows = rv, a.sum = sum, a.sum_rows = rv, a.x = x, a.x_rows = rv;
  a.residual = res, a.res_rows = rv, a.weight = w, a.bias = b, a.mean = mean, a.rstd = rstd;
  a.stats_rows = RowView::contiguous(rows, 1);
  a.dtype = dtype_of<T>::value;
  a.wdtype = dtype_of<W>::value;
  a.eps = eps, a.rms = rms, a.threads = threads_or_all(threads);
  norm_forward(a);
}
}  // namespace

void rms_norm_forward(float* y, float* rstd, const float* x, const float* w, float eps,
                      int64_t rows, int64_t cols, int threads) {
  norm<float, float>(y, nullptr, nullptr, rstd, x, nullptr, w, nullptr, eps, rows, cols, true,
                     threads);
}
void rms_norm_forward(bf16_t* y, float* rstd, const bf16_t* x, const bf16_t* w, float eps,
                      int64_t rows, int64_t cols, int threads) {
  norm<bf16_t, bf16_t>(y, nullptr, nullptr, rstd, x, nullptr, w, nullptr, eps, rows, cols, true,
                       threads);
}
void rms_norm_prenorm_forward(float* y, float* sum, float* rstd, const float* x,
                              const float* residual, const float* w, float eps, int64_t rows,
                              int64_t cols, int threads) {
  norm<float, float>(y, sum, nullptr, rstd, x, residual, w, nullptr, eps, rows, cols, true,
                     threads);
}
void layer_norm_forward(float* y, float* mean, float* rstd, const float* x, const float* w,
                        const float* b, float eps, int64_t rows, int64_t cols, int threads) {
  norm<float, float>(y, nullptr, mean, rstd, x, nullptr, w, b, eps, rows, cols, false, threads);
}

}  // namespace tboost::kernels::cpu
