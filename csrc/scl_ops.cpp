// The scl operator library: schemas only, the product's ops (the test builds' ops are
// csrc/testing). Backends register their kernels with TORCH_LIBRARY_IMPL beside their sources,
// autograd is csrc/autograd.cpp, and the fake kernels (shapes for meta tensors and
// torch.compile) are registered from Python (scl_kernels/backends/fused_ops.py).
#include <Python.h>
#include <torch/library.h>
#include <torch/version.h>

#include <string>

#include "core/call_arguments.h"

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
  // The Triton tile kernels (scl_kernels/backends/triton registers them from Python); the
  // arguments are those of scl::TileInputs and scl::GradCoefficients (csrc/core/tile_kernels.h);
  // `deterministic` is the plan's (no atomics).
  // In these ops `temperature` ([1] float64) holds t: in device memory, where the kernels read
  // it, with temperature_in_memory; else the host value the call read and checked, on the CPU
  // (scl::Temperature, csrc/core/temperature.h).
  m.def("supcon_triton_lse_tiles(Tensor q, Tensor z, Tensor q_inv_norm, Tensor z_inv_norm, "
        "Tensor temperature, bool temperature_in_memory, int self_offset, bool symmetric) -> Tensor lse");
  m.def("supcon_triton_grad_tiles(Tensor q, Tensor z, Tensor q_inv_norm, Tensor z_inv_norm, "
        "Tensor temperature, bool temperature_in_memory, int self_offset, bool symmetric, bool deterministic, "
        "Tensor coef, Tensor lse_hi, Tensor lse_lo) -> (Tensor dq, Tensor dz)");
  // The focal loss's walk over positive pairs (scl::TileKernels::positive_walk; registered from
  // Python like the tiles). An empty grad_weight asks for the forward only.
  m.def("supcon_triton_positive_walk(Tensor q, Tensor z, Tensor q_inv_norm, Tensor z_inv_norm, "
        "float inv_t, int self_offset, Tensor anchor_class, Tensor contrast_class, "
        "Tensor lse_hi, Tensor lse_lo, float gamma, Tensor grad_weight) -> "
        "(Tensor loss_sum, Tensor hterm_sum, Tensor dq, Tensor dz)");
  // The forward's tiles and its per-anchor losses in one op (scl::TileKernels::
  // lse_and_anchor_losses; registered from Python like the tiles): the log-sum-exp as
  // supcon_triton_lse_tiles gives it, and the losses from it in one kernel, or, given the
  // mean's zeroed accumulators (mean_sums), their mean, the accumulators left holding the totals.
  m.def("supcon_triton_lse_and_losses(Tensor q, Tensor z, Tensor q_inv_norm, "
        "Tensor z_inv_norm, Tensor temperature, bool temperature_in_memory, int self_offset, bool symmetric, "
        "Tensor class_sums, Tensor anchor_class, Tensor num_positives, bool single_set, "
        "Tensor(a!)? mean_sums) -> (Tensor lse, Tensor loss)");
  // The backward's assembly for one output's rows in one kernel
  // (scl::TileKernels::assemble_backward; registered from Python like the tiles). An empty
  // extra, anchor_weight or row_class leaves its term out.
  m.def("supcon_triton_assemble_backward(Tensor rows, Tensor inv_norm, Tensor grads, "
        "Tensor extra, int anchor_offset, Tensor anchor_weight, Tensor anchor_class, "
        "Tensor class_sums, bool self_in_class, Tensor row_class, Tensor weighted_sums, "
        "bool class_shares_weight, Tensor temperature, bool temperature_in_memory, bool normalize, "
        "float max_inv_norm, ScalarType out_dtype) -> (Tensor grad, Tensor unit_dot)");
  // The preparation of one set of rows in one kernel (scl::TileKernels::prepare_rows;
  // registered from Python like the tiles); class_sums, non_finite and mean_sums are empty when
  // not asked for.
  m.def("supcon_triton_prepare_rows(Tensor rows, Tensor labels, Tensor sorted_labels, "
        "bool normalize, bool self_in_class, bool class_sums, bool check_values, "
        "bool mean_sums) -> (Tensor inv_norm, Tensor row_class, Tensor num_positives, "
        "Tensor class_sums, Tensor non_finite, Tensor mean_sums)");
  // The backward's per-anchor weights, its gradient tiles and the assembly of each output in
  // one op (scl::TileKernels::weights_grads_and_assembly; registered from Python like the
  // tiles): anchors_with_positives is given where grad_loss is the mean's (0-dim); with
  // class_shares_weight no weighted class sums are formed; the contrast's gradient and unit
  // dots are empty in single set.
  m.def("supcon_triton_weights_grads_and_assembly(Tensor grad_loss, "
        "Tensor? anchors_with_positives, Tensor lse, Tensor q, Tensor z, Tensor q_inv_norm, "
        "Tensor z_inv_norm, Tensor temperature, bool temperature_in_memory, int self_offset, bool symmetric, "
        "bool deterministic, Tensor num_positives, Tensor anchor_class, Tensor contrast_class, "
        "Tensor class_sums, bool single_set, int anchor_offset, bool class_shares_weight, "
        "bool normalize, float max_inv_norm, ScalarType features_dtype, ScalarType contrast_dtype) -> "
        "(Tensor grad_features, Tensor unit_dot_features, Tensor grad_contrast, "
        "Tensor unit_dot_contrast)");
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
