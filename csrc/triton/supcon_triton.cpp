// scl::supcon_triton: the shared core (csrc/core) with tile kernels written in Triton. Triton
// launches from Python, so the tiles and the fused stages (the positive walk of the focal loss and
// of multi-hot labels, with the latter's positives, the preparation, the backward's assembly) are
// the ops scl::supcon_triton_{lse_tiles,grad_tiles,positive_walk,multi_label_positives,
// assemble_backward,prepare_rows}, whose kernels scl_kernels/backends/triton registers; this file
// calls them through the dispatcher, their arguments listed in stage_arguments.h.
// Each call is a crossing into Python, so the stages that run back to back go as one op, the
// grouped forms of TileKernels: scl::supcon_triton_lse_and_losses (the tiles and the fused
// losses) and scl::supcon_triton_weights_grads_and_assembly (the anchor weights, the gradient
// tiles and every output's assembly).
#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>

#include <optional>
#include <tuple>

#include "../core/supcon_orchestration.h"
#include "../core/supcon_problem.h"
#include "stage_arguments.h"

namespace scl::triton {
namespace {

// The kernels compute in float32 whatever the input (float64 inputs are read as float32).
at::ScalarType compute_type(at::ScalarType) { return at::kFloat; }


// A clear error instead of the dispatcher's when the Python side has not registered the tiles.
void require_tile_kernel(const char* name, const at::Tensor& like) {
  const c10::DispatchKey key = like.is_cuda() ? c10::DispatchKey::CUDA : c10::DispatchKey::CPU;
  TORCH_CHECK(c10::Dispatcher::singleton().findSchemaOrThrow(name, "").hasKernelForDispatchKey(key),
              name, " has no kernel for ", like.device(),
              ": the Triton tile kernels are registered by importing "
              "scl_kernels.backends.triton.registration (needs the triton package; CPU tensors need TRITON_INTERPRET=1)");
}

// The stage op `name` with the signature Result(parameters of its arguments' list).
template <typename Signature>
c10::TypedOperatorHandle<Signature> stage_op(const char* name) {
  return c10::Dispatcher::singleton().findSchemaOrThrow(name, "").typed<Signature>();
}

at::Tensor lse_tiles(const SupConProblem& p, Schedule schedule) {
  static const auto op = stage_op<at::Tensor(SCL_STAGE_TYPES(SCL_TRITON_LSE_TILES_ARGUMENTS))>(
      "scl::supcon_triton_lse_tiles");
  require_tile_kernel("scl::supcon_triton_lse_tiles", p.z);
  return op.call(SCL_STAGE_VALUES(SCL_TRITON_LSE_TILES_ARGUMENTS));
}

TileGrads grad_tiles(const SupConProblem& p, Schedule schedule, const GradCoefficients& c) {
  static const auto op =
      stage_op<std::tuple<at::Tensor, at::Tensor>(
          SCL_STAGE_TYPES(SCL_TRITON_GRAD_TILES_ARGUMENTS))>("scl::supcon_triton_grad_tiles");
  require_tile_kernel("scl::supcon_triton_grad_tiles", p.z);
  const bool symmetric = schedule == Schedule::kSymmetric;
  const at::Tensor none = at::empty({0}, c.coef.options());
  auto [dq, dz] = op.call(SCL_STAGE_VALUES(SCL_TRITON_GRAD_TILES_ARGUMENTS));
  return {symmetric ? at::Tensor() : dq, dz};
}

PositiveWalkOutputs positive_walk(const SupConProblem& p, const PositiveWalkInputs& walk) {
  static const auto op =
      stage_op<std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor>(
          SCL_STAGE_TYPES(SCL_TRITON_POSITIVE_WALK_ARGUMENTS))>("scl::supcon_triton_positive_walk");
  require_tile_kernel("scl::supcon_triton_positive_walk", p.z);
  auto [loss_sum, hterm_sum, dq, dz] =
      op.call(SCL_STAGE_VALUES(SCL_TRITON_POSITIVE_WALK_ARGUMENTS));
  return {loss_sum, hterm_sum, dq, dz};
}

MultiLabelPositives multi_label_positives(const SupConProblem& p) {
  static const auto op =
      stage_op<std::tuple<at::Tensor, at::Tensor>(
          SCL_STAGE_TYPES(SCL_TRITON_MULTI_LABEL_POSITIVES_ARGUMENTS))>(
          "scl::supcon_triton_multi_label_positives");
  require_tile_kernel("scl::supcon_triton_multi_label_positives", p.z);
  auto [num_positives, weight_sum] =
      op.call(SCL_STAGE_VALUES(SCL_TRITON_MULTI_LABEL_POSITIVES_ARGUMENTS));
  return {num_positives, weight_sum};
}

// The forward's tiles and fused losses in one crossing (TileKernels::lse_and_anchor_losses).
LseAndLosses lse_and_anchor_losses(const SupConProblem& p, Schedule schedule,
                                   const AnchorLossInputs& finish) {
  static const auto op =
      stage_op<std::tuple<at::Tensor, at::Tensor>(
          SCL_STAGE_TYPES(SCL_TRITON_LSE_AND_LOSSES_ARGUMENTS))>(
          "scl::supcon_triton_lse_and_losses");
  require_tile_kernel("scl::supcon_triton_lse_and_losses", p.z);
  auto [lse, losses] = op.call(SCL_STAGE_VALUES(SCL_TRITON_LSE_AND_LOSSES_ARGUMENTS));
  return {lse, losses};
}

BackwardAssembly assemble_backward(const SupConProblem& p, const BackwardAssemblyInputs& side) {
  static const auto op =
      stage_op<std::tuple<at::Tensor, at::Tensor>(
          SCL_STAGE_TYPES(SCL_TRITON_ASSEMBLE_BACKWARD_ARGUMENTS))>(
          "scl::supcon_triton_assemble_backward");
  require_tile_kernel("scl::supcon_triton_assemble_backward", side.rows);
  const at::Tensor none = at::empty({0}, side.grads.options());
  const auto given = [&](const at::Tensor& t) { return t.defined() ? t : none; };
  auto [grad, unit_dot] = op.call(SCL_STAGE_VALUES(SCL_TRITON_ASSEMBLE_BACKWARD_ARGUMENTS));
  return {grad, unit_dot};
}

PreparedRows prepare_rows(const RowPreparationInputs& in) {
  static const auto op =
      stage_op<std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor>(
          SCL_STAGE_TYPES(SCL_TRITON_PREPARE_ROWS_ARGUMENTS))>("scl::supcon_triton_prepare_rows");
  require_tile_kernel("scl::supcon_triton_prepare_rows", in.rows);
  auto [inv_norm, row_class, num_positives, class_sums, non_finite, mean_sums] =
      op.call(SCL_STAGE_VALUES(SCL_TRITON_PREPARE_ROWS_ARGUMENTS));
  return {inv_norm,
          row_class,
          num_positives,
          in.class_sums ? class_sums : at::Tensor(),
          in.check_values ? non_finite : at::Tensor(),
          in.mean_sums ? mean_sums : at::Tensor()};
}

// The backward's weights, tiles and every output's assembly in one crossing
// (TileKernels::weights_grads_and_assembly).
AssembledGradients weights_grads_and_assembly(const SupConProblem& p,
                                              const WeightsGradsAndAssemblyInputs& stages) {
  static const auto op =
      stage_op<std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor>(
          SCL_STAGE_TYPES(SCL_TRITON_WEIGHTS_GRADS_AND_ASSEMBLY_ARGUMENTS))>(
          "scl::supcon_triton_weights_grads_and_assembly");
  require_tile_kernel("scl::supcon_triton_weights_grads_and_assembly", p.z);
  const Schedule schedule = stages.weights.schedule;
  const AnchorWeightInputs& w = stages.weights;
  auto [features, features_dot, contrast, contrast_dot] =
      op.call(SCL_STAGE_VALUES(SCL_TRITON_WEIGHTS_GRADS_AND_ASSEMBLY_ARGUMENTS));
  if (p.single_set) return {{features, features_dot}, {}};
  return {{features, features_dot}, {contrast, contrast_dot}};
}

bool host_may_wait(const at::Tensor& like) {
  if (!like.is_cuda()) return true;  // Triton's interpreter: nothing to capture
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("scl::supcon_triton_host_may_wait", "")
                             .typed<bool(const at::Tensor&)>();
  require_tile_kernel("scl::supcon_triton_host_may_wait", like);
  return op.call(like);
}

// The kernels address rows with int32 offsets.
constexpr int64_t kMaxRowsElements = (int64_t{1} << 31) - 1;

const TileKernels& triton_kernels() {
  // The symmetric forward sums a row's tiles by atomics: not reproducible. One symmetric
  // backward walk (full rows).
  static const TileKernels kernels{compute_type,
                                   /*symmetric_forward_is_deterministic=*/false,
                                   /*reads_temperature=*/true,
                                   /*walks_triangle=*/false, /*masks_groups=*/true,
                                   kMaxRowsElements,
                                   /*blas_missing=*/{}, lse_tiles,
                                   grad_tiles, host_may_wait, positive_walk,
                                   /*anchor_losses=*/{}, assemble_backward, prepare_rows,
                                   /*anchor_weights=*/{}, lse_and_anchor_losses,
                                   weights_grads_and_assembly, multi_label_positives};
  return kernels;
}

}  // namespace

// Triton runs CUDA tensors, and CPU tensors in its interpreter.
TORCH_LIBRARY_IMPL(scl, CPU, m) {
  m.impl("supcon_triton", &FusedOpKernels<triton_kernels>::forward);
  m.impl("supcon_triton_backward", &FusedOpKernels<triton_kernels>::backward);
  m.impl("supcon_triton_plan", &FusedOpKernels<triton_kernels>::plan);
}

TORCH_LIBRARY_IMPL(scl, CUDA, m) {
  m.impl("supcon_triton", &FusedOpKernels<triton_kernels>::forward);
  m.impl("supcon_triton_backward", &FusedOpKernels<triton_kernels>::backward);
  m.impl("supcon_triton_plan", &FusedOpKernels<triton_kernels>::plan);
}

}  // namespace scl::triton
