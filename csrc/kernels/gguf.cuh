// GGUF weights kept in their blocks (device code only): SM70 and newer, FP16 activations and
// outputs, FP32 accumulation, no BF16 or SM80-only instructions.
//
// A weight [N, K] is N rows of K / block_elems GGUF blocks each (row_bytes = that times
// block_bytes), exactly as the file stores it (layouts: vllm_volta/model_executor/model_loader/
// gguf_dequant.py). Every type is walked in steps of 256 weights of a row: one K-quant
// super-block, or eight 32-weight blocks. Lane l of a warp owns weights [8 l, 8 l + 8) of each
// step, which always share one scale (sub-blocks are 16 or 32 wide), so a lane decodes 8 small
// integers q and one (scale, offset): w = scale * q - offset. The products with x are then
// summed on the integers and scaled once per sub-block:
//   sum_i w_i x_i = scale * sum_i q_i x_i - offset * sum_i x_i.
// Loads: the K-quants Q4_K / Q5_K read their 8 quant bytes as one 8-byte load (their blocks are
// multiples of 16 bytes); Q6_K (210-byte), Q8_0 (34) and Q4_0 (18) blocks are only 2-byte
// aligned in a row, so those read 16-bit words.
//  gguf_gemv_kernel<M, R, B>: out[m][n] = sum_k x[m][k] W[n][k] (+ bias[n]) for M <= 8 decode
//    rows; R (kGgufRowsPerWarp) weight rows per warp, kGgufGemvWarps warps per block, warp-shuffle
//    reduction. Integers become floats through their exponent bits (PRMT + FADD), not I2F.
//  gguf_dequantize_kernel<B>: out [N, K] float16 = W, 8 weights (one 16-byte store) per thread,
//    each rounded once from float32.
#pragma once

#include <cuda_fp16.h>

#include "kernels/programmatic_launch.cuh"
#include "kernels/reduce.cuh"

#ifdef __CUDACC_RTC__
using int64_t = long long;
using uint32_t = unsigned int;
using uint16_t = unsigned short;
using uint8_t = unsigned char;
#else
#include <cstdint>
#endif

namespace vllm_volta {

constexpr int kGgufGemvMaxRows = 8;
constexpr int kGgufGemvWarps = 4;      // warps per block of the gemv
constexpr int kGgufRowsPerWarp = 2;    // output features per warp (they share x's loads)
constexpr int kGgufStep = 256;     // weights of a row per warp step

// GGML type ids (gguf.GGMLQuantizationType) of the types kept quantized.
constexpr int kGgmlQ4_0 = 2;
constexpr int kGgmlQ8_0 = 8;
constexpr int kGgmlQ4_K = 12;
constexpr int kGgmlQ5_K = 13;
constexpr int kGgmlQ6_K = 14;

namespace gguf {

__device__ __forceinline__ float half_bits(uint32_t bits) {
  return __half2float(__ushort_as_half(static_cast<unsigned short>(bits & 0xFFFFu)));
}

__device__ __forceinline__ uint32_t byte_of(uint32_t word, int i) { return (word >> (8 * i)) & 0xFFu; }

// Small integers to float without I2F (a conversion-pipe instruction, 1/8 of the FP32 rate on
// SM90): 2^23 + b has b as its low mantissa bits, so one byte permute and one FADD give b exactly.
constexpr float kTwo23 = 8388608.f;
__device__ __forceinline__ float int_bits_to_float(uint32_t small) {
  return __int_as_float(static_cast<int>(0x4B000000u | small)) - kTwo23;
}

// The 4 bytes of v as floats 0..255 (one PRMT and one FADD each).
__device__ __forceinline__ void bytes_to_float(uint32_t v, float* f) {
#pragma unroll
  for (int i = 0; i < 4; ++i) f[i] = __int_as_float(static_cast<int>(__byte_perm(v, 0x4B000000u, 0x7440 | i))) - kTwo23;
}

__device__ __forceinline__ void bytes8_to_float(uint32_t lo, uint32_t hi, float (&q)[8]) {
  bytes_to_float(lo, q);
  bytes_to_float(hi, q + 4);
}

// 8 bytes at p (8-byte aligned) as two little-endian words.
__device__ __forceinline__ uint2 load8_aligned(const uint8_t* p) { return __ldg(reinterpret_cast<const uint2*>(p)); }

// 8 bytes at p (2-byte aligned) as two little-endian words.
__device__ __forceinline__ uint2 load8_u16(const uint8_t* p) {
  const unsigned short* h = reinterpret_cast<const unsigned short*>(p);
  const uint32_t a = __ldg(h), b = __ldg(h + 1), c = __ldg(h + 2), d = __ldg(h + 3);
  return make_uint2(a | (b << 16), c | (d << 16));
}

__device__ __forceinline__ uint32_t load_u16(const uint8_t* p) {
  return __ldg(reinterpret_cast<const unsigned short*>(p));
}

__device__ __forceinline__ uint32_t load_u32(const uint8_t* p) {
  return __ldg(reinterpret_cast<const unsigned int*>(p));
}

// The 6-bit (scale, min) of sub-block j (0..7) of Q4_K / Q5_K from the 12 bytes at p (4-aligned),
// without branches (lanes of one warp hold different j).
__device__ __forceinline__ void k_scale_min(const uint8_t* p, int j, float& sc, float& mn) {
  const uint32_t s0 = load_u32(p), s1 = load_u32(p + 4), s2 = load_u32(p + 8);
  const int i = j & 3;
  const uint32_t b0 = byte_of(s0, i), b1 = byte_of(s1, i), b2 = byte_of(s2, i);
  const bool low = j < 4;
  const uint32_t s = low ? (b0 & 63u) : ((b2 & 15u) | ((b0 >> 6) << 4));
  const uint32_t m = low ? (b1 & 63u) : ((b2 >> 4) | ((b1 >> 6) << 4));
  sc = int_bits_to_float(s);
  mn = int_bits_to_float(m);
}

}  // namespace gguf

// Each block type: kBlockElems, kBlockBytes, lane_valid(nblocks, step, lane) (false where the
// lane's 8 weights lie past the row's end: only the 32-weight types, when K is not a multiple of
// 256) and load(row, step, lane, q, scale, offset), which decodes the lane's 8 weights of `step`:
// w_i = scale * q_i - offset, with q_i small non-negative integers.

// Q4_K: d, dmin f16; scales u8[12]; qs u8[128] (4 chunks of 32: low nibbles sub-block 2c, high 2c+1).
struct GgufQ4K {
  static constexpr int kBlockElems = 256, kBlockBytes = 144;
  __device__ __forceinline__ static bool lane_valid(int, int, int) { return true; }
  __device__ __forceinline__ static void load(const uint8_t* row, int step, int lane, float (&q)[8], float& scale,
                                              float& offset) {
    const uint8_t* b = row + step * kBlockBytes;  // rows are < 2^31 bytes
    const int j = lane >> 2, pos = (lane & 3) * 8;
    const uint32_t dm = gguf::load_u32(b);
    float sc, mn;
    gguf::k_scale_min(b + 4, j, sc, mn);
    const uint2 qs = gguf::load8_aligned(b + 16 + 32 * (j >> 1) + pos);
    const int shift = (j & 1) * 4;
    gguf::bytes8_to_float((qs.x >> shift) & 0x0F0F0F0Fu, (qs.y >> shift) & 0x0F0F0F0Fu, q);
    scale = gguf::half_bits(dm) * sc;
    offset = gguf::half_bits(dm >> 16) * mn;
  }
};

// Q5_K: as Q4_K plus qh u8[32] before qs: the fifth bit of sub-block j, element e is bit j of qh[e].
struct GgufQ5K {
  static constexpr int kBlockElems = 256, kBlockBytes = 176;
  __device__ __forceinline__ static bool lane_valid(int, int, int) { return true; }
  __device__ __forceinline__ static void load(const uint8_t* row, int step, int lane, float (&q)[8], float& scale,
                                              float& offset) {
    const uint8_t* b = row + step * kBlockBytes;  // rows are < 2^31 bytes
    const int j = lane >> 2, pos = (lane & 3) * 8;
    const uint32_t dm = gguf::load_u32(b);
    float sc, mn;
    gguf::k_scale_min(b + 4, j, sc, mn);
    const uint2 qh = gguf::load8_aligned(b + 16 + pos);
    const uint2 qs = gguf::load8_aligned(b + 48 + 32 * (j >> 1) + pos);
    const int shift = (j & 1) * 4;
    const uint32_t lo = ((qs.x >> shift) & 0x0F0F0F0Fu) | (((qh.x >> j) & 0x01010101u) << 4);
    const uint32_t hi = ((qs.y >> shift) & 0x0F0F0F0Fu) | (((qh.y >> j) & 0x01010101u) << 4);
    gguf::bytes8_to_float(lo, hi, q);
    scale = gguf::half_bits(dm) * sc;
    offset = gguf::half_bits(dm >> 16) * mn;
  }
};

// Q6_K: ql u8[128], qh u8[64], scales int8[16], d f16. Half h (128 weights) = 4 runs of 32: run r,
// element l takes the low nibble (r < 2) or high nibble (r >= 2) of ql[64 h + 32 (r & 1) + l] and
// bits 2r, 2r + 1 of qh[32 h + l]; w = d * scale[sub-block of 16] * (q - 32).
struct GgufQ6K {
  static constexpr int kBlockElems = 256, kBlockBytes = 210;
  __device__ __forceinline__ static bool lane_valid(int, int, int) { return true; }
  __device__ __forceinline__ static void load(const uint8_t* row, int step, int lane, float (&q)[8], float& scale,
                                              float& offset) {
    const uint8_t* b = row + step * kBlockBytes;  // rows are < 2^31 bytes
    const int h = lane >> 4, run = (lane >> 2) & 3, l0 = (lane & 3) * 8;
    const uint2 ql = gguf::load8_u16(b + 64 * h + 32 * (run & 1) + l0);
    const uint2 qh = gguf::load8_u16(b + 128 + 32 * h + l0);
    const int low_shift = (run >> 1) * 4, high_shift = 2 * run;
    const uint32_t lo = ((ql.x >> low_shift) & 0x0F0F0F0Fu) | (((qh.x >> high_shift) & 0x03030303u) << 4);
    const uint32_t hi = ((ql.y >> low_shift) & 0x0F0F0F0Fu) | (((qh.y >> high_shift) & 0x03030303u) << 4);
    gguf::bytes8_to_float(lo, hi, q);
    // The lane's 8 weights are half of sub-block lane / 2: its signed scale byte, offset by 128.
    const float sub_scale = gguf::int_bits_to_float(__ldg(b + 192 + (lane >> 1)) ^ 0x80u) - 128.f;
    scale = gguf::half_bits(gguf::load_u16(b + 208)) * sub_scale;
    offset = 32.f * scale;
  }
};

// Q8_0: d f16, q int8[32]; w = d * q = d * (q + 128) - 128 d.
struct GgufQ8_0 {
  static constexpr int kBlockElems = 32, kBlockBytes = 34;
  __device__ __forceinline__ static bool lane_valid(int nblocks, int step, int lane) {
    return step * 8 + (lane >> 2) < nblocks;
  }
  __device__ __forceinline__ static void load(const uint8_t* row, int step, int lane, float (&q)[8], float& scale,
                                              float& offset) {
    const uint8_t* b = row + (step * 8 + (lane >> 2)) * kBlockBytes;
    const uint2 qs = gguf::load8_u16(b + 2 + (lane & 3) * 8);
    gguf::bytes8_to_float(qs.x ^ 0x80808080u, qs.y ^ 0x80808080u, q);  // q + 128, as unsigned bytes
    scale = gguf::half_bits(gguf::load_u16(b));
    offset = 128.f * scale;
  }
};

// Q4_0: d f16, qs u8[16]: weights 0..15 the low nibbles, 16..31 the high ones; w = d * (q - 8).
struct GgufQ4_0 {
  static constexpr int kBlockElems = 32, kBlockBytes = 18;
  __device__ __forceinline__ static bool lane_valid(int nblocks, int step, int lane) {
    return step * 8 + (lane >> 2) < nblocks;
  }
  __device__ __forceinline__ static void load(const uint8_t* row, int step, int lane, float (&q)[8], float& scale,
                                              float& offset) {
    const uint8_t* b = row + (step * 8 + (lane >> 2)) * kBlockBytes;
    const int part = lane & 3;  // weights [8 part, 8 part + 8) of the block
    const uint2 qs = gguf::load8_u16(b + 2 + 8 * (part & 1));
    const int shift = (part >> 1) * 4;
    gguf::bytes8_to_float((qs.x >> shift) & 0x0F0F0F0Fu, (qs.y >> shift) & 0x0F0F0F0Fu, q);
    scale = gguf::half_bits(gguf::load_u16(b));
    offset = 8.f * scale;
  }
};

// x[e .. e + 8) of one float16 row (16-byte aligned) as floats.
__device__ __forceinline__ void gguf_load_x8(const __half* row, int64_t e, float (&f)[8]) {
  const uint4 v = *reinterpret_cast<const uint4*>(row + e);
  const __half2* h = reinterpret_cast<const __half2*>(&v);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 p = __half22float2(h[i]);
    f[2 * i] = p.x;
    f[2 * i + 1] = p.y;
  }
}

// M input rows (row stride x_stride, 16-byte aligned rows), weight rows of row_bytes bytes; each
// warp owns R consecutive output features, whose weights it decodes against the same x values
// (x is read, converted and summed once for the R rows).
template <int M, int R, typename B>
__global__ void __launch_bounds__(kGgufGemvWarps * 32)
    gguf_gemv_kernel(__half* __restrict__ out, int64_t out_stride, const __half* __restrict__ x, int64_t x_stride,
                     const uint8_t* __restrict__ weight, int64_t row_bytes, const __half* __restrict__ bias, int n,
                     int k) {
  pdl_launch_dependents();
  pdl_wait();
  const int lane = threadIdx.x & 31;
  const int row0 = (blockIdx.x * kGgufGemvWarps + (threadIdx.x >> 5)) * R;
  if (row0 >= n) return;  // the whole warp: no block-wide synchronization follows
  const uint8_t* w[R];
#pragma unroll
  for (int r = 0; r < R; ++r) w[r] = weight + static_cast<int64_t>(min(row0 + r, n - 1)) * row_bytes;
  const int nblocks = k / B::kBlockElems;
  const int steps = (k + kGgufStep - 1) / kGgufStep;
  float acc[M][R];
#pragma unroll
  for (int m = 0; m < M; ++m)
#pragma unroll
    for (int r = 0; r < R; ++r) acc[m][r] = 0.f;
#pragma unroll 4
  for (int s = 0; s < steps; ++s) {
    if (!B::lane_valid(nblocks, s, lane)) continue;
    const int64_t e = static_cast<int64_t>(s) * kGgufStep + lane * 8;
    float xf[M][8], xsum[M];
#pragma unroll
    for (int m = 0; m < M; ++m) {
      gguf_load_x8(x + m * x_stride, e, xf[m]);
      xsum[m] = ((xf[m][0] + xf[m][1]) + (xf[m][2] + xf[m][3])) + ((xf[m][4] + xf[m][5]) + (xf[m][6] + xf[m][7]));
    }
#pragma unroll
    for (int r = 0; r < R; ++r) {
      float q[8], scale, offset;
      B::load(w[r], s, lane, q, scale, offset);
#pragma unroll
      for (int m = 0; m < M; ++m) {
        float dot = 0.f;
#pragma unroll
        for (int i = 0; i < 8; ++i) dot = fmaf(q[i], xf[m][i], dot);
        acc[m][r] = fmaf(scale, dot, fmaf(-offset, xsum[m], acc[m][r]));
      }
    }
  }
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const int row = row0 + r;
    const float b = (bias != nullptr && row < n) ? __half2float(bias[row]) : 0.f;
#pragma unroll
    for (int m = 0; m < M; ++m) {
      const float y = warp_sum(acc[m][r]);
      if (lane == m && row < n) out[m * out_stride + row] = __float2half_rn(y + b);
    }
  }
}

// out [N, K] float16 (16-byte aligned, K a multiple of 32) = W; one thread per 8 weights.
template <typename B>
__global__ void gguf_dequantize_kernel(__half* __restrict__ out, const uint8_t* __restrict__ weight,
                                       int64_t row_bytes, int n, int k) {
  pdl_launch_dependents();
  pdl_wait();
  const int steps = (k + kGgufStep - 1) / kGgufStep;
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t per_row = static_cast<int64_t>(steps) * 32;
  if (idx >= per_row * n) return;
  const int64_t row = idx / per_row;
  const int rem = static_cast<int>(idx % per_row);
  const int s = rem >> 5, lane = rem & 31;
  if (!B::lane_valid(k / B::kBlockElems, s, lane)) return;
  float q[8], scale, offset;
  B::load(weight + row * row_bytes, s, lane, q, scale, offset);
  __align__(16) __half2 h[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    h[i] = __floats2half2_rn(fmaf(scale, q[2 * i], -offset), fmaf(scale, q[2 * i + 1], -offset));
  }
  *reinterpret_cast<uint4*>(out + row * k + static_cast<int64_t>(s) * kGgufStep + lane * 8) =
      *reinterpret_cast<const uint4*>(h);
}

}  // namespace vllm_volta
