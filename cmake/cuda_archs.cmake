# Target-arch selection for vllm_volta._C and the VLLM_V100_ADAPTER decision.
#
# Kept free of CUDA and torch so that a configure-only CMake project (the test in
# test_v100/build/) can exercise exactly the code the real build runs.
#
# Rule (DESIGN.md section 2): VLLM_V100_ADAPTER is defined exactly when EVERY target
# arch is below 8.0. A mixed list such as "7.0;8.0" builds the native kernels only.

# Named archs as torch.utils.cpp_extension accepts them.
set(_VV_NAMED_Volta "7.0")
set(_VV_NAMED_Turing "7.5")
set(_VV_NAMED_Ampere "8.0;8.6")
set(_VV_NAMED_Ada "8.9")
set(_VV_NAMED_Hopper "9.0")

# vllm_volta_parse_arch_list(<list string> <out cmake archs> <out numeric archs>)
#   "7.0 7.5" / "7.0;7.5" / "7.0,7.5" / "7.5+PTX" / "9.0a" / "Volta" ->
#   CMAKE_CUDA_ARCHITECTURES entries ("70-real", "75" = SASS+PTX, "90a-real") and
#   the numeric archs (70, 75, 90) used for the adapter decision.
function(vllm_volta_parse_arch_list arch_string out_cmake out_numeric)
  string(REGEX REPLACE "[ \t\n,;]+" ";" _tokens "${arch_string}")
  set(_cmake "")
  set(_numeric "")
  foreach(_tok IN LISTS _tokens)
    if(_tok STREQUAL "")
      continue()
    endif()
    set(_ptx FALSE)
    if(_tok MATCHES "^(.*)\\+PTX$")
      set(_ptx TRUE)
      set(_tok "${CMAKE_MATCH_1}")
    endif()
    set(_expanded "${_tok}")
    if(DEFINED _VV_NAMED_${_tok})
      set(_expanded "${_VV_NAMED_${_tok}}")
    endif()
    foreach(_arch IN LISTS _expanded)
      if(NOT _arch MATCHES "^([0-9]+)\\.([0-9])([af]?)$")
        message(FATAL_ERROR
          "vllm_volta: TORCH_CUDA_ARCH_LIST entry '${_tok}' is not understood. "
          "Allowed: 'X.Y', 'X.Y+PTX', 'X.Ya' (e.g. '7.0', '7.5+PTX', '9.0a'), or a name "
          "(Volta, Turing, Ampere, Ada, Hopper), separated by spaces or ';'.")
      endif()
      set(_num "${CMAKE_MATCH_1}${CMAKE_MATCH_2}")
      set(_suffix "${CMAKE_MATCH_3}")
      if(_ptx)
        list(APPEND _cmake "${_num}${_suffix}")        # SASS + PTX
      else()
        list(APPEND _cmake "${_num}${_suffix}-real")   # SASS only
      endif()
      list(APPEND _numeric "${_num}")
    endforeach()
  endforeach()
  list(REMOVE_DUPLICATES _cmake)
  list(REMOVE_DUPLICATES _numeric)
  set(${out_cmake} "${_cmake}" PARENT_SCOPE)
  set(${out_numeric} "${_numeric}" PARENT_SCOPE)
endfunction()

# vllm_volta_adapter_decision(<numeric archs> <out bool> <out reason>)
function(vllm_volta_adapter_decision numeric out_on out_reason)
  set(_native "")
  foreach(_a IN LISTS numeric)
    if(_a GREATER_EQUAL 80)
      list(APPEND _native "${_a}")
    endif()
  endforeach()
  if(numeric STREQUAL "")
    set(${out_on} OFF PARENT_SCOPE)
    set(${out_reason} "no CUDA target archs" PARENT_SCOPE)
  elseif(_native STREQUAL "")
    set(${out_on} ON PARENT_SCOPE)
    set(${out_reason} "every target arch (${numeric}) is below 8.0" PARENT_SCOPE)
  else()
    set(${out_on} OFF PARENT_SCOPE)
    set(${out_reason} "target arch(s) ${_native} are >= 8.0, so native kernels are built (kept Volta-safe)" PARENT_SCOPE)
  endif()
endfunction()

# vllm_volta_detect_gpu_archs(<out>) - "X.Y" of each visible GPU, via torch.
# VLLM_VOLTA_DETECTED_ARCHS (cache/-D) overrides detection, for tests and odd drivers.
function(vllm_volta_detect_gpu_archs out)
  if(DEFINED VLLM_VOLTA_DETECTED_ARCHS)
    set(${out} "${VLLM_VOLTA_DETECTED_ARCHS}" PARENT_SCOPE)
    return()
  endif()
  execute_process(
    COMMAND "${Python_EXECUTABLE}" -c
      "import torch; print(';'.join('%d.%d' % torch.cuda.get_device_capability(i) for i in range(torch.cuda.device_count())))"
    OUTPUT_VARIABLE _caps OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET RESULT_VARIABLE _rc)
  if(NOT _rc EQUAL 0)
    set(_caps "")
  endif()
  set(${out} "${_caps}" PARENT_SCOPE)
endfunction()

# vllm_volta_select_cuda_archs(<torch arch list>)
#   Reads TORCH_CUDA_ARCH_LIST (-D, else environment); empty -> GPUs present; none ->
#   the archs torch itself was built for (<torch arch list>, "X.Y" entries).
#   Sets in the caller: VLLM_VOLTA_CUDA_ARCHS (CMAKE_CUDA_ARCHITECTURES form),
#   VLLM_VOLTA_NUMERIC_ARCHS, VLLM_VOLTA_ADAPTER (ON/OFF), VLLM_VOLTA_ADAPTER_REASON.
function(vllm_volta_select_cuda_archs torch_archs)
  if(DEFINED TORCH_CUDA_ARCH_LIST)
    set(_list "${TORCH_CUDA_ARCH_LIST}")
    set(_source "TORCH_CUDA_ARCH_LIST")
  else()
    set(_list "$ENV{TORCH_CUDA_ARCH_LIST}")
    set(_source "TORCH_CUDA_ARCH_LIST")
  endif()
  string(STRIP "${_list}" _list)
  if(_list STREQUAL "")
    vllm_volta_detect_gpu_archs(_list)
    set(_source "GPUs present")
    if(_list STREQUAL "")
      set(_list "${torch_archs}")
      set(_source "no GPU found and TORCH_CUDA_ARCH_LIST empty: archs of this torch build")
    endif()
  endif()
  vllm_volta_parse_arch_list("${_list}" _cmake _numeric)
  if(_cmake STREQUAL "")
    message(FATAL_ERROR "vllm_volta: no CUDA target arch could be determined; set TORCH_CUDA_ARCH_LIST (e.g. '7.0' for V100, '7.5' for T4, '9.0' for H100/H200).")
  endif()
  vllm_volta_adapter_decision("${_numeric}" _on _reason)
  message(STATUS "vllm_volta: CUDA target archs [${_cmake}] (from ${_source}: '${_list}')")
  message(STATUS "vllm_volta: VLLM_V100_ADAPTER=${_on} because ${_reason}")
  set(VLLM_VOLTA_CUDA_ARCHS "${_cmake}" PARENT_SCOPE)
  set(VLLM_VOLTA_NUMERIC_ARCHS "${_numeric}" PARENT_SCOPE)
  set(VLLM_VOLTA_ADAPTER "${_on}" PARENT_SCOPE)
  set(VLLM_VOLTA_ADAPTER_REASON "${_reason}" PARENT_SCOPE)
endfunction()
