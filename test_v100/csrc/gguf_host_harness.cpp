// Runs the device code of csrc/kernels/gguf.cuh on the host (test_gguf_host.py): the CUDA builtins
// the kernels use are emulated (a warp is 32 std::threads; __shfl_xor_sync trades values through a
// barrier), so the exact kernel source is checked without a GPU.
//   gguf_host_harness gemv <qtype> <M> <N> <K> <weight> <x> <bias or -> <out>
//   gguf_host_harness dequantize <qtype> <N> <K> <weight> <out>
// Files are raw little-endian arrays: weight uint8 [N, row_bytes], x / bias / out float16.
#include <algorithm>
#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <iterator>
#include <string>
#include <thread>
#include <vector>

#include <cuda_fp16.h>
#include <vector_types.h>

struct HostDim3 {
  unsigned x = 0, y = 0, z = 0;
};
thread_local HostDim3 threadIdx, blockIdx;
HostDim3 blockDim;

struct Warp {
  float slots[32];
  std::barrier<> sync{32};
};
thread_local Warp* current_warp = nullptr;

inline float __shfl_xor_sync(unsigned, float v, int offset) {
  const int lane = threadIdx.x & 31;
  current_warp->slots[lane] = v;
  current_warp->sync.arrive_and_wait();
  const float other = current_warp->slots[lane ^ offset];
  current_warp->sync.arrive_and_wait();
  return other;
}

template <typename T>
inline T __ldg(const T* p) {
  return *p;
}

using std::min;

inline float __int_as_float(int i) {
  float f;
  std::memcpy(&f, &i, sizeof f);
  return f;
}

inline unsigned __funnelshift_r(unsigned lo, unsigned hi, unsigned shift) {
  return static_cast<unsigned>(((static_cast<unsigned long long>(hi) << 32) | lo) >> (shift & 31));
}

// PTX prmt (default mode): result byte k = byte (s >> 4k) & 7 of the 8 bytes {y:x}.
inline unsigned __byte_perm(unsigned x, unsigned y, unsigned s) {
  const unsigned long long bytes = (static_cast<unsigned long long>(y) << 32) | x;
  unsigned r = 0;
  for (int k = 0; k < 4; ++k) r |= static_cast<unsigned>((bytes >> (8 * ((s >> (4 * k)) & 7))) & 0xFF) << (8 * k);
  return r;
}

inline void __syncthreads() {}  // reduce.cuh's row_sum (unused by the GGUF kernels)
#define __launch_bounds__(x)

#include "kernels/gguf.cuh"

using namespace vllm_volta;

static std::vector<unsigned char> read_file(const char* path) {
  std::ifstream f(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

static void write_file(const char* path, const void* data, size_t n) {
  std::ofstream f(path, std::ios::binary);
  f.write(static_cast<const char*>(data), static_cast<std::streamsize>(n));
}

// Every warp of every block, one warp at a time, its 32 lanes as threads.
static void run_grid(unsigned blocks, unsigned threads, const std::function<void()>& kernel) {
  blockDim.x = threads;
  for (unsigned b = 0; b < blocks; ++b) {
    for (unsigned w = 0; w < threads / 32; ++w) {
      Warp warp;
      std::vector<std::thread> lanes;
      for (unsigned lane = 0; lane < 32; ++lane) {
        lanes.emplace_back([&, lane] {
          blockIdx.x = b;
          threadIdx.x = w * 32 + lane;
          current_warp = &warp;
          kernel();
        });
      }
      for (auto& t : lanes) t.join();
    }
  }
}

template <typename B, int M>
static void gemv(int n, int k, const unsigned char* w, const __half* x, const __half* bias, __half* out) {
  const int64_t row_bytes = k / B::kBlockElems * B::kBlockBytes;
  constexpr int R = gguf_rows_per_warp<M>();
  run_grid((n + kGgufGemvWarps * R - 1) / (kGgufGemvWarps * R), kGgufGemvWarps * 32,
           [&] { gguf_gemv_kernel<M, R, B>(out, n, x, k, w, row_bytes, bias, n, k); });
}

template <typename B>
static void gemv_rows(int m, int n, int k, const unsigned char* w, const __half* x, const __half* bias, __half* out) {
  switch (m) {
    case 1: return gemv<B, 1>(n, k, w, x, bias, out);
    case 2: return gemv<B, 2>(n, k, w, x, bias, out);
    case 3: return gemv<B, 3>(n, k, w, x, bias, out);
    case 4: return gemv<B, 4>(n, k, w, x, bias, out);
    case 5: return gemv<B, 5>(n, k, w, x, bias, out);
    case 6: return gemv<B, 6>(n, k, w, x, bias, out);
    case 7: return gemv<B, 7>(n, k, w, x, bias, out);
    default: return gemv<B, 8>(n, k, w, x, bias, out);
  }
}

template <typename B>
static void dequantize(int n, int k, const unsigned char* w, __half* out) {
  const int64_t row_bytes = k / B::kBlockElems * B::kBlockBytes;
  const int64_t threads = static_cast<int64_t>(n) * ((k + kGgufStep - 1) / kGgufStep) * 32;
  // No warp-level calls: each thread runs alone (one "warp" of 32 at a time keeps run_grid simple).
  run_grid(static_cast<unsigned>((threads + 255) / 256), 256,
           [&] { gguf_dequantize_kernel<B>(out, w, row_bytes, n, k); });
}

template <typename F>
static void dispatch(int qtype, F&& f) {
  switch (qtype) {
    case kGgmlQ4_0: return f(GgufQ4_0{});
    case kGgmlQ8_0: return f(GgufQ8_0{});
    case kGgmlQ4_K: return f(GgufQ4K{});
    case kGgmlQ5_K: return f(GgufQ5K{});
    case kGgmlQ6_K: return f(GgufQ6K{});
    default: std::fprintf(stderr, "unknown qtype %d\n", qtype); std::exit(2);
  }
}

int main(int argc, char** argv) {
  if (argc >= 9 && std::string(argv[1]) == "gemv") {
    const int qtype = std::atoi(argv[2]), m = std::atoi(argv[3]), n = std::atoi(argv[4]), k = std::atoi(argv[5]);
    const auto w = read_file(argv[6]);
    const auto xb = read_file(argv[7]);
    std::vector<unsigned char> bb = std::string(argv[8]) == "-" ? std::vector<unsigned char>() : read_file(argv[8]);
    std::vector<__half> out(static_cast<size_t>(m) * n, __float2half_rn(-1.f));
    dispatch(qtype, [&](auto block) {
      gemv_rows<decltype(block)>(m, n, k, w.data(), reinterpret_cast<const __half*>(xb.data()),
                                 bb.empty() ? nullptr : reinterpret_cast<const __half*>(bb.data()), out.data());
    });
    write_file(argv[9], out.data(), out.size() * sizeof(__half));
    return 0;
  }
  if (argc >= 7 && std::string(argv[1]) == "dequantize") {
    const int qtype = std::atoi(argv[2]), n = std::atoi(argv[3]), k = std::atoi(argv[4]);
    const auto w = read_file(argv[5]);
    std::vector<__half> out(static_cast<size_t>(n) * k, __float2half_rn(-1.f));
    dispatch(qtype, [&](auto block) { dequantize<decltype(block)>(n, k, w.data(), out.data()); });
    write_file(argv[6], out.data(), out.size() * sizeof(__half));
    return 0;
  }
  std::fprintf(stderr, "usage: see the header of gguf_host_harness.cpp\n");
  return 2;
}
