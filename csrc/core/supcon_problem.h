// The device-generic O(N*D) half of the SupCon op, shared by every backend: argument checks,
// row norms, labels, and every O(N*D) term of the loss and its gradient (positives through class
// sums, normalisation and temperature gradients; docs/MATH.md). Row-wise steps run over bounded
// chunks of rows, so a 16-bit input never gets a full float32 copy here.
#pragma once

#include <ATen/ATen.h>

#include <functional>
#include <optional>

#include "call_plan.h"
#include "call_arguments.h"
#include "tile_kernels.h"
#include "tile_math.h"

namespace scl {

class DeferredValueChecks;

using tile_math::kNormEps;

// Which rows of a problem: the anchors q or the contrast rows z.
enum class Rows { kAnchors, kContrast };

// One call's loss: anchors q[m, d] against contrast rows z[n, d]. The call's one params type:
// every stage of tile_kernels.h reads it.
struct SupConProblem {
  bool single_set;     // contrast is the features themselves; anchor i is row anchor_offset + i
  bool normalize;
  Temperature temperature;  // the plan's: a host 1/t, or t in device memory
  int64_t m, n, d;
  int64_t anchor_offset;
  at::ScalarType compute_type;       // of the O(N*D) terms: float64 for float64 input, else float32
  at::Tensor q, z;                   // the caller's rows, contiguous; q is a view of z in single set
  at::Tensor q_inv_norm, z_inv_norm; // 1 / max(||x||, eps) per row (ones without normalisation)
  // The unit rows in the compute dtype, kept when they fit in one chunk (small batches, whose
  // time goes to passes over the rows rather than to the tiles); undefined otherwise.
  at::Tensor q_unit, z_unit;
  at::Tensor anchor_class, contrast_class;  // compact class ids (negative labels share one id)
  at::Tensor class_sums;             // [classes, d] sums of unit contrast rows per class id (off
                                     // the CPU, one row per label: prepare_problem)
  at::Tensor num_positives;          // [m] int64, |P(i)|
  // The tiles' group mask, where the call has groups (undefined otherwise): per row, the int32
  // compact group id (-1: no group) and pair class, equal for two rows exactly when they are a
  // positive pair (a row without a class has one of its own). A pair of one group whose pair
  // classes differ leaves the denominator (docs/MATH.md section 11).
  at::Tensor anchor_group, contrast_group, anchor_pair_class, contrast_pair_class;
  // Multi-hot labels (docs/MATH.md section 11), where the call has them: the pair rule, and each
  // row's classes as ceil(C / 64) 64-bit words ([m, K] and [n, K] int64; bit c of word c / 64 is
  // class c), which the group mask compares in place of the pair classes (then undefined). Then
  // anchor_class and contrast_class are zeros, class_sums is undefined, num_positives counts the
  // positive pairs and positive_weight (float64 [m]) holds W_i, the sum of their weights
  // (TileKernels::multi_label_positives).
  MultiLabelRule multi_label = MultiLabelRule::kNone;
  at::Tensor anchor_words, contrast_words;
  at::Tensor positive_weight;
  // The mean's zeroed accumulators where the fused preparation made them (asked with the mean
  // reduction: TileKernels::prepare_rows); else undefined.
  at::Tensor mean_sums;
  // 0-dim float64 on the device: the number of anchors with |P(i)| > 0, where a forward's fused
  // finish counted it (TileKernels::anchor_losses with mean) for its backward; else undefined.
  at::Tensor anchors_with_positives;

  // The plan's choices that the kernels follow: no atomics anywhere (CallPlan::deterministic),
  // and the symmetric backward's walk (CallPlan::symmetric_backward_walk).
  bool deterministic = false;
  SymmetricBackwardWalk symmetric_backward_walk = SymmetricBackwardWalk::kNone;

  int64_t self_offset() const { return single_set ? anchor_offset : -1; }
  // The anchors' first row among the rows of their output: anchor_offset in single set, where
  // they are contrast rows; 0 in a cross set.
  int64_t anchor_row() const { return single_set ? anchor_offset : 0; }

  // Unit rows start..start+length of q or z in the compute dtype.
  at::Tensor unit(Rows rows, int64_t start, int64_t length) const;
};

// True to prepare without reading any value on the host (no unique, no bincount, value checks
// deferred): always off the CPU, where each read would stall the device's queue. On the CPU the
// direct ops are cheaper; TestHooks::device_preparation takes the device's path there too, so
// that CPU tests (and the CUDA backend's dry run) cover it.
bool prepare_without_host_reads(const at::Tensor& x);

// Checks the op's arguments but the rows' values and the temperature's value (TypeError /
// ValueError naming the argument).
void check_arguments(const SupConArgs& args);

// The call's rule for multi-hot labels (kNone with class ids); a ValueError for a multi_label
// that names none, whatever the labels.
MultiLabelRule multi_label_rule(const SupConArgs& args);

// The temperature t read on the host (a host tensor in place; a device one costs the op's only
// host read) and checked positive and finite: the call's one check of a value read on the host
// (a value left in memory is checked with the rows', prepare_problem). plan_call calls it once
// per call, where it reads t.
double read_temperature(const SupConArgs& args);

// Prepares the arguments that plan_call checked, as the plan says (its temperature, host reads
// and fused preparation: TileKernels::prepare_rows). With value_checks, NaN / inf in the rows is
// an error too: raised at once on the CPU, queued in value_checks off it
// (deferred_value_check.h). Forward checks values; backward (same inputs) passes nullptr. A
// temperature the plan leaves in memory is kept as a tensor (SupConProblem::temperature), its
// check joining value_checks.
SupConProblem prepare_problem(
    const SupConArgs& args, const CallPlan& plan, DeferredValueChecks* value_checks,
    const std::function<PreparedRows(const RowPreparationInputs&)>& prepare_rows);

// Elements per chunk of the temporaries that the row-wise stages and the blocks of pairs make
// (2^24: 64 MiB of float32, 128 MiB of float64); tests set smaller chunks
// (TestHooks::chunk_elements) to run the chunked paths on small inputs.
int64_t chunk_elements();

// Per-anchor loss l_i from the float64 log-sum-exp: in the loss dtype, 0 without positives.
at::Tensor anchor_losses(const SupConProblem& p, const at::Tensor& lse);

// ValueError unless grad_loss is [m] (0-dim for the mean) on the problem's device.
void check_grad_loss(const SupConProblem& p, const at::Tensor& grad_loss, bool mean);

// The mean of the per-anchor losses over the anchors with positives (0-dim; 0 where none has).
at::Tensor mean_over_anchors_with_positives(const SupConProblem& p, const at::Tensor& losses);

// The mean's 0-dim gradient as the per-anchor losses' gradient: grad / (anchors with positives),
// expanded to [m].
at::Tensor per_anchor_grad_of_mean(const SupConProblem& p, const at::Tensor& grad_loss);

// g_i in the compute dtype, 0 for anchors that carry no loss (whatever the upstream gradient).
at::Tensor effective_anchor_grads(const SupConProblem& p, const at::Tensor& grad_loss);

// w_i = g_i / |P(i)| per anchor (0 without positives, since g_i is), in g's dtype.
at::Tensor positive_weights(const SupConProblem& p, const at::Tensor& g);

// W_c = sum of w_i u_i over the anchors of class c ([classes, d], class_sums' dtype): what the
// positive pairs give each contrast row of class c, times -1/t.
at::Tensor weighted_class_sums(const SupConProblem& p, const at::Tensor& w);

// Adds the positive-pair part of the gradient w.r.t. unit rows to dq [m, d] and dz [n, d]
// (dq may be dz itself, for the symmetric kernels' combined gradient).
void add_positive_grads(const SupConProblem& p, const at::Tensor& g, const at::Tensor& dq,
                        const at::Tensor& dz);

// sum_i u_i . grads_i over the unit rows u of `rows` (float64, 0-dim).
at::Tensor unit_dot(const SupConProblem& p, Rows rows, const at::Tensor& grads);

// dx from the gradient w.r.t. unit rows, through z = x / max(||x||, eps), in `out_dtype`.
at::Tensor normalize_backward(const SupConProblem& p, Rows rows, const at::Tensor& d_unit,
                              at::ScalarType out_dtype);

}  // namespace scl
