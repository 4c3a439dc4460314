// Warp / row reductions (device code only). blockDim.x must be a multiple of 32.
#pragma once

namespace vllm_volta {

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

// Sum of v over the blockDim.x threads that share threadIdx.y (one row of a 2-D block),
// returned to each of them. blockDim.x * blockDim.y <= 1024. Call once per kernel (shared
// scratch); every thread of the block must call it (it may synchronize the block).
__device__ __forceinline__ float row_sum(float v) {
  __shared__ float partial[32][32];  // [row][warp of the row]
  v = warp_sum(v);
  const int warps_per_row = blockDim.x >> 5;
  if (warps_per_row == 1) return v;  // uniform over the block
  const int lane = threadIdx.x & 31;
  if (lane == 0) partial[threadIdx.y][threadIdx.x >> 5] = v;
  __syncthreads();
  v = lane < warps_per_row ? partial[threadIdx.y][lane] : 0.f;
  return warp_sum(v);
}

}  // namespace vllm_volta
