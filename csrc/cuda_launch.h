// Host-side helpers for launching our CUDA kernels from stable-ABI op functions:
// device checks, the current stream, dtype and vector-width dispatch.
#pragma once

#include "op_checks.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <torch/csrc/stable/accelerator.h>
#include <torch/csrc/stable/c/shim.h>
#include <torch/headeronly/util/shim_utils.h>

#include <cstdint>
#include <initializer_list>
#include <utility>

// Highest numeric target arch of this build (CMakeLists.txt), e.g. 75 for "7.5+PTX".
#ifndef VLLM_VOLTA_MAX_CUDA_ARCH
#define VLLM_VOLTA_MAX_CUDA_ARCH 0
#endif

namespace vllm_volta {

inline void check_cuda(const char* op, const char* arg, const Tensor& t) {
  VLLM_VOLTA_CHECK(t.is_cuda(), op, ": '", arg, "' must be a CUDA tensor");
}

// The stream PyTorch is currently using on the tensor's device (CUDA-graph capture safe).
inline cudaStream_t current_stream(const Tensor& t) {
  void* stream = nullptr;
  TORCH_ERROR_CODE_CHECK(aoti_torch_get_current_cuda_stream(t.get_device_index(), &stream));
  return static_cast<cudaStream_t>(stream);
}

inline void check_launch(const char* op) {
  const cudaError_t err = cudaGetLastError();
  VLLM_VOLTA_CHECK(err == cudaSuccess, op, ": CUDA kernel launch failed: ", cudaGetErrorString(err));
}

// Compute capability of `device` as major * 10 + minor.
inline int device_sm(int device) {
  int major = 0, minor = 0;
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
  cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device);
  return major * 10 + minor;
}

template <typename T>
struct TypeTag {
  using type = T;
};

// Calls f(TypeTag<T>{}) with T = float / __half / __nv_bfloat16 for t's dtype. BF16 is
// refused on a GPU below SM80 and in builds without an SM80+ target (the bf16 kernels are
// compiled to a trap there).
template <typename F>
void dispatch_float_type(const char* op, const Tensor& t, F&& f) {
  switch (t.scalar_type()) {
    case ScalarType::Float: f(TypeTag<float>{}); return;
    case ScalarType::Half: f(TypeTag<__half>{}); return;
    case ScalarType::BFloat16: {
      VLLM_VOLTA_CHECK(VLLM_VOLTA_MAX_CUDA_ARCH >= 80, op,
                      ": bfloat16 kernels are not built (every arch in TORCH_CUDA_ARCH_LIST is below 8.0); "
                      "use float16");
      const int sm = device_sm(t.get_device_index());
      VLLM_VOLTA_CHECK(sm >= 80, op, ": bfloat16 needs a GPU with compute capability >= 8.0 (this one is ",
                      sm / 10, ".", sm % 10, "); use float16");
      f(TypeTag<__nv_bfloat16>{});
      return;
    }
    default:
      VLLM_VOLTA_CHECK(false, op, ": unsupported dtype ", dtype_name(t.scalar_type()));
  }
}

// Widest vector (elements, up to 16 bytes) such that every pointer and every element
// count/stride is a multiple of it, so each row starts aligned; odd sizes fall back to 1.
inline int pick_vec_width(int64_t elem_size, std::initializer_list<const void*> ptrs,
                          std::initializer_list<int64_t> counts) {
  int width = static_cast<int>(16 / elem_size);
  for (; width > 1; width /= 2) {
    bool ok = true;
    for (const void* p : ptrs) ok = ok && reinterpret_cast<uintptr_t>(p) % (width * elem_size) == 0;
    for (int64_t c : counts) ok = ok && c % width == 0;
    if (ok) break;
  }
  return width;
}

template <int N>
struct IntTag {
  static constexpr int value = N;
};

// Calls f(IntTag<width>{}) for width in {8, 4, 2, 1}, never above 16 bytes of T.
template <typename T, typename F>
void dispatch_vec_width(int width, F&& f) {
  if constexpr (sizeof(T) <= 2) {
    if (width == 8) return f(IntTag<8>{});
  }
  if (width == 4) return f(IntTag<4>{});
  if (width == 2) return f(IntTag<2>{});
  return f(IntTag<1>{});
}

// Calls f(IntTag<m>{}) for 1 <= m <= 8 (the decode GEMVs' row counts; the caller checks m, and
// anything above 8 takes 8).
template <typename F>
void dispatch_rows_up_to_8(int64_t m, F&& f) {
  switch (m) {
    case 1: return f(IntTag<1>{});
    case 2: return f(IntTag<2>{});
    case 3: return f(IntTag<3>{});
    case 4: return f(IntTag<4>{});
    case 5: return f(IntTag<5>{});
    case 6: return f(IntTag<6>{});
    case 7: return f(IntTag<7>{});
    default: return f(IntTag<8>{});
  }
}

// VLLM_VOLTA_DEVICE_CAPABILITY ("7.0" or "70", as envs.py parses it) as major * 10 + minor, or
// 0 when unset: Volta mode on a newer GPU (csrc/programmatic_launch.cu).
int emulated_device_sm();

// Whether our kernels go out as programmatic dependents on `device` (csrc/programmatic_launch.cu):
// SM90+, an image compiled for compute_90+, not Volta mode, VLLM_VOLTA_PDL not switched off.
bool programmatic_launch_enabled(int device);

// Whether a decode kernel over `rows` rows (gemv input rows, attention sequences) goes out as a
// programmatic dependent launch: where enabled, from 3 rows. At 1-2 rows a decode step only
// streams weights; there plain launches, with gemv_add / gemv_rope_cache in one-wave grids
// (gemv_kernels.cu), made Llama-3-8B decode 1-2% faster per token on an H200; at 4 and 32 rows
// programmatic launches were ~0.3% faster (docs/PERFORMANCE_HISTORY.md).
inline bool programmatic_launch_for(int device, int64_t rows) {
  return rows >= 3 && programmatic_launch_enabled(device);
}

// kernel<<<grid, block, smem, stream>>>(args...), as a programmatic dependent launch if
// `programmatic`: the kernel may then start before the previous one in the stream ends, so it
// must call pdl_wait() (kernels/programmatic_launch.cuh) before reading what that one wrote.
template <typename... Params, typename... Args>
void launch_kernel(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                   bool programmatic, Args&&... args) {
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  config.attrs = attr;
  config.numAttrs = programmatic ? 1 : 0;
  cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...);
}

// Whether a pointer may be read with 16-byte vector loads.
inline bool is_aligned16(const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % 16 == 0; }

inline int round_up(int x, int multiple) { return (x + multiple - 1) / multiple * multiple; }
inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

}  // namespace vllm_volta
