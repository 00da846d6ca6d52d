// Backward kernels (norms, activations, rope, embedding): the float64 references against
// central differences of the forward references, then the CPU kernels (f32, bf16) against the
// references on odd sizes, with poisoned dx, accumulating parameter gradients, and bitwise
// equal results for every thread count.
#include <cmath>
#include <cstring>
#include <tuple>

#include "src/kernels/cpu/kernels.h"
#include "tboost/kernels/cpu.h"
#include "tests/ops/harness.h"

namespace tboost::testing {
namespace {

namespace ref = kernels::ref;
using ops::ActivationType;

Vec random_vec(Rng& rng, size_t n, double lo = -1.0, double hi = 1.0) {
  Vec v(n);
  for (double& x : v) x = rng.nonzero(lo, hi);
  return v;
}
// Values an f32 holds exactly (initial contents of accumulated f32 gradients).
Vec random_f32_vec(Rng& rng, size_t n) {
  Vec v = random_vec(rng, n);
  for (double& x : v) x = static_cast<float>(x);
  return v;
}

double dot(const Vec& a, const Vec& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

// Central difference of f at v[i] (v restored afterwards).
template <class F>
double central(Vec& v, size_t i, F&& f) {
  const double h = 1e-5 * std::max(1.0, std::abs(v[i])), keep = v[i];
  v[i] = keep + h;
  const double up = f();
  v[i] = keep - h;
  const double dn = f();
  v[i] = keep;
  return (up - dn) / (2 * h);
}

void expect_grad(const Vec& analytic, const std::vector<double>& numeric, const std::string& what) {
  ASSERT_EQ(analytic.size(), numeric.size());
  for (size_t i = 0; i < analytic.size(); ++i)
    EXPECT_NEAR(analytic[i], numeric[i], 1e-6 * (1.0 + std::abs(numeric[i])))
        << what << " element " << i;
}

// ---- the references against central differences --------------------------------------------

TEST(BackwardReference, NormMatchesCentralDifferences) {
  Rng rng;
  SCOPED_TRACE("seed " + std::to_string(rng.seed()));
  const int64_t R = 3, C = 7;
  for (bool rms : {true, false})
    for (bool plus_one : {false, true})
      for (bool prenorm : {false, true}) {
        Vec x = random_vec(rng, R * C, -1, 3), res = random_vec(rng, R * C),
            w = random_vec(rng, C, 0.5, 1.5), b = random_vec(rng, C), dy = random_vec(rng, R * C),
            dsum = random_vec(rng, R * C);
        const double eps = 1e-5;
        // loss = sum(dy * y) (+ sum(dsum * (x + res)) with PRENORM)
        auto loss = [&] {
          RefOut y, s;
          ref::norm(&y, prenorm ? &s : nullptr, nullptr, nullptr, x, prenorm ? &res : nullptr, w,
                    rms ? nullptr : &b, eps, R, C, rms, plus_one);
          return dot(dy, y.value) + (prenorm ? dot(dsum, s.value) : 0.0);
        };
        Vec s = x;
        if (prenorm)
          for (size_t i = 0; i < s.size(); ++i) s[i] += res[i];
        RefOut dx, dw, db;
        ref::norm_backward(&dx, &dw, rms ? nullptr : &db, dy, s, w, prenorm ? &dsum : nullptr, eps,
                           R, C, rms, plus_one);
        std::vector<double> nx, nw, nb, nr;
        for (size_t i = 0; i < x.size(); ++i) nx.push_back(central(x, i, loss));
        for (size_t i = 0; i < w.size(); ++i) nw.push_back(central(w, i, loss));
        const std::string tag = std::string(rms ? "rms" : "ln") + (prenorm ? " prenorm" : "") +
                                (plus_one ? " plus_one" : "");
        expect_grad(dx.value, nx, tag + " dx");
        expect_grad(dw.value, nw, tag + " dw");
        if (prenorm) {
          for (size_t i = 0; i < res.size(); ++i) nr.push_back(central(res, i, loss));
          expect_grad(dx.value, nr, tag + " dresidual");
        }
        if (!rms) {
          for (size_t i = 0; i < b.size(); ++i) nb.push_back(central(b, i, loss));
          expect_grad(db.value, nb, tag + " db");
        }
      }
}

TEST(BackwardReference, ActivationsMatchCentralDifferences) {
  Rng rng;
  SCOPED_TRACE("seed " + std::to_string(rng.seed()));
  const int64_t R = 2, F = 9;
  for (ActivationType t :
       {ActivationType::kSilu, ActivationType::kGeluErf, ActivationType::kGeluTanh,
        ActivationType::kRelu, ActivationType::kSwiGlu, ActivationType::kGeGluErf,
        ActivationType::kGeGluTanh})
    for (bool gate_first : {true, false}) {
      const bool gated = ops::is_gated(t);
      if (!gated && !gate_first) continue;
      Vec x = random_vec(rng, static_cast<size_t>(R * F * (gated ? 2 : 1)), -3, 3);
      const Vec dy = random_vec(rng, R * F);
      auto loss = [&] {
        RefOut y;
        ref::activation(&y, x, R, F, t, gate_first);
        return dot(dy, y.value);
      };
      RefOut dx;
      ref::activation_backward(&dx, dy, x, R, F, t, gate_first);
      std::vector<double> nx;
      for (size_t i = 0; i < x.size(); ++i) nx.push_back(central(x, i, loss));
      expect_grad(dx.value, nx,
                  std::string(ops::activation_type_name(t)) + (gate_first ? "" : " up first"));
    }
}

TEST(BackwardReference, LinearMatchesCentralDifferences) {
  Rng rng;
  SCOPED_TRACE("seed " + std::to_string(rng.seed()));
  const int64_t M = 3, K = 4, N = 5;
  Vec x = random_vec(rng, M * K), w = random_vec(rng, N * K), b = random_vec(rng, N);
  const Vec dy = random_vec(rng, M * N);
  auto loss = [&] {
    RefOut y;
    ref::linear(&y, x, w, b, {}, M, K, N, ops::Activation::kNone);
    return dot(dy, y.value);
  };
  RefOut dx, dw, db;
  ref::linear_backward(&dx, &dw, &db, dy, x, w, M, K, N);
  std::vector<double> nx, nw, nb;
  for (size_t i = 0; i < x.size(); ++i) nx.push_back(central(x, i, loss));
  for (size_t i = 0; i < w.size(); ++i) nw.push_back(central(w, i, loss));
  for (size_t i = 0; i < b.size(); ++i) nb.push_back(central(b, i, loss));
  expect_grad(dx.value, nx, "linear dx");
  expect_grad(dw.value, nw, "linear dw");
  expect_grad(db.value, nb, "linear db");
}

TEST(BackwardReference, LinearCrossEntropyMatchesCentralDifferences) {
  Rng rng;
  SCOPED_TRACE("seed " + std::to_string(rng.seed()));
  const int64_t M = 4, K = 3, V = 6;
  const std::vector<int64_t> labels = {2, -100, 5, 0};
  for (double eps : {0.0, 0.1}) {
    Vec x = random_vec(rng, M * K, -2, 2), w = random_vec(rng, V * K, -2, 2);
    RefOut dx, dw, tmp1, tmp2;
    ref::linear_cross_entropy(&dx, &dw, x, w, labels, M, K, V, -100, eps);
    auto loss = [&] {
      return ref::linear_cross_entropy(&tmp1, &tmp2, x, w, labels, M, K, V, -100, eps);
    };
    std::vector<double> nx, nw;
    for (size_t i = 0; i < x.size(); ++i) nx.push_back(central(x, i, loss));
    for (size_t i = 0; i < w.size(); ++i) nw.push_back(central(w, i, loss));
    expect_grad(dx.value, nx, "lce dx");
    expect_grad(dw.value, nw, "lce dw");
  }
}

TEST(BackwardReference, RopeIsRopeAtNegatedPositions) {
  Rng rng;
  SCOPED_TRACE("seed " + std::to_string(rng.seed()));
  const int64_t rows = 4, D = 10;
  for (auto rot : {ops::RopeRotation::kRotateHalf, ops::RopeRotation::kInterleaved})
    for (int64_t rd : {int64_t{0}, int64_t{6}}) {
      Vec x = random_vec(rng, rows * D), dy = random_vec(rng, rows * D), pos(rows), neg(rows);
      for (int64_t r = 0; r < rows; ++r) pos[r] = 3.0 + 17.0 * r, neg[r] = -pos[r];
      auto loss = [&] {
        RefOut y;
        ref::rope(&y, x, pos, rows, D, rd, rot, 10000.0, 1.0);
        return dot(dy, y.value);
      };
      RefOut dx;
      ref::rope(&dx, dy, neg, rows, D, rd, rot, 10000.0, 1.0);
      std::vector<double> nx;
      for (size_t i = 0; i < x.size(); ++i) nx.push_back(central(x, i, loss));
      expect_grad(dx.value, nx, "rope");
    }
}

TEST(BackwardReference, EmbeddingMatchesCentralDifferences) {
  Rng rng;
  const int64_t V = 5, C = 3;
  const std::vector<int64_t> ids = {4, 0, 4, 2, 4};
  Vec table = random_vec(rng, V * C);
  const Vec dy = random_vec(rng, ids.size() * C);
  auto loss = [&] {
    double s = 0;
    for (size_t t = 0; t < ids.size(); ++t)
      for (int64_t c = 0; c < C; ++c) s += dy[t * C + c] * table[ids[t] * C + c];
    return s;
  };
  RefOut dw;
  ref::embedding_backward(&dw, dy, ids, V, C);
  std::vector<double> nw;
  for (size_t i = 0; i < table.size(); ++i) nw.push_back(central(table, i, loss));
  expect_grad(dw.value, nw, "embedding");
}

// ---- the kernels against the references -----------------------------------------------------

// Every element within tol * scale (+ a denormal-sized floor) and normwise within tol, plus,
// as in the op harness, tol·||scale - |want||| for the terms that cancel: without it a tiny
// case (one row, two classes: dx = (p0 - y0)·w0 + (p1 - y1)·w1 nearly cancels) failed in
// some runs (fresh random inputs) with every element inside its bound.
void expect_matches(const Vec& got, const RefOut& want, double tol, const std::string& what) {
  ASSERT_EQ(got.size(), want.value.size()) << what;
  double num = 0, den = 0, slack = 0;
  int bad = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double e = std::abs(got[i] - want.value[i]);
    const double sl = std::max(0.0, want.scale[i] - std::abs(want.value[i]));
    num += e * e, den += want.value[i] * want.value[i], slack += sl * sl;
    if (!(e <= tol * want.scale[i] + 1e-30) && bad++ < 5)
      ADD_FAILURE() << what << " element " << i << ": got " << got[i] << " want " << want.value[i]
                    << " (scale " << want.scale[i] << ", tol " << tol << ")";
  }
  EXPECT_LE(std::sqrt(num), tol * (std::sqrt(den) + std::sqrt(slack)) + 1e-30)
      << what << " normwise";
}

// An f32 gradient accumulated onto base: got = f32(base + delta), delta as want says. Each of
// the `adds` roundings into the f32 buffer may cost an ulp of |base + delta| on top of delta's
// own tolerance (the fused cross-entropy adds once per chunk of rows).
void expect_accumulated(const std::vector<float>& got, const Vec& base, const RefOut& want,
                        double tol, const std::string& what, int adds = 1) {
  ASSERT_EQ(got.size(), want.value.size()) << what;
  int bad = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double sum = base[i] + want.value[i];
    const double e = std::abs(static_cast<double>(got[i]) - sum);
    if (!(e <= tol * want.scale[i] + adds * std::ldexp(std::abs(sum), -23) + 1e-30) && bad++ < 5)
      ADD_FAILURE() << what << " element " << i << ": got " << got[i] << " want " << sum
                    << " (base " << base[i] << ", delta scale " << want.scale[i] << ")";
  }
}

Tensor poisoned(DType dt, const Shape& s) {
  return poisoned_output(TensorDesc::contiguous(dt, s), false).view;
}

struct NormBwdCase {
  bool rms;
  DType dt;
  int64_t rows, cols;
  bool dsum, plus_one;
};

class NormBackwardKernel : public ::testing::TestWithParam<NormBwdCase> {};

TEST_P(NormBackwardKernel, MatchesReferenceAndIsThreadIndependent) {
  const NormBwdCase c = GetParam();
  Rng rng;
  SCOPED_TRACE("seed " + std::to_string(rng.seed()));
  const int64_t R = c.rows, C = c.cols;
  const double eps = 1e-5;
  auto t = [&](const Shape& s, double lo, double hi) {
    return random_tensor(rng, c.dt, s, false, lo, hi).view;
  };
  const Tensor x = t({R, C}, -1, 3), dy = t({R, C}, -1, 1), ds = t({R, C}, -1, 1);
  const Tensor w = t({C}, 0.5, 1.5);
  const Vec xv = to_f64(x), wv = to_f64(w), dyv = to_f64(dy), dsv = to_f64(ds);
  // Forward statistics as the forward would save them (f32).
  std::vector<float> mean(static_cast<size_t>(R)), rstd(static_cast<size_t>(R));
  for (int64_t r = 0; r < R; ++r) {
    double mu = 0, var = 0;
    for (int64_t k = 0; k < C; ++k) mu += c.rms ? 0.0 : xv[r * C + k] / static_cast<double>(C);
    for (int64_t k = 0; k < C; ++k) var += (xv[r * C + k] - mu) * (xv[r * C + k] - mu);
    mean[r] = static_cast<float>(mu);
    rstd[r] = static_cast<float>(1.0 / std::sqrt(var / static_cast<double>(C) + eps));
  }
  RefOut rdx, rdw, rdb;
  ref::norm_backward(&rdx, &rdw, c.rms ? nullptr : &rdb, dyv, xv, wv, c.dsum ? &dsv : nullptr, eps,
                     R, C, c.rms, c.plus_one);
  const Vec dw0 = random_f32_vec(rng, C), db0 = random_f32_vec(rng, C);  // gradients accumulate
  std::vector<std::vector<float>> dws, dbs;
  for (int threads : {1, 2, 3}) {
    Tensor dx = poisoned(c.dt, {R, C});
    std::vector<float> dw(dw0.begin(), dw0.end()), db(db0.begin(), db0.end());
    kernels::NormBackwardArgs a;
    a.dx = dx.data(), a.dy = dy.data(), a.x = x.data(), a.dsum = c.dsum ? ds.data() : nullptr;
    a.weight = w.data(), a.dw = dw.data(), a.db = c.rms ? nullptr : db.data();
    a.mean = mean.data(), a.rstd = rstd.data(), a.dtype = c.dt, a.wdtype = c.dt;
    a.rows = R, a.cols = C, a.rms = c.rms, a.plus_one = c.plus_one, a.threads = threads;
    kernels::norm_backward(a);
    const double tol = tolerance(c.dt, C);
    expect_matches(to_f64(dx), rdx, tol, "dx t" + std::to_string(threads));
    // f32 accumulation over rows: the f32 tolerance (inputs are exactly the stored values).
    expect_accumulated(dw, dw0, rdw, tolerance(DType::kF32, R), "dw");
    if (!c.rms) expect_accumulated(db, db0, rdb, tolerance(DType::kF32, R), "db");
    dws.push_back(dw), dbs.push_back(db);
  }
  for (size_t k = 1; k < dws.size(); ++k) {
    EXPECT_EQ(0, std::memcmp(dws[0].data(), dws[k].data(), dws[0].size() * 4)) << "dw bits";
    EXPECT_EQ(0, std::memcmp(dbs[0].data(), dbs[k].data(), dbs[0].size() * 4)) << "db bits";
  }
}

std::vector<NormBwdCase> norm_cases() {
  std::vector<NormBwdCase> v;
  for (bool rms : {true, false})
    for (DType dt : {DType::kF32, DType::kBF16})
      // (1 x 1 only for RmsNorm: LayerNorm of one element is the constant b, of two elements
      // the constants b +- w, so its dx is pure cancellation.)
      for (auto [r, c] :
           {std::pair<int64_t, int64_t>{1, rms ? 1 : 3}, {3, 7}, {33, 64}, {70, 129}, {200, 770}})
        v.push_back({rms, dt, r, c, (r + c) % 2 == 0, c == 64});
  v.push_back({true, DType::kF32, 5, 2304, true, false});
  return v;
}

INSTANTIATE_TEST_SUITE_P(Cases, NormBackwardKernel, ::testing::ValuesIn(norm_cases()),
                         [](const auto& info) {
                           const NormBwdCase& c = info.param;
                           return std::string(c.rms ? "rms" : "ln") + "_" + dtype_name(c.dt) + "_" +
                                  std::to_string(c.rows) + "x" + std::to_string(c.cols) +
                                  (c.dsum ? "_dsum" : "") + (c.plus_one ? "_plus1" : "");
                         });

TEST(ActivationBackwardKernel, MatchesReference) {
  Rng rng;
  SCOPED_TRACE("seed " + std::to_string(rng.seed()));
  for (DType dt : {DType::kF32, DType::kBF16})
    for (ActivationType t :
         {ActivationType::kSilu, ActivationType::kGeluErf, ActivationType::kGeluTanh,
          ActivationType::kRelu, ActivationType::kSwiGlu, ActivationType::kGeGluErf,
          ActivationType::kGeGluTanh})
      for (bool gate_first : {true, false})
        for (auto [R, F] : {std::pair<int64_t, int64_t>{1, 1}, {3, 13}, {17, 200}}) {
          if (!ops::is_gated(t) && !gate_first) continue;
          const int64_t xc = ops::is_gated(t) ? 2 * F : F;
          const Tensor x = random_tensor(rng, dt, {R, xc}, false, -4, 4).view;
          const Tensor dy = random_tensor(rng, dt, {R, F}, false).view;
          RefOut want;
          ref::activation_backward(&want, to_f64(dy), to_f64(x), R, F, t, gate_first);
          Tensor dx = poisoned(dt, {R, xc});
          kernels::ActivationBackwardArgs a;
          a.dx = dx.data(), a.dy = dy.data(), a.x = x.data(), a.dtype = dt, a.type = t;
          a.gate_first = gate_first, a.rows = R, a.cols = F, a.threads = 2;
          kernels::activation_backward(a);
          expect_matches(to_f64(dx), want, tolerance(dt),
                         std::string(ops::activation_type_name(t)) +
                             (gate_first ? "" : " up first ") + dtype_name(dt) + " " +
                             std::to_string(R) + "x" + std::to_string(F));
        }
}

TEST(ActivationBackwardKernel, PublicFunctionSwiGluUpFirst) {
  Rng rng;
  const int64_t R = 4, F = 11;
  const Tensor x = random_tensor(rng, DType::kF32, {R, 2 * F}, false, -3, 3).view;
  const Tensor dy = random_tensor(rng, DType::kF32, {R, F}, false).view;
  RefOut want;
  ref::activation_backward(&want, to_f64(dy), to_f64(x), R, F, ActivationType::kSwiGlu, false);
  Tensor dx = poisoned(DType::kF32, {R, 2 * F});
  kernels::cpu::activation_backward(dx.data_as<float>(), dy.data_as<float>(), x.data_as<float>(),
                                    ActivationType::kSwiGlu, R, F, /*gate_first=*/false);
  expect_matches(to_f64(dx), want, tolerance(DType::kF32), "swiglu");
}

TEST(RopeBackwardKernel, MatchesReferenceAndInvertsTheForward) {
  Rng rng;
  SCOPED_TRACE("seed " + std::to_string(rng.seed()));
  for (DType dt : {DType::kF32, DType::kBF16})
    for (auto rot : {ops::RopeRotation::kRotateHalf, ops::RopeRotation::kInterleaved})
      for (int64_t rd : {int64_t{0}, int64_t{32}}) {
        const int64_t T = 9, H = 3, D = 64;
        const Tensor dy = random_tensor(rng, dt, {T, H, D}, false).view;
        std::vector<int32_t> pos(T);
        Vec negpos(static_cast<size_t>(T * H));
        for (int64_t i = 0; i < T; ++i) {
          pos[i] = static_cast<int32_t>(rng.integer(0, 5000));
          for (int64_t h = 0; h < H; ++h) negpos[i * H + h] = -pos[i];
        }
        ops::RopeParam p;
        p.rotation = rot, p.rotary_dim = rd, p.theta = 10000.0f;
        Tensor dx = poisoned(dt, {T, H, D});
        if (dt == DType::kF32)
          kernels::cpu::rope_backward(dx.data_as<float>(), dy.data_as<float>(), pos.data(), p, T, H,
                                      D);
        else
          kernels::cpu::rope_backward(dx.data_as<bf16_t>(), dy.data_as<bf16_t>(), pos.data(), p, T,
                                      H, D);
        RefOut want;
        ref::rope(&want, to_f64(dy), negpos, T * H, D, rd, rot, 10000.0, 1.0);
        expect_matches(to_f64(dx), want, tolerance(dt), "rope backward");
        if (dt == DType::kF32) {
          // Forward of the backward's output gives dy back (R(a) R(-a) = I).
          RefOut back;
          Vec ppos(negpos.size());
          for (size_t i = 0; i < ppos.size(); ++i) ppos[i] = -negpos[i];
          ref::rope(&back, to_f64(dx), ppos, T * H, D, rd, rot, 10000.0, 1.0);
          const Vec dyv = to_f64(dy);
          for (size_t i = 0; i < dyv.size(); ++i) EXPECT_NEAR(back.value[i], dyv[i], 1e-5);
        }
      }
}

TEST(EmbeddingBackwardKernel, AccumulatesRepeatedIdsThreadIndependently) {
  Rng rng;
  SCOPED_TRACE("seed " + std::to_string(rng.seed()));
  for (DType dt : {DType::kF32, DType::kBF16}) {
    const int64_t V = 37, C = 19, T = 101;
    std::vector<int32_t> ids(T);
    std::vector<int64_t> ids64(T);
    for (int64_t t = 0; t < T; ++t) ids64[t] = ids[t] = static_cast<int32_t>(rng.integer(0, 9));
    ids[T - 1] = static_cast<int32_t>(V - 1), ids64[T - 1] = V - 1;
    const Tensor dy = random_tensor(rng, dt, {T, C}, false).view;
    RefOut want;
    ref::embedding_backward(&want, to_f64(dy), ids64, V, C);
    const Vec w0 = random_f32_vec(rng, V * C);
    std::vector<std::vector<float>> outs;
    for (int threads : {1, 2, 3}) {
      std::vector<float> dw(w0.begin(), w0.end());
      if (dt == DType::kF32)
        kernels::cpu::embedding_backward(dw.data(), dy.data_as<float>(), ids.data(), T, V, C,
                                         threads);
      else
        kernels::cpu::embedding_backward(dw.data(), dy.data_as<bf16_t>(), ids.data(), T, V, C,
                                         threads);
      expect_accumulated(dw, w0, want, tolerance(DType::kF32, T), "embedding dw");
      outs.push_back(dw);
    }
    for (size_t k = 1; k < outs.size(); ++k)
      EXPECT_EQ(0, std::memcmp(outs[0].data(), outs[k].data(), outs[0].size() * 4));
  }
}

TEST(LinearBackwardKernel, MatchesReferenceAndAccumulates) {
  Rng rng;
  SCOPED_TRACE("seed " + std::to_string(rng.seed()));
  for (DType dt : {DType::kF32, DType::kBF16})
    for (auto [M, K, N] : {std::tuple<int64_t, int64_t, int64_t>{1, 1, 1},
                           {7, 5, 3},
                           {33, 64, 17},
                           {130, 129, 100}}) {
      const Tensor x = random_tensor(rng, dt, {M, K}, false).view;
      const Tensor w = random_tensor(rng, dt, {N, K}, false).view;
      const Tensor dy = random_tensor(rng, dt, {M, N}, false).view;
      RefOut rdx, rdw, rdb;
      ref::linear_backward(&rdx, &rdw, &rdb, to_f64(dy), to_f64(x), to_f64(w), M, K, N);
      const Vec dw0 = random_f32_vec(rng, N * K), db0 = random_f32_vec(rng, N);
      std::vector<std::vector<float>> dbs;
      for (int threads : {1, 2}) {
        Tensor dx = poisoned(dt, {M, K});
        std::vector<float> dw(dw0.begin(), dw0.end()), db(db0.begin(), db0.end());
        if (dt == DType::kF32)
          kernels::cpu::linear_backward(dx.data_as<float>(), dw.data(), db.data(),
                                        dy.data_as<float>(), x.data_as<float>(), w.data_as<float>(),
                                        M, K, N, threads);
        else
          kernels::cpu::linear_backward(dx.data_as<bf16_t>(), dw.data(), db.data(),
                                        dy.data_as<bf16_t>(), x.data_as<bf16_t>(),
                                        w.data_as<bf16_t>(), M, K, N, threads);
        const std::string tag = std::string(dtype_name(dt)) + " " + std::to_string(M) + "x" +
                                std::to_string(K) + "x" + std::to_string(N);
        expect_matches(to_f64(dx), rdx, tolerance(dt, N), tag + " dx");
        expect_accumulated(dw, dw0, rdw, tolerance(DType::kF32, M), tag + " dw");
        expect_accumulated(db, db0, rdb, tolerance(DType::kF32, M), tag + " db");
        dbs.push_back(db);
      }
      EXPECT_EQ(0, std::memcmp(dbs[0].data(), dbs[1].data(), dbs[0].size() * 4)) << "db bits";
    }
}

TEST(LinearBackwardKernel, NullOutputsAreSkipped) {
  Rng rng;
  const int64_t M = 4, K = 6, N = 5;
  const Tensor x = random_tensor(rng, DType::kF32, {M, K}, false).view;
  const Tensor w = random_tensor(rng, DType::kF32, {N, K}, false).view;
  const Tensor dy = random_tensor(rng, DType::kF32, {M, N}, false).view;
  RefOut rdx, rdw, rdb;
  ref::linear_backward(&rdx, &rdw, &rdb, to_f64(dy), to_f64(x), to_f64(w), M, K, N);
  std::vector<float> dw(N * K, 0.0f);
  kernels::cpu::linear_backward(static_cast<float*>(nullptr), dw.data(), nullptr,
                                dy.data_as<float>(), x.data_as<float>(), w.data_as<float>(), M, K,
                                N);
  expect_matches(Vec(dw.begin(), dw.end()), rdw, tolerance(DType::kF32, M), "dw only");
}

struct LceCase {
  DType dt;
  int64_t M, K, V, chunk;
  float eps;
};

class LinearCrossEntropyKernel : public ::testing::TestWithParam<LceCase> {};

TEST_P(LinearCrossEntropyKernel, MatchesReference) {
  const LceCase c = GetParam();
  Rng rng;
  SCOPED_TRACE("seed " + std::to_string(rng.seed()));
  const Tensor x = random_tensor(rng, c.dt, {c.M, c.K}, false, -2, 2).view;
  const Tensor w = random_tensor(rng, c.dt, {c.V, c.K}, false, -2, 2).view;
  std::vector<int32_t> labels(static_cast<size_t>(c.M));
  std::vector<int64_t> labels64(labels.size());
  for (size_t i = 0; i < labels.size(); ++i) {
    labels[i] = i % 5 == 3 ? -100 : static_cast<int32_t>(rng.integer(0, c.V - 1));
    labels64[i] = labels[i];
  }
  RefOut rdx, rdw;
  const double want = ref::linear_cross_entropy(&rdx, &rdw, to_f64(x), to_f64(w), labels64, c.M,
                                                c.K, c.V, -100, c.eps);
  const Vec dw0 = random_f32_vec(rng, c.V * c.K);
  for (int threads : {1, 2}) {
    Tensor dx = poisoned(c.dt, {c.M, c.K});
    std::vector<float> dw(dw0.begin(), dw0.end());
    double got;
    if (c.dt == DType::kF32)
      got = kernels::cpu::linear_cross_entropy(dx.data_as<float>(), dw.data(), x.data_as<float>(),
                                               w.data_as<float>(), labels.data(), c.M, c.K, c.V,
                                               -100, c.eps, c.chunk, threads);
    else
      got = kernels::cpu::linear_cross_entropy(dx.data_as<bf16_t>(), dw.data(), x.data_as<bf16_t>(),
                                               w.data_as<bf16_t>(), labels.data(), c.M, c.K, c.V,
                                               -100, c.eps, c.chunk, threads);
    // The loss is computed from exactly the stored inputs in f32 with an f64 sum: f32
    // tolerance for both dtypes.
    EXPECT_NEAR(got, want, tolerance(DType::kF32, c.K) * (1.0 + std::abs(want))) << "loss";
    expect_matches(to_f64(dx), rdx, tolerance(c.dt, c.V), "dx");
    const int64_t chunk = c.chunk > 0 ? c.chunk : c.M;  // these cases fit one default chunk
    // Where oneDNN has a bf16 matmul (AVX-512 BF16), the logits' gradient is rounded to bf16
    // once so dW's product runs natively too: bf16's tolerance then; f32's where it is widened.
    const DType dw_dt = c.dt != DType::kF32 && kernels::gemm_has_native(c.dt) ? c.dt : DType::kF32;
    expect_accumulated(dw, dw0, rdw, tolerance(dw_dt, c.M), "dw",
                       static_cast<int>((c.M + chunk - 1) / chunk));
  }
}

std::vector<LceCase> lce_cases() {
  std::vector<LceCase> v;
  for (DType dt : {DType::kF32, DType::kBF16})
    for (float eps : {0.0f, 0.1f}) {
      v.push_back({dt, 1, 1, 2, 0, eps});
      v.push_back({dt, 7, 5, 11, 3, eps});
      v.push_back({dt, 40, 33, 257, 0, eps});
      v.push_back({dt, 40, 33, 257, 1, eps});
    }
  v.push_back({DType::kF32, 64, 16, 5003, 17, 0.0f});
  // bf16 gradients packed over the f32 logits in waves of rows: 4 chunks of 16 rows, and one
  // chunk of 45 (the last wave [32, 45) partial).
  v.push_back({DType::kBF16, 64, 16, 5003, 17, 0.0f});
  v.push_back({DType::kBF16, 45, 16, 1003, 0, 0.1f});
  return v;
}

INSTANTIATE_TEST_SUITE_P(Cases, LinearCrossEntropyKernel, ::testing::ValuesIn(lce_cases()),
                         [](const auto& info) {
                           const LceCase& c = info.param;
                           return std::string(dtype_name(c.dt)) + "_" + std::to_string(c.M) + "x" +
                                  std::to_string(c.K) + "x" + std::to_string(c.V) + "_chunk" +
                                  std::to_string(c.chunk) + (c.eps != 0.0f ? "_smooth" : "");
                         });

TEST(LinearCrossEntropyKernel, ChunksAreBalancedAndBounded) {
  EXPECT_EQ(kernels::cross_entropy_chunk_rows(1024, 50257), 205);  // 5 chunks of <= 208 rows
  EXPECT_EQ(kernels::cross_entropy_chunk_rows(1024, 32000), 256);
  EXPECT_EQ(kernels::cross_entropy_chunk_rows(7, 11, 3), 3);
  EXPECT_EQ(kernels::cross_entropy_chunk_rows(64, 11, 17), 16);
  EXPECT_EQ(kernels::cross_entropy_chunk_rows(5, 11, 0), 5);
  EXPECT_EQ(kernels::cross_entropy_chunk_rows(1, 1 << 30, 0), 1);
  for (int64_t M : {1, 2, 17, 1000, 4097})
    for (int64_t req : {0, 1, 3, 16, 5000}) {
      const int64_t c = kernels::cross_entropy_chunk_rows(M, 50257, req);
      const int64_t cap = req > 0 ? req : 208;
      EXPECT_LE(c, std::max<int64_t>(1, std::min(M, cap))) << M << " " << req;
      EXPECT_EQ((M + c - 1) / c, (M + cap - 1) / cap) << M << " " << req;
    }
}

// The per-chunk step with 16-bit gradients packed over the f32 logits (in waves of rows), for
// bf16 and f16 on every CPU: the fused kernel packs only where oneDNN has a 16-bit matmul, so on
// AVX2 the cases above never reach it. Each packed row must be the f32 step's gradient rounded,
// and the losses the same bits; 1 to 3 threads, row counts that end waves early and late.
TEST(LinearCrossEntropyKernel, PackedGradientRowsAreTheF32GradientRounded) {
  Rng rng;
  SCOPED_TRACE("seed " + std::to_string(rng.seed()));
  const int64_t V = 1003;
  for (DType gt : {DType::kBF16, DType::kF16})
    for (int64_t rows : {1, 2, 3, 5, 45, 64})
      for (int threads : {1, 2, 3}) {
        SCOPED_TRACE(std::string(dtype_name(gt)) + " rows " + std::to_string(rows) + " threads " +
                     std::to_string(threads));
        const Vec z0 = random_f32_vec(rng, static_cast<size_t>(rows * V));
        std::vector<int32_t> labels(static_cast<size_t>(rows));
        for (size_t i = 0; i < labels.size(); ++i)
          labels[i] = i % 5 == 3 ? -100 : static_cast<int32_t>(rng.integer(0, V - 1));
        // f16: no smoothing and a scale of 64 keep every gradient above f16's subnormals, where
        // a hardware conversion under flush-to-zero may differ from the scalar one.
        const float eps = gt == DType::kF16 ? 0.0f : 0.1f;
        std::vector<float> zf(z0.size()), zh(z0.size());
        for (size_t i = 0; i < z0.size(); ++i) zf[i] = zh[i] = 4.0f * static_cast<float>(z0[i]);
        std::vector<double> lf(labels.size()), lh(labels.size());
        kernels::cross_entropy_rows(zf.data(), DType::kF32, lf.data(), labels.data(), rows, V, -100,
                                    eps, 64.0f, threads);
        kernels::cross_entropy_rows(zh.data(), gt, lh.data(), labels.data(), rows, V, -100, eps,
                                    64.0f, threads);
        EXPECT_EQ(lf, lh) << "losses";
        const auto* g16 = reinterpret_cast<const uint16_t*>(zh.data());
        int64_t bad = 0, first = -1;
        for (int64_t i = 0; i < rows * V; ++i) {
          const float f = zf[static_cast<size_t>(i)];
          const uint16_t want = gt == DType::kBF16 ? f32_to_bf16(f).bits : f32_to_f16(f).bits;
          if (g16[i] != want && bad++ == 0) first = i;
        }
        EXPECT_EQ(bad, 0) << "first at row " << first / V << ", column " << first % V;
      }
  EXPECT_THROW(kernels::cross_entropy_rows(nullptr, DType::kI32, nullptr, nullptr, 0, 1, -100, 0.0f,
                                           1.0f, 1),
               Error);
}

// Rows in one dtype and the head in another (f16 training storage: f16 rows, the f32 master
// head): the head is used as stored, the rows widened; dx comes back in the rows' dtype.
TEST(LinearCrossEntropyKernel, F16RowsWithAnF32Head) {
  Rng rng;
  SCOPED_TRACE("seed " + std::to_string(rng.seed()));
  const int64_t M = 37, K = 29, V = 301;
  const Tensor x = random_tensor(rng, DType::kF16, {M, K}, false, -2, 2).view;
  const Tensor w = random_tensor(rng, DType::kF32, {V, K}, false, -2, 2).view;
  std::vector<int32_t> labels(static_cast<size_t>(M));
  std::vector<int64_t> labels64(labels.size());
  for (size_t i = 0; i < labels.size(); ++i) {
    labels[i] = i % 7 == 2 ? -100 : static_cast<int32_t>(rng.integer(0, V - 1));
    labels64[i] = labels[i];
  }
  RefOut rdx, rdw;
  const double want =
      ref::linear_cross_entropy(&rdx, &rdw, to_f64(x), to_f64(w), labels64, M, K, V, -100, 0.0f);
  Tensor dx = poisoned(DType::kF16, {M, K});
  std::vector<float> dw(static_cast<size_t>(V * K), 0.0f);
  kernels::LinearCrossEntropyArgs a;
  a.dx = dx.data(), a.dw = dw.data(), a.x = x.data(), a.w = w.data(), a.labels = labels.data();
  a.dtype = DType::kF16, a.w_dtype = DType::kF32, a.M = M, a.K = K, a.V = V, a.chunk_rows = 11;
  a.threads = 2;
  const double got = kernels::linear_cross_entropy(a);
  EXPECT_NEAR(got, want, tolerance(DType::kF32, K) * (1.0 + std::abs(want))) << "loss";
  expect_matches(to_f64(dx), rdx, tolerance(DType::kF16, V), "dx");
  expect_matches(Vec(dw.begin(), dw.end()), rdw, tolerance(DType::kF32, M), "dw");
}

TEST(LinearCrossEntropyKernel, BadLabelThrowsBeforeWritingAndAllIgnoredIsZero) {
  Rng rng;
  const int64_t M = 5, K = 4, V = 7;
  const Tensor x = random_tensor(rng, DType::kF32, {M, K}, false).view;
  const Tensor w = random_tensor(rng, DType::kF32, {V, K}, false).view;
  std::vector<int32_t> labels = {1, 2, 7, 0, 3};  // 7 is outside [0, 7)
  Tensor dx = poisoned(DType::kF32, {M, K});
  std::vector<float> dw(V * K, 0.5f);
  try {
    kernels::cpu::linear_cross_entropy(dx.data_as<float>(), dw.data(), x.data_as<float>(),
                                       w.data_as<float>(), labels.data(), M, K, V);
    ADD_FAILURE() << "no error for a label outside the vocabulary";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("label 7 at row 2"), std::string::npos) << e.what();
  }
  for (int64_t i = 0; i < M * K; ++i) EXPECT_TRUE(std::isnan(dx.data_as<float>()[i]));
  for (float v : dw) EXPECT_EQ(v, 0.5f);
  labels.assign(M, -100);
  const double l =
      kernels::cpu::linear_cross_entropy(dx.data_as<float>(), dw.data(), x.data_as<float>(),
                                         w.data_as<float>(), labels.data(), M, K, V);
  EXPECT_EQ(l, 0.0);
  for (int64_t i = 0; i < M * K; ++i) EXPECT_EQ(dx.data_as<float>()[i], 0.0f);
  for (float v : dw) EXPECT_EQ(v, 0.5f);
}

TEST(NormBackwardKernel, PublicFunctionsMatchReference) {
  Rng rng;
  const int64_t R = 6, C = 45;
  const Tensor x = random_tensor(rng, DType::kF32, {R, C}, false, -1, 2).view;
  const Tensor dy = random_tensor(rng, DType::kF32, {R, C}, false).view;
  const Tensor w = random_tensor(rng, DType::kF32, {C}, false, 0.5, 1.5).view;
  Tensor y = Tensor::empty(DType::kF32, {R, C}), dx = Tensor::empty(DType::kF32, {R, C});
  std::vector<float> mean(R), rstd(R), dw(C, 0.0f), db(C, 0.0f);
  kernels::cpu::layer_norm_forward(y.data_as<float>(), mean.data(), rstd.data(), x.data_as<float>(),
                                   w.data_as<float>(), nullptr, 1e-5f, R, C);
  kernels::cpu::layer_norm_backward(dx.data_as<float>(), dw.data(), db.data(), dy.data_as<float>(),
                                    x.data_as<float>(), w.data_as<float>(), mean.data(),
                                    rstd.data(), nullptr, R, C);
  RefOut rdx, rdw, rdb;
  ref::norm_backward(&rdx, &rdw, &rdb, to_f64(dy), to_f64(x), to_f64(w), nullptr, 1e-5, R, C, false,
                     false);
  expect_matches(to_f64(dx), rdx, tolerance(DType::kF32, C), "ln dx");
  expect_matches(Vec(dw.begin(), dw.end()), rdw, tolerance(DType::kF32, R), "ln dw");
  expect_matches(Vec(db.begin(), db.end()), rdb, tolerance(DType::kF32, R), "ln db");
}

}  // namespace
}  // namespace tboost::testing
