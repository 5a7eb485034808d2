// The scl operator library: schemas only. Backends register their kernels with
// TORCH_LIBRARY_IMPL beside their sources; fake kernels and autograd are registered from Python
// (scl_kernels/_op.py).
#include <Python.h>
#include <torch/library.h>

// Importing scl_kernels._C loads this library and runs the registrations; the module itself is
// empty, so it needs no pybind11 and ties to no Python ABI beyond the init symbol.
extern "C" PyObject* PyInit__C(void) {
  static struct PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "_C", nullptr, -1, nullptr};
  return PyModule_Create(&module_def);
}

TORCH_LIBRARY(scl, m) {
  // Per-anchor SupCon loss. Single set (contrast None): anchors are the first num_anchors rows of
  // features, the contrast set is all rows, anchor i never sees column i. Cross set: anchors are
  // all feature rows, the contrast set is `contrast`, no self column. Returns the loss per anchor
  // (0 for anchors without positives), the log-sum-exp per anchor saved for backward, and |P(i)|.
  m.def(
      "supcon(Tensor features, Tensor labels, Tensor? contrast, Tensor? contrast_labels, "
      "Tensor temperature, int num_anchors, bool normalize) -> (Tensor loss, Tensor lse, "
      "Tensor num_positives)");
  // Gradients w.r.t. features, contrast ([0, D] without a contrast set) and temperature.
  m.def(
      "supcon_backward(Tensor grad_loss, Tensor features, Tensor labels, Tensor? contrast, "
      "Tensor? contrast_labels, Tensor temperature, int num_anchors, bool normalize, Tensor lse) "
      "-> (Tensor grad_features, Tensor grad_contrast, Tensor grad_temperature)");
}
