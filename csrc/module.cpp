// Makes the shared library importable as `vllm_volta._C`. Importing it runs the
// static STABLE_TORCH_LIBRARY registrations; ops are reached through torch.ops._C.
// The module also records how it was built, so Python (platform layer, tests) can tell
// a V100-adapter build from a native one. Limited API: one binary per platform.
#include <Python.h>

#ifndef VLLM_VOLTA_CUDA_ARCHS
#define VLLM_VOLTA_CUDA_ARCHS ""
#endif

#ifdef USE_CUDA
namespace vllm_volta {
bool programmatic_launch_enabled(int device);  // csrc/programmatic_launch.cu
}
#endif

// programmatic_launch(device: int) -> bool: whether the decode kernels go out as programmatic
// dependent launches on that CUDA device (always False in a CPU build).
static PyObject* programmatic_launch(PyObject*, PyObject* arg) {
  const long device = PyLong_AsLong(arg);
  if (device == -1 && PyErr_Occurred()) return nullptr;
#ifdef USE_CUDA
  return PyBool_FromLong(vllm_volta::programmatic_launch_enabled(static_cast<int>(device)));
#else
  return PyBool_FromLong(0);
#endif
}

extern "C" PyMODINIT_FUNC PyInit__C(void) {
  static PyMethodDef methods[] = {
      {"programmatic_launch", programmatic_launch, METH_O,
       "Whether the decode kernels are programmatic dependent launches on this CUDA device."},
      {nullptr, nullptr, 0, nullptr}};
  static PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "_C", "vllm-volta ops (torch.ops._C)", -1,
                                   methods, nullptr, nullptr, nullptr, nullptr};
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
