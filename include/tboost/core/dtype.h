// DType: the element types tboost stores, and scalar + vectorized conversions.
//
// Floating storage types are f32, f16 (IEEE binary16) and bf16; arithmetic is always f32 (or
// f64 in reference kernels). Narrowing conversions round to nearest, ties to even; NaN stays
// NaN (quiet) and never becomes Inf.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

namespace tboost {

enum class DType : uint8_t { kF32, kF16, kBF16, kI8, kU8, kI32, kI64 };

inline constexpr DType kAllDTypes[] = {DType::kF32, DType::kF16, DType::kBF16, DType::kI8,
                                       DType::kU8,  DType::kI32, DType::kI64};

size_t dtype_size(DType t);
const char* dtype_name(DType t);
// Parses "f32", "float32", "bf16", ...; throws tboost::Error naming the text otherwise.
DType parse_dtype(std::string_view text);
inline bool is_floating(DType t) {
  return t == DType::kF32 || t == DType::kF16 || t == DType::kBF16;
}

// 16-bit storage types. Plain structs so they cannot be mixed up with integers.
struct bf16_t {
  uint16_t bits;
};
struct f16_t {
  uint16_t bits;
};

inline float bf16_to_f32(bf16_t v) {
  uint32_t u = static_cast<uint32_t>(v.bits) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline bf16_t f32_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return bf16_t{static_cast<uint16_t>((u >> 16) | 0x40)};
  u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest, ties to even
  return bf16_t{static_cast<uint16_t>(u >> 16)};
}

float f16_to_f32(f16_t v);
f16_t f32_to_f16(float f);

template <class T>
struct dtype_of;
template <>
struct dtype_of<float> {
  static constexpr DType value = DType::kF32;
};
template <>
struct dtype_of<f16_t> {
  static constexpr DType value = DType::kF16;
};
template <>
struct dtype_of<bf16_t> {
  static constexpr DType value = DType::kBF16;
};
template <>
struct dtype_of<int8_t> {
  static constexpr DType value = DType::kI8;
};
template <>
struct dtype_of<uint8_t> {
  static constexpr DType value = DType::kU8;
};
template <>
struct dtype_of<int32_t> {
  static constexpr DType value = DType::kI32;
};
template <>
struct dtype_of<int64_t> {
  static constexpr DType value = DType::kI64;
};

// Scalar load/store through f32, for generic code paths.
inline float to_f32(float v) { return v; }
inline float to_f32(bf16_t v) { return bf16_to_f32(v); }
inline float to_f32(f16_t v) { return f16_to_f32(v); }
template <class T>
inline T from_f32(float v);
template <>
inline float from_f32<float>(float v) {
  return v;
}
template <>
inline bf16_t from_f32<bf16_t>(float v) {
  return f32_to_bf16(v);
}
template <>
inline f16_t from_f32<f16_t>(float v) {
  return f32_to_f16(v);
}

// Vectorized conversion of n contiguous elements between any two dtypes (Highway, runtime
// dispatched). Float -> integer rounds to nearest even and saturates; NaN -> 0.
void convert(void* dst, DType dst_type, const void* src, DType src_type, int64_t n);

// Reads one element of any dtype as double (for tests and reference code).
double load_as_f64(const void* base, DType t, int64_t index);
// Writes one element of any dtype from double (rounds as `convert` does).
void store_from_f64(void* base, DType t, int64_t index, double v);

}  // namespace tboost
