// Causal depthwise conv1d over a linear-attention layer's q | k | v channels, with a per-slot
// conv state (the last kWidth - 1 inputs of each channel, oldest first), SiLU optional.
// Device code only. One thread per (token, channel): depthwise, so channels never interact.
//
//   out[t, c] = act(bias[c] + sum_i weight[c, i] * x_ext[t - (kWidth - 1) + i, c])
// where x_ext is the sequence's inputs preceded by its conv state (zeros for a new sequence).
// The sum is FP32; it is rounded to T before the activation, as a T-typed conv would store it.
#pragma once

#include "type_convert.cuh"

namespace vllm_volta {

constexpr int kConvThreads = 256;

template <typename T>
struct ConvParams {
  const T* x;  // [N, C], token rows x_stride apart
  int64_t x_stride;
  T* out;  // [N, C] contiguous
  const T* weight;  // [C, kWidth] contiguous
  const T* bias;    // [C] or null
  T* conv_state;    // [num_slots, C, kWidth - 1], strides below
  int64_t st_slot, st_chan, st_pos;
  const int* state_slots;         // [B]; negative: skip the sequence (zeros out, state untouched)
  const int* query_start_loc;     // [B + 1] (prefill), null for decode (token b = sequence b)
  const bool* has_initial_state;  // [B] or null (every sequence continues from its state)
  int channels;
  int num_tokens;
  int num_seqs;
  bool silu;
};

template <typename T, int kWidth>
__device__ __forceinline__ float conv_output(const ConvParams<T>& p, int c, const float (&window)[kWidth]) {
  float acc = p.bias ? Convert<T>::to_float(p.bias[c]) : 0.f;
#pragma unroll
  for (int i = 0; i < kWidth; ++i) acc = fmaf(Convert<T>::to_float(p.weight[c * kWidth + i]), window[i], acc);
  acc = round_to<T>(acc);
  return p.silu ? acc / (1.f + __expf(-acc)) : acc;
}

// Decode: one token per sequence; reads the slot's state, writes the output and the shifted state.
template <typename T, int kWidth>
__global__ void __launch_bounds__(kConvThreads) causal_conv1d_update_kernel(ConvParams<T> p) {
  if constexpr (!arch_supports<T>::value) {
    __trap();
  } else {
    const int c = blockIdx.x * kConvThreads + threadIdx.x;
    const int b = blockIdx.y;
    if (c >= p.channels) return;
    const int slot = p.state_slots[b];
    T* out = p.out + static_cast<int64_t>(b) * p.channels + c;
    if (slot < 0) {
      *out = Convert<T>::from_float(0.f);
      return;
    }
    T* st = p.conv_state + slot * p.st_slot + c * p.st_chan;
    const bool load = p.has_initial_state == nullptr || p.has_initial_state[b];
    float window[kWidth];
#pragma unroll
    for (int i = 0; i + 1 < kWidth; ++i) window[i] = load ? Convert<T>::to_float(st[i * p.st_pos]) : 0.f;
    const T x = p.x[b * p.x_stride + c];
    window[kWidth - 1] = Convert<T>::to_float(x);
    *out = Convert<T>::from_float(conv_output<T, kWidth>(p, c, window));
#pragma unroll
    for (int i = 0; i + 2 < kWidth; ++i) st[i * p.st_pos] = Convert<T>::from_float(window[i + 1]);
    st[(kWidth - 2) * p.st_pos] = x;
  }
}

// The sequence holding token t: the last b with query_start_loc[b] <= t (binary search).
__device__ __forceinline__ int conv_seq_of(const int* qsl, int num_seqs, int t) {
  int lo = 0, hi = num_seqs - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) >> 1;
    if (qsl[mid] <= t) lo = mid; else hi = mid - 1;
  }
  return lo;
}

// Prefill outputs (varlen): reads the states, never writes them (causal_conv1d_state_kernel,
// launched after it on the stream, does), so no block sees a state another one has updated.
template <typename T, int kWidth>
__global__ void __launch_bounds__(kConvThreads) causal_conv1d_fwd_kernel(ConvParams<T> p) {
  if constexpr (!arch_supports<T>::value) {
    __trap();
  } else {
    const int c = blockIdx.x * kConvThreads + threadIdx.x;
    if (c >= p.channels) return;
    for (int t = blockIdx.y; t < p.num_tokens; t += gridDim.y) {
      const int b = conv_seq_of(p.query_start_loc, p.num_seqs, t);
      const int start = p.query_start_loc[b];
      T* out = p.out + static_cast<int64_t>(t) * p.channels + c;
      const int slot = p.state_slots[b];
      if (slot < 0) {
        *out = Convert<T>::from_float(0.f);
        continue;
      }
      const bool load = p.has_initial_state == nullptr || p.has_initial_state[b];
      const T* st = p.conv_state + slot * p.st_slot + c * p.st_chan;
      const int pos = t - start;  // position in the sequence
      float window[kWidth];
#pragma unroll
      for (int i = 0; i < kWidth; ++i) {
        const int src = pos - (kWidth - 1) + i;  // < 0: from the state, at kWidth - 1 + src
        if (src >= 0) {
          window[i] = Convert<T>::to_float(p.x[static_cast<int64_t>(start + src) * p.x_stride + c]);
        } else {
          window[i] = load ? Convert<T>::to_float(st[(kWidth - 1 + src) * p.st_pos]) : 0.f;
        }
      }
      *out = Convert<T>::from_float(conv_output<T, kWidth>(p, c, window));
    }
  }
}

// Prefill state write-back: each (sequence, channel) keeps the last kWidth - 1 entries of
// state ++ inputs (all old entries are read before any is written, by the same thread).
template <typename T, int kWidth>
__global__ void __launch_bounds__(kConvThreads) causal_conv1d_state_kernel(ConvParams<T> p) {
  if constexpr (!arch_supports<T>::value) {
    __trap();
  } else {
    const int c = blockIdx.x * kConvThreads + threadIdx.x;
    const int b = blockIdx.y;
    if (c >= p.channels) return;
    const int slot = p.state_slots[b];
    if (slot < 0) return;
    const int start = p.query_start_loc[b];
    const int len = p.query_start_loc[b + 1] - start;
    const bool load = p.has_initial_state == nullptr || p.has_initial_state[b];
    T* st = p.conv_state + slot * p.st_slot + c * p.st_chan;
    T old[kWidth - 1];
#pragma unroll
    for (int i = 0; i + 1 < kWidth; ++i) old[i] = load ? st[i * p.st_pos] : Convert<T>::from_float(0.f);
#pragma unroll
    for (int j = 0; j + 1 < kWidth; ++j) {
      const int m = len + j;  // index into state ++ inputs (the state is entries 0 .. kWidth - 2)
      st[j * p.st_pos] = m < kWidth - 1 ? old[m] : p.x[static_cast<int64_t>(start + m - (kWidth - 1)) * p.x_stride + c];
    }
  }
}

}  // namespace vllm_volta
