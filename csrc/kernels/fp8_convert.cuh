// float8_e4m3fn -> float16 with integer bit operations (device code only): SM70 and newer. SM70
// and SM75 have no FP8 conversion instruction, and the GPUs that do (SM89+) convert the same way
// for the same result, so one code path serves all.
//
// e4m3fn: sign, 4 exponent bits (bias 7), 3 mantissa bits; no infinities; S.1111.111 is NaN.
// float16: sign, 5 exponent bits (bias 15), 10 mantissa bits. Placing the 7 magnitude bits of a
// byte right below a half's sign bit (shifted right by one) gives the half with exponent field
// 0eeee and mantissa mmm0000000, which is the e4m3fn value times 2^-8 for every byte, normal
// (2^(e-15) vs 2^(e-7)) and denormal (2^-14 * m/8 vs 2^-6 * m/8) alike. Two bytes go into one
// half2 per operation; the factor 2^8 is one half2 multiply (exact: a power of two within
// range), or is folded into a scale applied later (the "raw" form).
#pragma once

#include <cuda_fp16.h>

#ifdef __CUDACC_RTC__
using uint32_t = unsigned int;  // NVRTC has no <cstdint>
#else
#include <cstdint>
#endif

namespace vllm_volta {

// The factor between an e4m3fn value and its raw half (kFp8RawScale * raw = value).
constexpr float kFp8RawScale = 256.f;

// Bytes 0, 1 (lo) and 2, 3 (hi) of w as raw half2s: each half = the e4m3fn value / 256, exactly.
// A NaN byte reads as 480 / 256 (S.01111.1110000000); fp8x4_to_half2x2 turns it back into NaN.
__device__ __forceinline__ void fp8x4_to_half2x2_raw(uint32_t w, uint32_t& lo, uint32_t& hi) {
  // Each byte into the high byte of its 16-bit lane, zeros below.
  const uint32_t a = __byte_perm(w, 0u, 0x1404);
  const uint32_t b = __byte_perm(w, 0u, 0x3424);
  // Magnitude one bit right (exponent 0eeee, mantissa mmm0000000), the sign where it was.
  lo = ((a >> 1) & 0x3F803F80u) | (a & 0x80008000u);
  hi = ((b >> 1) & 0x3F803F80u) | (b & 0x80008000u);
}

__device__ __forceinline__ __half2 as_half2(uint32_t bits) {
  __half2 h;
  *reinterpret_cast<uint32_t*>(&h) = bits;
  return h;
}

__device__ __forceinline__ uint32_t half2_bits(__half2 h) { return *reinterpret_cast<uint32_t*>(&h); }

// One raw half2 -> the e4m3fn values as a half2, exactly (NaN bytes give NaN).
__device__ __forceinline__ __half2 fp8_raw_to_half2(uint32_t raw) {
  const __half2 value = __hmul2(as_half2(raw), __float2half2_rn(kFp8RawScale));
  // Raw magnitude 0x3F80 only comes from S.1111.111 (the value 480 would be, which e4m3fn lacks).
  const uint32_t nan_lanes = __vcmpeq2(raw & 0x7FFF7FFFu, 0x3F803F80u);
  return as_half2(half2_bits(value) | (nan_lanes & 0x7E007E00u));
}

// Bytes 0, 1 (lo) and 2, 3 (hi) of w as half2s of their exact e4m3fn values.
__device__ __forceinline__ void fp8x4_to_half2x2(uint32_t w, __half2& lo, __half2& hi) {
  uint32_t rlo, rhi;
  fp8x4_to_half2x2_raw(w, rlo, rhi);
  lo = fp8_raw_to_half2(rlo);
  hi = fp8_raw_to_half2(rhi);
}

// 16 e4m3fn bytes -> 16 floats, each the value / 256 (exact; finite bytes only: see above).
__device__ __forceinline__ void fp8x16_to_float_raw(const uint4& w, float (&f)[16]) {
  const uint32_t words[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    uint32_t lo, hi;
    fp8x4_to_half2x2_raw(words[i], lo, hi);
    const float2 a = __half22float2(as_half2(lo));
    const float2 b = __half22float2(as_half2(hi));
    f[4 * i] = a.x;
    f[4 * i + 1] = a.y;
    f[4 * i + 2] = b.x;
    f[4 * i + 3] = b.y;
  }
}

}  // namespace vllm_volta
