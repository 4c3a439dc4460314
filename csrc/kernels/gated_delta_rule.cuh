// Gated DeltaNet recurrence (Qwen3.5 / Qwen3-Next linear attention), device code only.
//
// Per sequence and value head h, with q, k of the key head h / (Hv / Hk), a state S [Dk, Dv]:
//   S <- S * exp(g_t);  S <- S + k_t (beta_t * (v_t - S^T k_t))^T;  o_t = S^T (q_t * scale)
// (q, k optionally L2-normalised first; g, beta given, or made from the raw a / b projections
// as g = -exp(A_log) * softplus(a + dt_bias), beta = sigmoid(b)).
//
// The columns of S are independent (each column j only needs v_j and its own entries), so a
// block owns a [Dk, kCols] tile of one head's state for the whole sequence, in registers: it
// is read once and written once. With S the state before the token and e = exp(g):
//   S^T k, S^T q and the scalars |q|^2, |k|^2, q.k come from ONE reduction over the rows,
//   delta = beta * (v - e * S^T k_hat),  o = e * S^T q_hat + delta * (k_hat . q_hat),
// then S' = e * S + k_hat delta^T. One block-wide reduction (one __syncthreads) per token.
// FMA only: no tensor cores, nothing below SM70 missing. bf16 compiles to a trap below SM80.
#pragma once

#include "type_convert.cuh"

namespace vllm_volta {

constexpr int kGdnThreads = 128;  // 4 warps
constexpr int kGdnWarps = kGdnThreads / 32;

// Scalar element types of the per-token gate inputs (a / b / A_log / dt_bias), chosen at run
// time: they are one value per (token, head), so a branch costs nothing and saves instances.
enum GdnScalarType : int { kGdnF32 = 0, kGdnF16 = 1, kGdnBF16 = 2 };

struct GdnParams {
  const void* q;  // [N, Hk, Dk], token rows q_stride apart, heads packed
  const void* k;  // [N, Hk, Dk], rows k_stride apart
  const void* v;  // [N, Hv, Dv], rows v_stride apart
  int64_t q_stride, k_stride, v_stride;
  const void* a;  // [N, Hv]: g, or the raw a projection when A_log is given
  const void* b;  // [N, Hv]: beta, or the raw b projection when A_log is given
  int64_t a_stride, b_stride;
  int a_type, b_type;
  const void* A_log;    // [Hv] or null
  const void* dt_bias;  // [Hv] (with A_log)
  int A_log_type, dt_bias_type;
  void* state;  // [num_slots, Hv, Dk, Dv] contiguous
  const int* state_slots;          // [B]; a negative slot skips the sequence
  const int* query_start_loc;      // [B + 1] (kVarlen), else unused: one token per sequence
  const bool* has_initial_state;   // [B], or null: every sequence continues from its slot
  void* out;  // [N, Hv, Dv] contiguous
  int num_k_heads, num_v_heads, dk, dv;
  float scale;
  bool qk_l2norm;
};

// A gate input's raw bits (float32, or float16 / bfloat16 in the low half), loaded now and
// converted later, so the load's latency hides behind the previous token's work.
__device__ __forceinline__ unsigned gdn_load_bits(const void* p, int type, int64_t i) {
  if (type == kGdnF32) return static_cast<const unsigned*>(p)[i];
  return static_cast<const unsigned short*>(p)[i];
}

__device__ __forceinline__ float gdn_bits_to_float(unsigned bits, int type) {
  if (type == kGdnF16) return __half2float(__ushort_as_half(static_cast<unsigned short>(bits)));
  if (type == kGdnBF16) return __uint_as_float(bits << 16);  // bf16 is float32's upper half: exact
  return __uint_as_float(bits);
}

__device__ __forceinline__ float gdn_load_scalar(const void* p, int type, int64_t i) {
  return gdn_bits_to_float(gdn_load_bits(p, type, i), type);
}

// softplus with torch's default threshold (x > 20 -> x).
__device__ __forceinline__ float gdn_softplus(float x) { return x > 20.f ? x : log1pf(__expf(x)); }

// Per-head gate constants: -exp(A_log[h]) and dt_bias[h] (fused gates only).
struct GdnHeadGates {
  float neg_A;
  float dt_bias;
};

// g (log decay) and beta of a token from its raw a / b inputs.
__device__ __forceinline__ void gdn_gates(const GdnParams& p, const GdnHeadGates& hg, unsigned a_bits,
                                          unsigned b_bits, float& g, float& beta) {
  const float a = gdn_bits_to_float(a_bits, p.a_type);
  const float b = gdn_bits_to_float(b_bits, p.b_type);
  if (p.A_log != nullptr) {
    g = hg.neg_A * gdn_softplus(a + hg.dt_bias);
    beta = 1.f / (1.f + expf(-b));
  } else {
    g = a;
    beta = b;
  }
}

// One token's inputs as loaded (unconverted): q / k rows of this thread, v columns, gate bits.
template <typename T, int kRows, int kVec>
struct GdnTokenRaw {
  T q[kRows];
  T k[kRows];
  T v[kVec];
  unsigned a, b;
};

// Block tile: kColThreads threads across kColThreads * kVec state columns, the rest of the
// warp and the other warps down the rows (row of register r: ry + r * kRowThreads).
// kVarlen: tokens query_start_loc[seq] .. [seq + 1], the next token's inputs loaded during the
// current one's reduction; else token seq alone (decode: no prefetch registers).
template <typename T, typename S, int kVec, int kColThreads, int kMaxDk, bool kVarlen>
__global__ void __launch_bounds__(kGdnThreads) gated_delta_rule_kernel(GdnParams p) {
  if constexpr (!arch_supports<T>::value || !arch_supports<S>::value) {
    __trap();
  } else {
    constexpr int kWarpRows = 32 / kColThreads;
    constexpr int kRowThreads = kWarpRows * kGdnWarps;
    constexpr int kRows = (kMaxDk + kRowThreads - 1) / kRowThreads;
    constexpr int kCols = kColThreads * kVec;
    constexpr int kRed = 2 * kVec + 3;  // S^T k, S^T q per column, then |q|^2, |k|^2, q.k
    __shared__ float red[2][kGdnWarps][kColThreads][kRed];

    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int cx = lane % kColThreads;
    const int ry = warp * kWarpRows + lane / kColThreads;
    const int chunks = (p.dv + kCols - 1) / kCols;
    const int h = blockIdx.x / chunks;
    const int col0 = (blockIdx.x % chunks) * kCols + cx * kVec;
    const int hk = h / (p.num_v_heads / p.num_k_heads);
    const int seq = blockIdx.y;
    const int slot = p.state_slots[seq];
    const int64_t t_begin = kVarlen ? p.query_start_loc[seq] : seq;
    const int64_t t_end = kVarlen ? p.query_start_loc[seq + 1] : seq + 1;
    // Which of this thread's columns exist (Dv need not be a multiple of the tile).
    bool col_ok[kVec];
#pragma unroll
    for (int c = 0; c < kVec; ++c) col_ok[c] = col0 + c < p.dv;
    const bool writes_out = ry == 0;  // one row of threads stores o

    if (slot < 0) {  // a skipped row: zeros out, the state is neither read nor written
      if (writes_out)
        for (int64_t t = t_begin; t < t_end; ++t)
#pragma unroll
          for (int c = 0; c < kVec; ++c)
            if (col_ok[c])
              static_cast<T*>(p.out)[(t * p.num_v_heads + h) * p.dv + col0 + c] = Convert<T>::from_float(0.f);
      return;
    }

    S* state = static_cast<S*>(p.state) + (static_cast<int64_t>(slot) * p.num_v_heads + h) * p.dk * p.dv;
    const bool load = p.has_initial_state == nullptr || p.has_initial_state[seq];
    float s[kRows][kVec];
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      const int i = ry + r * kRowThreads;
      Vec<S, kVec> in;
      if (load && i < p.dk && col_ok[0]) {
        if constexpr (kVec > 1) {  // the host picks kVec > 1 only when Dv % kVec == 0
          in = *reinterpret_cast<const Vec<S, kVec>*>(state + static_cast<int64_t>(i) * p.dv + col0);
        } else {
          in.v[0] = state[static_cast<int64_t>(i) * p.dv + col0];
        }
#pragma unroll
        for (int c = 0; c < kVec; ++c) s[r][c] = Convert<S>::to_float(in.v[c]);
      } else {
#pragma unroll
        for (int c = 0; c < kVec; ++c) s[r][c] = 0.f;
      }
    }

    const T* qbase = static_cast<const T*>(p.q) + static_cast<int64_t>(hk) * p.dk;
    const T* kbase = static_cast<const T*>(p.k) + static_cast<int64_t>(hk) * p.dk;
    const T* vbase = static_cast<const T*>(p.v) + static_cast<int64_t>(h) * p.dv + col0;
    GdnHeadGates hg{0.f, 0.f};
    if (p.A_log != nullptr) {
      hg.neg_A = -expf(gdn_load_scalar(p.A_log, p.A_log_type, h));
      hg.dt_bias = gdn_load_scalar(p.dt_bias, p.dt_bias_type, h);
    }
    const T zero = Convert<T>::from_float(0.f);
    GdnTokenRaw<T, kRows, kVec> raw;
    auto load_token = [&](int64_t t) {
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
        const int i = ry + r * kRowThreads;
        raw.q[r] = i < p.dk ? qbase[t * p.q_stride + i] : zero;
        raw.k[r] = i < p.dk ? kbase[t * p.k_stride + i] : zero;
      }
#pragma unroll
      for (int c = 0; c < kVec; ++c) raw.v[c] = col_ok[c] ? vbase[t * p.v_stride + c] : zero;
      raw.a = gdn_load_bits(p.a, p.a_type, t * p.a_stride + h);
      raw.b = gdn_load_bits(p.b, p.b_type, t * p.b_stride + h);
    };
    if (t_begin < t_end) load_token(t_begin);
    for (int64_t t = t_begin; t < t_end; ++t) {
      const int buf = static_cast<int>((t - t_begin) & 1);
      float qv[kRows], kv[kRows], vv[kVec];
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
        qv[r] = Convert<T>::to_float(raw.q[r]);
        kv[r] = Convert<T>::to_float(raw.k[r]);
      }
#pragma unroll
      for (int c = 0; c < kVec; ++c) vv[c] = Convert<T>::to_float(raw.v[c]);
      float g, beta;
      gdn_gates(p, hg, raw.a, raw.b, g, beta);
      if (kVarlen && t + 1 < t_end) load_token(t + 1);  // in flight during this token's reduction

      float part[kRed];
#pragma unroll
      for (int j = 0; j < kRed; ++j) part[j] = 0.f;
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
#pragma unroll
        for (int c = 0; c < kVec; ++c) {
          part[c] = fmaf(s[r][c], kv[r], part[c]);
          part[kVec + c] = fmaf(s[r][c], qv[r], part[kVec + c]);
        }
        part[2 * kVec] = fmaf(qv[r], qv[r], part[2 * kVec]);
        part[2 * kVec + 1] = fmaf(kv[r], kv[r], part[2 * kVec + 1]);
        part[2 * kVec + 2] = fmaf(qv[r], kv[r], part[2 * kVec + 2]);
      }
      // Sum over the lanes of the warp that share cx, then over the warps in shared memory
      // (double-buffered by token parity, so one barrier per token suffices).
#pragma unroll
      for (int off = kColThreads; off < 32; off <<= 1)
#pragma unroll
        for (int j = 0; j < kRed; ++j) part[j] += __shfl_xor_sync(0xffffffffu, part[j], off);
      if (lane < kColThreads)
#pragma unroll
        for (int j = 0; j < kRed; ++j) red[buf][warp][cx][j] = part[j];
      __syncthreads();
#pragma unroll
      for (int j = 0; j < kRed; ++j) {
        float sum = 0.f;
#pragma unroll
        for (int w = 0; w < kGdnWarps; ++w) sum += red[buf][w][cx][j];
        part[j] = sum;
      }

      const float rq = p.qk_l2norm ? rsqrtf(part[2 * kVec] + 1e-6f) : 1.f;
      const float rk = p.qk_l2norm ? rsqrtf(part[2 * kVec + 1] + 1e-6f) : 1.f;
      const float decay = expf(g);
      const float qs = rq * p.scale;
      const float kq = part[2 * kVec + 2] * rk * qs;  // k_hat . (q_hat * scale)
      float delta[kVec];
#pragma unroll
      for (int c = 0; c < kVec; ++c) {
        delta[c] = beta * (vv[c] - decay * rk * part[c]);
        if (writes_out && col_ok[c]) {
          const float o = decay * qs * part[kVec + c] + delta[c] * kq;
          static_cast<T*>(p.out)[(t * p.num_v_heads + h) * p.dv + col0 + c] = Convert<T>::from_float(o);
        }
      }
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
        const float kh = kv[r] * rk;
#pragma unroll
        for (int c = 0; c < kVec; ++c) s[r][c] = fmaf(kh, delta[c], decay * s[r][c]);
      }
    }

#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      const int i = ry + r * kRowThreads;
      if (i >= p.dk || !col_ok[0]) continue;
      Vec<S, kVec> o;
#pragma unroll
      for (int c = 0; c < kVec; ++c) o.v[c] = Convert<S>::from_float(s[r][c]);
      if constexpr (kVec > 1) {
        *reinterpret_cast<Vec<S, kVec>*>(state + static_cast<int64_t>(i) * p.dv + col0) = o;
      } else {
        state[static_cast<int64_t>(i) * p.dv + col0] = o.v[0];
      }
    }
  }
}

}  // namespace vllm_volta
