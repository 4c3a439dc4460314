// Warp-level WMMA steps shared by the tiled GEMMs (moe_gemm.cuh, w4_gemm.cuh), device code only:
// 16x16x16 fragments with FP32 accumulation (SM70 and newer). Tiles live in shared memory: A as
// rows x K (row major), B as output columns x K (read col major), C as FP32 rows x columns.
// Warp (wm, wn) owns the FM x FN fragments at rows (wm * FM + i) * 16, columns (wn * FN + j) * 16.
#pragma once

#include <mma.h>

namespace vllm_volta {

template <int FM, int FN>
using WmmaAccumulators = nvcuda::wmma::fragment<nvcuda::wmma::accumulator, 16, 16, 16, float>[FM][FN];

// acc += A B^T over one BK-wide K step of the tiles (LD elements per tile row).
template <typename T, int FM, int FN, int BK, int LD>
__device__ __forceinline__ void wmma_tile_k_step(WmmaAccumulators<FM, FN>& acc, const T (*a_tile)[LD],
                                                 const T (*b_tile)[LD], int wm, int wn) {
  namespace wmma = nvcuda::wmma;
#pragma unroll
  for (int kk = 0; kk < BK; kk += 16) {
    wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major> fa[FM];
    wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::col_major> fb[FN];
#pragma unroll
    for (int i = 0; i < FM; ++i) wmma::load_matrix_sync(fa[i], &a_tile[(wm * FM + i) * 16][kk], LD);
#pragma unroll
    for (int j = 0; j < FN; ++j) wmma::load_matrix_sync(fb[j], &b_tile[(wn * FN + j) * 16][kk], LD);
#pragma unroll
    for (int i = 0; i < FM; ++i)
#pragma unroll
      for (int j = 0; j < FN; ++j) wmma::mma_sync(acc[i][j], fa[i], fb[j], acc[i][j]);
  }
}

// The warp's accumulators into the FP32 C tile (LDC floats per row).
template <int FM, int FN, int LDC>
__device__ __forceinline__ void wmma_store_tiles(float (*c_tile)[LDC], WmmaAccumulators<FM, FN>& acc, int wm,
                                                 int wn) {
#pragma unroll
  for (int i = 0; i < FM; ++i)
#pragma unroll
    for (int j = 0; j < FN; ++j)
      nvcuda::wmma::store_matrix_sync(&c_tile[(wm * FM + i) * 16][(wn * FN + j) * 16], acc[i][j], LDC,
                                      nvcuda::wmma::mem_row_major);
}

}  // namespace vllm_volta
