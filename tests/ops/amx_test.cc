// The AMX tile product (src/kernels/cpu/amx.h) against a float64 reference: 1 to 3 row and
// column tiles (its 2 x 2 blocks and their 1-wide edges), K of 32 to 96, with and without
// accumulation, leading dimensions wider than the data. Skipped where AMX is not usable (the
// attention tests cover its callers there too). Then the product over B's rows as they lie
// (amx_gemm_rows): 1 to 9 column tiles (groups of 4 and their remainders), 0 to 3 whole steps,
// with and without a separate tail block.
#include "src/kernels/cpu/amx.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "tests/ops/harness.h"

namespace tboost::testing {
namespace {

// A random value of magnitude ~1 as bf16 bits (the float's upper half).
uint16_t RandomBf16(Rng& rng) {
  const float f = static_cast<float>(rng.uniform(-2.0, 2.0));
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return static_cast<uint16_t>(u >> 16);
}

double Bf16Value(uint16_t b) {
  const uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

TEST(AmxGemm, MatchesFloat64Reference) {
  if (!kernels::amx_bf16_usable()) GTEST_SKIP() << "AMX bf16 is not usable on this CPU / OS";
  Rng rng;
  SCOPED_TRACE("seed " + std::to_string(rng.seed()));
  const float kSentinel = 12345.0f;
  int ran = 0;
  for (int64_t mt = 1; mt <= 3; ++mt)
    for (int64_t nt = 1; nt <= 3; ++nt)
      for (int64_t K : {32, 96})
        for (bool acc : {false, true}) {
          SCOPED_TRACE("mt " + std::to_string(mt) + " nt " + std::to_string(nt) + " K " +
                       std::to_string(K) + (acc ? " accumulate" : ""));
          const int64_t M = 16 * mt, N = 16 * nt;
          const int64_t lda = K + 3, ldb = N + 5, ldc = N + 7;  // elements, wider than the data
          std::vector<uint16_t> a(static_cast<size_t>(M * lda));
          std::vector<uint32_t> b(static_cast<size_t>(K / 2 * ldb));
          for (auto& x : a) x = RandomBf16(rng);
          for (auto& x : b) x = RandomBf16(rng) | static_cast<uint32_t>(RandomBf16(rng)) << 16;
          std::vector<float> c(static_cast<size_t>(M * ldc), kSentinel);
          std::vector<double> want(static_cast<size_t>(M * N)), bound(want.size());
          for (int64_t m = 0; m < M; ++m)
            for (int64_t n = 0; n < N; ++n) {
              float& cv = c[static_cast<size_t>(m * ldc + n)];
              cv = acc ? static_cast<float>(rng.uniform(-4.0, 4.0))
                       : std::numeric_limits<float>::quiet_NaN();  // poison: must be overwritten
              double s = acc ? cv : 0.0, sa = acc ? std::abs(cv) : 0.0;
              for (int64_t k = 0; k < K; ++k) {
                const uint32_t pair = b[static_cast<size_t>(k / 2 * ldb + n)];
                const double bv = Bf16Value(static_cast<uint16_t>(k % 2 ? pair >> 16 : pair));
                const double t = Bf16Value(a[static_cast<size_t>(m * lda + k)]) * bv;
                s += t;
                sa += std::abs(t);
              }
              want[static_cast<size_t>(m * N + n)] = s;
              bound[static_cast<size_t>(m * N + n)] = sa;
            }
          kernels::amx_begin();
          kernels::amx_gemm(a.data(), lda * 2, mt, b.data(), ldb * 4, nt, K, c.data(), ldc, acc);
          kernels::amx_end();
          for (int64_t m = 0; m < M; ++m) {
            for (int64_t n = 0; n < N; ++n) {
              const double got = c[static_cast<size_t>(m * ldc + n)];
              const double w = want[static_cast<size_t>(m * N + n)];
              // Products of bf16 values are exact in f32; the f32 sums round at most K + 1 times.
              const double tol =
                  1e-6 * static_cast<double>(K + 1) * bound[static_cast<size_t>(m * N + n)] + 1e-30;
              ASSERT_TRUE(std::isfinite(got)) << "C[" << m << "][" << n << "]";
              ASSERT_LE(std::abs(got - w), tol) << "C[" << m << "][" << n << "]";
            }
            for (int64_t n = N; n < ldc; ++n)
              ASSERT_EQ(c[static_cast<size_t>(m * ldc + n)], kSentinel)
                  << "written past C's columns, row " << m;
          }
          ++ran;
        }
  EXPECT_EQ(ran, 36);
}

// C (16 x 16·nt) = A · B, B's rows in place: C[m][n] = sum over steps s and rows r < 16 of
// A[m][32s + 2r] · B_s[r][2n] + A[m][32s + 2r + 1] · B_s[r][2n + 1], B_s the step's 16 rows (the
// tail block for the last step where there is one).
TEST(AmxGemmRows, MatchesFloat64Reference) {
  if (!kernels::amx_bf16_usable()) GTEST_SKIP() << "AMX bf16 is not usable on this CPU / OS";
  Rng rng;
  SCOPED_TRACE("seed " + std::to_string(rng.seed()));
  const float kSentinel = 12345.0f;
  int ran = 0;
  for (int64_t nt : {1, 2, 3, 4, 5, 8, 9})
    for (int64_t steps = 0; steps <= 3; ++steps)
      for (bool tail : {false, true}) {
        if (steps == 0 && !tail) continue;
        SCOPED_TRACE("nt " + std::to_string(nt) + " steps " + std::to_string(steps) +
                     (tail ? " tail" : ""));
        const int64_t all = steps + (tail ? 1 : 0), N = 16 * nt;
        const int64_t lda = 32 * all + 6;  // bf16 elements, wider than the data
        const int64_t ldb = 32 * nt + 10, ldt = 32 * nt + 2;
        std::vector<uint16_t> a(static_cast<size_t>(16 * lda));
        std::vector<uint16_t> b(static_cast<size_t>(16 * std::max<int64_t>(steps, 1) * ldb));
        std::vector<uint16_t> t(static_cast<size_t>(16 * ldt));
        for (auto& x : a) x = RandomBf16(rng);
        for (auto& x : b) x = RandomBf16(rng);
        for (auto& x : t) x = RandomBf16(rng);
        const int64_t ldc = N + 3;
        std::vector<float> c(static_cast<size_t>(16 * ldc), kSentinel);
        for (int64_t m = 0; m < 16; ++m)
          for (int64_t n = 0; n < N; ++n)
            c[static_cast<size_t>(m * ldc + n)] = std::numeric_limits<float>::quiet_NaN();
        kernels::amx_begin();
        kernels::amx_gemm_rows(a.data(), lda * 2, reinterpret_cast<const char*>(b.data()), ldb * 2,
                               steps, tail ? reinterpret_cast<const char*>(t.data()) : nullptr,
                               ldt * 2, nt, c.data(), ldc, 256);
        kernels::amx_end();
        for (int64_t m = 0; m < 16; ++m) {
          for (int64_t n = 0; n < N; ++n) {
            double s = 0.0, sa = 0.0;
            for (int64_t st = 0; st < all; ++st)
              for (int64_t r = 0; r < 16; ++r)
                for (int64_t e = 0; e < 2; ++e) {
                  const uint16_t bv = st < steps
                                          ? b[static_cast<size_t>((16 * st + r) * ldb + 2 * n + e)]
                                          : t[static_cast<size_t>(r * ldt + 2 * n + e)];
                  const double p =
                      Bf16Value(a[static_cast<size_t>(m * lda + 32 * st + 2 * r + e)]) *
                      Bf16Value(bv);
                  s += p;
                  sa += std::abs(p);
                }
            const double got = c[static_cast<size_t>(m * ldc + n)];
            const double tol = 1e-6 * static_cast<double>(32 * all + 1) * sa + 1e-30;
            ASSERT_TRUE(std::isfinite(got)) << "C[" << m << "][" << n << "]";
            ASSERT_LE(std::abs(got - s), tol) << "C[" << m << "][" << n << "]";
          }
          for (int64_t n = N; n < ldc; ++n)
            ASSERT_EQ(c[static_cast<size_t>(m * ldc + n)], kSentinel)
                << "written past C's columns, row " << m;
        }
        ++ran;
      }
  EXPECT_EQ(ran, 49);
}

}  // namespace
}  // namespace tboost::testing
