// Makes the shared library importable as `vllm_volta._C`. Importing it runs the
// static STABLE_TORCH_LIBRARY registrations; the module itself holds no functions
// (ops are reached through torch.ops._C). Limited API, so one binary per platform.
#include <Python.h>

extern "C" PyMODINIT_FUNC PyInit__C(void) {
  static PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "_C", "vllm-volta ops (torch.ops._C)", -1,
                                   nullptr, nullptr, nullptr, nullptr, nullptr};
  return PyModule_Create(&module_def);
}
