// What a backend supplies to the shared SupCon core: the two tiled O(N^2) steps, for the focal
// loss a walk over the positive pairs (docs/MATH.md, sections "Forward", "Backward" and "Focal
// contrastive loss"), and optionally fused forms of O(N*D) stages (the preparation of the rows,
// the forward's per-anchor losses, the backward's per-anchor weights and its assembly).
// Everything O(N*D) that a backend does not take over (checks, norms, labels, positives,
// gradient assembly) lives in supcon_problem.* and supcon_orchestration.*.
#pragma once

#include <ATen/ATen.h>

#include <functional>
#include <utility>

namespace scl {

// How the pairs of multi-hot labels are weighed (docs/MATH.md section 11): kNone for class ids.
enum class MultiLabelRule {
  kNone,
  kAny,      // w_ij = 1 where the rows share a class
  kJaccard,  // w_ij = |Y_i & Y_j| / |Y_i | Y_j|
};

enum class Schedule {
  // Every tile of anchors x contrast rows, online running max: any layout, any logit scale.
  kPlain,
  // Single set with every row an anchor and unit rows: only tiles I <= J, with the fixed shift
  // 1/t in place of the running max, so one exp serves a row and a column.
  kSymmetric,
};

// How the symmetric backward walks its tiles, where the backend has a choice
// (TileKernels::walks_triangle; the call plan decides, CallPlan::symmetric_backward_walk).
enum class SymmetricBackwardWalk {
  kNone,           // no choice: a plain backward, or a backend with one symmetric walk
  kTriangle,       // the upper triangle by cluster pairs, adding by atomics (fenced exchange)
  kTriangleAsync,  // the same, the partners exchanging by st.async (opt-in)
  kRows,           // full rows: every element stored once, no atomics
};

// Every stage reads the call's one params type, its SupConProblem (supcon_problem.h): the rows
// (the caller's values, contiguous, input dtype; a kernel forms unit rows as x_i * inv_norm_i in
// whatever precision it computes), their norms, classes and class sums, the temperature and the
// plan's choices that kernels follow; the structs below hold only what a stage adds to it.
struct SupConProblem;

// The softmax part of the gradient w.r.t. unit rows, in the compute dtype. kSymmetric kernels
// return both sides summed into `dz` ([n, d]) and leave `dq` undefined.
struct TileGrads {
  at::Tensor dq;  // [m, d] anchor side: (1/t) sum_j G_ij z_j
  at::Tensor dz;  // [n, d] contrast side: (1/t) sum_i G_ij q_i
};

// The per-anchor scalars of the backward tiles (all [m], compute dtype):
//   kPlain:     G_ij = coef_i * exp(s_ij - lse_hi_i - lse_lo_i),  coef_i = g_i / t
//   kSymmetric: G_ij + G_ji = exp(s_ij - 1/t) (coef_i + coef_j),  coef_i = g_i e^(1/t - lse_i) / t
// lse = lse_hi + lse_lo: the log-sum-exp split so that a float32 kernel subtracts it exactly
// (docs/MATH.md, "Precision"). Rows with coef_i == 0 must contribute nothing, whatever their lse.
struct GradCoefficients {
  at::Tensor coef;
  at::Tensor lse_hi;
  at::Tensor lse_lo;
};

// The focal loss's walk over the positive pairs (docs/MATH.md, "Focal contrastive loss"). With
// x_ip = lse_i - s_ip, u_ip = 1 - exp(-x_ip) and w_i = grad_weight_i it gives, summed over anchor
// i's positives p (its class's columns but its own):
//   forward only (grad_weight empty): loss_sum_i = sum_p u_ip^gamma x_ip
//   with grad_weight: hterm_sum_i = sum_p hterm_ip, hterm_ip = u_ip^gamma (1 + gamma pi_ip x_ip / u_ip),
//     dq_i = -(1/t) sum_p w_i hterm_ip z_p  and  dz_p = -(1/t) sum_i w_i hterm_ip q_i
// in the kernels' compute dtype; the outputs not asked for are undefined or empty.
//
// With multi-hot labels (SupConProblem::multi_label) the pairs carry their weights w_ip
// (docs/MATH.md section 11) and the sums above become sum_p w_ip (...), gamma may be 0 (the
// multi-label SupCon loss itself: loss_sum_i = sum_p w_ip x_ip and hterm_ip = 1), and
// grad_weight_i is g_i / W_i.
struct PositiveWalkInputs {
  at::Tensor anchor_class;    // [m] int64 compact class id; -1: no positives, never walked
                              // (multi-label: only that mark; the classes are the problem's words)
  at::Tensor contrast_class;  // [n] int64 compact class id >= 0 (multi-label: unread)
  at::Tensor lse_hi, lse_lo;  // [m] lse = hi + lo, split as in GradCoefficients
  double gamma;               // > 0 (multi-label: >= 0)
  at::Tensor grad_weight;     // [m] g_i / |P(i)| (0 without positives); empty: forward only
};

// Per anchor of a multi-label call: |P(i)|, its positive pairs, and W_i, the sum of their weights.
struct MultiLabelPositives {
  at::Tensor num_positives;  // [m] int64
  at::Tensor weight_sum;     // [m] float64
};

struct PositiveWalkOutputs {
  at::Tensor loss_sum;   // [m]
  at::Tensor hterm_sum;  // [m]
  at::Tensor dq;         // [m, d]
  at::Tensor dz;         // [n, d]
};

// The forward's finish (docs/MATH.md, "Forward"): per anchor, from its float64 log-sum-exp,
//   l_i = lse_i - (1 / (t |P(i)|)) u_i . (C_{y_i} - [single set] u_i),   0 where |P(i)| = 0,
// with u_i = q_i * q_inv_norm_i the unit row and C the class sums of unit contrast rows (one row
// per class id), for float32 compute: the dot product accumulates in float32, the rest in float64.
// With `mean_sums` (m > 0, reproducible results not asked for: the sums add by atomics) the step
// also reduces: the loss is the mean of l_i over the anchors with |P(i)| > 0 (0 where none has),
// the caller's "mean" reduction, and their number comes back for the backward.
// Read from the problem: the anchor rows q with q_inv_norm, class_sums, anchor_class,
// num_positives, the temperature and single_set (the anchor's own row is in its class sum: take
// it out). The stage's own:
struct AnchorLossInputs {
  at::Tensor lse;            // [m] float64
  // With the mean: its accumulators, [3] float64 zeroed (the losses' sum, the anchors with
  // positives, the blocks done; PreparedRows zeroes them with the class sums), which the step
  // leaves holding their totals; undefined: per-anchor losses.
  at::Tensor mean_sums;
};

// The backward's assembly for one output's rows (docs/MATH.md, "Backward"): from the tiles'
// gradient w.r.t. the unit rows, add the positive pairs' part and go back through the
// normalisation. Per row r, with u_r = rows_r * inv_norm_r and a = r - anchor_offset,
//   d_r = grads_r + [a an anchor] (extra_a - (w_a / t) (k C_{y_a} - [self_in_class] 2 u_r))
//         - [row_class given] (1 / t) W_{c_r}
// with k = 2 where class_shares_weight (below; the contrast part folded in), else 1
//   grad_r = normalize ? (d_r - [inv_norm_r < max_inv_norm] (u_r . d_r) u_r) inv_norm_r : d_r
// in out_dtype, and unit_dot_r = u_r . d_r in the compute dtype (the temperature's gradient is
// -(1/t) / 2 times their sum over every output row: each pair's term appears once on the anchor
// side and once on the contrast side). Undefined tensors leave their term out.
// Read from the problem: the anchors' classes and class sums, self_in_class (single set: the
// anchor's own row is in its class sum), anchor_offset (single set's; 0 in a cross set), the
// temperature, normalize and max_inv_norm = 1 / eps (rows shorter than eps are scaled, not
// projected). The stage's own, per output:
struct BackwardAssemblyInputs {
  at::Tensor rows;           // [R, d] the caller's rows of this output, contiguous
  at::Tensor inv_norm;       // [R] compute dtype
  at::Tensor grads;          // [R, d] compute dtype: the tiles' gradient w.r.t. the unit rows
  at::Tensor extra;          // [A, d] or undefined: added at the anchor rows (the plain
                             // schedule's anchor side, in single set)
  at::Tensor anchor_weight;  // [A] w_a = g_a / |P(a)|, or undefined: no anchor part
  at::Tensor row_class;      // [R] int64 rows of weighted_sums, or undefined: no contrast part
  at::Tensor weighted_sums;  // [classes, d] W_c = sum of w_a u_a over the anchors of class c
  // Every row is an anchor (single set, A = R) and the anchors of a class share one weight (the
  // gradient of a mean or of a sum): then W_{c_r} = w_r C_{c_r}, the contrast part is the
  // anchor part's class sum once more, and row_class and weighted_sums stay undefined.
  bool class_shares_weight;
  at::ScalarType out_dtype;
};

struct BackwardAssembly {
  at::Tensor grad;      // [R, d] out_dtype
  at::Tensor unit_dot;  // [R] compute dtype
};

// The backward's per-anchor weights in one fused step (docs/MATH.md, "Backward"): per anchor a,
//   g_a = |P(a)| > 0 ? grad_loss_a : 0,   weight_a = w_a = g_a / |P(a)|   (0 without positives)
// (for the mean's gradient, grad_loss_a = grad_loss / anchors_with_positives, read on the device)
//   coefficients: GradCoefficients of g for the schedule (lse split into hi + lo for kPlain)
//   weighted_sums = [classes, d], row c the sum of w_a u_a over the anchors of class c
//                   (u_a = q_a * q_inv_norm_a); none (classes 0) where the assembly needs none
//                   (BackwardAssemblyInputs::class_shares_weight)
// in float32, the coefficients' arithmetic in float64 as the core's grad_coefficients does it.
// Read from the problem: the anchor rows q with q_inv_norm, num_positives, anchor_class (rows of
// weighted_sums, below `classes`) and the temperature. The stage's own:
struct AnchorWeightInputs {
  at::Tensor grad_loss;      // [m] the upstream gradient of the per-anchor losses, or 0-dim: of
                             // their mean, with anchors_with_positives
  at::Tensor anchors_with_positives;  // 0-dim float64 (AnchorLossInputs::mean_sums[1]), or undefined
  at::Tensor lse;            // [m] float64
  int64_t classes;           // 0: no weighted sums (an empty [0, d] tensor comes back)
  Schedule schedule;
};

struct AnchorWeights {
  at::Tensor weight;         // [m] float32
  at::Tensor weighted_sums;  // [classes, d] float32
  GradCoefficients coefficients;
};

// The preparation of one set of rows in one fused step (docs/MATH.md, "Labels leave the
// quadratic loop"). With lower_r and upper_r the first and one-past-last positions of label_r
// among the contrast rows' sorted labels, per row r:
//   inv_norm_r  = normalize ? 1 / max(||x_r||, eps) : 1                      (float32)
//   class_r     = min(lower_r, n - 1): a row of class_sums, one per contrast row
//   positives_r = label_r >= 0 ? upper_r - lower_r - [self_in_class] : 0     (int64)
//   class_sums  = [n, d] float32, row c the sum of x_r inv_norm_r over the rows of class c
//   non_finite  = [1] int32, the number of rows holding a NaN or inf
//   mean_sums   = [3] float64 zeros: the mean's accumulators (AnchorLossInputs), zeroed with the
//                 class sums by one fill instead of a launch of their own
// The class id of a label is where its run starts in the sorted labels: a row index below n,
// found by binary search, so that no count of the classes is ever read on the host.
struct RowPreparationInputs {
  at::Tensor rows;           // [R, d] the caller's rows, contiguous
  at::Tensor labels;         // [R] integer
  at::Tensor sorted_labels;  // [n] the contrast rows' labels, ascending
  bool normalize;
  bool self_in_class;        // single set: a row's own label is among the sorted labels
  bool class_sums;           // these are the contrast rows: sum them per class
  bool check_values;         // count the rows holding a NaN or inf
  bool mean_sums;            // zero the mean's accumulators too
};

struct PreparedRows {
  at::Tensor inv_norm;       // [R] float32
  at::Tensor row_class;      // [R] int64
  at::Tensor num_positives;  // [R] int64
  at::Tensor class_sums;     // [n, d] float32, or undefined when not asked for
  at::Tensor non_finite;     // [1] int32, or undefined when not asked for
  at::Tensor mean_sums;      // [3] float64 zeros, or undefined when not asked for
};

// The forward's tiles and its fused finish as one call (TileKernels::lse_and_anchor_losses):
// what `lse` and then `anchor_losses` give, AnchorLossInputs::lse left undefined (the call
// computes it).
struct LseAndLosses {
  at::Tensor lse;     // as TileKernels::lse
  at::Tensor losses;  // as TileKernels::anchor_losses
};

// The backward's weights, tiles and assembly as one call (TileKernels::weights_grads_and_assembly):
// what anchor_weights, grad and assemble_backward for each output give, the assembly's inputs
// as the core forms them from these.
// Read from the problem besides the weights': contrast_class (the contrast rows' rows of the
// weighted sums), class_sums, single_set (one output: the contrast rows, holding the anchors),
// the anchors' first row, normalize, and each output's dtype (its rows').
struct WeightsGradsAndAssemblyInputs {
  AnchorWeightInputs weights;  // `classes` 0 exactly where class_shares_weight
  bool class_shares_weight;
};

struct AssembledGradients {
  BackwardAssembly features;
  BackwardAssembly contrast;  // undefined in single set
};

struct TileKernels {
  // Precision the kernels compute in for an input dtype (float64 stays float64 only where the
  // kernels support it); it decides the fixed shift's range.
  std::function<at::ScalarType(at::ScalarType)> compute_type;
  // Whether the symmetric forward gives bitwise-reproducible results; when it does not, the
  // plain schedule serves torch.use_deterministic_algorithms(True).
  bool symmetric_forward_is_deterministic;
  // Whether the tiles and the fused stages read t from device memory where the call's
  // Temperature is there (temperature.h): then a temperature on the GPU is not read on the host
  // while the host may not wait (host_may_wait), so a CUDA graph can capture the call.
  bool reads_temperature;
  // Whether the symmetric backward can walk the upper triangle (adding by atomics) instead of
  // full rows: the plan then chooses the walk (SupConProblem::symmetric_backward_walk).
  bool walks_triangle;
  // Whether the tiles mask the pairs that groups take out of the denominator
  // (SupConProblem::anchor_group and the rest): the plan refuses groups elsewhere.
  bool masks_groups;
  // The most elements the kernels take in one rows tensor (features, contrast), 0 for no limit:
  // a call past it is refused by the plan (Triton's kernels address rows with int32 offsets).
  int64_t max_rows_elements;
  // Whether the BLAS the tiles multiply through is missing from this PyTorch build (empty: the
  // kernels need none): the plan refuses every call then.
  std::function<bool()> blas_missing;
  // Log-sum-exp per anchor over its columns, float64 [m] (-inf for an anchor without columns).
  std::function<at::Tensor(const SupConProblem&, Schedule)> lse;
  std::function<TileGrads(const SupConProblem&, Schedule, const GradCoefficients&)> grad;
  // Whether the host may wait for values on `like`'s device now (empty: always). A CUDA backend
  // says no while the current stream captures a CUDA graph: the forward then leaves out its
  // NaN / inf check, which a replay on new values would not repeat anyway.
  std::function<bool(const at::Tensor& like)> host_may_wait;
  // The positive walk of the focal loss and of multi-hot labels (empty: this backend has
  // neither, and focal_gamma != 0 is refused; see walks_focal).
  std::function<PositiveWalkOutputs(const SupConProblem&, const PositiveWalkInputs&)>
      positive_walk;
  // The per-anchor losses in one fused step, for float32 compute, and their mean where asked
  // (empty, or float64 inputs: the core's ATen steps, anchor_losses in supcon_problem.h, a dozen
  // launches on a GPU, and four more for the mean). The loss: [m], or 0-dim with mean_sums; in
  // the class sums' dtype.
  std::function<at::Tensor(const SupConProblem&, const AnchorLossInputs&)> anchor_losses;
  // The backward's assembly in one fused step per output, for float32 compute and the
  // non-focal loss (empty: the core's ATen steps, add_positive_grads, unit_dot and
  // normalize_backward in supcon_problem.h, three dozen launches on a GPU).
  std::function<BackwardAssembly(const SupConProblem&, const BackwardAssemblyInputs&)>
      assemble_backward;
  // The preparation in one fused step per set of rows, for float32 compute where reproducible
  // results are not asked for (the class sums add by atomics; empty: the core's ATen steps in
  // supcon_problem.cpp, two dozen launches on a GPU).
  std::function<PreparedRows(const RowPreparationInputs&)> prepare_rows;
  // The backward's per-anchor weights in one fused step, where the fused assembly serves and
  // reproducible results are not asked for (the weighted sums add by atomics; empty: the core's
  // ATen steps, effective_anchor_grads, grad_coefficients, positive_weights and
  // weighted_class_sums, about twenty launches on a GPU).
  std::function<AnchorWeights(const SupConProblem&, const AnchorWeightInputs&)> anchor_weights;
  // Grouped forms of the fused stages, for a backend whose every call is a crossing into
  // Python (Triton): each stands for the separate stages it groups, which such a backend need
  // not supply, and the call plan takes it wherever they would run (CallPlan::grouped_forward,
  // grouped_backward). lse_and_anchor_losses: the log-sum-exp tiles and the fused losses;
  // weights_grads_and_assembly: the anchor weights, the gradient tiles and every output's
  // fused assembly.
  std::function<LseAndLosses(const SupConProblem&, Schedule, const AnchorLossInputs&)>
      lse_and_anchor_losses;
  std::function<AssembledGradients(const SupConProblem&, const WeightsGradsAndAssemblyInputs&)>
      weights_grads_and_assembly;
  // The positives of multi-hot labels, from the same pair weights as the backend's positive
  // walk, which then walks multi-label calls too (empty: its walk has no pair weights, and
  // multi-hot labels are refused).
  std::function<MultiLabelPositives(const SupConProblem&)> multi_label_positives;
  // Whether positive_walk takes the focal loss (gamma > 0) too, not only the multi-label SupCon
  // loss: the plan refuses focal calls where not.
  bool walks_focal = true;
};

}  // namespace scl
