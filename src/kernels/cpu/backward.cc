// Backward kernels of the row-wise ops, for training: RmsNorm / LayerNorm (PRENORM's sum
// gradient added in), activations (plain and gated), embedding, column sums (bias gradients).
//
// Input gradients (dx) are written; parameter gradients (dw, db, the embedding table's)
// accumulate with += in f32, so micro-batches add up without a separate pass. Math in f32
// whatever the storage type. Reductions over rows (dw, db) go through fixed chunks of kChunk
// rows: each chunk sums its rows in order into its own partial row, then the partials are added
// in chunk order. The chunking does not depend on the thread count, so neither do the bits of
// the result (DESIGN.md: our own reductions are thread-count independent). The embedding
// gradient splits the table's rows among threads, each adding its tokens in token order.
// clang-format off: Highway's per-target re-inclusion needs this exact order.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "src/kernels/cpu/backward.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
// clang-format on

#include <algorithm>
#include <cstring>
#include <vector>

#include "hwy/highway.h"
#include "src/core/parallel.h"
#include "src/kernels/cpu/hwy_util-inl.h"
#include "src/kernels/cpu/kernels.h"

HWY_BEFORE_NAMESPACE();
namespace tboost::kernels::HWY_NAMESPACE {

constexpr int64_t kChunk = 32;  // rows per partial sum of dw / db

// out (C) += the chunk partials p (chunks, C) added in chunk order; columns split among
// threads.
void AddChunks(float* out, const float* p, int64_t chunks, int64_t C, int threads, bool ftz) {
  const hn::ScalableTag<float> d;
  const int64_t L = static_cast<int64_t>(hn::Lanes(d));
  parallel_for(threads, (C + L - 1) / L, 64, ftz, [&](int64_t v0, int64_t v1) {
    for (int64_t i = v0 * L; i < std::min(C, v1 * L); i += L) {
      const int64_t n = std::min(L, C - i);
      auto acc = hn::Zero(d);
      for (int64_t c = 0; c < chunks; ++c) acc = hn::Add(acc, LoadN(d, p + c * C + i, n));
      StoreN(d, hn::Add(LoadN(d, out + i, n), acc), out + i, n);
    }
  });
}

template <class T>
void ColumnSumTyped(float* out, const T* x, int64_t rows, int64_t C, int threads, bool ftz) {
  const hn::ScalableTag<float> d;
  const int64_t L = static_cast<int64_t>(hn::Lanes(d));
  const int64_t chunks = (rows + kChunk - 1) / kChunk;
  std::vector<float> part(static_cast<size_t>(chunks * C));
  parallel_for(threads, chunks, 1, ftz, [&](int64_t c0, int64_t c1) {
    for (int64_t c = c0; c < c1; ++c) {
      float* pc = part.data() + c * C;
      for (int64_t i = 0; i < C; i += L) {
        const int64_t n = std::min(L, C - i);
        auto acc = hn::Zero(d);
        for (int64_t r = c * kChunk; r < std::min(rows, (c + 1) * kChunk); ++r)
          acc = hn::Add(acc, LoadN(d, x + r * C + i, n));
        StoreN(d, acc, pc + i, n);
      }
    }
  });
  AddChunks(out, part.data(), chunks, C, threads, ftz);
}

void ColumnSumAccumulate(float* out, const void* x, DType dtype, int64_t rows, int64_t cols,
                         int threads, bool ftz) {
  if (rows <= 0 || cols <= 0) return;
  switch (dtype) {
    case DType::kBF16:
      return ColumnSumTyped(out, static_cast<const bf16_t*>(x), rows, cols, threads, ftz);
    case DType::kF16:
      return ColumnSumTyped(out, static_cast<const f16_t*>(x), rows, cols, threads, ftz);
    default:
      return ColumnSumTyped(out, static_cast<const float*>(x), rows, cols, threads, ftz);
  }
}

// ---- norms -------------------------------------------------------------------------------

template <class T, class W>
void NormBackwardTyped(const NormBackwardArgs& a) {
  const hn::ScalableTag<float> d;
  const int64_t L = static_cast<int64_t>(hn::Lanes(d));
  const int64_t rows = a.rows, C = a.cols;
  const int64_t chunks = (rows + kChunk - 1) / kChunk;
  const bool want_w = a.dw != nullptr, want_b = a.db != nullptr && !a.rms;
  // Partial rows: [chunk][C] for dw, then for db.
  std::vector<float> part(
      static_cast<size_t>((want_w ? chunks * C : 0) + (want_b ? chunks * C : 0)));
  float* pw = part.data();
  float* pb = part.data() + (want_w ? chunks * C : 0);
  const W* w = static_cast<const W*>(a.weight);
  const auto one = hn::Set(d, a.plus_one ? 1.0f : 0.0f);
  const auto inv_c = hn::Set(d, 1.0f / static_cast<float>(C));
  parallel_for(a.threads, chunks, 1, a.ftz, [&](int64_t c0, int64_t c1) {
    for (int64_t c = c0; c < c1; ++c) {
      float* cw = want_w ? pw + c * C : nullptr;
      float* cb = want_b ? pb + c * C : nullptr;
      if (cw) std::fill(cw, cw + C, 0.0f);
      if (cb) std::fill(cb, cb + C, 0.0f);
      for (int64_t r = c * kChunk; r < std::min(rows, (c + 1) * kChunk); ++r) {
        const T* x = static_cast<const T*>(a.x) + r * C;
        const T* dy = static_cast<const T*>(a.dy) + r * C;
        const T* ds = a.dsum ? static_cast<const T*>(a.dsum) + r * C : nullptr;
        T* dx = static_cast<T*>(a.dx) + r * C;
        const auto rs = hn::Set(d, a.rstd[r]);
        const auto mu = hn::Set(d, a.rms ? 0.0f : a.mean[r]);
        // Pass 1: sum(g) and sum(g * xhat), g = dy * w; the chunk's dw / db partials.
        auto s1 = hn::Zero(d), s2 = hn::Zero(d);
        for (int64_t i = 0; i < C; i += L) {
          const int64_t n = std::min(L, C - i);
          const auto xh = hn::Mul(hn::Sub(LoadN(d, x + i, n), mu), rs);
          const auto g = LoadN(d, dy + i, n);
          const auto gw = hn::Mul(g, hn::Add(LoadN(d, w + i, n), one));
          s1 = hn::Add(s1, gw);
          s2 = hn::MulAdd(gw, xh, s2);
          if (cw) StoreN(d, hn::MulAdd(g, xh, LoadN(d, cw + i, n)), cw + i, n);
          if (cb) StoreN(d, hn::Add(g, LoadN(d, cb + i, n)), cb + i, n);
        }
        const auto m1 = a.rms ? hn::Zero(d) : hn::Mul(hn::Set(d, ReduceSumF(d, s1)), inv_c);
        const auto m2 = hn::Mul(hn::Set(d, ReduceSumF(d, s2)), inv_c);
        // Pass 2 (the row is in L1/L2): dx = rstd * (g - mean(g) - xhat * mean(g * xhat)).
        for (int64_t i = 0; i < C; i += L) {
          const int64_t n = std::min(L, C - i);
          const auto xh = hn::Mul(hn::Sub(LoadN(d, x + i, n), mu), rs);
          const auto gw = hn::Mul(LoadN(d, dy + i, n), hn::Add(LoadN(d, w + i, n), one));
          auto v = hn::Mul(rs, hn::NegMulAdd(xh, m2, hn::Sub(gw, m1)));
          if (ds) v = hn::Add(v, LoadN(d, ds + i, n));
          StoreN(d, v, dx + i, n);
        }
      }
    }
  });
  if (want_w) AddChunks(a.dw, pw, chunks, C, a.threads, a.ftz);
  if (want_b) AddChunks(a.db, pb, chunks, C, a.threads, a.ftz);
}

template <class T>
void NormBackwardW(const NormBackwardArgs& a) {
  switch (a.wdtype) {
    case DType::kBF16:
      return NormBackwardTyped<T, bf16_t>(a);
    case DType::kF16:
      return NormBackwardTyped<T, f16_t>(a);
    default:
      return NormBackwardTyped<T, float>(a);
  }
}

void NormBackward(const NormBackwardArgs& a) {
  if (a.rows <= 0 || a.cols <= 0) return;
  switch (a.dtype) {
    case DType::kBF16:
      return NormBackwardW<bf16_t>(a);
    case DType::kF16:
      return NormBackwardW<f16_t>(a);
    default:
      return NormBackwardW<float>(a);
  }
}

// ---- activations ---------------------------------------------------------------------------

// act(x) and act'(x) of one vector.
template <ops::ActivationType kAct, class D, class V>
HWY_INLINE void ActAndGrad(D d, V x, V& act, V& grad) {
  using ops::ActivationType;
  const auto half = hn::Set(d, 0.5f), onev = hn::Set(d, 1.0f);
  if constexpr (kAct == ActivationType::kRelu) {
    const auto pos = hn::Gt(x, hn::Zero(d));
    act = hn::IfThenElseZero(pos, x);
    grad = hn::IfThenElseZero(pos, onev);
  } else if constexpr (kAct == ActivationType::kSilu) {
    const auto s = Sigmoid(d, x);
    act = hn::Mul(x, s);
    grad = hn::Mul(s, hn::MulAdd(x, hn::Sub(onev, s), onev));  // s (1 + x (1 - s))
  } else if constexpr (kAct == ActivationType::kGeluErf) {
    // 0.5 x (1 + erf(x / sqrt 2)); derivative 0.5 (1 + erf) + x exp(-x^2 / 2) / sqrt(2 pi).
    const auto cdf = hn::Mul(half, hn::Add(onev, Erf(d, hn::Mul(x, hn::Set(d, 0.70710678f)))));
    const auto pdf =
        hn::Mul(hn::Set(d, 0.39894228f), FastExp(d, hn::Mul(hn::Set(d, -0.5f), hn::Mul(x, x))));
    act = hn::Mul(x, cdf);
    grad = hn::MulAdd(x, pdf, cdf);
  } else {
    // 0.5 x (1 + tanh(u)), u = k (x + 0.044715 x^3); tanh(u) = 2 sigmoid(2u) - 1.
    const auto k = hn::Set(d, 0.7978845608f), c = hn::Set(d, 0.044715f);
    const auto x2 = hn::Mul(x, x);
    const auto u = hn::Mul(k, hn::MulAdd(hn::Mul(c, x2), x, x));
    const auto t = hn::MulSub(hn::Set(d, 2.0f), Sigmoid(d, hn::Add(u, u)), onev);
    const auto du = hn::Mul(k, hn::MulAdd(hn::Set(d, 3.0f * 0.044715f), x2, onev));
    act = hn::Mul(hn::Mul(half, x), hn::Add(onev, t));
    // 0.5 (1 + t) + 0.5 x (1 - t^2) du
    grad = hn::MulAdd(hn::Mul(hn::Mul(half, x), hn::NegMulAdd(t, t, onev)), du,
                      hn::Mul(half, hn::Add(onev, t)));
  }
}

template <ops::ActivationType kAct, class T>
void ActivationBackwardTyped(const ActivationBackwardArgs& a) {
  const hn::ScalableTag<float> d;
  const int64_t L = static_cast<int64_t>(hn::Lanes(d));
  const int64_t F = a.cols;
  const bool gated = ops::is_gated(a.type);
  const int64_t xcols = gated ? 2 * F : F;
  parallel_for(a.threads, a.rows, std::max<int64_t>(1, 8192 / std::max<int64_t>(1, F)), a.ftz,
               [&](int64_t r0, int64_t r1) {
                 for (int64_t r = r0; r < r1; ++r) {
                   const T* x = static_cast<const T*>(a.x) + r * xcols;
                   const T* dy = static_cast<const T*>(a.dy) + r * F;
                   T* dx = static_cast<T*>(a.dx) + r * xcols;
                   const T* g = gated && !a.gate_first ? x + F : x;
                   const T* u = gated ? (a.gate_first ? x + F : x) : nullptr;
                   T* dg = gated && !a.gate_first ? dx + F : dx;
                   T* du = gated ? (a.gate_first ? dx + F : dx) : nullptr;
                   for (int64_t i = 0; i < F; i += L) {
                     const int64_t n = std::min(L, F - i);
                     hn::Vec<decltype(d)> act, grad;
                     ActAndGrad<kAct>(d, LoadN(d, g + i, n), act, grad);
                     const auto gy = LoadN(d, dy + i, n);
                     if (u) {
                       // y = act(g) * u: dg = dy * u * act'(g), du = dy * act(g).
                       const auto uv = LoadN(d, u + i, n);
                       StoreN(d, hn::Mul(hn::Mul(gy, uv), grad), dg + i, n);
                       StoreN(d, hn::Mul(gy, act), du + i, n);
                     } else {
                       StoreN(d, hn::Mul(gy, grad), dg + i, n);
                     }
                   }
                 }
               });
}

template <class T>
void ActivationBackwardT(const ActivationBackwardArgs& a) {
  using ops::ActivationType;
  switch (a.type) {
    case ActivationType::kRelu:
      return ActivationBackwardTyped<ActivationType::kRelu, T>(a);
    case ActivationType::kGeluErf:
    case ActivationType::kGeGluErf:
      return ActivationBackwardTyped<ActivationType::kGeluErf, T>(a);
    case ActivationType::kGeluTanh:
    case ActivationType::kGeGluTanh:
      return ActivationBackwardTyped<ActivationType::kGeluTanh, T>(a);
    default:  // kSilu, kSwiGlu
      return ActivationBackwardTyped<ActivationType::kSilu, T>(a);
  }
}

void ActivationBackward(const ActivationBackwardArgs& a) {
  if (a.rows <= 0 || a.cols <= 0) return;
  switch (a.dtype) {
    case DType::kBF16:
      return ActivationBackwardT<bf16_t>(a);
    case DType::kF16:
      return ActivationBackwardT<f16_t>(a);
    default:
      return ActivationBackwardT<float>(a);
  }
}

// ---- embedding -----------------------------------------------------------------------------

template <class T, class I>
void EmbeddingBackwardTyped(const EmbeddingBackwardArgs& a) {
  const hn::ScalableTag<float> d;
  const int64_t L = static_cast<int64_t>(hn::Lanes(d));
  const int64_t C = a.cols;
  const I* ids = static_cast<const I*>(a.ids);
  // Threads own table rows [v0, v1) and scan every token: no two threads touch one row, and
  // each row adds its tokens in token order, for any thread count.
  parallel_for(a.threads, a.vocab, std::max<int64_t>(1, a.vocab / 2), a.ftz,
               [&](int64_t v0, int64_t v1) {
                 for (int64_t t = 0; t < a.tokens; ++t) {
                   const auto id = static_cast<int64_t>(ids[t]);
                   if (id < v0 || id >= v1) continue;
                   const T* dy = static_cast<const T*>(a.dy) + t * C;
                   float* dw = a.dw + id * C;
                   for (int64_t i = 0; i < C; i += L) {
                     const int64_t n = std::min(L, C - i);
                     StoreN(d, hn::Add(LoadN(d, dw + i, n), LoadN(d, dy + i, n)), dw + i, n);
                   }
                 }
               });
}

template <class T>
void EmbeddingBackwardT(const EmbeddingBackwardArgs& a) {
  if (a.ids_dtype == DType::kI64) return EmbeddingBackwardTyped<T, int64_t>(a);
  return EmbeddingBackwardTyped<T, int32_t>(a);
}

void EmbeddingBackward(const EmbeddingBackwardArgs& a) {
  if (a.tokens <= 0 || a.cols <= 0 || a.vocab <= 0) return;
  switch (a.dtype) {
    case DType::kBF16:
      return EmbeddingBackwardT<bf16_t>(a);
    case DType::kF16:
      return EmbeddingBackwardT<f16_t>(a);
    default:
      return EmbeddingBackwardT<float>(a);
  }
}

}  // namespace tboost::kernels::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace tboost::kernels {
HWY_EXPORT(NormBackward);
HWY_EXPORT(ActivationBackward);
HWY_EXPORT(EmbeddingBackward);
HWY_EXPORT(ColumnSumAccumulate);
void norm_backward(const NormBackwardArgs& a) { HWY_DYNAMIC_DISPATCH(NormBackward)(a); }
void activation_backward(const ActivationBackwardArgs& a) {
  HWY_DYNAMIC_DISPATCH(ActivationBackward)(a);
}
void embedding_backward(const EmbeddingBackwardArgs& a) {
  HWY_DYNAMIC_DISPATCH(EmbeddingBackward)(a);
}
void column_sum_accumulate(float* out, const void* x, DType dtype, int64_t rows, int64_t cols,
                           int threads, bool ftz) {
  HWY_DYNAMIC_DISPATCH(ColumnSumAccumulate)(out, x, dtype, rows, cols, threads, ftz);
}
}  // namespace tboost::kernels
#endif
