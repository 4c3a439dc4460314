# Ask the Python interpreter's torch where its headers/libraries are and whether it
# has CUDA. We deliberately do not use find_package(Torch): it drags in the legacy
# ATen/C++ API and needs a CUDA toolkit even for a CPU build; the stable ABI only
# needs torch/include and libtorch_cpu (+ libtorch_cuda for CUDA builds).
#
# Sets: TORCH_VERSION_STR, TORCH_INCLUDE_DIR, TORCH_LIB_DIR, TORCH_CUDA_VERSION
# (empty for CPU-only torch), TORCH_CUDA_ARCHS ("X.Y;..." that torch was built for).
execute_process(
  COMMAND "${Python_EXECUTABLE}" -c [=[
import os, re, torch
root = os.path.dirname(torch.__file__)
archs = [a[3:] for a in (torch.cuda.get_arch_list() if torch.version.cuda else []) if a.startswith("sm_")]
print(torch.__version__)
print(os.path.join(root, "include"))
print(os.path.join(root, "lib"))
print(torch.version.cuda or "")
print(",".join(re.sub(r"^(\d+)(\d)([a-z]?)$", r"\1.\2\3", a) for a in archs))
]=]
  OUTPUT_VARIABLE _torch_info
  RESULT_VARIABLE _torch_rc
  ERROR_VARIABLE _torch_err)
if(NOT _torch_rc EQUAL 0)
  message(FATAL_ERROR "vllm_volta: could not import torch with ${Python_EXECUTABLE}: ${_torch_err}")
endif()
string(REPLACE "\n" ";" _torch_lines "${_torch_info}")
list(GET _torch_lines 0 TORCH_VERSION_STR)
list(GET _torch_lines 1 TORCH_INCLUDE_DIR)
list(GET _torch_lines 2 TORCH_LIB_DIR)
list(GET _torch_lines 3 TORCH_CUDA_VERSION)
list(GET _torch_lines 4 TORCH_CUDA_ARCHS)
string(REPLACE "," ";" TORCH_CUDA_ARCHS "${TORCH_CUDA_ARCHS}")
if(NOT EXISTS "${TORCH_INCLUDE_DIR}/torch/csrc/stable/ops.h"
   OR NOT EXISTS "${TORCH_INCLUDE_DIR}/torch/headeronly/util/Exception.h")
  message(FATAL_ERROR
    "vllm_volta: torch ${TORCH_VERSION_STR} lacks the stable-ABI headers "
    "(torch/csrc/stable/ops.h, torch/headeronly/util/Exception.h); install torch>=2.11 "
    "(on a V100: pip install -r requirements-cu126.txt).")
endif()
message(STATUS "vllm_volta: torch ${TORCH_VERSION_STR} (CUDA: '${TORCH_CUDA_VERSION}') at ${TORCH_INCLUDE_DIR}")
