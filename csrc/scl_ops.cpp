// The scl operator library: schemas only, the product's ops (the test builds' ops are
// csrc/testing). Backends register their kernels with TORCH_LIBRARY_IMPL beside their sources,
// autograd is csrc/autograd.cpp, and the fake kernels (shapes for meta tensors and
// torch.compile) are registered from Python (scl_kernels/backends/fused_ops.py).
#include <Python.h>
#include <torch/library.h>
#include <torch/version.h>

#include <string>

#include "core/call_arguments.h"
#include "triton/stage_arguments.h"

// The torch this library was compiled against, as a string in the file itself: scl_kernels/
// _extension.py reads it without loading the library, so that a library built for another torch
// is reported as such instead of as an undefined symbol.
extern "C" __attribute__((used, visibility("default"))) const char scl_kernels_build_info[] =
    "scl_kernels build info: torch " TORCH_VERSION
#ifdef SCL_WITH_CUDA
    ", with CUDA kernels";
#else
    ", CPU only";
#endif

// Importing scl_kernels._C loads this library and runs the registrations; the module itself is
// empty, so it needs no pybind11 and ties to no Python ABI beyond the init symbol.
extern "C" PyObject* PyInit__C(void) {
  static struct PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "_C", nullptr, -1, nullptr};
  return PyModule_Create(&module_def);
}

TORCH_LIBRARY(scl, m) {
  // The op: its CPU kernel is csrc/cpu, its CUDA key is left to a native CUDA kernel.
  m.def(("supcon" + scl::kForwardSchema).c_str());
  m.def(("supcon_backward" + scl::kBackwardSchema).c_str());
  // The same op with the Triton tile kernels (csrc/triton): its own name, so that it never
  // competes with scl::supcon for a dispatch key, and so that CPU tensors can run it in
  // Triton's interpreter.
  m.def(("supcon_triton" + scl::kForwardSchema).c_str());
  m.def(("supcon_triton_backward" + scl::kBackwardSchema).c_str());
  // What a call with these arguments would do (csrc/core/call_plan.h), for scl_kernels.explain.
  m.def(("supcon_plan" + scl::kPlanSchema).c_str());
  m.def(("supcon_triton_plan" + scl::kPlanSchema).c_str());
  // The Triton stage ops, whose kernels scl_kernels/backends/triton registers from Python:
  // the tiles and the fused stages of scl::TileKernels (csrc/core/tile_kernels.h), their
  // arguments listed in csrc/triton/stage_arguments.h, which says what each op does.
  m.def(SCL_STAGE_SCHEMA("supcon_triton_lse_tiles", SCL_TRITON_LSE_TILES_ARGUMENTS,
                         "Tensor lse"));
  m.def(SCL_STAGE_SCHEMA("supcon_triton_grad_tiles", SCL_TRITON_GRAD_TILES_ARGUMENTS,
                         "(Tensor dq, Tensor dz)"));
  m.def(SCL_STAGE_SCHEMA("supcon_triton_positive_walk", SCL_TRITON_POSITIVE_WALK_ARGUMENTS,
                         "(Tensor loss_sum, Tensor hterm_sum, Tensor dq, Tensor dz)"));
  m.def(SCL_STAGE_SCHEMA("supcon_triton_multi_label_positives",
                         SCL_TRITON_MULTI_LABEL_POSITIVES_ARGUMENTS,
                         "(Tensor num_positives, Tensor weight_sum)"));
  m.def(SCL_STAGE_SCHEMA("supcon_triton_lse_and_losses", SCL_TRITON_LSE_AND_LOSSES_ARGUMENTS,
                         "(Tensor lse, Tensor loss)"));
  m.def(SCL_STAGE_SCHEMA("supcon_triton_assemble_backward",
                         SCL_TRITON_ASSEMBLE_BACKWARD_ARGUMENTS, "(Tensor grad, Tensor unit_dot)"));
  m.def(SCL_STAGE_SCHEMA("supcon_triton_prepare_rows", SCL_TRITON_PREPARE_ROWS_ARGUMENTS,
                         "(Tensor inv_norm, Tensor row_class, Tensor num_positives, "
                         "Tensor class_sums, Tensor non_finite, Tensor mean_sums)"));
  m.def(SCL_STAGE_SCHEMA("supcon_triton_weights_grads_and_assembly",
                         SCL_TRITON_WEIGHTS_GRADS_AND_ASSEMBLY_ARGUMENTS,
                         "(Tensor grad_features, Tensor unit_dot_features, Tensor grad_contrast, "
                         "Tensor unit_dot_contrast)"));
  // Whether the host may wait for values on `like`'s device now (false while a CUDA graph is
  // being captured): TileKernels::host_may_wait, answered in Python because csrc/triton is
  // compiled without CUDA.
  m.def("supcon_triton_host_may_wait(Tensor like) -> bool");
  // Waits for the NaN / inf checks that earlier calls left to the device and raises the first
  // failure (csrc/core/deferred_value_check.h, where it is implemented).
  m.def("raise_deferred_value_errors() -> ()");
  // Hard-pair mining: the C++ CPU kernel (csrc/cpu/hard_pairs.cpp) and, under its own name,
  // the Triton kernel (scl_kernels/backends/triton/hard_pairs.py).
  // Per anchor (every feature row), its hardest positive (least similar row of its label) and
  // hardest negative (most similar row of another label): index (-1 for none) and cosine
  // similarity (dot product without normalize; NaN for none), ties to the lowest index. Single
  // set: the candidates are the other feature rows; cross set: the contrast rows. No gradient;
  // values are not checked here (scl_kernels.hard_pairs does). docs/MATH.md, "Hard pairs".
  for (const char* name : {"hard_pairs", "hard_pairs_triton"}) {
    m.def((std::string(name) +
           "(Tensor features, Tensor labels, Tensor? contrast, Tensor? contrast_labels, "
           "bool normalize) -> (Tensor positive_index, Tensor positive_similarity, "
           "Tensor negative_index, Tensor negative_similarity)").c_str());
  }
}
