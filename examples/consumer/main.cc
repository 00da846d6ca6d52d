// Uses only the installed headers: creates a PRENORM RmsNorm, runs it, checks one value.
#include <tboost/tboost.h>

#include <cmath>
#include <cstdio>

int main() {
  tboost::Context ctx;
  auto op = tboost::create_operation(
      tboost::ops::RmsNormParam{.epsilon = 1e-6f, .layer = tboost::ops::NormLayer::kPreNorm});
  tboost::Tensor x = tboost::Tensor::empty(tboost::DType::kF32, {2, 4});
  tboost::Tensor r = tboost::Tensor::empty(tboost::DType::kF32, {2, 4});
  tboost::Tensor w = tboost::Tensor::empty(tboost::DType::kF32, {4});
  for (int i = 0; i < 8; ++i) {
    x.data_as<float>()[i] = 1.0f + static_cast<float>(i);
    r.data_as<float>()[i] = 1.0f;
  }
  for (int i = 0; i < 4; ++i) w.data_as<float>()[i] = 1.0f;
  tboost::Tensor y = tboost::Tensor::empty(tboost::DType::kF32, {2, 4});
  tboost::Tensor sum = tboost::Tensor::empty(tboost::DType::kF32, {2, 4});
  tboost::run_operation(*op, {{x, r, w}, {y, sum}}, ctx);
  // Row 0: sum = 2,3,4,5; rms = sqrt(54/4); y[0] = 2 / rms.
  const double expect = 2.0 / std::sqrt(54.0 / 4.0);
  if (std::abs(y.data_as<float>()[0] - expect) > 1e-5 || sum.data_as<float>()[3] != 5.0f) {
    std::fprintf(stderr, "consumer: wrong result %f vs %f\n", y.data_as<float>()[0], expect);
    return 1;
  }
  std::printf("consumer: ok (%s)\n", tboost::Context::kernel_isa().c_str());
  return 0;
}
