// Makes the shared library importable as `vllm_volta._C`. Importing it runs the
// static STABLE_TORCH_LIBRARY registrations; ops are reached through torch.ops._C.
// The module also records how it was built, so Python (platform layer, tests) can tell
// a V100-adapter build from a native one. Limited API: one binary per platform.
#include <Python.h>

#ifndef VLLM_VOLTA_CUDA_ARCHS
#define VLLM_VOLTA_CUDA_ARCHS ""
#endif

extern "C" PyMODINIT_FUNC PyInit__C(void) {
  static PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "_C", "vllm-volta ops (torch.ops._C)", -1,
                                   nullptr, nullptr, nullptr, nullptr, nullptr};
  PyObject* module = PyModule_Create(&module_def);
  if (module == nullptr) return nullptr;
#ifdef USE_CUDA
  const long built_with_cuda = 1;
#else
  const long built_with_cuda = 0;
#endif
#ifdef VLLM_V100_ADAPTER
  const long v100_adapter = 1;
#else
  const long v100_adapter = 0;
#endif
  // CUDA_ARCHS: CMAKE_CUDA_ARCHITECTURES entries, comma separated ("75", "90-real"); "" for CPU.
  if (PyModule_AddIntConstant(module, "BUILT_WITH_CUDA", built_with_cuda) < 0 ||
      PyModule_AddIntConstant(module, "V100_ADAPTER", v100_adapter) < 0 ||
      PyModule_AddStringConstant(module, "CUDA_ARCHS", VLLM_VOLTA_CUDA_ARCHS) < 0) {
    Py_DECREF(module);
    return nullptr;
  }
  return module;
}
