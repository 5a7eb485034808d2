// What one call of the op will do, decided once from its arguments and the backend's kernels:
// the schedule of each direction, where the temperature comes from, which fused stages run and
// which ATen steps stand in for them, the value checks, the threads. Forward and backward follow
// it instead of deriving conditions again; scl::supcon_plan (scl_kernels.explain) returns its
// description, profiles show it as a range, and every "cannot run" error quotes it.
#pragma once

#include <ATen/ATen.h>

#include <string>

#include "call_arguments.h"
#include "temperature.h"
#include "tile_kernels.h"

namespace scl {

struct SupConProblem;

// How the forward checks the rows for NaN / inf.
enum class ValueChecks {
  kOnHost,    // at once, raising from the call (CPU)
  kDeferred,  // on the device, the verdict read without a wait (deferred_value_check.h)
  kSkipped,   // none: a CUDA graph is being captured, and a replay would not repeat them
};

// How the forward turns the log-sum-exp into the loss.
enum class ForwardFinish {
  kPositiveWalk,        // the focal loss or multi-hot labels: the backend's walk over the
                        // positive pairs
  kFusedLosses,         // TileKernels::anchor_losses, per anchor
  kFusedLossesAndMean,  // TileKernels::anchor_losses with the mean's accumulators (atomics)
  kAtenLosses,          // the core's ATen steps (anchor_losses in supcon_problem.h)
};

// How the backward assembles the row gradients around the backend's tile gradients.
enum class AssemblyPath {
  kPositiveWalk,            // the walk's positive part, then the core's ATen assembly
  kFusedWeightsAndAssembly, // TileKernels::anchor_weights and ::assemble_backward
  kFusedAssembly,           // ATen weights (reproducible sums), TileKernels::assemble_backward
  kAten,                    // the core's ATen steps
};

// Why a backend cannot compute a call (plan_call's caller raises it with the plan).
enum class Refusal {
  kNone,
  kNoBlas,                 // TileKernels::blas_missing: this PyTorch build exports no BLAS
  kTooManyElements,        // a rows tensor past TileKernels::max_rows_elements
  kNoFocalWalk,            // focal_gamma > 0 without TileKernels::positive_walk, walks_focal
  kNoGroupMask,            // groups without TileKernels::masks_groups
  kNoPairWeights,          // multi-hot labels without TileKernels::multi_label_positives
  kTemperatureUnreadable,  // a GPU temperature that must be read while a CUDA graph is captured
};

// Why a direction takes the plain schedule instead of the symmetric one, as bits (none: the
// symmetric one), so that explain names every condition that failed, not only the first.
enum PlainBecause : unsigned {
  kContrastRows = 1u << 0,         // a contrast set: the logits are not square
  kSomeAnchors = 1u << 1,          // not every row an anchor: not square either
  kNotNormalized = 1u << 2,        // rows not unit: the fixed shift 1/t does not bound them
  kTemperatureUnread = 1u << 3,    // no host value to check the shift's range against
  kSmallTemperature = 1u << 4,     // 1/t outside the shift's range (fixed_shift_is_safe)
  kReproducibleForward = 1u << 5,  // the backend's triangle forward is not reproducible
};

struct CallPlan {
  // Read once on the host (a CPU tensor in place: 1/t is a number of the call), or left unread
  // in device memory for the kernels (TileKernels::reads_temperature); unread (neither) where
  // the plan refuses the call because it cannot read t now (kTemperatureUnreadable).
  Temperature temperature;
  bool focal;
  MultiLabelRule multi_label;  // kNone for class ids
  Refusal refusal;  // kNone where the backend can compute the call
  // Preparation: by host reads (unique, bincount; the CPU) or without any (sort-based class
  // ids, deferred checks: off the CPU, or TestHooks::device_preparation), and by the backend's
  // fused step (TileKernels::prepare_rows) or by ATen steps.
  bool host_reads;
  bool fused_preparation;
  Schedule forward_schedule;
  Schedule backward_schedule;
  unsigned forward_plain_because;  // PlainBecause bits; 0 exactly where the schedule is symmetric
  unsigned backward_plain_because;
  at::ScalarType rows_type;
  at::ScalarType compute_type;  // TileKernels::compute_type of rows_type
  ForwardFinish forward_finish;
  bool mean;  // the loss is the mean over the anchors with positives, taken inside the op
  AssemblyPath backward_assembly;
  // The fused stages go to the backend grouped (TileKernels::lse_and_anchor_losses,
  // weights_grads_and_assembly), where it has the group: the forward's tiles with its fused
  // losses, the backward's fused weights with its tiles and assembly.
  bool grouped_forward;
  bool grouped_backward;
  ValueChecks value_checks;
  // The tile kernels use torch's threads (past the grain); the rest of the call runs on the
  // calling thread (calling_thread.h).
  bool parallel_tiles;
  bool deterministic;  // torch.use_deterministic_algorithms(True): no atomics anywhere
  // The symmetric backward's walk where the backend has a choice (TileKernels::walks_triangle)
  // and the backward is symmetric: full rows in deterministic mode, else the process's setting
  // (symmetric_backward_walk_setting); kNone elsewhere.
  SymmetricBackwardWalk symmetric_backward_walk;
  int64_t rows_elements;  // the largest rows tensor's, for the refusal's message
  int64_t max_rows_elements;

  // "name: value" lines, the same names scl_kernels.explain parses.
  std::string describe() const;
  // One line, for profiler ranges and errors.
  std::string summary() const;
};

// Checks the arguments (TypeError / ValueError naming the argument) and plans the call. The
// temperature is read here where it is read at all. A backward that reuses its forward's
// problem (`kept`) reads nothing: the problem holds what the forward read. A call the backend
// cannot compute is planned too (CallPlan::refusal), for scl_kernels.explain to show.
CallPlan plan_call(const TileKernels& kernels, const SupConArgs& args,
                   const SupConProblem* kept = nullptr);

// The walk SCL_CUDA_SYMMETRIC_BACKWARD asks for ("triangle", the default, "triangle-async" or
// "rows"), read once per process, or the test hook symmetric_backward_walk's (test_hooks.h); a
// value that names none is a ValueError naming its source, from any call of the op.
SymmetricBackwardWalk symmetric_backward_walk_setting();

// Raises the plan's refusal in one line (what was asked, the plan's line that refuses, what to
// do), quoting the plan: NotImplementedError for a feature the backend lacks, ValueError for a
// temperature it cannot read now or rows past its size limit, RuntimeError without BLAS.
void require_runnable(const CallPlan& plan, const SupConArgs& args);

// True when exp(s - 1/t) cannot underflow for unit rows (|s| <= 1/t) in `compute_type`: the
// condition of the fixed shift that the symmetric schedule relies on.
bool fixed_shift_is_safe(double inv_t, at::ScalarType compute_type);

}  // namespace scl
