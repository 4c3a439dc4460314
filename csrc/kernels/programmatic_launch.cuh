// Programmatic dependent launch (device side, SM90 and newer; no-ops when compiled for older
// archs). A kernel launched with cudaLaunchAttributeProgrammaticStreamSerialization
// (launch_kernel in cuda_launch.h) may start while the kernel before it in the stream is still
// running: it must call pdl_wait() before it touches anything that kernel writes, and may do
// work that reads only constant data (weights) before that. pdl_launch_dependents() lets the
// next such kernel start; every block of ours calls it first thing.
#pragma once

namespace vllm_volta {

__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

__device__ __forceinline__ void pdl_launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" :::);
#endif
}

}  // namespace vllm_volta
