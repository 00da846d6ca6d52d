// AMX bf16 tile products (amx.h). Our own rather than oneDNN's: the attention prefill runs
// two small products per (query tile, key block) with its online softmax in between, and a
// library call per product costs more than the product (the same reason its vector
// micro-kernels are ours).
#include "src/kernels/cpu/amx.h"

#include "tboost/core/cpu_features.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define TBOOST_AMX 1
#else
#define TBOOST_AMX 0
#endif
#if TBOOST_AMX && defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#endif

#include <algorithm>
#include <cstdlib>

namespace tboost::kernels {
namespace {

#if TBOOST_AMX && defined(__linux__)
bool request_amx() {
  const CpuFeatures& f = cpu_features();
  if (!f.amx_tile || !f.amx_bf16 || !f.avx512_bf16) return false;
  unsigned lo = 0, hi = 0;
  __asm__("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  const unsigned long long xcr0 = (static_cast<unsigned long long>(hi) << 32) | lo;
  constexpr unsigned long long kTileState = (1ull << 17) | (1ull << 18);
  if ((xcr0 & kTileState) != kTileState) return false;
  // Linux 5.16+ keeps the 8 KiB tile data out of a process's state until it asks for it.
  constexpr long kReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
  return syscall(SYS_arch_prctl, kReqXcompPerm, kXfeatureXtiledata) == 0;
}
#else
bool request_amx() { return false; }
#endif

}  // namespace

bool amx_bf16_usable() {
  static const bool ok = request_amx();
  return ok;
}

#if TBOOST_AMX
#define TBOOST_AMX_ATTR __attribute__((target("amx-tile,amx-bf16")))

namespace {
// Palette 1: rows and bytes per row of each tile register.
struct alignas(64) TileConfig {
  uint8_t palette = 1, start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};
}  // namespace

TBOOST_AMX_ATTR void amx_begin() {
  TileConfig c;
  for (int t = 0; t < 8; ++t) c.colsb[t] = 64, c.rows[t] = 16;
  // Not _tile_loadconfig: g++ 12's version names only the first 8 bytes of the configuration
  // as its operand, so the stores of the rest were dropped as dead.
  __asm__ volatile("ldtilecfg %0" : : "m"(c));
}

TBOOST_AMX_ATTR void amx_end() { _tile_release(); }

namespace {
// One block of C: MR x NR tiles of 16 x 16 (MR, NR <= 2). Tiles 0-3 hold C (tile 2r + c), 4-5
// A's row tiles, 6-7 B's column tiles: with 2 x 2 each loaded tile serves two products.
template <int MR, int NR>
TBOOST_AMX_ATTR inline void Block(const char* a, int64_t lda, const char* b, int64_t ldb, int64_t K,
                                  float* c, int64_t ldc, bool accumulate) {
  const int64_t ldcb = ldc * static_cast<int64_t>(sizeof(float));
  float* c1 = c + 16 * ldc;  // second row tile
  if (accumulate) {
    _tile_loadd(0, c, ldcb);
    if constexpr (NR == 2) _tile_loadd(1, c + 16, ldcb);
    if constexpr (MR == 2) _tile_loadd(2, c1, ldcb);
    if constexpr (MR == 2 && NR == 2) _tile_loadd(3, c1 + 16, ldcb);
  } else {
    _tile_zero(0);
    if constexpr (NR == 2) _tile_zero(1);
    if constexpr (MR == 2) _tile_zero(2);
    if constexpr (MR == 2 && NR == 2) _tile_zero(3);
  }
  for (int64_t k = 0; k < K; k += 32) {
    const char* bk = b + (k / 2) * ldb;
    _tile_loadd(4, a + k * 2, lda);
    _tile_loadd(6, bk, ldb);
    _tile_dpbf16ps(0, 4, 6);
    if constexpr (NR == 2) {
      _tile_loadd(7, bk + 64, ldb);
      _tile_dpbf16ps(1, 4, 7);
    }
    if constexpr (MR == 2) {
      _tile_loadd(5, a + 16 * lda + k * 2, lda);
      _tile_dpbf16ps(2, 5, 6);
      if constexpr (NR == 2) _tile_dpbf16ps(3, 5, 7);
    }
  }
  _tile_stored(0, c, ldcb);
  if constexpr (NR == 2) _tile_stored(1, c + 16, ldcb);
  if constexpr (MR == 2) _tile_stored(2, c1, ldcb);
  if constexpr (MR == 2 && NR == 2) _tile_stored(3, c1 + 16, ldcb);
}
}  // namespace

// Out of line, in its own file, on purpose: g++'s tile-load intrinsics name no memory operand,
// so only a call boundary guarantees the caller's stores to A, B and C are done before them.
TBOOST_AMX_ATTR void amx_gemm(const uint16_t* A, int64_t lda, int64_t mt, const uint32_t* B,
                              int64_t ldb, int64_t nt, int64_t K, float* C, int64_t ldc,
                              bool accumulate) {
  const char* a = reinterpret_cast<const char*>(A);
  const char* b = reinterpret_cast<const char*>(B);
  for (int64_t n = 0; n < nt; n += 2) {
    const bool n2 = n + 1 < nt;
    for (int64_t m = 0; m < mt; m += 2) {
      const char* am = a + m * 16 * lda;
      const char* bn = b + n * 64;
      float* c = C + m * 16 * ldc + n * 16;
      if (m + 1 < mt) {
        if (n2)
          Block<2, 2>(am, lda, bn, ldb, K, c, ldc, accumulate);
        else
          Block<2, 1>(am, lda, bn, ldb, K, c, ldc, accumulate);
      } else {
        if (n2)
          Block<1, 2>(am, lda, bn, ldb, K, c, ldc, accumulate);
        else
          Block<1, 1>(am, lda, bn, ldb, K, c, ldc, accumulate);
      }
    }
  }
}
namespace {
// One group of NG (<= 4) column tiles of amx_gemm_rows: C in tiles 0..NG-1, A in 4, B in 5-7.
template <int NG>
TBOOST_AMX_ATTR inline void RowsGroup(const char* a, int64_t lda, const char* b, int64_t ldb,
                                      int64_t steps, const char* tail, int64_t ldt, float* c,
                                      int64_t ldcb, int64_t pf, int64_t pf_bytes) {
  _tile_zero(0);
  if constexpr (NG > 1) _tile_zero(1);
  if constexpr (NG > 2) _tile_zero(2);
  if constexpr (NG > 3) _tile_zero(3);
  const int64_t last = tail ? steps + 1 : steps;
  for (int64_t s = 0; s < last; ++s) {
    const char* bs = s < steps ? b + 16 * s * ldb : tail;
    const int64_t ld = s < steps ? ldb : ldt;
    if (s < steps)
      for (int64_t r = 0; r < 16; ++r)
        for (int64_t x = 0; x < pf_bytes; x += 64) __builtin_prefetch(bs + r * ldb + x + pf, 0, 3);
    _tile_loadd(4, a + s * 64, lda);
    _tile_loadd(5, bs, ld);
    _tile_dpbf16ps(0, 4, 5);
    if constexpr (NG > 1) {
      _tile_loadd(6, bs + 64, ld);
      _tile_dpbf16ps(1, 4, 6);
    }
    if constexpr (NG > 2) {
      _tile_loadd(7, bs + 128, ld);
      _tile_dpbf16ps(2, 4, 7);
    }
    if constexpr (NG > 3) {
      _tile_loadd(5, bs + 192, ld);
      _tile_dpbf16ps(3, 4, 5);
    }
  }
  _tile_stored(0, c, ldcb);
  if constexpr (NG > 1) _tile_stored(1, c + 16, ldcb);
  if constexpr (NG > 2) _tile_stored(2, c + 32, ldcb);
  if constexpr (NG > 3) _tile_stored(3, c + 48, ldcb);
}
}  // namespace

TBOOST_AMX_ATTR void amx_gemm_rows(const uint16_t* A, int64_t lda, const char* B, int64_t ldb,
                                   int64_t steps, const char* tail, int64_t ldt, int64_t nt,
                                   float* C, int64_t ldc, int64_t pf) {
  const char* a = reinterpret_cast<const char*>(A);
  const int64_t ldcb = ldc * static_cast<int64_t>(sizeof(float));
  for (int64_t g = 0; g < nt; g += 4) {
    // The first group's steps ask for the whole rows (nt·64 bytes); later groups find them in
    // cache.
    const int64_t pfb = pf != 0 && g == 0 ? nt * 64 : 0;
    const char* b = B + g * 64;
    const char* t = tail ? tail + g * 64 : nullptr;
    float* c = C + g * 16;
    switch (std::min<int64_t>(4, nt - g)) {
      case 1:
        RowsGroup<1>(a, lda, b, ldb, steps, t, ldt, c, ldcb, pf, pfb);
        break;
      case 2:
        RowsGroup<2>(a, lda, b, ldb, steps, t, ldt, c, ldcb, pf, pfb);
        break;
      case 3:
        RowsGroup<3>(a, lda, b, ldb, steps, t, ldt, c, ldcb, pf, pfb);
        break;
      default:
        RowsGroup<4>(a, lda, b, ldb, steps, t, ldt, c, ldcb, pf, pfb);
        break;
    }
  }
}
#else
void amx_begin() { std::abort(); }
void amx_end() { std::abort(); }
void amx_gemm(const uint16_t*, int64_t, int64_t, const uint32_t*, int64_t, int64_t, int64_t, float*,
              int64_t, bool) {
  std::abort();
}
void amx_gemm_rows(const uint16_t*, int64_t, const char*, int64_t, int64_t, const char*, int64_t,
                   int64_t, float*, int64_t, int64_t) {
  std::abort();
}
#endif

}  // namespace tboost::kernels
