// Optimizer kernels: AdamW against the float64 reference over many steps (and the first
// step's closed form), the bf16 weight copy, the gradient sum of squares (thread-count
// independent bits, inf/NaN propagated).
#include <cmath>
#include <cstring>
#include <limits>

#include "tboost/kernels/cpu.h"
#include "tests/ops/harness.h"

namespace tboost::testing {
namespace {

namespace ref = kernels::ref;

std::vector<float> random_floats(Rng& rng, int64_t n, double lo, double hi) {
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = static_cast<float>(rng.nonzero(lo, hi));
  return v;
}

TEST(AdamW, FirstStepIsTheClosedForm) {
  // m = v = 0: the step is p (1 - lr wd) - lr g / (|g| + eps) for any betas.
  std::vector<float> p = {1.0f, -2.0f, 0.5f}, m(3, 0.0f), v(3, 0.0f), g = {0.3f, -1e-3f, 4.0f};
  kernels::cpu::AdamWHyper h;
  h.lr = 0.01f, h.weight_decay = 0.1f, h.eps = 1e-8f;
  const std::vector<float> p0 = p;
  kernels::cpu::adamw_step(p.data(), m.data(), v.data(), g.data(), nullptr, 3, 1, h);
  for (size_t i = 0; i < 3; ++i) {
    const double want =
        p0[i] * (1.0 - 0.01 * 0.1) - 0.01 * g[i] / (std::abs(static_cast<double>(g[i])) + 1e-8);
    EXPECT_NEAR(p[i], want, 1e-6) << i;
  }
}

TEST(AdamW, TwentyStepsFollowTheReference) {
  Rng rng;
  SCOPED_TRACE("seed " + std::to_string(rng.seed()));
  struct Cfg {
    int64_t n;
    float lr, wd, scale;
    int threads;
  };
  for (const Cfg c : {Cfg{1, 1e-3f, 0.0f, 1.0f, 1}, Cfg{1027, 3e-4f, 0.01f, 1.0f, 2},
                      Cfg{4099, 1e-2f, 0.1f, 0.25f, 3}}) {
    std::vector<float> p = random_floats(rng, c.n, -1, 1), m(p.size(), 0.0f), v(p.size(), 0.0f);
    std::vector<bf16_t> p16(p.size());
    Vec rp(p.begin(), p.end()), rm(p.size(), 0.0), rv(p.size(), 0.0);
    kernels::cpu::AdamWHyper h;
    h.lr = c.lr, h.weight_decay = c.wd;
    for (int64_t step = 1; step <= 20; ++step) {
      const std::vector<float> g = random_floats(rng, c.n, -0.1, 0.1);
      kernels::cpu::adamw_step(p.data(), m.data(), v.data(), g.data(), p16.data(), c.n, step, h,
                               c.scale, c.threads);
      ref::adamw_step(&rp, &rm, &rv, Vec(g.begin(), g.end()), step, c.lr, h.beta1, h.beta2, h.eps,
                      c.wd, c.scale);
    }
    for (size_t i = 0; i < p.size(); ++i) {
      // f32 state through 20 steps: each step moves p by at most ~lr, in f32.
      ASSERT_NEAR(p[i], rp[i], 1e-6 + 20 * 4e-7 * std::abs(rp[i])) << "p " << i;
      ASSERT_NEAR(m[i], rm[i], 1e-6 * (1 + std::abs(rm[i]))) << "m " << i;
      ASSERT_NEAR(v[i], rv[i], 1e-6 * (1 + std::abs(rv[i]))) << "v " << i;
      bf16_t want16;
      convert(&want16, DType::kBF16, &p[i], DType::kF32, 1);
      ASSERT_EQ(p16[i].bits, want16.bits) << "bf16 copy " << i;
    }
  }
}

TEST(GradSumSquares, MatchesF64AndIsThreadIndependent) {
  Rng rng;
  SCOPED_TRACE("seed " + std::to_string(rng.seed()));
  for (int64_t n : {int64_t{1}, int64_t{7}, int64_t{4096}, int64_t{70001}}) {
    const std::vector<float> g = random_floats(rng, n, -3, 3);
    double want = 0;
    for (float x : g) want += static_cast<double>(x) * x;
    const double s1 = kernels::cpu::grad_sum_squares(g.data(), n, 1);
    EXPECT_NEAR(s1, want, 1e-6 * want) << n;
    for (int threads : {2, 3}) {
      const double s = kernels::cpu::grad_sum_squares(g.data(), n, threads);
      EXPECT_EQ(0, std::memcmp(&s, &s1, sizeof(double))) << n << " threads " << threads;
    }
  }
}

TEST(GradSumSquares, PropagatesInfAndNaN) {
  std::vector<float> g(10000, 0.5f);
  g[6000] = std::numeric_limits<float>::infinity();
  EXPECT_TRUE(std::isinf(kernels::cpu::grad_sum_squares(g.data(), 10000, 2)));
  g[6000] = std::nanf("");
  EXPECT_TRUE(std::isnan(kernels::cpu::grad_sum_squares(g.data(), 10000, 2)));
  EXPECT_EQ(kernels::cpu::grad_sum_squares(g.data(), 0, 2), 0.0);
}

}  // namespace
}  // namespace tboost::testing
