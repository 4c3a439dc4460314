// Whether our decode kernels are launched as programmatic dependents (see
// kernels/programmatic_launch.cuh and launch_kernel in cuda_launch.h), decided once per device;
// and the capability Volta mode emulates (VLLM_VOLTA_DEVICE_CAPABILITY), which both read.
#include "cuda_launch.h"

#include <atomic>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace vllm_volta {

namespace {

// Compiled for the same archs as every kernel of this build, so its image is theirs.
__global__ void probe_kernel() {}

// Plain C string handling here: no std::string, whose out-of-line members are one more thing
// for the linker to resolve against libstdc++ (see test_stable_abi.py).
bool env_switched_off(const char* name) {
  const char* value = std::getenv(name);
  if (value == nullptr) return false;
  char v[8] = {};
  for (int i = 0; i < 7 && value[i] != '\0'; ++i) {
    v[i] = static_cast<char>(std::tolower(static_cast<unsigned char>(value[i])));
  }
  return std::strcmp(v, "0") == 0 || std::strcmp(v, "false") == 0 || std::strcmp(v, "no") == 0 ||
         std::strcmp(v, "off") == 0;
}

bool decide(int device) {
  if (env_switched_off("VLLM_VOLTA_PDL")) return false;
  const int emulated = emulated_device_sm();
  if (emulated != 0 && emulated < 90) return false;  // Volta mode: as on a GPU without it
  if (device_sm(device) < 90) return false;
  cudaFuncAttributes attr{};
  if (cudaFuncGetAttributes(&attr, probe_kernel) != cudaSuccess) {
    (void)cudaGetLastError();  // no image for this device: not ours to report here
    return false;
  }
  // The image that runs here was compiled for compute_90+ (it has the griddepcontrol
  // instructions), not JIT-compiled from an older PTX.
  return attr.ptxVersion >= 90;
}

}  // namespace

int emulated_device_sm() {
  const char* value = std::getenv("VLLM_VOLTA_DEVICE_CAPABILITY");
  int major = 0, minor = 0;
  if (value == nullptr) return 0;
  if (std::sscanf(value, "%d.%d", &major, &minor) == 2) return major * 10 + minor;
  return major;  // "70" (or nothing parsable: 0)
}

bool programmatic_launch_enabled(int device) {
  constexpr int kMaxDevices = 64;
  static std::atomic<int> state[kMaxDevices];  // 0 unknown, 1 off, 2 on
  if (device < 0 || device >= kMaxDevices) return decide(device);
  int s = state[device].load(std::memory_order_relaxed);
  if (s == 0) {
    s = decide(device) ? 2 : 1;
    state[device].store(s, std::memory_order_relaxed);
  }
  return s == 2;
}

}  // namespace vllm_volta
