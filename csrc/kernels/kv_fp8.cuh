// FP8 KV-cache element formats (device code only): OCP e4m3fn and e5m2 stored as bytes, encoded
// and decoded with integer / float arithmetic only, so the same code runs on SM70, which has
// no FP8 instructions (no __nv_fp8 intrinsics anywhere).
//
// Decoding goes to "raw" FP16 bits with two or three integer ops per pair of bytes:
//  - e5m2 is the top byte of an FP16 (same exponent bias): the value itself, factor 1;
//  - e4m3fn's sign/exponent/mantissa shifted into FP16's fields give the value times 2^-8 (bias
//    7 against 15), subnormals included; the kernels fold the 2^8 (kRawFactor) into their scales.
// A cache holds x / scale (per layer, per K and V); readers multiply by scale * kRawFactor.
#pragma once

#include "kernels/type_convert.cuh"

namespace vllm_volta {

// Cache element tags: the paged kernels are templates on T (queries, outputs) and C, the
// cache element, which is T itself or one of these.
struct Fp8E4M3 {
  static constexpr bool kE4M3 = true;
  static constexpr float kMax = 448.f;       // largest finite value
  static constexpr float kRawFactor = 256.f;  // value = raw FP16 decode * kRawFactor
};
struct Fp8E5M2 {
  static constexpr bool kE4M3 = false;
  static constexpr float kMax = 57344.f;
  static constexpr float kRawFactor = 1.f;
};

template <typename C>
struct is_fp8 {
  static constexpr bool value = false;
};
template <>
struct is_fp8<Fp8E4M3> {
  static constexpr bool value = true;
};
template <>
struct is_fp8<Fp8E5M2> {
  static constexpr bool value = true;
};

template <typename A, typename B>
struct same_type {
  static constexpr bool value = false;
};
template <typename A>
struct same_type<A, A> {
  static constexpr bool value = true;
};

// What a cache element is stored as: T, or a byte for the FP8 formats.
template <typename C>
struct CacheStorage {
  using type = C;
};
template <>
struct CacheStorage<Fp8E4M3> {
  using type = unsigned char;
};
template <>
struct CacheStorage<Fp8E5M2> {
  using type = unsigned char;
};

// Two FP8 bytes (bytes `hi` * 2 and `hi` * 2 + 1 of w, hi = 0 or 1) -> the raw FP16 pair (as the
// 32-bit image of a __half2: first byte in the low half).
template <typename Fmt, int HI>
__device__ __forceinline__ unsigned fp8x2_to_raw_half2(unsigned w) {
  // Each byte to the top of its 16-bit half (the low byte of each half zero).
  const unsigned t = __byte_perm(w, 0u, HI ? 0x3424u : 0x1404u);
  if constexpr (!Fmt::kE4M3) {
    return t;
  } else {
    const unsigned a = t & 0x7F007F00u;  // exponent + mantissa, to go 1 bit down into FP16's fields
    // 0x7F / 0xFF are e4m3fn's NaNs (the format has no infinities): +0x0100 carries into bit 15 of
    // exactly those halves (never across), which then get FP16's all-ones exponent.
    const unsigned nan = (((a + 0x01000100u) >> 15) & 0x00010001u) * 0x7C00u;
    return (t & 0x80008000u) | (a >> 1) | nan;
  }
}

// One FP8 byte -> the value divided by Fmt::kRawFactor, as a float.
template <typename Fmt>
__device__ __forceinline__ float fp8_to_raw_float(unsigned char b) {
  const unsigned h2 = fp8x2_to_raw_half2<Fmt, 0>(static_cast<unsigned>(b));
  return __half2float(__ushort_as_half(static_cast<unsigned short>(h2 & 0xFFFFu)));
}

// float -> FP8 byte: round to nearest even, saturating to +-Fmt::kMax (infinities too); NaN ->
// the format's NaN (0x7F with the sign).
template <typename Fmt>
__device__ __forceinline__ unsigned char float_to_fp8(float x) {
  constexpr bool kE4M3 = Fmt::kE4M3;
  constexpr int kMantBits = kE4M3 ? 3 : 2;
  constexpr int kBias = kE4M3 ? 7 : 15;
  constexpr float kMinNormal = kE4M3 ? 0.015625f : 6.103515625e-05f;  // 2^-6, 2^-14
  constexpr float kSubnormalSteps = kE4M3 ? 512.f : 65536.f;           // 1 / smallest subnormal
  constexpr unsigned kMaxCode = kE4M3 ? 0x7Eu : 0x7Bu;
  const unsigned bits = __float_as_uint(x);
  const unsigned sign = (bits >> 24) & 0x80u;
  const float a = fabsf(x);
  if (a != a) return static_cast<unsigned char>(sign | 0x7Fu);
  if (a >= Fmt::kMax) return static_cast<unsigned char>(sign | kMaxCode);
  unsigned code;
  if (a < kMinNormal) {
    code = static_cast<unsigned>(__float2int_rn(a * kSubnormalSteps));  // exact scaling, RNE; 2^-6 -> code 8
  } else {
    // Round the float's exponent|mantissa word to kMantBits mantissa bits (ties to even; a
    // carry moves into the exponent), then rebias the exponent.
    constexpr int kShift = 23 - kMantBits;
    const unsigned ab = bits & 0x7FFFFFFFu;
    const unsigned r = (ab + ((1u << (kShift - 1)) - 1u) + ((ab >> kShift) & 1u)) >> kShift;
    code = r - (static_cast<unsigned>(127 - kBias) << kMantBits);
  }
  return static_cast<unsigned char>(sign | code);
}

}  // namespace vllm_volta
