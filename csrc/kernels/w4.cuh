// 4-bit weights in the K-major layout (device code only), SM70 and newer, FP16 in and out.
// Layout (vllm_volta/model_executor/layers/quantization/w4_layout.py): qweight int32 [N, K / 8],
// row n's K values contiguous, int32 j holding k = 8j + 2i + h in bits 4i + 16h; sz half2 [N, G]
// = (scale, zero point) of row n's group; W[k][n] = (q - z) * s. K % 32 == 0 and a 32-value chunk
// (one 16-byte load) lies in one group: chunk c's group is c >> group_shift.
// Dequantization in registers, two k at a time: (q & 0x000F000F) | 0x64006400 is the half2
// (1024 + q0, 1024 + q1) and the 0x00F000F0 mask gives (1024 + 16 q2, 1024 + 16 q3); subtracting
// (1024 + z), or a fused x/16 - (64 + z), is exact (q - z in -15..15), then one rounding for * s:
// the same float16 weight the dequantize-then-GEMM path makes.
//  w4_dequantize_kernel: W^T [N, K] half (for the cuBLAS path of long inputs).
//  w4_gemv_kernel<M, R>: out [M, N] = x [M, K] W for 1..8 rows, one pass: warp w of a block owns R
//    consecutive output rows, its lanes stride along K (a warp reads 512 contiguous bytes of a
//    row per load) with the next chunks' loads in flight during these chunks' math (issued
//    before pdl_wait: the weights do not depend on the kernel before). The block stages x one
//    1024-k window at a time in shared memory (coalesced loads, the next window's in flight
//    during this one's math; conflict-free reads, where per-lane reads of x through L1 would
//    touch 16 lines per 512 bytes). Products accumulate in
//    half2 over one 32-value chunk (16 per half), then in FP32; a warp-shuffle sum.
#pragma once

#include "kernels/programmatic_launch.cuh"
#include "kernels/type_convert.cuh"

namespace vllm_volta {

constexpr int kW4MaxGemvRows = 8;
constexpr int kW4GemvWarps = 4;
// 16-byte weight loads a lane has in flight: R rows x (8 / R) chunks per iteration, the next
// iteration's issued before this one's math (4096-long rows take one iteration at R <= 2).
constexpr int kW4GemvLoads = 8;

__device__ __forceinline__ __half2 w4_bits_as_half2(unsigned v) {
  __half2 h;
  *reinterpret_cast<unsigned*>(&h) = v;
  return h;
}

// Per-group constants of one output row: s2 = (s, s), nz1024 = -(1024 + z), nz64 = -(64 + z).
struct W4Group {
  __half2 s2, nz1024, nz64;
};

__device__ __forceinline__ W4Group w4_group(__half2 sz) {
  const __half2 z2 = __half2half2(__high2half(sz));
  W4Group g;
  g.s2 = __half2half2(__low2half(sz));
  g.nz1024 = __hneg2(__hadd2(z2, __float2half2_rn(1024.f)));
  g.nz64 = __hneg2(__hadd2(z2, __float2half2_rn(64.f)));
  return g;
}

// The 8 weights of int32 q as 4 half2 of consecutive k: ((q - z) * s), one rounding each.
__device__ __forceinline__ void w4_dequant8(unsigned q, const W4Group& g, __half2 (&w)[4]) {
  constexpr unsigned kMagic = 0x64006400u, kLo = 0x000F000Fu, kHi = 0x00F000F0u;
  const unsigned q8 = q >> 8;
  const __half2 sixteenth = __float2half2_rn(0.0625f);
  w[0] = __hmul2(__hadd2(w4_bits_as_half2((q & kLo) | kMagic), g.nz1024), g.s2);
  w[1] = __hmul2(__hfma2(w4_bits_as_half2((q & kHi) | kMagic), sixteenth, g.nz64), g.s2);
  w[2] = __hmul2(__hadd2(w4_bits_as_half2((q8 & kLo) | kMagic), g.nz1024), g.s2);
  w[3] = __hmul2(__hfma2(w4_bits_as_half2((q8 & kHi) | kMagic), sixteenth, g.nz64), g.s2);
}

__device__ __forceinline__ unsigned w4_word(const uint4& v, int j) {
  return j == 0 ? v.x : j == 1 ? v.y : j == 2 ? v.z : v.w;
}

// One thread per int32: 8 halves of W^T (one 16-byte store).
__global__ void w4_dequantize_kernel(__half* __restrict__ out, const unsigned* __restrict__ qweight,
                                     const __half2* __restrict__ sz, int64_t n, int64_t k, int groups,
                                     int group_shift) {
  pdl_launch_dependents();
  pdl_wait();
  const int64_t words = k / 8;
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= n * words) return;
  const int64_t row = idx / words, word = idx % words;
  const W4Group g = w4_group(sz[row * groups + ((word / 4) >> group_shift)]);
  __align__(16) __half2 w[4];
  w4_dequant8(qweight[idx], g, w);
  *reinterpret_cast<uint4*>(out + idx * 8) = *reinterpret_cast<const uint4*>(w);
}

template <int M, int R>
__global__ void __launch_bounds__(32 * kW4GemvWarps)
    w4_gemv_kernel(__half* __restrict__ out, const __half* __restrict__ x, const uint4* __restrict__ qweight,
                   const __half2* __restrict__ sz, int n, int k, int groups, int group_shift) {
  constexpr int U = kW4GemvLoads / R;  // chunks per lane per iteration
  constexpr int kThreads = 32 * kW4GemvWarps;
  static_assert(kThreads == 4 * 32, "one x vector per thread stages a window");
  // x of the block's current window (32 chunks = 1024 k), two windows alternating: vector j of
  // chunk l of row m at xs[buf][m][j][l], so a warp's reads of one j are 512 contiguous bytes;
  // rows of j padded by 32 bytes so the staging writes (4 j x 2 chunks per 8 lanes) hit
  // distinct banks too.
  __shared__ __align__(16) uint4 xs[2][M][4][34];
  pdl_launch_dependents();
  const int lane = threadIdx.x % 32;
  const int row0 = (blockIdx.x * kW4GemvWarps + threadIdx.x / 32) * R;
  const bool live = row0 < n;  // a warp past N still stages x and meets the barriers
  const int chunks = k / 32;
  const uint4* rows[R];
  const __half2* row_sz[R];
#pragma unroll
  for (int r = 0; r < R; ++r) {  // rows past N re-read the last row; their sums are not written
    const int row = min(row0 + r, n - 1);
    rows[r] = qweight + static_cast<int64_t>(row) * chunks;
    row_sz[r] = sz + static_cast<int64_t>(row) * groups;
  }
  const uint4 zero4 = make_uint4(0u, 0u, 0u, 0u);
  uint4 next[U][R];
  auto load = [&](int c0) {
#pragma unroll
    for (int u = 0; u < U; ++u)
#pragma unroll
      for (int r = 0; r < R; ++r)
        next[u][r] = live && c0 + 32 * u < chunks ? __ldg(rows[r] + c0 + 32 * u) : zero4;
  };
  load(lane);  // the weights do not depend on the kernel before: read them while it finishes
  pdl_wait();
  const uint4* xv = reinterpret_cast<const uint4*>(x);
  const int x_stride = k / 8;  // uint4 per input row
  uint4 xr[M];  // this thread's x vector of the next window: vector t of it (chunk t / 4, t % 4)
  auto load_x = [&](int window) {
    const int v = window * 4 + static_cast<int>(threadIdx.x);
#pragma unroll
    for (int m = 0; m < M; ++m) xr[m] = v < x_stride ? __ldg(xv + m * x_stride + v) : zero4;
  };
  load_x(0);

  float y[R][M];
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int m = 0; m < M; ++m) y[r][m] = 0.f;
  int buf = 0;
  for (int b0 = 0; b0 < chunks; b0 += 32 * U) {  // the same trip count in every warp
    uint4 cur[U][R];
#pragma unroll
    for (int u = 0; u < U; ++u)
#pragma unroll
      for (int r = 0; r < R; ++r) cur[u][r] = next[u][r];
    if (b0 + 32 * U < chunks) load(b0 + 32 * U + lane);
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int window = b0 + 32 * u;  // first chunk of this window
      if (window >= chunks) break;     // uniform across the block
#pragma unroll
      for (int m = 0; m < M; ++m) xs[buf][m][threadIdx.x % 4][threadIdx.x / 4] = xr[m];
      __syncthreads();  // (the other buffer's readers finished before the previous barrier)
      load_x(window + 32);  // in flight during this window's math
      const int c = window + lane;
      if (live && c < chunks) {
        W4Group g[R];
#pragma unroll
        for (int r = 0; r < R; ++r) g[r] = w4_group(__ldg(row_sz[r] + (c >> group_shift)));
        __half2 acc[R][M];
#pragma unroll
        for (int r = 0; r < R; ++r)
#pragma unroll
          for (int m = 0; m < M; ++m) acc[r][m] = __float2half2_rn(0.f);
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          uint4 xq[M];
#pragma unroll
          for (int m = 0; m < M; ++m) xq[m] = xs[buf][m][j][lane];
#pragma unroll
          for (int r = 0; r < R; ++r) {
            __half2 w[4];
            w4_dequant8(w4_word(cur[u][r], j), g[r], w);
#pragma unroll
            for (int m = 0; m < M; ++m) {
              const __half2* xh = reinterpret_cast<const __half2*>(&xq[m]);
#pragma unroll
              for (int p = 0; p < 4; ++p) acc[r][m] = __hfma2(xh[p], w[p], acc[r][m]);
            }
          }
        }
#pragma unroll
        for (int r = 0; r < R; ++r)
#pragma unroll
          for (int m = 0; m < M; ++m) {
            const float2 f = __half22float2(acc[r][m]);
            y[r][m] += f.x + f.y;
          }
      }
      buf ^= 1;
    }
  }
  if (!live) return;
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int m = 0; m < M; ++m)
#pragma unroll
      for (int off = 16; off > 0; off /= 2) y[r][m] += __shfl_xor_sync(0xffffffffu, y[r][m], off);
  if (lane == 0) {
#pragma unroll
    for (int r = 0; r < R; ++r)
      if (row0 + r < n)
#pragma unroll
        for (int m = 0; m < M; ++m) out[static_cast<int64_t>(m) * n + row0 + r] = __float2half_rn(y[r][m]);
  }
}

}  // namespace vllm_volta
