// The op test harness, in the spirit of ggml's test-backend-ops.
//
// Each case is defined once, with a printable name, as a builder that makes fresh random
// inputs (never zeros; a new seed every run, printed on failure and settable with
// TBOOST_TEST_SEED), optionally as strided views, and a float64 reference. The harness makes
// the outputs itself: poisoned with NaN (so every element must be written) and, for strided
// cases, embedded in a larger buffer whose gaps hold a sentinel that must survive (no write
// out of bounds). It then runs the op through the public Operation contract and checks each
// output normwise (||out - ref|| / ||ref|| <= tol) and element by element against the sum of
// the magnitudes of the terms (|out - ref| <= tol * scale). Bad-input cases expect a
// tboost::Error whose message names the problem, and outputs left exactly as poisoned.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "src/kernels/ref/reference.h"
#include "tboost/tboost.h"

namespace tboost::testing {

using kernels::ref::RefOut;
using kernels::ref::Vec;

class Rng {
 public:
  Rng();
  explicit Rng(uint64_t seed) : seed_(seed), gen_(seed) {}
  uint64_t seed() const { return seed_; }
  double uniform(double lo, double hi) {
    return std::uniform_real_distribution<double>(lo, hi)(gen_);
  }
  int64_t integer(int64_t lo, int64_t hi) {  // inclusive
    return std::uniform_int_distribution<int64_t>(lo, hi)(gen_);
  }
  // Uniform in [lo, hi] but never within 1e-3 of zero ("never zeros").
  double nonzero(double lo, double hi);

 private:
  uint64_t seed_;
  std::mt19937_64 gen_;
};

// Storage in which a (possibly strided) view lives; padding holds a sentinel byte pattern.
struct Buffer {
  Tensor storage;  // contiguous, padded
  Tensor view;     // what the op sees
  int64_t pad_last = 0, pad_second = 0;
};

// Random tensor. strided: the last dim is padded by 3 elements and, for rank >= 3, dim -2 by
// 1, so rows are not uniformly strided either.
Buffer random_tensor(Rng& rng, DType dtype, const Shape& shape, bool strided, double lo = -1.0,
                     double hi = 1.0);
// Output: NaN (or integer sentinel) in the view, 0xA5 sentinel bytes in the padding.
Buffer poisoned_output(const TensorDesc& desc, bool strided);
// Integer tensor (ids, positions) with values in [lo, hi].
Tensor random_ints(Rng& rng, DType dtype, const Shape& shape, int64_t lo, int64_t hi);

// Logical (row-major) values of any tensor view, as doubles.
Vec to_f64(const Tensor& t);

// Tolerance against float64 for a dtype and a reduction length (DESIGN.md numerics).
double tolerance(DType dtype, int64_t reduction_len = 1);

// For the direct (non-harness) tests: every element of got within tol·(1 + |want|) of want.
void expect_close(const Tensor& got, const Vec& want, double tol);

struct Expected {
  RefOut ref;
  double tol = 0.0;
};

struct OpCase {
  AnyParam param;
  std::vector<Buffer> inputs;
  bool strided_outputs = false;
  // Given the inputs, the expected value of every output.
  std::function<std::vector<Expected>(const std::vector<Tensor>& inputs)> reference;
  int threads = 0;  // 0: all cores
};

struct CaseSpec {
  std::string name;
  std::function<OpCase(Rng&)> build;
};

struct BadCase {
  AnyParam param;
  std::vector<Buffer> inputs;
  // Outputs to pass; if empty, the harness derives them from a good twin if given.
  std::vector<TensorDesc> outputs;
  std::string expect_substring;  // the error message must contain this
  ErrorCode expect_code = ErrorCode::kInvalidArgument;
  bool check_code = false;
  bool error_at_execute_only = false;  // data-dependent errors (ids out of range)
};

struct BadSpec {
  std::string name;
  std::function<BadCase(Rng&)> build;
};

// Runs a case and records gtest failures.
void run_case(const CaseSpec& spec);
void run_bad_case(const BadSpec& spec);

// False when only Highway's portable targets are left to dispatch to (the suite forced with
// TBOOST_TEST_HWY_TARGET=emu128): their kernels have no non-temporal stores, so the 16 MiB+ cases
// that exist to reach the streamed-output path would repeat the small cases there (at a one-lane
// speed, slowest of all under the sanitizers).
bool streamed_outputs_possible();

// gtest-safe name: letters, digits and '_' only.
std::string test_name(const std::string& name);

}  // namespace tboost::testing

// Declares the parameterized good/bad suites for one op: PREFIX_cases() and PREFIX_bad().
#define TBOOST_OP_TESTS(Suite, cases_fn, bad_fn)                                                 \
  class Suite##Test : public ::testing::TestWithParam<::tboost::testing::CaseSpec> {};           \
  TEST_P(Suite##Test, MatchesFloat64Reference) { ::tboost::testing::run_case(GetParam()); }      \
  INSTANTIATE_TEST_SUITE_P(                                                                      \
      Cases, Suite##Test, ::testing::ValuesIn(cases_fn()),                                       \
      [](const auto& info) { return ::tboost::testing::test_name(info.param.name); });           \
  class Suite##BadTest : public ::testing::TestWithParam<::tboost::testing::BadSpec> {};         \
  TEST_P(Suite##BadTest, RejectsWithClearError) { ::tboost::testing::run_bad_case(GetParam()); } \
  INSTANTIATE_TEST_SUITE_P(                                                                      \
      Bad, Suite##BadTest, ::testing::ValuesIn(bad_fn()),                                        \
      [](const auto& info) { return ::tboost::testing::test_name(info.param.name); })
