// GGUF weights kept in their blocks (device code only): SM70 and newer, FP16 activations and
// outputs, FP32 accumulation, no BF16 or SM80-only instructions.
//
// A weight [N, K] is N rows of K / block_elems GGUF blocks each (row_bytes = that times
// block_bytes), exactly as the file stores it (layouts: vllm_volta/model_executor/model_loader/
// gguf_dequant.py). Every type is walked in steps of 1024 weights of a row (four K-quant
// super-blocks, or 32 blocks of 32): each lane of a warp owns 32 of them, as 4 groups of 8
// consecutive weights under one sub-block scale each (sub-blocks are 16 or 32 wide). A group
// decodes to 8 small integers q and one (scale, offset), w = scale * q - offset, so its products
// with x are summed on the integers and scaled once:
//   sum_i w_i x_i = scale * sum_i q_i x_i - offset * sum_i x_i.
// Integers become floats through their exponent bits (PRMT + FADD), not I2F (a conversion-pipe
// instruction). Loads: Q4_K / Q5_K blocks are multiples of 16 bytes, so a lane reads its 16 quant
// bytes in one 16-byte load; Q6_K (210-byte), Q8_0 (34) and Q4_0 (18) blocks are only 2-byte
// aligned in a row, so those read 16-bit words or aligned words joined by funnel shifts.
//  gguf_gemv_kernel<M, R, B>: out[m][n] = sum_k x[m][k] W[n][k] (+ bias[n]) for M <= 8 decode
//    rows; R (gguf_rows_per_warp<M>) weight rows per warp sharing x's loads, conversions and sums,
//    kGgufGemvWarps warps per block, warp-shuffle reduction.
//  gguf_dequantize_kernel<B>: out [N, K] float16 = W, 32 weights (four 16-byte stores) per
//    thread, each rounded once from float32.
#pragma once

#include <cuda_fp16.h>

#include "kernels/gguf_blocks.cuh"
#include "kernels/programmatic_launch.cuh"
#include "kernels/reduce.cuh"

namespace vllm_volta {

constexpr int kGgufGemvMaxRows = 8;
constexpr int kGgufGemvWarps = 4;      // warps per block of the gemv
// Output features per warp (they share x's loads, conversions and sums): 4 for one input row,
// where x's share of the work is largest, else 2 (registers for the rows' x values).
template <int M>
__host__ __device__ constexpr int gguf_rows_per_warp() {
  return M == 1 ? 4 : 2;
}
constexpr int kGgufStep = 1024;    // weights of a row per warp step (32 a lane)

// x[e .. e + 8) of one float16 row (16-byte aligned) as floats, and their sum.
__device__ __forceinline__ float gguf_load_x8(const __half* row, int e, float (&f)[8]) {
  const uint4 v = *reinterpret_cast<const uint4*>(row + e);
  const __half2* h = reinterpret_cast<const __half2*>(&v);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 p = __half22float2(h[i]);
    f[2 * i] = p.x;
    f[2 * i + 1] = p.y;
  }
  return ((f[0] + f[1]) + (f[2] + f[3])) + ((f[4] + f[5]) + (f[6] + f[7]));
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
#pragma unroll 2
  for (int s = 0; s < steps; ++s) {
    if (!B::lane_valid(nblocks, s, lane)) continue;
    typename B::Raw raw[R];
#pragma unroll
    for (int r = 0; r < R; ++r) B::fetch(w[r], s, lane, raw[r]);
#pragma unroll
    for (int g = 0; g < 4; ++g) {
      const int e = B::x_offset(s, lane, g);
      float xf[M][8], xsum[M];
#pragma unroll
      for (int m = 0; m < M; ++m) xsum[m] = gguf_load_x8(x + m * x_stride, e, xf[m]);
#pragma unroll
      for (int r = 0; r < R; ++r) {
        float q[8], scale, offset;
        B::template group<true>(raw[r], g, q, scale, offset);
#pragma unroll
        for (int m = 0; m < M; ++m) {
          float dot = 0.f;
#pragma unroll
          for (int i = 0; i < 8; ++i) dot = fmaf(q[i], xf[m][i], dot);
          acc[m][r] = fmaf(scale, dot, fmaf(-offset, xsum[m], acc[m][r]));
        }
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

// out [N, K] float16 (16-byte aligned, K a multiple of 32) = W; one thread per lane-step (32 weights).
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
  typename B::Raw raw;
  B::fetch(weight + row * row_bytes, s, lane, raw);
#pragma unroll
  for (int g = 0; g < 4; ++g) {
    float q[8], scale, offset;
    B::template group<false>(raw, g, q, scale, offset);
    __align__(16) __half2 h[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      h[i] = __floats2half2_rn(fmaf(scale, q[2 * i], -offset), fmaf(scale, q[2 * i + 1], -offset));
    }
    *reinterpret_cast<uint4*>(out + row * k + B::x_offset(s, lane, g)) = *reinterpret_cast<const uint4*>(h);
  }
}

}  // namespace vllm_volta
