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
//  gguf_gemv_kernel<M, B>: out[m][n] = sum_k x[m][k] W[n][k] (+ bias[n]) for M <= 8 decode rows;
//    one warp per weight row, kGgufGemvWarps rows per block, warp-shuffle reduction.
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
constexpr int kGgufGemvWarps = 4;  // weight rows per block of the gemv
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

// Byte i (0..7) of the 8 bytes in v.
__device__ __forceinline__ uint32_t byte8(const uint2& v, int i) { return byte_of(i < 4 ? v.x : v.y, i & 3); }

// The 6-bit (scale, min) of sub-block j (0..7) of Q4_K / Q5_K from the 12 bytes at p (4-aligned).
__device__ __forceinline__ void k_scale_min(const uint8_t* p, int j, float& sc, float& mn) {
  const uint32_t s0 = load_u32(p), s1 = load_u32(p + 4), s2 = load_u32(p + 8);
  if (j < 4) {
    sc = static_cast<float>(byte_of(s0, j) & 63u);
    mn = static_cast<float>(byte_of(s1, j) & 63u);
  } else {
    const int i = j - 4;
    sc = static_cast<float>((byte_of(s2, i) & 15u) | ((byte_of(s0, i) >> 6) << 4));
    mn = static_cast<float>((byte_of(s2, i) >> 4) | ((byte_of(s1, i) >> 6) << 4));
  }
}

}  // namespace gguf

// Each block type: kBlockElems, kBlockBytes, and load(row, nblocks, step, lane, q, scale, offset),
// which decodes the lane's 8 weights of `step` (w_i = scale * q_i - offset) and returns false when
// they lie past the row's end (only the 32-weight types, when K is not a multiple of 256).

// Q4_K: d, dmin f16; scales u8[12]; qs u8[128] (4 chunks of 32: low nibbles sub-block 2c, high 2c+1).
struct GgufQ4K {
  static constexpr int kBlockElems = 256, kBlockBytes = 144;
  __device__ __forceinline__ static bool load(const uint8_t* row, int, int step, int lane, float (&q)[8],
                                              float& scale, float& offset) {
    const uint8_t* b = row + static_cast<int64_t>(step) * kBlockBytes;
    const int j = lane >> 2, pos = (lane & 3) * 8;
    const uint32_t dm = gguf::load_u32(b);
    float sc, mn;
    gguf::k_scale_min(b + 4, j, sc, mn);
    const uint2 qs = gguf::load8_aligned(b + 16 + 32 * (j >> 1) + pos);
    const int shift = (j & 1) * 4;
#pragma unroll
    for (int i = 0; i < 8; ++i) q[i] = static_cast<float>((gguf::byte8(qs, i) >> shift) & 15u);
    scale = gguf::half_bits(dm) * sc;
    offset = gguf::half_bits(dm >> 16) * mn;
    return true;
  }
};

// Q5_K: as Q4_K plus qh u8[32] before qs: the fifth bit of sub-block j, element e is bit j of qh[e].
struct GgufQ5K {
  static constexpr int kBlockElems = 256, kBlockBytes = 176;
  __device__ __forceinline__ static bool load(const uint8_t* row, int, int step, int lane, float (&q)[8],
                                              float& scale, float& offset) {
    const uint8_t* b = row + static_cast<int64_t>(step) * kBlockBytes;
    const int j = lane >> 2, pos = (lane & 3) * 8;
    const uint32_t dm = gguf::load_u32(b);
    float sc, mn;
    gguf::k_scale_min(b + 4, j, sc, mn);
    const uint2 qh = gguf::load8_aligned(b + 16 + pos);
    const uint2 qs = gguf::load8_aligned(b + 48 + 32 * (j >> 1) + pos);
    const int shift = (j & 1) * 4;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const uint32_t low = (gguf::byte8(qs, i) >> shift) & 15u, high = (gguf::byte8(qh, i) >> j) & 1u;
      q[i] = static_cast<float>(low | (high << 4));
    }
    scale = gguf::half_bits(dm) * sc;
    offset = gguf::half_bits(dm >> 16) * mn;
    return true;
  }
};

// Q6_K: ql u8[128], qh u8[64], scales int8[16], d f16. Half h (128 weights) = 4 runs of 32: run r,
// element l takes the low nibble (r < 2) or high nibble (r >= 2) of ql[64 h + 32 (r & 1) + l] and
// bits 2r, 2r + 1 of qh[32 h + l]; w = d * scale[sub-block of 16] * (q - 32).
struct GgufQ6K {
  static constexpr int kBlockElems = 256, kBlockBytes = 210;
  __device__ __forceinline__ static bool load(const uint8_t* row, int, int step, int lane, float (&q)[8],
                                              float& scale, float& offset) {
    const uint8_t* b = row + static_cast<int64_t>(step) * kBlockBytes;
    const int h = lane >> 4, run = (lane >> 2) & 3, l0 = (lane & 3) * 8;
    const uint2 ql = gguf::load8_u16(b + 64 * h + 32 * (run & 1) + l0);
    const uint2 qh = gguf::load8_u16(b + 128 + 32 * h + l0);
    const int low_shift = (run >> 1) * 4, high_shift = 2 * run;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const uint32_t low = (gguf::byte8(ql, i) >> low_shift) & 15u, high = (gguf::byte8(qh, i) >> high_shift) & 3u;
      q[i] = static_cast<float>(low | (high << 4));
    }
    // The lane's 8 weights are half of sub-block lane / 2: its signed scale byte.
    const int sub_scale = static_cast<signed char>(__ldg(b + 192 + (lane >> 1)));
    scale = gguf::half_bits(gguf::load_u16(b + 208)) * static_cast<float>(sub_scale);
    offset = 32.f * scale;
    return true;
  }
};

// Q8_0: d f16, q int8[32]; w = d * q.
struct GgufQ8_0 {
  static constexpr int kBlockElems = 32, kBlockBytes = 34;
  __device__ __forceinline__ static bool load(const uint8_t* row, int nblocks, int step, int lane, float (&q)[8],
                                              float& scale, float& offset) {
    const int block = step * 8 + (lane >> 2);
    if (block >= nblocks) return false;
    const uint8_t* b = row + static_cast<int64_t>(block) * kBlockBytes;
    const uint2 qs = gguf::load8_u16(b + 2 + (lane & 3) * 8);
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      q[i] = static_cast<float>(static_cast<signed char>(static_cast<unsigned char>(gguf::byte8(qs, i))));
    }
    scale = gguf::half_bits(gguf::load_u16(b));
    offset = 0.f;
    return true;
  }
};

// Q4_0: d f16, qs u8[16]: weights 0..15 the low nibbles, 16..31 the high ones; w = d * (q - 8).
struct GgufQ4_0 {
  static constexpr int kBlockElems = 32, kBlockBytes = 18;
  __device__ __forceinline__ static bool load(const uint8_t* row, int nblocks, int step, int lane, float (&q)[8],
                                              float& scale, float& offset) {
    const int block = step * 8 + (lane >> 2);
    if (block >= nblocks) return false;
    const uint8_t* b = row + static_cast<int64_t>(block) * kBlockBytes;
    const int part = lane & 3;  // weights [8 part, 8 part + 8) of the block
    const uint2 qs = gguf::load8_u16(b + 2 + 8 * (part & 1));
    const int shift = (part >> 1) * 4;
#pragma unroll
    for (int i = 0; i < 8; ++i) q[i] = static_cast<float>((gguf::byte8(qs, i) >> shift) & 15u);
    scale = gguf::half_bits(gguf::load_u16(b));
    offset = 8.f * scale;
    return true;
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

// M input rows (row stride x_stride, 16-byte aligned rows), weight rows of row_bytes bytes; one warp
// per output feature.
template <int M, typename B>
__global__ void __launch_bounds__(kGgufGemvWarps * 32)
    gguf_gemv_kernel(__half* __restrict__ out, int64_t out_stride, const __half* __restrict__ x, int64_t x_stride,
                     const uint8_t* __restrict__ weight, int64_t row_bytes, const __half* __restrict__ bias, int n,
                     int k) {
  pdl_launch_dependents();
  pdl_wait();
  const int lane = threadIdx.x & 31;
  const int row = blockIdx.x * kGgufGemvWarps + (threadIdx.x >> 5);
  if (row >= n) return;  // the whole warp: no block-wide synchronization follows
  const uint8_t* w = weight + static_cast<int64_t>(row) * row_bytes;
  const int nblocks = k / B::kBlockElems;
  const int steps = (k + kGgufStep - 1) / kGgufStep;
  float acc[M];
#pragma unroll
  for (int m = 0; m < M; ++m) acc[m] = 0.f;
#pragma unroll 2
  for (int s = 0; s < steps; ++s) {
    float q[8], scale, offset;
    if (!B::load(w, nblocks, s, lane, q, scale, offset)) continue;
    const int64_t e = static_cast<int64_t>(s) * kGgufStep + lane * 8;
#pragma unroll
    for (int m = 0; m < M; ++m) {
      float xf[8];
      gguf_load_x8(x + m * x_stride, e, xf);
      float dot = 0.f, sum = 0.f;
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        dot = fmaf(q[i], xf[i], dot);
        sum += xf[i];
      }
      acc[m] = fmaf(scale, dot, fmaf(-offset, sum, acc[m]));
    }
  }
  const float b = bias != nullptr ? __half2float(bias[row]) : 0.f;
#pragma unroll
  for (int m = 0; m < M; ++m) {
    const float y = warp_sum(acc[m]);
    if (lane == m) out[m * out_stride + row] = __float2half_rn(y + b);
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
  float q[8], scale, offset;
  if (!B::load(weight + row * row_bytes, k / B::kBlockElems, s, lane, q, scale, offset)) return;
  __align__(16) __half2 h[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    h[i] = __floats2half2_rn(fmaf(scale, q[2 * i], -offset), fmaf(scale, q[2 * i + 1], -offset));
  }
  *reinterpret_cast<uint4*>(out + row * k + static_cast<int64_t>(s) * kGgufStep + lane * 8) =
      *reinterpret_cast<const uint4*>(h);
}

}  // namespace vllm_volta
