// AWQ 4-bit weights (device code only), SM70 and newer, FP16 in and out, FP32 math.
// Layout (AutoAWQ "gemm"): qweight int32 [K, N / 8], eight 4-bit weights of 8 consecutive output
// columns per int32, column c of the 8 in bits 4 * kAwqNibble[c] ..; qzeros int32 [K / g, N / 8]
// packed alike; scales half [K / g, N]; W[k][n] = (q[k][n] - z[k / g][n]) * s[k / g][n].
//  awq_dequantize_kernel: W [K, N] half, one packed int32 (8 columns, one 16-byte store) per thread.
//  awq_gemv_kernel: partial[split][m][n] = sum over the split's k of x[m][k] W[k][n] (FP32), for
//    M <= kAwqGemvMaxRows decode rows; awq_reduce_kernel sums the splits into out [M, N] half.
//    Block: 32 lanes x kAwqGemvWarps warps over 32 packed columns (256 outputs); lane l owns
//    packed column 32 * blockIdx.x + l (a warp reads 128 contiguous bytes of qweight per k),
//    the warps take consecutive k ranges of the block's split (blockIdx.y) and meet in shared
//    memory. The packed weights are read once; x rows come through the read-only cache.
#pragma once

#include "kernels/programmatic_launch.cuh"
#include "kernels/type_convert.cuh"

namespace vllm_volta {

constexpr int kAwqGemvMaxRows = 4;
constexpr int kAwqGemvWarps = 8;

// The nibble of each of the 8 columns of a packed int32 (AWQ's order 0, 2, 4, 6, 1, 3, 5, 7 inverted).
__device__ __forceinline__ int awq_shift(int column) {
  constexpr int kNibble[8] = {0, 4, 1, 5, 2, 6, 3, 7};
  return 4 * kNibble[column];
}

// Scales (s) and zero point times scale (zs) of 8 packed columns of one group.
__device__ __forceinline__ void awq_group_params(const int* qzeros, const __half* scales, int64_t group_row,
                                                 int64_t packed_cols, int64_t col8, float (&s)[8], float (&zs)[8]) {
  const int z = qzeros[group_row * packed_cols + col8];
  const uint4 sv = *reinterpret_cast<const uint4*>(scales + group_row * packed_cols * 8 + col8 * 8);
  const __half* sh = reinterpret_cast<const __half*>(&sv);
#pragma unroll
  for (int c = 0; c < 8; ++c) {
    s[c] = __half2float(sh[c]);
    zs[c] = static_cast<float>((z >> awq_shift(c)) & 0xF) * s[c];
  }
}

static __global__ void awq_dequantize_kernel(__half* __restrict__ out, const int* __restrict__ qweight,
                                      const int* __restrict__ qzeros, const __half* __restrict__ scales,
                                      int64_t k_rows, int64_t packed_cols, int group_size) {
  pdl_launch_dependents();
  pdl_wait();
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= k_rows * packed_cols) return;
  const int64_t k = idx / packed_cols, col8 = idx % packed_cols;
  float s[8], zs[8];
  awq_group_params(qzeros, scales, k / group_size, packed_cols, col8, s, zs);
  const int q = qweight[idx];
  __align__(16) __half w[8];
#pragma unroll
  for (int c = 0; c < 8; ++c) w[c] = __float2half_rn(static_cast<float>((q >> awq_shift(c)) & 0xF) * s[c] - zs[c]);
  *reinterpret_cast<uint4*>(out + idx * 8) = *reinterpret_cast<const uint4*>(w);
}

template <int M>
__global__ void awq_gemv_kernel(float* __restrict__ partial, const __half* __restrict__ x,
                                const int* __restrict__ qweight, const int* __restrict__ qzeros,
                                const __half* __restrict__ scales, int64_t k_rows, int64_t packed_cols,
                                int group_size, int64_t split_len) {
  pdl_launch_dependents();
  pdl_wait();  // x comes from the kernel before
  __shared__ float red[kAwqGemvWarps][M][8][32];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int64_t col8 = static_cast<int64_t>(blockIdx.x) * 32 + lane;
  const bool live = col8 < packed_cols;
  // This warp's k range: its share of the block's split.
  const int64_t split0 = blockIdx.y * split_len;
  const int64_t split1 = min(k_rows, split0 + split_len);
  const int64_t per_warp = (split1 - split0 + kAwqGemvWarps - 1) / kAwqGemvWarps;
  const int64_t k0 = min(split1, split0 + warp * per_warp);
  const int64_t k1 = min(split1, k0 + per_warp);
  float acc[M][8];
#pragma unroll
  for (int m = 0; m < M; ++m)
#pragma unroll
    for (int c = 0; c < 8; ++c) acc[m][c] = 0.f;
  if (live) {
    for (int64_t g0 = k0; g0 < k1;) {  // one quantization group at a time
      const int64_t g1 = min(k1, (g0 / group_size + 1) * group_size);
      float s[8], zs[8];
      awq_group_params(qzeros, scales, g0 / group_size, packed_cols, col8, s, zs);
#pragma unroll 4
      for (int64_t k = g0; k < g1; ++k) {
        const int q = __ldg(qweight + k * packed_cols + col8);
        float xm[M];
#pragma unroll
        for (int m = 0; m < M; ++m) xm[m] = __half2float(__ldg(x + m * k_rows + k));
#pragma unroll
        for (int c = 0; c < 8; ++c) {
          const float w = static_cast<float>((q >> awq_shift(c)) & 0xF) * s[c] - zs[c];
#pragma unroll
          for (int m = 0; m < M; ++m) acc[m][c] = fmaf(xm[m], w, acc[m][c]);
        }
      }
      g0 = g1;
    }
  }
#pragma unroll
  for (int m = 0; m < M; ++m)
#pragma unroll
    for (int c = 0; c < 8; ++c) red[warp][m][c][lane] = acc[m][c];
  __syncthreads();
  // Thread t sums output (m, column) over the warps: 32 packed columns x 8 x M outputs per block.
  for (int o = threadIdx.x; o < M * 8 * 32; o += blockDim.x) {
    const int m = o / 256, c = (o / 32) % 8, l = o % 32;
    const int64_t col = (static_cast<int64_t>(blockIdx.x) * 32 + l) * 8 + c;
    if (col >= packed_cols * 8) continue;
    float sum = 0.f;
#pragma unroll
    for (int w = 0; w < kAwqGemvWarps; ++w) sum += red[w][m][c][l];
    partial[(static_cast<int64_t>(blockIdx.y) * M + m) * packed_cols * 8 + col] = sum;
  }
}

// out[m][n] = sum over splits of partial[split][m][n], rounded to half.
static __global__ void awq_reduce_kernel(__half* __restrict__ out, const float* __restrict__ partial, int64_t outputs,
                                  int splits) {
  pdl_launch_dependents();
  pdl_wait();
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= outputs) return;
  float sum = 0.f;
  for (int s = 0; s < splits; ++s) sum += partial[s * outputs + idx];
  out[idx] = __float2half_rn(sum);
}

}  // namespace vllm_volta
