// GGUF block types decoded in registers (device code only, kernels/gguf.cuh's lanes): for each
// kept type, which 32 weights of a 1024-weight step a lane owns, their loads, and their decoding
// into 4 groups of 8 small integers with one (scale, offset) each. SM70 and newer: integer and
// FP32 instructions only. Block layouts: vllm_volta/model_executor/model_loader/gguf_dequant.py.
#pragma once

#include <cuda_fp16.h>

#ifdef __CUDACC_RTC__
using int64_t = long long;
using uint32_t = unsigned int;
using uint16_t = unsigned short;
using uint8_t = unsigned char;
using uintptr_t = unsigned long long;
#else
#include <cstdint>
#endif

namespace vllm_volta {

// GGML type ids (gguf.GGMLQuantizationType) of the types kept quantized.
constexpr int kGgmlQ4_0 = 2;
constexpr int kGgmlQ8_0 = 8;
constexpr int kGgmlQ4_K = 12;
constexpr int kGgmlQ5_K = 13;
constexpr int kGgmlQ6_K = 14;

namespace gguf {

__device__ __forceinline__ float half_bits(uint32_t bits) {
  return __half2float(__ushort_as_half(static_cast<unsigned short>(bits & 0xFFFFu)));
}

__device__ __forceinline__ uint32_t byte_of(uint32_t word, int i) { return (word >> (8 * i)) & 0xFFu; }

// Small integers to float without I2F (a conversion-pipe instruction, 1/8 of the FP32 rate on
// SM90): 2^23 + b has b as its low mantissa bits, so one byte permute and one FADD give b exactly.
constexpr float kTwo23 = 8388608.f;
__device__ __forceinline__ float int_bits_to_float(uint32_t small) {
  return __int_as_float(static_cast<int>(0x4B000000u | small)) - kTwo23;
}

// The 4 bytes of v as floats 0..255 (one PRMT and one FADD each).
__device__ __forceinline__ void bytes_to_float(uint32_t v, float* f) {
#pragma unroll
  for (int i = 0; i < 4; ++i) f[i] = __int_as_float(static_cast<int>(__byte_perm(v, 0x4B000000u, 0x7440 | i))) - kTwo23;
}

__device__ __forceinline__ void bytes8_to_float(uint32_t lo, uint32_t hi, float (&q)[8]) {
  bytes_to_float(lo, q);
  bytes_to_float(hi, q + 4);
}

// Bytes 0x80 | q << (7 - b) of v (q < 2^b) as the floats 1 + q / 2^b: one PRMT each puts the byte
// under the exponent of 1.0 (its 0x80 is the exponent's lowest bit), so no FADD is needed.
__device__ __forceinline__ void unit_bytes_to_float(uint32_t v, float* f) {
#pragma unroll
  for (int i = 0; i < 4; ++i) f[i] = __int_as_float(static_cast<int>(__byte_perm(v, 0x3F800000u, 0x7044 | (i << 8))));
}

// 8 integers q < 2^kBits (bytes of lo, hi) of a group with w = scale * q - offset. Exact (kUnit
// false): q as floats. kUnit (the gemv, kBits <= 7): u = 1 + q / 2^kBits with scale and offset
// rewritten so that w = scale * u - offset still holds (scale * u is q's term plus a constant).
template <bool kUnit, int kBits>
__device__ __forceinline__ void decode8(uint32_t lo, uint32_t hi, float (&q)[8], float& scale, float& offset) {
  if constexpr (kUnit && kBits <= 7) {
    constexpr int kShift = 7 - kBits;
    constexpr float kUnitScale = static_cast<float>(1 << kBits);
    unit_bytes_to_float((lo << kShift) | 0x80808080u, q);
    unit_bytes_to_float((hi << kShift) | 0x80808080u, q + 4);
    offset = fmaf(scale, kUnitScale, offset);
    scale *= kUnitScale;
  } else {
    bytes8_to_float(lo, hi, q);
  }
}

__device__ __forceinline__ uint32_t load_u16(const uint8_t* p) {
  return __ldg(reinterpret_cast<const unsigned short*>(p));
}

__device__ __forceinline__ uint32_t load_u32(const uint8_t* p) {
  return __ldg(reinterpret_cast<const unsigned int*>(p));
}

// 8 bytes at p (2-byte aligned) as two little-endian words.
__device__ __forceinline__ uint2 load8_u16(const uint8_t* p) {
  const unsigned short* h = reinterpret_cast<const unsigned short*>(p);
  const uint32_t a = __ldg(h), b = __ldg(h + 1), c = __ldg(h + 2), d = __ldg(h + 3);
  return make_uint2(a | (b << 16), c | (d << 16));
}

// N words (4 N bytes) at p, 2-byte aligned: aligned 32-bit loads joined by funnel shifts. Where p is
// not 4-byte aligned one more aligned word is read; it holds the last two bytes wanted, so it lies
// inside the (4-byte aligned) allocation.
template <int N>
__device__ __forceinline__ void load_words_a2(const uint8_t* p, uint32_t (&w)[N]) {
  const int misaligned = static_cast<int>(reinterpret_cast<uintptr_t>(p) & 2u);
  const unsigned int* base = reinterpret_cast<const unsigned int*>(p - misaligned);
  uint32_t raw[N + 1];
#pragma unroll
  for (int i = 0; i < N; ++i) raw[i] = __ldg(base + i);
  raw[N] = misaligned ? __ldg(base + N) : 0u;
#pragma unroll
  for (int i = 0; i < N; ++i) w[i] = __funnelshift_r(raw[i], raw[i + 1], 8 * misaligned);
}

// The 6-bit (scale, min) of sub-block j (0..7) of Q4_K / Q5_K from their 12 bytes (s0, s1, s2),
// without branches (lanes of one warp hold different j).
__device__ __forceinline__ void k_scale_min(uint32_t s0, uint32_t s1, uint32_t s2, int j, float& sc, float& mn) {
  const int i = j & 3;
  const uint32_t b0 = byte_of(s0, i), b1 = byte_of(s1, i), b2 = byte_of(s2, i);
  const bool low = j < 4;
  const uint32_t s = low ? (b0 & 63u) : ((b2 & 15u) | ((b0 >> 6) << 4));
  const uint32_t m = low ? (b1 & 63u) : ((b2 >> 4) | ((b1 >> 6) << 4));
  sc = int_bits_to_float(s);
  mn = int_bits_to_float(m);
}

}  // namespace gguf

// Every type is walked in steps of 1024 weights of a row; a lane owns 32 of them as 4 groups of 8
// consecutive weights, each group under one sub-block scale. A block type gives:
//   lane_valid(nblocks, step, lane): whether the lane's weights exist (K need not fill the step);
//   fetch(row, step, lane, raw): the lane's raw words and its groups' scales (loads only here);
//   x_offset(step, lane, g): the first weight of group g in the row;
//   group<kUnit>(raw, g, q, scale, offset): group g's 8 weights, w_i = scale * q_i - offset, q_i
//     small non-negative integers as floats (exact: the dequantize kernel), or with kUnit the
//     cheaper 1 + q_i / 2^bits (gguf::decode8: the gemv).
// K-quants: 4 super-blocks a step, 8 lanes each; 32-weight types: 32 blocks a step, one a lane.

// Q4_K: d, dmin f16; scales u8[12]; qs u8[128] (4 chunks of 32: low nibbles sub-block 2c, high 2c+1).
// Lane: chunk c, half hf: qs[32 c + 16 hf, + 16), i.e. weights 16 hf.. of sub-blocks 2c and 2c + 1.
struct GgufQ4K {
  static constexpr int kBlockElems = 256, kBlockBytes = 144;
  struct Raw {
    uint4 qs;
    float scale[2], offset[2];
  };
  __device__ __forceinline__ static bool lane_valid(int nblocks, int step, int lane) {
    return step * 4 + (lane >> 3) < nblocks;
  }
  __device__ __forceinline__ static int x_offset(int step, int lane, int g) {
    return (step * 4 + (lane >> 3)) * 256 + 64 * ((lane >> 1) & 3) + 16 * (lane & 1) + (g & 1) * 8 + (g >> 1) * 32;
  }
  __device__ __forceinline__ static void fetch_scales(const uint8_t* b, int c, Raw& raw) {
    const uint32_t dm = gguf::load_u32(b);
    const uint32_t s0 = gguf::load_u32(b + 4), s1 = gguf::load_u32(b + 8), s2 = gguf::load_u32(b + 12);
    const float d = gguf::half_bits(dm), dmin = gguf::half_bits(dm >> 16);
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      float sc, mn;
      gguf::k_scale_min(s0, s1, s2, 2 * c + i, sc, mn);
      raw.scale[i] = d * sc;
      raw.offset[i] = dmin * mn;
    }
  }
  __device__ __forceinline__ static void fetch(const uint8_t* row, int step, int lane, Raw& raw) {
    const uint8_t* b = row + (step * 4 + (lane >> 3)) * kBlockBytes;  // rows are < 2^31 bytes
    const int c = (lane >> 1) & 3;
    raw.qs = __ldg(reinterpret_cast<const uint4*>(b + 16 + 32 * c + 16 * (lane & 1)));
    fetch_scales(b, c, raw);
  }
  template <bool kUnit>
  __device__ __forceinline__ static void group(const Raw& raw, int g, float (&q)[8], float& scale, float& offset) {
    const int shift = (g >> 1) * 4;  // groups 0, 1: low nibbles (sub-block 2c); 2, 3: high (2c + 1)
    const uint32_t lo = (g & 1) ? raw.qs.z : raw.qs.x, hi = (g & 1) ? raw.qs.w : raw.qs.y;
    scale = raw.scale[g >> 1];
    offset = raw.offset[g >> 1];
    gguf::decode8<kUnit, 4>((lo >> shift) & 0x0F0F0F0Fu, (hi >> shift) & 0x0F0F0F0Fu, q, scale, offset);
  }
};

// Q5_K: as Q4_K plus qh u8[32] before qs: the fifth bit of sub-block j, element e is bit j of qh[e].
struct GgufQ5K {
  static constexpr int kBlockElems = 256, kBlockBytes = 176;
  struct Raw {
    uint4 qs, qh;
    float scale[2], offset[2];
    int c;
  };
  __device__ __forceinline__ static bool lane_valid(int nblocks, int step, int lane) {
    return GgufQ4K::lane_valid(nblocks, step, lane);
  }
  __device__ __forceinline__ static int x_offset(int step, int lane, int g) { return GgufQ4K::x_offset(step, lane, g); }
  __device__ __forceinline__ static void fetch(const uint8_t* row, int step, int lane, Raw& raw) {
    const uint8_t* b = row + (step * 4 + (lane >> 3)) * kBlockBytes;
    raw.c = (lane >> 1) & 3;
    raw.qh = __ldg(reinterpret_cast<const uint4*>(b + 16 + 16 * (lane & 1)));
    raw.qs = __ldg(reinterpret_cast<const uint4*>(b + 48 + 32 * raw.c + 16 * (lane & 1)));
    GgufQ4K::Raw k;
    GgufQ4K::fetch_scales(b, raw.c, k);
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      raw.scale[i] = k.scale[i];
      raw.offset[i] = k.offset[i];
    }
  }
  template <bool kUnit>
  __device__ __forceinline__ static void group(const Raw& raw, int g, float (&q)[8], float& scale, float& offset) {
    const int shift = (g >> 1) * 4, bit = 2 * raw.c + (g >> 1);
    const uint32_t lo = (g & 1) ? raw.qs.z : raw.qs.x, hi = (g & 1) ? raw.qs.w : raw.qs.y;
    const uint32_t hlo = (g & 1) ? raw.qh.z : raw.qh.x, hhi = (g & 1) ? raw.qh.w : raw.qh.y;
    scale = raw.scale[g >> 1];
    offset = raw.offset[g >> 1];
    gguf::decode8<kUnit, 5>(((lo >> shift) & 0x0F0F0F0Fu) | (((hlo >> bit) & 0x01010101u) << 4),
                            ((hi >> shift) & 0x0F0F0F0Fu) | (((hhi >> bit) & 0x01010101u) << 4), q, scale, offset);
  }
};

// Q6_K: ql u8[128], qh u8[64], scales int8[16], d f16. Half h (128 weights) = 4 runs of 32: run r,
// element l takes the low nibble (r < 2) or high nibble (r >= 2) of ql[64 h + 32 (r & 1) + l] and
// bits 2r, 2r + 1 of qh[32 h + l]; w = d * scale[sub-block of 16] * (q - 32). Lane: half h,
// elements l in [p, p + 8) of all 4 runs (group g = run g).
struct GgufQ6K {
  static constexpr int kBlockElems = 256, kBlockBytes = 210;
  struct Raw {
    uint2 ql[2], qh;
    float scale[4];
  };
  __device__ __forceinline__ static bool lane_valid(int nblocks, int step, int lane) {
    return step * 4 + (lane >> 3) < nblocks;
  }
  __device__ __forceinline__ static int x_offset(int step, int lane, int g) {
    return (step * 4 + (lane >> 3)) * 256 + 128 * ((lane >> 2) & 1) + 32 * g + 8 * (lane & 3);
  }
  __device__ __forceinline__ static void fetch(const uint8_t* row, int step, int lane, Raw& raw) {
    const uint8_t* b = row + (step * 4 + (lane >> 3)) * kBlockBytes;  // 2-byte aligned
    const int h = (lane >> 2) & 1, p = 8 * (lane & 3);
    raw.ql[0] = gguf::load8_u16(b + 64 * h + p);
    raw.ql[1] = gguf::load8_u16(b + 64 * h + 32 + p);
    raw.qh = gguf::load8_u16(b + 128 + 32 * h + p);
    const float d = gguf::half_bits(gguf::load_u16(b + 208));
#pragma unroll
    for (int g = 0; g < 4; ++g) {
      // Sub-block (128 h + 32 g + p) / 16: its signed scale byte, offset by 128 to read it unsigned.
      const uint32_t sub = __ldg(b + 192 + 8 * h + 2 * g + (p >> 4));
      raw.scale[g] = d * (gguf::int_bits_to_float(sub ^ 0x80u) - 128.f);
    }
  }
  template <bool kUnit>
  __device__ __forceinline__ static void group(const Raw& raw, int g, float (&q)[8], float& scale, float& offset) {
    const uint2 ql = raw.ql[g & 1];
    const int low_shift = (g >> 1) * 4, high_shift = 2 * g;
    scale = raw.scale[g];
    offset = 32.f * scale;
    gguf::decode8<kUnit, 6>(((ql.x >> low_shift) & 0x0F0F0F0Fu) | (((raw.qh.x >> high_shift) & 0x03030303u) << 4),
                            ((ql.y >> low_shift) & 0x0F0F0F0Fu) | (((raw.qh.y >> high_shift) & 0x03030303u) << 4), q,
                            scale, offset);
  }
};

// Q8_0: d f16, q int8[32]; w = d * q = d * (q + 128) - 128 d. Lane: one block.
struct GgufQ8_0 {
  static constexpr int kBlockElems = 32, kBlockBytes = 34;
  struct Raw {
    uint32_t qs[8];
    float scale;
  };
  __device__ __forceinline__ static bool lane_valid(int nblocks, int step, int lane) {
    return step * 32 + lane < nblocks;
  }
  __device__ __forceinline__ static int x_offset(int step, int lane, int g) { return (step * 32 + lane) * 32 + 8 * g; }
  __device__ __forceinline__ static void fetch(const uint8_t* row, int step, int lane, Raw& raw) {
    const uint8_t* b = row + (step * 32 + lane) * kBlockBytes;
    gguf::load_words_a2<8>(b + 2, raw.qs);
    raw.scale = gguf::half_bits(gguf::load_u16(b));
  }
  template <bool kUnit>
  __device__ __forceinline__ static void group(const Raw& raw, int g, float (&q)[8], float& scale, float& offset) {
    scale = raw.scale;
    offset = 128.f * raw.scale;
    // q + 128 as unsigned bytes: 8 bits, always exact floats.
    gguf::decode8<kUnit, 8>(raw.qs[2 * g] ^ 0x80808080u, raw.qs[2 * g + 1] ^ 0x80808080u, q, scale, offset);
  }
};

// Q4_0: d f16, qs u8[16]: weights 0..15 the low nibbles, 16..31 the high ones; w = d * (q - 8).
// Lane: one block.
struct GgufQ4_0 {
  static constexpr int kBlockElems = 32, kBlockBytes = 18;
  struct Raw {
    uint32_t qs[4];
    float scale;
  };
  __device__ __forceinline__ static bool lane_valid(int nblocks, int step, int lane) {
    return GgufQ8_0::lane_valid(nblocks, step, lane);
  }
  __device__ __forceinline__ static int x_offset(int step, int lane, int g) {
    return GgufQ8_0::x_offset(step, lane, g);
  }
  __device__ __forceinline__ static void fetch(const uint8_t* row, int step, int lane, Raw& raw) {
    const uint8_t* b = row + (step * 32 + lane) * kBlockBytes;
    gguf::load_words_a2<4>(b + 2, raw.qs);
    raw.scale = gguf::half_bits(gguf::load_u16(b));
  }
  template <bool kUnit>
  __device__ __forceinline__ static void group(const Raw& raw, int g, float (&q)[8], float& scale, float& offset) {
    const int shift = (g >> 1) * 4, word = 2 * (g & 1);  // groups 0, 1: low nibbles; 2, 3: high
    scale = raw.scale;
    offset = 8.f * raw.scale;
    gguf::decode8<kUnit, 4>((raw.qs[word] >> shift) & 0x0F0F0F0Fu, (raw.qs[word + 1] >> shift) & 0x0F0F0F0Fu, q,
                            scale, offset);
  }
};

}  // namespace vllm_volta
