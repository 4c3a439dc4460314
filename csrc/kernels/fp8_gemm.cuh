// FP8 (e4m3fn) weights on tensor cores (device code only): SM70 and newer, WMMA m16n16k16 with
// float16 inputs (bfloat16 on SM80+: its instances compile to a trap below) and FP32 accumulation;
// no FP8 instructions. For inputs of more rows than
// the GEMV takes (prefill chunks, large decode batches): out [M, N] = x [M, K] W^T (+ bias), W as in
// kernels/fp8_gemv.cuh (weight [N, K] bytes, scales float32 [N, G]).
// Block (n, m, split): kFp8GemmBN weight rows x BM = 16 * FM input rows over the split's K range,
// kFp8GemmBK inputs a step. Each step the weight tile (16 bytes a thread, twice) is converted to
// the activation type T and scaled by its row's group scale on the way into shared memory (the
// value a dequantized weight would hold: one rounding), the input tile copied beside it; the next
// step's loads are in flight during the MMAs. 8 warps: 4 along N (16 weight rows each) x 2 along
// K (half a step each); the two K halves meet in shared memory at the end. One split: out is
// written (+ bias) directly; several: FP32 partial sums [split][M][N], summed in order by
// fp8_gemm_reduce_kernel (deterministic).
#pragma once

#include <mma.h>

#include "kernels/fp8_convert.cuh"
#include "kernels/programmatic_launch.cuh"
#include "kernels/type_convert.cuh"

#ifdef __CUDACC_RTC__
using int64_t = long long;
#endif

namespace vllm_volta {

constexpr int kFp8GemmThreads = 256;
constexpr int kFp8GemmBN = 64;
constexpr int kFp8GemmBK = 128;
constexpr int kFp8GemmPad = 8;  // halves of row padding: rows stay 16-byte aligned, banks spread

template <typename T, int FM>
struct Fp8GemmSmem {
  static constexpr int BM = 16 * FM, LD = kFp8GemmBK + kFp8GemmPad, LDC = kFp8GemmBN + 4;
  union {
    struct {
      T a[BM][LD];
      T b[kFp8GemmBN][LD];
    } tiles;
    float c[2][BM][LDC];  // the two K halves' sums, after the last step
  };
};

// 16 weights of a row, times their scale, as 16 values of T (two 16-byte stores' worth).
template <typename T>
__device__ __forceinline__ void fp8x16_scaled(const uint4& w, float scale, uint4 (&h)[2]) {
  float f[16];
  fp8x16_to_float_raw(w, f);
  const float s = scale * kFp8RawScale;
  T* out = reinterpret_cast<T*>(h);
#pragma unroll
  for (int i = 0; i < 16; ++i) out[i] = Convert<T>::from_float(f[i] * s);
}

// Input rows [m), weight rows [n), K = k (a multiple of 16), split range k_split (a multiple of
// kFp8GemmBK). partial == nullptr: write out (+ bias); else partial[split][m][n] in FP32.
template <typename T, int FM>
__device__ __forceinline__ void fp8_gemm_body(T* __restrict__ out, int64_t out_stride, float* __restrict__ partial,
                                              const T* __restrict__ x, int64_t x_stride,
                                              const unsigned char* __restrict__ weight,
                                              const float* __restrict__ scales, int groups, int group_vecs,
                                              const T* __restrict__ bias, int m, int n, int k, int k_split) {
  namespace wmma = nvcuda::wmma;
  using Smem = Fp8GemmSmem<T, FM>;
  constexpr int BM = Smem::BM, BN = kFp8GemmBN, BK = kFp8GemmBK, LD = Smem::LD;
  constexpr int A_VK = BK / 8, B_VK = BK / 16;  // 16-byte vectors per tile row (halves / bytes)
  constexpr int A_LOADS = BM * A_VK / kFp8GemmThreads, B_LOADS = BN * B_VK / kFp8GemmThreads;
  static_assert(A_LOADS >= 1 && B_LOADS >= 1 && BM * A_VK % kFp8GemmThreads == 0, "tile shape");
  __shared__ __align__(128) Smem smem;

  const int n0 = blockIdx.x * BN, m0 = blockIdx.y * BM;
  const int k0 = blockIdx.z * k_split, k1 = min(k, k0 + k_split);
  const int tid = threadIdx.x;

  // This thread's loads: A rows (input rows past m load zeros), B rows (weight rows past n too).
  const uint4* a_src[A_LOADS];
  int a_row[A_LOADS], a_vec[A_LOADS];
#pragma unroll
  for (int i = 0; i < A_LOADS; ++i) {
    const int idx = tid + i * kFp8GemmThreads;
    a_row[i] = idx / A_VK;
    a_vec[i] = idx % A_VK;
    const int row = m0 + a_row[i];
    a_src[i] = row < m ? reinterpret_cast<const uint4*>(x + row * x_stride) : nullptr;
  }
  const uint4* b_src[B_LOADS];
  const float* b_scale[B_LOADS];
  int b_row[B_LOADS], b_vec[B_LOADS];
#pragma unroll
  for (int i = 0; i < B_LOADS; ++i) {
    const int idx = tid + i * kFp8GemmThreads;
    b_row[i] = idx / B_VK;
    b_vec[i] = idx % B_VK;
    const int64_t row = n0 + b_row[i];
    b_src[i] = row < n ? reinterpret_cast<const uint4*>(weight + row * k) : nullptr;
    b_scale[i] = scales + (row < n ? row : 0) * groups;
  }
  uint4 a_reg[A_LOADS], b_reg[B_LOADS];
  float s_reg[B_LOADS];
  const uint4 zero = make_uint4(0u, 0u, 0u, 0u);
  auto load = [&](int kb) {  // kb: the step's first input feature
#pragma unroll
    for (int i = 0; i < B_LOADS; ++i) {
      const int v = kb / 16 + b_vec[i];  // weight vectors: 16 bytes
      const bool live = b_src[i] != nullptr && v * 16 < k1;
      b_reg[i] = live ? __ldg(b_src[i] + v) : zero;
      s_reg[i] = live ? __ldg(b_scale[i] + (groups == 1 ? 0 : v / group_vecs)) : 0.f;
    }
#pragma unroll
    for (int i = 0; i < A_LOADS; ++i) {
      const int v = kb / 8 + a_vec[i];  // input vectors: 8 halves
      a_reg[i] = a_src[i] != nullptr && v * 8 < k1 ? a_src[i][v] : zero;
    }
  };

  const int warp = tid / 32, wn = warp % 4, wk = warp / 4;
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[FM];
#pragma unroll
  for (int i = 0; i < FM; ++i) wmma::fill_fragment(acc[i], 0.f);

  pdl_launch_dependents();
  pdl_wait();
  if (k0 < k1) load(k0);
  for (int kb = k0; kb < k1; kb += BK) {
#pragma unroll
    for (int i = 0; i < A_LOADS; ++i) *reinterpret_cast<uint4*>(&smem.tiles.a[a_row[i]][a_vec[i] * 8]) = a_reg[i];
#pragma unroll
    for (int i = 0; i < B_LOADS; ++i) {
      uint4 h[2];
      fp8x16_scaled<T>(b_reg[i], s_reg[i], h);
      uint4* dst = reinterpret_cast<uint4*>(&smem.tiles.b[b_row[i]][b_vec[i] * 16]);
      dst[0] = h[0];
      dst[1] = h[1];
    }
    __syncthreads();
    if (kb + BK < k1) load(kb + BK);  // in flight during the MMAs
#pragma unroll
    for (int kk = wk * (BK / 2); kk < (wk + 1) * (BK / 2); kk += 16) {
      wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::col_major> fb;
      wmma::load_matrix_sync(fb, &smem.tiles.b[wn * 16][kk], LD);
#pragma unroll
      for (int i = 0; i < FM; ++i) {
        wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major> fa;
        wmma::load_matrix_sync(fa, &smem.tiles.a[i * 16][kk], LD);
        wmma::mma_sync(acc[i], fa, fb, acc[i]);
      }
    }
    __syncthreads();
  }
#pragma unroll
  for (int i = 0; i < FM; ++i)
    wmma::store_matrix_sync(&smem.c[wk][i * 16][wn * 16], acc[i], Smem::LDC, wmma::mem_row_major);
  __syncthreads();
  for (int idx = tid; idx < BM * BN; idx += kFp8GemmThreads) {
    const int r = idx / BN, c = idx % BN, row = m0 + r, col = n0 + c;
    if (row >= m || col >= n) continue;
    const float y = smem.c[0][r][c] + smem.c[1][r][c];
    if (partial != nullptr) {
      partial[(static_cast<int64_t>(blockIdx.z) * m + row) * n + col] = y;
    } else {
      out[row * out_stride + col] = Convert<T>::from_float(bias != nullptr ? y + Convert<T>::to_float(bias[col]) : y);
    }
  }
}

template <typename T, int FM>
__global__ void __launch_bounds__(kFp8GemmThreads)
    fp8_gemm_kernel(T* __restrict__ out, int64_t out_stride, float* __restrict__ partial, const T* __restrict__ x,
                    int64_t x_stride, const unsigned char* __restrict__ weight, const float* __restrict__ scales,
                    int groups, int group_vecs, const T* __restrict__ bias, int m, int n, int k, int k_split) {
  if constexpr (!arch_supports<T>::value) {
    __trap();
  } else {
    fp8_gemm_body<T, FM>(out, out_stride, partial, x, x_stride, weight, scales, groups, group_vecs, bias, m, n, k,
                         k_split);
  }
}

// out[row][col] = sum over the splits of partial[split][row][col] (+ bias[col]), rounded to T.
template <typename T>
__device__ __forceinline__ void fp8_gemm_reduce_body(T* __restrict__ out, int64_t out_stride,
                                                     const float* __restrict__ partial, const T* __restrict__ bias,
                                                     int m, int n, int splits) {
  pdl_launch_dependents();
  pdl_wait();
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t outputs = static_cast<int64_t>(m) * n;
  if (idx >= outputs) return;
  const int64_t row = idx / n, col = idx % n;
  float y = 0.f;
  for (int s = 0; s < splits; ++s) y += partial[s * outputs + idx];
  out[row * out_stride + col] = Convert<T>::from_float(bias != nullptr ? y + Convert<T>::to_float(bias[col]) : y);
}

template <typename T>
__global__ void fp8_gemm_reduce_kernel(T* __restrict__ out, int64_t out_stride, const float* __restrict__ partial,
                                       const T* __restrict__ bias, int m, int n, int splits) {
  if constexpr (!arch_supports<T>::value) {
    __trap();
  } else {
    fp8_gemm_reduce_body<T>(out, out_stride, partial, bias, m, n, splits);
  }
}

}  // namespace vllm_volta
