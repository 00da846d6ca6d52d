// DType names, sizes, scalar f16 conversion and the vectorized `convert` (Highway).
// clang-format off: Highway's per-target re-inclusion needs this exact order.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "src/core/dtype.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
// clang-format on

#include "hwy/highway.h"
#include "src/kernels/cpu/hwy_util-inl.h"
#include "tboost/core/dtype.h"

HWY_BEFORE_NAMESPACE();
namespace tboost::kernels::HWY_NAMESPACE {

template <class TD, class TS>
void ConvertFloat(TD* dst, const TS* src, int64_t n) {
  const hn::ScalableTag<float> d;
  const int64_t L = static_cast<int64_t>(hn::Lanes(d));
  int64_t i = 0;
  for (; i + L <= n; i += L) StoreF(d, LoadF(d, src + i), dst + i);
  if (i < n)
    StoreTailF(d, LoadTailF(d, src + i, static_cast<size_t>(n - i)), dst + i,
               static_cast<size_t>(n - i));
}

void ConvertFloatDispatch(void* dst, DType dt, const void* src, DType st, int64_t n) {
  auto go = [&](auto* d) {
    switch (st) {
      case DType::kF32:
        return ConvertFloat(d, static_cast<const float*>(src), n);
      case DType::kBF16:
        return ConvertFloat(d, static_cast<const bf16_t*>(src), n);
      default:
        return ConvertFloat(d, static_cast<const f16_t*>(src), n);
    }
  };
  switch (dt) {
    case DType::kF32:
      return go(static_cast<float*>(dst));
    case DType::kBF16:
      return go(static_cast<bf16_t*>(dst));
    default:
      return go(static_cast<f16_t*>(dst));
  }
}

}  // namespace tboost::kernels::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include <cmath>
#include <limits>

#include "tboost/core/error.h"

namespace tboost {
namespace kernels {
HWY_EXPORT(ConvertFloatDispatch);
static void convert_float(void* dst, DType dt, const void* src, DType st, int64_t n) {
  HWY_DYNAMIC_DISPATCH(ConvertFloatDispatch)(dst, dt, src, st, n);
}
}  // namespace kernels

size_t dtype_size(DType t) {
  switch (t) {
    case DType::kF32:
      return 4;
    case DType::kF16:
      return 2;
    case DType::kBF16:
      return 2;
    case DType::kI8:
      return 1;
    case DType::kU8:
      return 1;
    case DType::kI32:
      return 4;
    case DType::kI64:
      return 8;
  }
  TBOOST_THROW(ErrorCode::kInvalidArgument, "unknown dtype code ", static_cast<int>(t));
}

const char* dtype_name(DType t) {
  switch (t) {
    case DType::kF32:
      return "f32";
    case DType::kF16:
      return "f16";
    case DType::kBF16:
      return "bf16";
    case DType::kI8:
      return "i8";
    case DType::kU8:
      return "u8";
    case DType::kI32:
      return "i32";
    case DType::kI64:
      return "i64";
  }
  return "unknown";
}

DType parse_dtype(std::string_view s) {
  if (s == "f32" || s == "float32" || s == "float") return DType::kF32;
  if (s == "f16" || s == "float16" || s == "half") return DType::kF16;
  if (s == "bf16" || s == "bfloat16") return DType::kBF16;
  if (s == "i8" || s == "int8") return DType::kI8;
  if (s == "u8" || s == "uint8") return DType::kU8;
  if (s == "i32" || s == "int32") return DType::kI32;
  if (s == "i64" || s == "int64") return DType::kI64;
  TBOOST_THROW(ErrorCode::kInvalidArgument, "unknown dtype '", s,
               "' (expected one of f32, f16, bf16, i8, u8, i32, i64)");
}

float f16_to_f32(f16_t v) {
  const uint32_t sign = static_cast<uint32_t>(v.bits & 0x8000u) << 16;
  uint32_t exp = (v.bits >> 10) & 0x1fu;
  uint32_t mant = v.bits & 0x3ffu;
  uint32_t u;
  if (exp == 0x1f) {
    u = sign | 0x7f800000u | (mant << 13);
  } else if (exp == 0) {
    if (mant == 0) {
      u = sign;
    } else {  // subnormal: normalize
      int e = -1;
      do {
        ++e;
        mant <<= 1;
      } while ((mant & 0x400u) == 0);
      u = sign | (static_cast<uint32_t>(127 - 15 - e) << 23) | ((mant & 0x3ffu) << 13);
    }
  } else {
    u = sign | ((exp + 112u) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

f16_t f32_to_f16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  const uint32_t abs = u & 0x7fffffffu;
  if (abs > 0x7f800000u) return f16_t{static_cast<uint16_t>(sign | 0x7e00u)};   // NaN
  if (abs >= 0x477ff000u) return f16_t{static_cast<uint16_t>(sign | 0x7c00u)};  // >= 65520: inf
  if (abs < 0x38800000u) {  // result subnormal or zero: round at 2^-24 granularity
    float a;
    std::memcpy(&a, &abs, 4);
    const float scaled = std::nearbyint(a * 16777216.0f);  // ties to even (default mode)
    return f16_t{static_cast<uint16_t>(sign | static_cast<uint16_t>(scaled))};
  }
  const uint32_t rounded = abs + 0xfffu + ((abs >> 13) & 1u);
  return f16_t{static_cast<uint16_t>(sign | ((rounded - 0x38000000u) >> 13))};
}

double load_as_f64(const void* base, DType t, int64_t i) {
  switch (t) {
    case DType::kF32:
      return static_cast<const float*>(base)[i];
    case DType::kF16:
      return f16_to_f32(static_cast<const f16_t*>(base)[i]);
    case DType::kBF16:
      return bf16_to_f32(static_cast<const bf16_t*>(base)[i]);
    case DType::kI8:
      return static_cast<const int8_t*>(base)[i];
    case DType::kU8:
      return static_cast<const uint8_t*>(base)[i];
    case DType::kI32:
      return static_cast<const int32_t*>(base)[i];
    case DType::kI64:
      return static_cast<double>(static_cast<const int64_t*>(base)[i]);
  }
  return 0;
}

template <class I>
static I saturate(double v) {
  if (std::isnan(v)) return 0;
  const double r = std::nearbyint(v);
  if (r <= static_cast<double>(std::numeric_limits<I>::min())) return std::numeric_limits<I>::min();
  if (r >= static_cast<double>(std::numeric_limits<I>::max())) return std::numeric_limits<I>::max();
  return static_cast<I>(r);
}

// double -> float rounded to odd: a result that is not exact gets its last bit set, so a
// second rounding to bf16/f16 (fewer bits) gives the correctly rounded value of v, not a
// double-rounded one (i32 16842753 -> bf16 must be 16908288, not 16777216).
static float to_f32_round_odd(double v) {
  float f = static_cast<float>(v);
  if (!std::isfinite(f) || static_cast<double>(f) == v) return f;
  if (std::abs(static_cast<double>(f)) > std::abs(v)) f = std::nextafter(f, 0.0f);
  uint32_t u;
  std::memcpy(&u, &f, 4);
  u |= 1u;
  std::memcpy(&f, &u, 4);
  return f;
}

void store_from_f64(void* base, DType t, int64_t i, double v) {
  switch (t) {
    case DType::kF32:
      static_cast<float*>(base)[i] = static_cast<float>(v);
      return;
    case DType::kF16:
      static_cast<f16_t*>(base)[i] = f32_to_f16(to_f32_round_odd(v));
      return;
    case DType::kBF16:
      static_cast<bf16_t*>(base)[i] = f32_to_bf16(to_f32_round_odd(v));
      return;
    case DType::kI8:
      static_cast<int8_t*>(base)[i] = saturate<int8_t>(v);
      return;
    case DType::kU8:
      static_cast<uint8_t*>(base)[i] = saturate<uint8_t>(v);
      return;
    case DType::kI32:
      static_cast<int32_t*>(base)[i] = saturate<int32_t>(v);
      return;
    case DType::kI64:
      static_cast<int64_t*>(base)[i] = saturate<int64_t>(v);
      return;
  }
}

void convert(void* dst, DType dt, const void* src, DType st, int64_t n) {
  TBOOST_CHECK(n >= 0, "negative element count ", n);
  if (n == 0) return;
  TBOOST_CHECK_CODE(dst && src, ErrorCode::kNullData, "convert: null ",
                    dst ? "source" : "destination");
  if (dt == st) {
    std::memcpy(dst, src, static_cast<size_t>(n) * dtype_size(dt));
    return;
  }
  if (is_floating(dt) && is_floating(st)) {
    kernels::convert_float(dst, dt, src, st, n);
    return;
  }
  // Integer paths are rare (ids, casts in graphs); a scalar loop through double is exact for
  // every value these types hold except i64 beyond 2^53, which no transformer tensor holds.
  for (int64_t i = 0; i < n; ++i) store_from_f64(dst, dt, i, load_as_f64(src, st, i));
}

}  // namespace tboost
#endif  // HWY_ONCE
