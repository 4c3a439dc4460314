// Block-wide reductions (device code only). blockDim.x must be a multiple of 32.
#pragma once

namespace vllm_volta {

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

// Sum of v over the block, returned to every thread. Call once per kernel (shared scratch).
__device__ __forceinline__ float block_sum(float v) {
  __shared__ float warp_sums[32];
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  v = warp_sum(v);
  if (lane == 0) warp_sums[warp] = v;
  __syncthreads();
  const int num_warps = (blockDim.x + 31) >> 5;
  v = lane < num_warps ? warp_sums[lane] : 0.f;
  return warp_sum(v);
}

}  // namespace vllm_volta
