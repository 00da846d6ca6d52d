// Public CPU kernels as free functions, for code that calls kernels directly (training loops,
// engines with their own scheduling). Contiguous row-major data; outputs first, then inputs,
// then sizes and params; shapes in the trailing comment. These do not validate beyond what
// the signature implies: the Operation interface is the checked path.
#pragma once

#include <cstdint>

#include "tboost/core/dtype.h"

namespace tboost::kernels::cpu {

// y = x / rms(x) * w; rstd (rows) may be null.        x, y: (rows, cols)  w: (cols)
void rms_norm_forward(float* y, float* rstd, const float* x, const float* w, float eps,
                      int64_t rows, int64_t cols, int threads = 0);
void rms_norm_forward(bf16_t* y, float* rstd, const bf16_t* x, const bf16_t* w, float eps,
                      int64_t rows, int64_t cols, int threads = 0);
// PRENORM: sum = x + residual; y = sum / rms(sum) * w.   (rows, cols)
void rms_norm_prenorm_forward(float* y, float* sum, float* rstd, const float* x,
                              const float* residual, const float* w, float eps, int64_t rows,
                              int64_t cols, int threads = 0);
// y = (x - mean) / std(x) * w + b; b, mean and rstd may be null.   (rows, cols)
void layer_norm_forward(float* y, float* mean, float* rstd, const float* x, const float* w,
                        const float* b, float eps, int64_t rows, int64_t cols, int threads = 0);

}  // namespace tboost::kernels::cpu
