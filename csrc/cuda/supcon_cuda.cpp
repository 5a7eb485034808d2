// CUDA backend of scl::supcon: the shared core (csrc/core) with the CUDA tile kernels (launch.h)
// and the fused O(N*D) stages (row_stages.h: the core's hooks, the tiles' per-row terms, the
// float64 log-sum-exp merge). This file is the only one that sees tensors: it brings rows to the
// kernels' form, allocates what they write, and launches on the current stream under a device
// guard. No host synchronisation and nothing of size N x N; under CUDA graph capture the core
// reads nothing. The library built without CUDA compiles it too, as a dry run on CPU tensors
// (csrc/cuda_dry_run): bench.launch_count counts the CUDA call from it, and the test suite checks
// this glue against the float64 reference.
#include <ATen/ATen.h>
#include <torch/library.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <utility>

#include "../core/class_overlap_products.h"
#include "../core/class_subset_gathers.h"
#include "../core/class_subsets.h"
#include "../core/group_shared_class_pairs.h"
#include "../core/supcon_orchestration.h"
#include "../core/tile_math.h"
#include "device_runtime.h"
#include "launch.h"
#include "row_stages.h"

namespace scl::cuda {
namespace {

// The kernels compute in fp32 (float64 inputs are read as float32), like the Triton backend.
at::ScalarType compute_type(at::ScalarType) { return at::kFloat; }

ElementType element_type(at::ScalarType t) {
  switch (t) {
    case at::kBFloat16: return ElementType::kBFloat16;
    case at::kHalf: return ElementType::kFloat16;
    default: return ElementType::kFloat32;
  }
}

// Rows as the kernels read them (tile_args.h, RowMatrix): 16- or 32-bit, contiguous, a row
// stride of whole 16 bytes with zero columns past D, a 16-byte aligned base. O(N * D) copy only
// when the caller's rows are not already so.
at::Tensor kernel_rows(const at::Tensor& x) {
  const at::Tensor rows = x.scalar_type() == at::kDouble ? x.to(at::kFloat) : x;
  const int64_t per_16_bytes = 16 / rows.element_size();
  const int64_t d = rows.size(1);
  const int64_t width = (d + per_16_bytes - 1) / per_16_bytes * per_16_bytes;
  if (rows.is_contiguous() && width == d &&
      reinterpret_cast<uintptr_t>(rows.data_ptr()) % 16 == 0) {
    return rows;
  }
  at::Tensor padded = at::zeros({rows.size(0), width}, rows.options());
  padded.narrow(1, 0, d).copy_(rows);
  return padded;
}

RowMatrix row_matrix(const at::Tensor& rows) {
  return {rows.data_ptr(), rows.size(0), rows.stride(0)};
}

// [rows rounded up to kTermsPadding, 4] fp32 per-row terms (tile_args.h, RowTerms), written by
// row_stages::row_terms.
at::Tensor terms_buffer(int64_t rows, const at::TensorOptions& options) {
  const int64_t padded = (rows + kTermsPadding - 1) / kTermsPadding * kTermsPadding;
  return at::empty({padded, 4}, options.dtype(at::kFloat));
}

RowTerms* terms_ptr(const at::Tensor& terms) {
  return reinterpret_cast<RowTerms*>(terms.data_ptr<float>());
}

// One array's description for row_stages::row_terms: `rows` rows of kind `kind`, into `terms`.
row_stages::TermsArray terms_array(row_stages::TermsKind kind, const at::Tensor& inv_norm,
                                   const at::Tensor& terms, const float* coef = nullptr,
                                   const float* lse_hi = nullptr, const float* lse_lo = nullptr,
                                   float bias = 0.0f) {
  return {kind, inv_norm.size(0), terms.size(0), inv_norm.data_ptr<float>(), coef, lse_hi, lse_lo,
          bias, terms_ptr(terms)};
}

// `zeroed` (contiguous fp32, or undefined): the next tile kernel's accumulator, set to 0 by the
// same launch.
void write_row_terms(KernelTemperature temperature, const row_stages::TermsArray& first,
                     const row_stages::TermsArray& second, const Device& device,
                     const at::Tensor& zeroed = at::Tensor()) {
  row_stages::row_terms({temperature, first, second,
                         zeroed.defined() ? zeroed.data_ptr<float>() : nullptr,
                         zeroed.defined() ? zeroed.numel() : 0},
                        device);
  check_launch();
}

// The group mask's ids of one side's rows as the kernels read them (TileProblem::own_groups):
// [rows padded like the terms, 2] int32, (group, pair class) per row, the padding in no group, so
// that the kernels read a tile's without bounds. Undefined for a call without groups.
at::Tensor group_ids(const at::Tensor& group, const at::Tensor& pair_class) {
  if (!group.defined()) return at::Tensor();
  TORCH_INTERNAL_ASSERT(pair_class.defined());
  const int64_t rows = group.size(0);
  const int64_t padded = (rows + kTermsPadding - 1) / kTermsPadding * kTermsPadding;
  at::Tensor ids = at::full({padded, 2}, -1, group.options().dtype(at::kInt));
  ids.narrow(0, 0, rows).select(1, 0).copy_(group);
  ids.narrow(0, 0, rows).select(1, 1).copy_(pair_class);
  return ids;
}

const tile_math::GroupId* group_ids_ptr(const at::Tensor& ids) {
  return ids.defined() ? reinterpret_cast<const tile_math::GroupId*>(ids.data_ptr<int32_t>()) : nullptr;
}

// The operands of one call: rows in the kernels' form, the anchors a view of the contrast rows
// in the single set, the inverse norms in fp32, and the group mask's ids where the call has
// groups.
struct Operands {
  at::Tensor q, z, rq, rz, q_groups, z_groups;
  TileProblem problem(const at::Tensor& own, const at::Tensor& streamed, const at::Tensor& own_terms,
                      const at::Tensor& streamed_terms, int64_t self_offset,
                      const at::Tensor& own_groups, const at::Tensor& streamed_groups) const {
    return {element_type(z.scalar_type()), z.size(1), row_matrix(own), row_matrix(streamed),
            terms_ptr(own_terms), terms_ptr(streamed_terms), self_offset,
            group_ids_ptr(own_groups), group_ids_ptr(streamed_groups)};
  }
};

Operands operands(const SupConProblem& p) {
  Operands o;
  o.z = kernel_rows(p.z);
  o.q = p.single_set ? o.z.narrow(0, p.anchor_offset, p.q.size(0)) : kernel_rows(p.q);
  o.rq = p.q_inv_norm.to(at::kFloat).contiguous();
  o.rz = p.z_inv_norm.to(at::kFloat).contiguous();
  // Multi-hot labels: every pair of one group leaves the tiles' denominator; the pairs that
  // share a class come back beside them (lse_tiles, multi_label_walk).
  const auto [anchor_pair_class, contrast_pair_class] =
      group_shared_class_pairs::apply(p)
          ? group_shared_class_pairs::own_pair_classes(p)
          : std::pair{p.anchor_pair_class, p.contrast_pair_class};
  o.q_groups = group_ids(p.anchor_group, anchor_pair_class);
  o.z_groups = group_ids(p.contrast_group, contrast_pair_class);
  return o;
}

using row_stages::TermsKind;
constexpr row_stages::TermsArray kNoTerms{};

at::Tensor tile_lse(const SupConProblem& p, Schedule schedule) {
  const DeviceGuard guard(p.z.device());
  const int64_t m = p.q.size(0), n = p.z.size(0);
  const auto float64 = p.z.options().dtype(at::kDouble);
  if (m == 0) return at::empty({0}, float64);
  const Operands o = operands(p);
  const Device device = current_device(p.z);
  const KernelTemperature temperature = p.temperature.for_kernels();
  at::Tensor lse = at::empty({m}, float64);
  if (schedule == Schedule::kSymmetric) {
    // The fixed shift c = log2(e) / t: the plan reads t on the host for this schedule.
    const float shift2 = row_stages::logit_scale(KernelTemperature::on_host(p.temperature.inv_t()));
    const at::Tensor terms = terms_buffer(n, o.rz.options());
    const at::Tensor row_sum = at::empty({terms.size(0)}, o.rz.options());
    write_row_terms(temperature,
                    terms_array(TermsKind::kContrast, o.rz, terms, nullptr, nullptr, nullptr, -shift2),
                    kNoTerms, device, row_sum);
    lse_symmetric(o.problem(o.z, o.z, terms, terms, 0, o.z_groups, o.z_groups), row_sum.data_ptr<float>(),
                  device);
    check_launch();
    row_stages::lse_merge({nullptr, row_sum.data_ptr<float>(), n, 1, temperature, lse.data_ptr<double>()},
                          device);
    check_launch();
    return lse;
  }
  const at::Tensor own = terms_buffer(m, o.rq.options()), streamed = terms_buffer(n, o.rz.options());
  write_row_terms(temperature, terms_array(TermsKind::kLseAnchor, o.rq, own),
                  terms_array(TermsKind::kContrast, o.rz, streamed), device);
  const TileProblem tiles = o.problem(o.q, o.z, own, streamed, p.self_offset(), o.q_groups, o.z_groups);
  const int splits = lse_plain_splits(tiles, device);
  at::Tensor part_max = at::empty({splits, m}, o.rq.options());
  at::Tensor part_sum = at::empty({splits, m}, o.rq.options());
  lse_plain(tiles, part_max.data_ptr<float>(), part_sum.data_ptr<float>(), splits, device);
  check_launch();
  // The splits' base-2 (max, sum) pairs merged in float64 (docs/MATH.md section 6).
  row_stages::lse_merge({part_max.data_ptr<float>(), part_sum.data_ptr<float>(), m, splits,
                         temperature, lse.data_ptr<double>()},
                        device);
  check_launch();
  return lse;
}

// The tiles' log-sum-exp, with the pairs of one group that share a class where the call has
// multi-hot labels and groups (group_shared_class_pairs.h).
at::Tensor lse_tiles(const SupConProblem& p, Schedule schedule) {
  const at::Tensor lse = tile_lse(p, schedule);
  return group_shared_class_pairs::apply(p) ? group_shared_class_pairs::add_to_lse(p, lse) : lse;
}

// The plan's symmetric backward walk as the triangle's exchange, or none for full rows: the
// upper triangle by cluster pairs (sm_90a, D <= 128; atomics), fenced or by st.async (opt-in
// until it has run on a GPU), unless the plan takes full rows (one program per row block over
// every column block; docs/CUDA_KERNELS.md): in deterministic mode, or asked for, e.g. to compare.
std::optional<TriangleExchange> triangle_exchange(SymmetricBackwardWalk walk) {
  switch (walk) {
    case SymmetricBackwardWalk::kTriangle: return TriangleExchange::kFenced;
    case SymmetricBackwardWalk::kTriangleAsync: return TriangleExchange::kAsync;
    case SymmetricBackwardWalk::kRows: return std::nullopt;
    case SymmetricBackwardWalk::kNone: break;
  }
  TORCH_INTERNAL_ASSERT(false, "a symmetric backward planned without a walk");
}

TileGrads grad_tiles(const SupConProblem& p, Schedule schedule, const GradCoefficients& c) {
  const DeviceGuard guard(p.z.device());
  const int64_t m = p.q.size(0), n = p.z.size(0), d = p.z.size(1);
  const Operands o = operands(p);
  const Device device = current_device(p.z);
  const KernelTemperature temperature = p.temperature.for_kernels();
  const at::Tensor coef = c.coef.to(at::kFloat).contiguous();
  const auto fp32 = o.rz.options();
  TileGrads out;
  if (schedule == Schedule::kSymmetric) {
    // Own and streamed rows are the same set: coef_i t / log2(e) meets r_j log2(e) / t; the
    // triangle's column side scales by r_i / r_j.
    const at::Tensor own = terms_buffer(n, fp32), streamed = terms_buffer(n, fp32);
    const TileProblem problem = o.problem(o.z, o.z, own, streamed, 0, o.z_groups, o.z_groups);
    const std::optional<TriangleExchange> exchange = triangle_exchange(p.symmetric_backward_walk);
    const bool triangle = exchange && symmetric_triangle_supported(problem, device);
    // The triangle adds whole 16-byte vectors into a padded buffer, zeroed by the row terms'
    // launch; the gradient is its view. The full-row walk stores every element.
    const at::Tensor accumulator = triangle ? at::empty({own.size(0), kTriangleGradWidth}, fp32)
                                            : at::empty({n, d}, fp32);
    write_row_terms(temperature,
                    terms_array(TermsKind::kSymmetricGradOwn, o.rz, own, coef.data_ptr<float>()),
                    terms_array(TermsKind::kSymmetricGradStreamed, o.rz, streamed, coef.data_ptr<float>()),
                    device, triangle ? accumulator : at::Tensor());
    if (triangle) {
      grad_symmetric_triangle(*exchange, problem, accumulator.data_ptr<float>(), device);
      out.dz = accumulator.narrow(0, 0, n).narrow(1, 0, d);
    } else {
      out.dz = accumulator;
      grad(GradWalk::kRowsSymmetric, problem, out.dz.data_ptr<float>(), d, device);
    }
    check_launch();
    return out;
  }
  // The anchors' lse in base 2 as an fp32 (hi, lo) pair; rows without gradient get hi = +inf
  // (weight 0).
  const at::Tensor lse_hi = c.lse_hi.to(at::kFloat).contiguous();
  const at::Tensor lse_lo = c.lse_lo.to(at::kFloat).contiguous();
  const at::Tensor anchors = terms_buffer(m, fp32), columns = terms_buffer(n, fp32);
  const at::Tensor anchors_streamed = terms_buffer(m, fp32);
  const float *hi = lse_hi.data_ptr<float>(), *lo = lse_lo.data_ptr<float>();
  write_row_terms(temperature,
                  terms_array(TermsKind::kAnchorGrad, o.rq, anchors, coef.data_ptr<float>(), hi, lo),
                  terms_array(TermsKind::kContrast, o.rz, columns), device);
  write_row_terms(temperature,
                  terms_array(TermsKind::kAnchorGradStreamed, o.rq, anchors_streamed,
                              coef.data_ptr<float>(), hi, lo),
                  kNoTerms, device);
  out.dq = at::empty({m, d}, fp32);
  if (m > 0) {
    grad(GradWalk::kRowsPlain, o.problem(o.q, o.z, anchors, columns, p.self_offset(), o.q_groups, o.z_groups),
         out.dq.data_ptr<float>(), d, device);
    check_launch();
  }
  // The contrast side: column blocks own their rows and walk the anchors (no atomics).
  out.dz = at::zeros({n, d}, fp32);
  if (m > 0) {
    grad(GradWalk::kColumns,
         o.problem(o.z, o.q, columns, anchors_streamed, p.self_offset(), o.z_groups, o.q_groups),
         out.dz.data_ptr<float>(), d, device);
    check_launch();
  }
  return out;
}

// ---- The fused O(N*D) stages (row_stages.h): one launch each, after at most one zeroed buffer.

row_stages::Rows rows_of(const at::Tensor& rows) {
  TORCH_INTERNAL_ASSERT(rows.scalar_type() != at::kDouble && rows.stride(1) == 1);
  return {element_type(rows.scalar_type()), rows.data_ptr(), rows.stride(0)};
}

template <class T>
const T* ptr(const at::Tensor& t) {
  return t.defined() ? t.data_ptr<T>() : nullptr;
}

PreparedRows prepare_rows(const RowPreparationInputs& in) {
  const DeviceGuard guard(in.rows.device());
  const at::Tensor rows = in.rows.contiguous();
  const at::Tensor labels = in.labels.to(at::kLong).contiguous();
  const at::Tensor sorted = in.sorted_labels.to(at::kLong).contiguous();
  const int64_t r = rows.size(0), d = rows.size(1), n = sorted.size(0);
  const auto fp32 = rows.options().dtype(at::kFloat);
  PreparedRows out{at::empty({r}, fp32), at::empty({r}, fp32.dtype(at::kLong)),
                   at::empty({r}, fp32.dtype(at::kLong))};
  // One zeroed buffer holds the class sums, the NaN / inf count and the mean's accumulators
  // (three float64 at an even float offset: 8-byte aligned).
  const int64_t sums = in.class_sums ? n * d : 0, count = in.check_values ? 1 : 0;
  const int64_t mean_at = (sums + count + 1) / 2 * 2, mean = in.mean_sums ? 6 : 0;
  if (mean_at + mean > 0) {
    const at::Tensor zeroed = at::zeros({mean_at + mean}, fp32);
    if (in.class_sums) out.class_sums = zeroed.narrow(0, 0, sums).view({n, d});
    if (in.check_values) out.non_finite = zeroed.narrow(0, sums, 1).view(at::kInt);
    if (in.mean_sums) out.mean_sums = zeroed.narrow(0, mean_at, mean).view(at::kDouble);
  }
  row_stages::prepare_rows(
      {rows_of(rows), r, d, labels.data_ptr<int64_t>(), sorted.data_ptr<int64_t>(), n,
       in.normalize, in.self_in_class, out.inv_norm.data_ptr<float>(),
       out.row_class.data_ptr<int64_t>(), out.num_positives.data_ptr<int64_t>(),
       in.class_sums ? out.class_sums.data_ptr<float>() : nullptr,
       in.check_values ? out.non_finite.data_ptr<int32_t>() : nullptr},
      current_device(rows));
  check_launch();
  return out;
}

at::Tensor anchor_losses(const SupConProblem& p, const AnchorLossInputs& finish) {
  const DeviceGuard guard(p.q.device());
  const at::Tensor q = p.q.contiguous(), q_inv_norm = p.q_inv_norm.contiguous();
  const at::Tensor class_sums = p.class_sums.contiguous();
  const at::Tensor anchor_class = p.anchor_class.contiguous();
  const at::Tensor num_positives = p.num_positives.contiguous(), lse = finish.lse.contiguous();
  const auto fp32 = q.options().dtype(at::kFloat);
  const bool mean = finish.mean_sums.defined();
  at::Tensor loss = mean ? at::empty({}, fp32) : at::empty({q.size(0)}, fp32);
  TORCH_INTERNAL_ASSERT(!mean ||
                        (finish.mean_sums.is_contiguous() && finish.mean_sums.numel() == 3));
  row_stages::anchor_losses(
      {rows_of(q), q.size(0), q.size(1), q_inv_norm.data_ptr<float>(),
       class_sums.data_ptr<float>(), anchor_class.data_ptr<int64_t>(),
       num_positives.data_ptr<int64_t>(), lse.data_ptr<double>(), p.temperature.for_kernels(),
       p.single_set,
       loss.data_ptr<float>(), mean ? finish.mean_sums.data_ptr<double>() : nullptr},
      current_device(q));
  check_launch();
  return loss;
}

AnchorWeights anchor_weights(const SupConProblem& p, const AnchorWeightInputs& in) {
  const DeviceGuard guard(p.q.device());
  const at::Tensor q = p.q.contiguous(), q_inv_norm = p.q_inv_norm.contiguous();
  // As it comes: the gradient of a mean is one value (0-dim, or expanded with stride 0).
  const at::Tensor grad_loss = in.grad_loss.to(at::kFloat);
  const at::Tensor& counted = in.anchors_with_positives;
  const at::Tensor lse = in.lse.contiguous(), num_positives = p.num_positives.contiguous();
  const at::Tensor anchor_class = p.anchor_class.contiguous();
  const int64_t m = q.size(0), d = q.size(1);
  const bool symmetric = in.schedule == Schedule::kSymmetric;
  const auto fp32 = q.options().dtype(at::kFloat);
  // Classes 0: no weighted sums (an empty tensor, no fill).
  AnchorWeights out{at::empty({m}, fp32),
                    in.classes > 0 ? at::zeros({in.classes, d}, fp32) : at::empty({0, d}, fp32),
                    {at::empty({m}, fp32)}};
  if (!symmetric) {
    out.coefficients.lse_hi = at::empty({m}, fp32);
    out.coefficients.lse_lo = at::empty({m}, fp32);
  }
  row_stages::anchor_weights(
      {grad_loss.data_ptr<float>(), grad_loss.dim() == 0 ? 0 : grad_loss.stride(0),
       counted.defined() ? counted.data_ptr<double>() : nullptr, lse.data_ptr<double>(),
       num_positives.data_ptr<int64_t>(), rows_of(q), m, d, q_inv_norm.data_ptr<float>(),
       anchor_class.data_ptr<int64_t>(), p.temperature.for_kernels(), symmetric,
       out.weight.data_ptr<float>(),
       in.classes > 0 ? out.weighted_sums.data_ptr<float>() : nullptr,
       out.coefficients.coef.data_ptr<float>(),
       symmetric ? nullptr : out.coefficients.lse_hi.data_ptr<float>(),
       symmetric ? nullptr : out.coefficients.lse_lo.data_ptr<float>()},
      current_device(q));
  check_launch();
  return out;
}

BackwardAssembly assemble_backward(const SupConProblem& p, const BackwardAssemblyInputs& side) {
  const DeviceGuard guard(side.rows.device());
  const at::Tensor rows = side.rows.contiguous(), inv_norm = side.inv_norm.contiguous();
  // The tiles' gradient as they left it (the triangle's is a view of a wider buffer).
  const at::Tensor grads = side.grads.stride(1) == 1 ? side.grads : side.grads.contiguous();
  const auto given = [](const at::Tensor& t) { return t.defined() ? t.contiguous() : t; };
  const at::Tensor extra = given(side.extra), anchor_weight = given(side.anchor_weight);
  const at::Tensor anchor_class = given(p.anchor_class), class_sums = given(p.class_sums);
  const at::Tensor row_class = given(side.row_class), weighted_sums = given(side.weighted_sums);
  const int64_t r = rows.size(0), d = rows.size(1);
  const int64_t anchor_count = extra.defined() ? extra.size(0)
                               : anchor_weight.defined() ? anchor_weight.size(0) : 0;
  // The caller's dtype but float64, which the kernels read as float32 (compute_type).
  const at::ScalarType grad_type = side.out_dtype == at::kDouble ? at::kFloat : side.out_dtype;
  BackwardAssembly out{at::empty({r, d}, rows.options().dtype(grad_type)),
                       at::empty({r}, rows.options().dtype(at::kFloat))};
  row_stages::assemble_backward(
      {rows_of(rows), r, d, inv_norm.data_ptr<float>(), grads.data_ptr<float>(), grads.stride(0),
       ptr<float>(extra), p.anchor_row(), anchor_count, ptr<float>(anchor_weight),
       ptr<int64_t>(anchor_class), ptr<float>(class_sums), p.single_set,
       ptr<int64_t>(row_class), ptr<float>(weighted_sums), side.class_shares_weight,
       p.temperature.for_kernels(), p.normalize,
       float(1.0 / kNormEps), element_type(grad_type), out.grad.data_ptr(),
       out.unit_dot.data_ptr<float>()},
      current_device(rows));
  check_launch();
  if (side.out_dtype != grad_type) out.grad = out.grad.to(side.out_dtype);
  return out;
}

// False while the current stream captures a CUDA graph: nothing may wait for the device then.
bool host_may_wait(const at::Tensor& like) { return !stream_is_capturing(like); }

// Multi-hot positives as ATen ops on the device (no positive walk of CUDA C++ kernels yet):
// sums over class subsets gathered there for rows of few classes, else the pairs' class
// overlaps in blocks. The sums' keys need their count on the host, which a captured stream
// cannot wait for: a capture takes the blocks, which read nothing on the host.
bool by_class_subsets(const SupConProblem& p) {
  return host_may_wait(p.z) &&
         class_subsets::takes_class_subsets([&] { return class_subsets::fit_on_device(p); });
}

MultiLabelPositives multi_label_positives(const SupConProblem& p) {
  return by_class_subsets(p) ? class_subsets::positives_by_gathers(p)
                             : class_overlaps::positives_by_products(p);
}

// The positive pairs' terms, and in the backward of a call with groups the softmax terms of the
// pairs of one group that share a class (the tiles' mask left them out: lse_tiles), whose
// weight is the anchor's g_i = a_i W_i.
PositiveWalkOutputs multi_label_walk(const SupConProblem& p, const PositiveWalkInputs& walk) {
  PositiveWalkOutputs out = by_class_subsets(p) ? class_subsets::walk_by_gathers(p, walk)
                                                : class_overlaps::walk_by_products(p, walk);
  if (group_shared_class_pairs::apply(p) && walk.grad_weight.numel() != 0) {
    const at::Tensor g = at::where(walk.anchor_class >= 0,
                                   walk.grad_weight.to(at::kDouble) * p.positive_weight, 0.0);
    const at::Tensor lse = walk.lse_hi.to(at::kDouble) + walk.lse_lo.to(at::kDouble);
    const auto [dq, dz] = group_shared_class_pairs::softmax_grads(p, lse, g);
    out.dq.add_(dq);
    out.dz.add_(dz);
  }
  return out;
}

TileKernels make_cuda_kernels() {
  // The symmetric forward adds a row's tiles by atomics: not reproducible. The symmetric
  // backward's triangle does too, so the plan takes the full-row walk in deterministic mode
  // (triangle_exchange above); the other backward walks write every element once. The O(N*D)
  // stages are fused (row_stages.h). Groups run the kernels compiled with the group mask
  // (TileProblem::own_groups), which compares one id per row: with multi-hot labels the rows'
  // own, the pairs that share a class put back beside the tiles (group_shared_class_pairs.h).
  // The walk serves the multi-label SupCon loss only, not the focal loss.
  TileKernels kernels{compute_type,
                      /*symmetric_forward_is_deterministic=*/false,
                      /*reads_temperature=*/true,
                      /*walks_triangle=*/true,
                      /*masks_groups=*/true,
                      /*max_rows_elements=*/0,
                      /*blas_missing=*/{},
                      lse_tiles,
                      grad_tiles,
                      host_may_wait,
                      multi_label_walk,
                      anchor_losses,
                      assemble_backward,
                      prepare_rows,
                      anchor_weights};
  kernels.multi_label_positives = multi_label_positives;
  kernels.walks_focal = false;
  return kernels;
}

const TileKernels& cuda_kernels() {
  static const TileKernels kernels = make_cuda_kernels();
  return kernels;
}

}  // namespace

#ifdef SCL_CUDA_DRY_RUN
// The same glue on CPU tensors, its launches recorded instead of made (csrc/cuda_dry_run).
TORCH_LIBRARY_IMPL(scl, CPU, m) {
  m.impl("supcon_cuda_dry_run", &FusedOpKernels<cuda_kernels>::forward);
  m.impl("supcon_cuda_dry_run_backward", &FusedOpKernels<cuda_kernels>::backward);
  m.impl("supcon_cuda_dry_run_plan", &FusedOpKernels<cuda_kernels>::plan);
}
#else
TORCH_LIBRARY_IMPL(scl, CUDA, m) {
  m.impl("supcon", &FusedOpKernels<cuda_kernels>::forward);
  m.impl("supcon_backward", &FusedOpKernels<cuda_kernels>::backward);
  m.impl("supcon_plan", &FusedOpKernels<cuda_kernels>::plan);
}
#endif

}  // namespace scl::cuda
