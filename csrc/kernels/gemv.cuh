// Matrix-vector products for decode steps of 1 to 4 tokens (device code only), FP16 with
// FP32 accumulation, SM70 and newer: out[m][row] = sum_k input[m][k] * weight[row][k].
// The weight is streamed once, with 16-byte loads: a block of blockDim.x threads (a multiple
// of 32, at most kGemvThreads) takes a group of R consecutive weight rows and splits K over all
// of its threads (thread t of T reads the 16-byte vectors t, t + T, ...), so each thread keeps
// U x R independent loads in flight; the input vectors are read once per step and reused for
// the R rows. Partial sums meet through warp shuffles and one shared-memory pass. A grid
// smaller than the number of groups (MULTI, below) gives a block the groups blockIdx.x,
// + gridDim.x, ...
// Epilogues, each equal to gemv followed by the op it replaces (same roundings):
//  kSiluAndMul (an MLP's gate_up projection, weight [2N, K] = [gate; up]): a block owns R/2
//    gate rows and the R/2 up rows that pair with them and writes out[m][j] =
//    silu(gate_j) * up_j, gate and up rounded to FP16 first (gemv, then silu_and_mul);
//  kAdd (a projection that feeds the residual stream): out[m][j] += the product, rounded to
//    FP16 first (gemv, then the add of fused_add_rms_norm).
//  kRopeCache (an attention layer's qkv projection at decode): the RoPE of the query and key
//    heads and the KV-cache write of key and value (rotary_embedding_and_cache) after the
//    product. A block owns R/2 rotation pairs (rows i and i + D/2 of a head, neox style; rows
//    2i and 2i + 1, GPT-J style) and the R/2 partners: out[m] holds q | k | v rotated as
//    rotary_embedding_and_cache leaves them (same roundings: bit-equal), and the key/value rows
//    also go to kv_cache at the token's slot (slots < 0 or past the cache are skipped).
// Prologue NORM (a decoder layer's pre-norm, which feeds qkv and gate_up): the input rows are
// RMS-normalized first, x -> x * rsqrt(mean(x^2) + eps) * g. Each block reads whole input rows
// anyway, so it sums their squares in the same pass, multiplies x by g in FP32 (exact: FP16 x
// FP16 fits FP32's mantissa) and scales its dot products by the row's rsqrt at the end. The
// normalized row is never rounded to FP16: the result is rms_norm then gemv, without that
// rounding (within FP16 rounding of it, not bit-equal).
#pragma once

#include "kernels/activation.cuh"
#include "kernels/programmatic_launch.cuh"
#include "kernels/reduce.cuh"
#include "kernels/rotary.cuh"
#include "kernels/type_convert.cuh"

namespace vllm_volta {

constexpr int kGemvThreads = 256;

__device__ __forceinline__ void half8_to_float8(const uint4& v, float (&f)[8]) {
  const __half2* h = reinterpret_cast<const __half2*>(&v);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 p = __half22float2(h[i]);
    f[2 * i] = p.x;
    f[2 * i + 1] = p.y;
  }
}

__device__ __forceinline__ float dot8(const uint4& w, const float (&x)[8], float acc) {
  float wf[8];
  half8_to_float8(w, wf);
#pragma unroll
  for (int i = 0; i < 8; ++i) acc = fmaf(wf[i], x[i], acc);
  return acc;
}

enum class GemvEpilogue { kNone, kSiluAndMul, kAdd, kRopeCache };

// What kRopeCache needs besides the product (full rotation: rot_dim = head_size).
struct GemvRope {
  const int64_t* positions;  // [M]
  const void* cos_sin;       // [max_position, head_size]: cos | sin, float32 or float16
  bool cos_sin_is_float;
  bool neox;
  int64_t cos_sin_stride;
  int64_t max_position;
  int head_size;
  int q_size;   // query features (heads x head_size); key and value have kv_size each
  int kv_size;
  __half* kv_cache;  // [2, num_slots, kv_size]
  const int64_t* slots;  // [M]
  int64_t num_slots;
};

// Weight row of rotation pair p's first (second = false) or second element.
__device__ __forceinline__ int rope_row(int p, bool second, const GemvRope& rope) {
  const int half = rope.head_size / 2, head = p / half, i = p % half;
  return head * rope.head_size + (rope.neox ? i + (second ? half : 0) : 2 * i + (second ? 1 : 0));
}

// M input rows, R weight rows per block, U vectors per thread per step in flight per row;
// n output features (kSiluAndMul: the weight has 2n rows; kRopeCache: n rotation pairs, the
// weight and out have 2n rows). NORM: norm_weight [k] and eps define the prologue. MULTI: the
// grid may be smaller than the number of groups (without it, a block per group; the code is
// then the single-group kernel, which the programmatic launches on SM90+ keep).
template <int M, int R, int U, GemvEpilogue E, bool NORM, bool MULTI>
__global__ void __launch_bounds__(kGemvThreads)
    gemv_kernel(__half* __restrict__ out, int64_t out_stride, const __half* __restrict__ input, int64_t in_stride,
                const __half* __restrict__ weight, const __half* __restrict__ bias, int n, int k,
                const __half* __restrict__ norm_weight, float eps, GemvRope rope) {
  constexpr bool GATED = E == GemvEpilogue::kSiluAndMul;
  constexpr bool ROPE = E == GemvEpilogue::kRopeCache;
  static_assert(!(GATED || ROPE) || R % 2 == 0, "a gated or rotating block pairs its rows");
  constexpr int kCols = GATED || ROPE ? R / 2 : R;  // output features (pairs) per block
  const int nvec = k / 8;
  int col0 = blockIdx.x * kCols;  // the block's (MULTI: current) group's first output feature
  // Weight row of the group's r-th row: features past n read feature n - 1 and are not written.
  auto row_of_group = [&](int first, int r) {
    const int col = min(first + r % kCols, n - 1);
    if constexpr (ROPE) return rope_row(col, r >= kCols, rope);
    return GATED && r >= kCols ? n + col : col;
  };
  auto row_of = [&](int r) { return row_of_group(col0, r); };
  const uint4* w[R];
  auto point_rows = [&](int first) {
#pragma unroll
    for (int r = 0; r < R; ++r)
      w[r] = reinterpret_cast<const uint4*>(weight + static_cast<int64_t>(row_of_group(first, r)) * k);
  };
  point_rows(col0);
  float acc[M][R];
  float squares[M];  // NORM: this thread's share of sum(x^2) per input row
  auto clear_sums = [&] {
#pragma unroll
    for (int m = 0; m < M; ++m) {
      squares[m] = 0.f;
#pragma unroll
      for (int r = 0; r < R; ++r) acc[m][r] = 0.f;
    }
  };
  clear_sums();

  const int threads = blockDim.x;
  // Weight vectors v0 + u * threads of each row (zero past the end).
  auto load_weights = [&](int v0, uint4 (&wv)[U][R]) {
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int v = v0 + u * threads;
#pragma unroll
      for (int r = 0; r < R; ++r) wv[u][r] = v < nvec ? w[r][v] : make_uint4(0u, 0u, 0u, 0u);
    }
  };
  const int step = threads * U;
  uint4 wv[U][R];
  // The weights are constant: their first loads go out before waiting for the kernel that
  // writes the input (a programmatic dependent launch overlaps them with that kernel's tail).
  pdl_launch_dependents();
  load_weights(threadIdx.x, wv);
  pdl_wait();
  constexpr int kMaxWarps = kGemvThreads / 32;
  constexpr int kSums = M * R + (NORM ? M : 0);  // dot products, then (NORM) the squares
  __shared__ float partial[kMaxWarps][kSums];
  const int warps = threads / 32;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  // MULTI: the block takes groups blockIdx.x, + gridDim.x, ...; the next group's first weight
  // loads go out before this group's sums and epilogue, so they stay in flight through them.
  const int groups = (n + kCols - 1) / kCols;  // a group: kCols output features
  for (int group = blockIdx.x;;) {
    for (int v0 = threadIdx.x; v0 < nvec; v0 += step) {
      float xv[U][M][8];
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int v = v0 + u * threads;
        const bool live = v < nvec;
        float g[8];
        if constexpr (NORM) half8_to_float8(live ? reinterpret_cast<const uint4*>(norm_weight)[v] : make_uint4(0u, 0u, 0u, 0u), g);
#pragma unroll
        for (int m = 0; m < M; ++m) {
          const uint4 x = live ? reinterpret_cast<const uint4*>(input + m * in_stride)[v] : make_uint4(0u, 0u, 0u, 0u);
          half8_to_float8(x, xv[u][m]);
          if constexpr (NORM) {
#pragma unroll
            for (int i = 0; i < 8; ++i) {
              squares[m] = fmaf(xv[u][m][i], xv[u][m][i], squares[m]);
              xv[u][m][i] *= g[i];
            }
          }
        }
      }
#pragma unroll
      for (int u = 0; u < U; ++u)
#pragma unroll
        for (int m = 0; m < M; ++m)
#pragma unroll
          for (int r = 0; r < R; ++r) acc[m][r] = dot8(wv[u][r], xv[u][m], acc[m][r]);
      if (v0 + step < nvec) load_weights(v0 + step, wv);
    }
    const int next = group + static_cast<int>(gridDim.x);
    if (MULTI && next < groups) {
      point_rows(next * kCols);
      load_weights(threadIdx.x, wv);
    }

#pragma unroll
    for (int m = 0; m < M; ++m) {
#pragma unroll
      for (int r = 0; r < R; ++r) {
        const float s = warp_sum(acc[m][r]);
        if (lane == 0) partial[warp][m * R + r] = s;
      }
      if constexpr (NORM) {
        const float s = warp_sum(squares[m]);
        if (lane == 0) partial[warp][M * R + m] = s;
      }
    }
    __syncthreads();
    auto block_sum = [&](int i, float s) {
#pragma unroll
      for (int w = 0; w < kMaxWarps; ++w)
        if (w < warps) s += partial[w][i];
      return s;
    };
    // One thread per output (m, col): its row's (GATED: its gate and up rows') sums.
    auto weight_row_sum = [&](int m, int r, int row) {
      const float b = bias != nullptr ? __half2float(bias[row]) : 0.f;
      if constexpr (NORM) return b + block_sum(m * R + r, 0.f) * rsqrtf(block_sum(M * R + m, 0.f) / k + eps);
      return block_sum(m * R + r, b);
    };
    // kRopeCache: rows a and b (a pair) of token m, their sums ya and yb.
    auto rope_and_cache = [&](int m, int a, int b, float ya, float yb) {
      __half ha = __float2half(ya), hb = __float2half(yb);
      const int64_t pos = rope.positions[m];
      if (a < rope.q_size + rope.kv_size && pos >= 0 && pos < rope.max_position) {  // query or key: rotate
        const int half = rope.head_size / 2, i = (rope.neox ? a : a / 2) % half;
        const int64_t at = pos * rope.cos_sin_stride + i;
        auto entry = [&](int64_t j) {
          return rope.cos_sin_is_float ? static_cast<const float*>(rope.cos_sin)[j]
                                       : __half2float(static_cast<const __half*>(rope.cos_sin)[j]);
        };
        rotate_pair(ha, hb, round_to<__half>(entry(at)), round_to<__half>(entry(at + half)));
      }
      out[m * out_stride + a] = ha;
      out[m * out_stride + b] = hb;
      const int64_t slot = rope.slots[m];
      if (a >= rope.q_size && slot >= 0 && slot < rope.num_slots) {  // key or value: into the cache
        const bool value = a >= rope.q_size + rope.kv_size;
        const int first = value ? rope.q_size + rope.kv_size : rope.q_size;  // the section's first row
        __half* row = rope.kv_cache + ((value ? rope.num_slots : 0) + slot) * rope.kv_size;
        row[a - first] = ha;
        row[b - first] = hb;
      }
    };
    if (threadIdx.x < M * kCols) {
      const int m = threadIdx.x / kCols, c = threadIdx.x % kCols, col = col0 + c;
      if (col < n) {
        if constexpr (ROPE) {
          const int a = row_of(c), b = row_of(kCols + c);
          rope_and_cache(m, a, b, weight_row_sum(m, c, a), weight_row_sum(m, kCols + c, b));
        } else {
          float y = weight_row_sum(m, c, col);
          if constexpr (GATED) {
            const float up = round_to<__half>(weight_row_sum(m, kCols + c, n + col));
            y = round_to<__half>(activate<Activation::kSilu>(round_to<__half>(y))) * up;
          } else if constexpr (E == GemvEpilogue::kAdd) {
            y = round_to<__half>(y) + __half2float(out[m * out_stride + col]);
          }
          out[m * out_stride + col] = __float2half(y);
        }
      }
    }
    if constexpr (!MULTI) {
      break;
    } else {
      if (next >= groups) break;
      group = next;
      col0 = group * kCols;
      clear_sums();
      __syncthreads();  // the next group reuses `partial`
    }
  }
}

}  // namespace vllm_volta
