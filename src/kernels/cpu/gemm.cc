// GEMM for the training kernels (Linear backward, fused linear + cross-entropy): one oneDNN
// matmul per call, y (M, N) = op(a) · op(b) (+ y), with cached primitives.
//
// Operands are strided matrices (a transposed operand is the same memory read with swapped
// strides, no copy). 16-bit operands run natively where oneDNN has a matmul for them (bf16 on
// AVX-512 CPUs); otherwise they are widened to f32 in a scratch buffer (oneDNN 2.6 has no bf16
// matmul on AVX2). Accumulation is oneDNN's "sum" post-op, so y += op(a) · op(b) costs no
// extra pass. oneDNN's summation order can depend on the thread count (it may split K among
// threads for some shapes); our own reductions do not.
#include <dnnl.hpp>
#include <map>
#include <memory>
#include <mutex>
#include <tuple>
#include <vector>

#include "src/core/parallel.h"
#include "src/kernels/cpu/kernels.h"
#include "src/ops/dnnl_util.h"
#include "tboost/core/error.h"

namespace tboost::kernels {
namespace {

using dnnl::memory;
using ops_internal::cpu_engine;
using ops_internal::dnnl_type;

// Strided (rows, cols) descriptor of a matrix whose row r, column c is at p[r * rs + c * cs].
memory::desc strided_md(int64_t rows, int64_t cols, int64_t rs, int64_t cs, DType t) {
  return memory::desc({rows, cols}, dnnl_type(t), memory::dims{rs, cs});
}

struct Key {
  int64_t M, N, K, ars, acs, brs, bcs, ldy;
  DType at, bt, yt;
  bool acc;
  int threads;
  auto tie() const { return std::tie(M, N, K, ars, acs, brs, bcs, ldy, at, bt, yt, acc, threads); }
  bool operator<(const Key& o) const { return tie() < o.tie(); }
};

std::mutex& cache_mutex() {
  static std::mutex m;
  return m;
}
struct Prim {
  dnnl::matmul matmul;
  memory::desc scratchpad;
};
std::map<Key, std::shared_ptr<Prim>>& cache() {
  static std::map<Key, std::shared_ptr<Prim>> c;
  return c;
}

// The primitive for k, or null when oneDNN has none for these dtypes.
std::shared_ptr<Prim> primitive(const Key& k) {
  std::lock_guard<std::mutex> lock(cache_mutex());
  auto it = cache().find(k);
  if (it != cache().end()) return it->second;
  std::shared_ptr<Prim> p;
  try {
    dnnl::post_ops po;
    if (k.acc) po.append_sum(1.0f);
    dnnl::primitive_attr attr = ops_internal::user_scratchpad_attr();
    attr.set_post_ops(po);
    const dnnl::matmul::desc desc(strided_md(k.M, k.K, k.ars, k.acs, k.at),
                                  strided_md(k.K, k.N, k.brs, k.bcs, k.bt),
                                  strided_md(k.M, k.N, k.ldy, 1, k.yt));
    const dnnl::matmul::primitive_desc pd(desc, attr, cpu_engine());
    p = std::make_shared<Prim>(Prim{dnnl::matmul(pd), pd.scratchpad_desc()});
  } catch (const dnnl::error&) {
    p = nullptr;
  }
  cache()[k] = p;
  return p;
}

// Grow-only per-thread f32 scratch (a fresh multi-MB vector per call would page-fault every
// time). Slot 0: a, 1: b, 2: y.
float* scratch(int slot, size_t n) {
  thread_local std::vector<float> buf[3];
  std::vector<float>& v = buf[slot];
  if (v.size() < n) v.resize(n);
  return v.data();
}

// An operand op(p) (rows, cols) with element strides (rs, cs), one of them 1, widened to f32 in
// its stored orientation (whole stored rows converted at once, in parallel): returns the copy
// and sets the copy's strides. A transposed operand stays transposed (strides swapped), so the
// copy is a plain row-by-row conversion.
const float* widen(int slot, const void* p, DType t, int64_t rows, int64_t cols, int64_t* rs,
                   int64_t* cs, int threads) {
  const bool row_major = *cs == 1;
  const int64_t srows = row_major ? rows : cols, scols = row_major ? cols : rows;
  const int64_t ld = row_major ? *rs : *cs;
  float* out = scratch(slot, static_cast<size_t>(rows * cols));
  const size_t es = dtype_size(t);
  parallel_for(threads, srows, 64, true, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r)
      convert(out + r * scols, DType::kF32,
              static_cast<const char*>(p) + static_cast<size_t>(r * ld) * es, t, scols);
  });
  if (row_major)
    *rs = cols, *cs = 1;
  else
    *rs = 1, *cs = rows;
  return out;
}

}  // namespace

bool gemm_has_native(DType t) {
  if (t == DType::kF32) return true;
  return primitive(Key{16, 16, 16, 16, 1, 16, 1, 16, t, t, DType::kF32, false, 1}) != nullptr;
}

void gemm(const GemmArgs& g) {
  if (g.M <= 0 || g.N <= 0) return;
  // Strides of op(a) (M, K) and op(b) (K, N).
  const int64_t ars = g.trans_a ? 1 : g.lda, acs = g.trans_a ? g.lda : 1;
  const int64_t brs = g.trans_b ? 1 : g.ldb, bcs = g.trans_b ? g.ldb : 1;
  const int threads = std::max(1, g.threads);
  ops_internal::OmpThreads omp(threads);
  if (g.K <= 0) {  // empty sum: y = 0 (or unchanged when accumulating)
    if (!g.accumulate) {
      std::vector<float> z(static_cast<size_t>(g.N), 0.0f);
      for (int64_t r = 0; r < g.M; ++r)
        convert(static_cast<char*>(g.y) + static_cast<size_t>(r * g.ldy) * dtype_size(g.y_dtype),
                g.y_dtype, z.data(), DType::kF32, g.N);
    }
    return;
  }
  Key k{g.M,   g.N,       g.K,       ars,       acs,          brs,    bcs,
        g.ldy, g.a_dtype, g.b_dtype, g.y_dtype, g.accumulate, threads};
  auto run = [&](const std::shared_ptr<Prim>& p, const Key& key, const void* a, const void* b,
                 void* y) {
    dnnl::stream s(cpu_engine());
    const memory am(strided_md(key.M, key.K, key.ars, key.acs, key.at), cpu_engine(),
                    const_cast<void*>(a));
    const memory bm(strided_md(key.K, key.N, key.brs, key.bcs, key.bt), cpu_engine(),
                    const_cast<void*>(b));
    const memory ym(strided_md(key.M, key.N, key.ldy, 1, key.yt), cpu_engine(), y);
    // Cached primitives run from any thread, so each call brings its own scratchpad
    // (dnnl_util.h).
    const memory sp = ops_internal::thread_scratchpad(p->scratchpad, cpu_engine());
    p->matmul.execute(s, {{DNNL_ARG_SRC, am},
                          {DNNL_ARG_WEIGHTS, bm},
                          {DNNL_ARG_DST, ym},
                          {DNNL_ARG_SCRATCHPAD, sp}});
    s.wait();
  };
  try {
    if (auto p = primitive(k)) return run(p, k, g.a, g.b, g.y);
    // No native matmul for these dtypes: widen the 16-bit operands to f32.
    const void* a = g.a;
    const void* b = g.b;
    Key f = k;
    if (g.a_dtype != DType::kF32) {
      a = widen(0, g.a, g.a_dtype, g.M, g.K, &f.ars, &f.acs, threads);
      f.at = DType::kF32;
    }
    if (g.b_dtype != DType::kF32) {
      b = widen(1, g.b, g.b_dtype, g.K, g.N, &f.brs, &f.bcs, threads);
      f.bt = DType::kF32;
    }
    if (auto p = primitive(f)) return run(p, f, a, b, g.y);
    // Nor for the output dtype: compute into f32 and round once.
    float* y32 = scratch(2, static_cast<size_t>(g.M * g.N));
    const size_t ye = dtype_size(g.y_dtype);
    auto yrow = [&](int64_t r) {
      return static_cast<char*>(g.y) + static_cast<size_t>(r * g.ldy) * ye;
    };
    if (g.accumulate)
      parallel_for(threads, g.M, 64, true, [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; ++r)
          convert(y32 + r * g.N, DType::kF32, yrow(r), g.y_dtype, g.N);
      });
    Key f32 = f;
    f32.yt = DType::kF32, f32.ldy = g.N;
    auto p = primitive(f32);
    if (!p) throw Error(ErrorCode::kUnsupported, "gemm: oneDNN has no f32 matmul for this case");
    run(p, f32, a, b, y32);
    parallel_for(threads, g.M, 64, true, [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r)
        convert(yrow(r), g.y_dtype, y32 + r * g.N, DType::kF32, g.N);
    });
  } catch (const dnnl::error& e) {
    throw Error(ErrorCode::kInternal, std::string("gemm: oneDNN failed: ") + e.what());
  }
}

}  // namespace tboost::kernels
