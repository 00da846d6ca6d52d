// DType conversions: round to nearest even, NaN/Inf handling, vectorized == scalar.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "tboost/tboost.h"

namespace tboost {
namespace {

float from_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

TEST(DType, Bf16RoundsToNearestEven) {
  EXPECT_EQ(f32_to_bf16(from_bits(0x3f808000u)).bits, 0x3f80);  // tie, even stays
  EXPECT_EQ(f32_to_bf16(from_bits(0x3f818000u)).bits, 0x3f82);  // tie, odd rounds up
  EXPECT_EQ(f32_to_bf16(from_bits(0x3f808001u)).bits, 0x3f81);  // above tie
  EXPECT_EQ(f32_to_bf16(std::numeric_limits<float>::infinity()).bits, 0x7f80);
  const bf16_t nan = f32_to_bf16(from_bits(0x7f800001u));  // signalling NaN, low payload
  EXPECT_TRUE(std::isnan(bf16_to_f32(nan)));
  EXPECT_EQ(f32_to_bf16(from_bits(0x7f7fffffu)).bits, 0x7f80);  // max float rounds to inf
}

TEST(DType, F16RoundTripsAndRounds) {
  for (uint32_t h = 0; h < 0x10000u; ++h) {
    const f16_t v{static_cast<uint16_t>(h)};
    const float f = f16_to_f32(v);
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(f16_to_f32(f32_to_f16(f))));
      continue;
    }
    ASSERT_EQ(f32_to_f16(f).bits, h) << "half bits " << h;
  }
  EXPECT_EQ(f32_to_f16(65520.0f).bits, 0x7c00);  // rounds to inf
  EXPECT_EQ(f32_to_f16(65504.0f).bits, 0x7bff);
  EXPECT_EQ(f32_to_f16(1.0f + std::ldexp(1.0f, -11)).bits, 0x3c00);  // tie to even
  EXPECT_EQ(f32_to_f16(std::ldexp(1.0f, -25)).bits, 0x0000);         // tie to even (0)
  EXPECT_EQ(f32_to_f16(std::ldexp(3.0f, -25)).bits, 0x0002);         // tie, rounds up to even
}

TEST(DType, VectorizedConvertMatchesScalar) {
  std::mt19937 gen(123);
  std::uniform_real_distribution<float> dist(-70000.0f, 70000.0f);
  const int64_t n = 1037;  // not a vector multiple
  std::vector<float> src(static_cast<size_t>(n));
  for (auto& v : src) v = dist(gen) * (gen() % 2 ? 1e-6f : 1.0f);
  src[3] = std::nanf("");
  src[4] = std::numeric_limits<float>::infinity();
  std::vector<bf16_t> b(static_cast<size_t>(n));
  std::vector<f16_t> h(static_cast<size_t>(n));
  convert(b.data(), DType::kBF16, src.data(), DType::kF32, n);
  convert(h.data(), DType::kF16, src.data(), DType::kF32, n);
  for (size_t i = 0; i < src.size(); ++i) {
    if (std::isnan(src[i])) {
      EXPECT_TRUE(std::isnan(bf16_to_f32(b[i])));
      EXPECT_TRUE(std::isnan(f16_to_f32(h[i])));
      continue;
    }
    EXPECT_EQ(b[i].bits, f32_to_bf16(src[i]).bits) << i;
    EXPECT_EQ(h[i].bits, f32_to_f16(src[i]).bits) << i << " " << src[i];
  }
  std::vector<float> back(static_cast<size_t>(n));
  convert(back.data(), DType::kF32, b.data(), DType::kBF16, n);
  for (size_t i = 0; i < src.size(); ++i)
    if (!std::isnan(src[i])) {
      EXPECT_EQ(back[i], bf16_to_f32(b[i]));
    }
}

TEST(DType, IntegerConversionsSaturateAndRound) {
  const float src[] = {1.5f, 2.5f, -300.0f, 300.0f, std::nanf("")};
  int8_t out[5];
  convert(out, DType::kI8, src, DType::kF32, 5);
  EXPECT_EQ(out[0], 2);
  EXPECT_EQ(out[1], 2);
  EXPECT_EQ(out[2], -128);
  EXPECT_EQ(out[3], 127);
  EXPECT_EQ(out[4], 0);
}

TEST(DType, ParseNamesAndRejectsUnknown) {
  EXPECT_EQ(parse_dtype("bf16"), DType::kBF16);
  EXPECT_EQ(parse_dtype("float32"), DType::kF32);
  try {
    parse_dtype("fp8");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("unknown dtype 'fp8'"), std::string::npos);
  }
}

}  // namespace
}  // namespace tboost
