#include "supcon_problem.h"

#include "deferred_value_check.h"
#include "test_hooks.h"

#include <ATen/Context.h>
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

namespace scl {

int64_t chunk_elements() {
  const int64_t hooked = test_hooks().chunk_elements;
  return hooked > 0 ? hooked : int64_t{1} << 24;
}

namespace {

// Calls fn(start, length) for consecutive chunks of `rows` rows of width d.
template <typename Fn>
void for_row_chunks(int64_t rows, int64_t d, Fn&& fn) {
  const int64_t step = std::max<int64_t>(1, chunk_elements() / std::max<int64_t>(d, 1));
  for (int64_t start = 0; start < rows; start += step) fn(start, std::min(step, rows - start));
}

// Small batches spend their time in op dispatch, not arithmetic: the helpers below skip the
// ops that would change nothing (a whole-tensor narrow, a same-dtype conversion).
at::Tensor rows_of(const at::Tensor& t, int64_t start, int64_t length) {
  return start == 0 && length == t.size(0) ? t : t.narrow(0, start, length);
}

at::Tensor as_type(const at::Tensor& t, at::ScalarType type) {
  return t.scalar_type() == type ? t : t.to(type);
}

// Unit rows start..start+length of `rows` in the compute dtype.
at::Tensor unit_chunk(const at::Tensor& rows, const at::Tensor& inv_norm, int64_t start,
                      int64_t length) {
  const at::Tensor part = as_type(rows_of(rows, start, length), inv_norm.scalar_type());
  return part * rows_of(inv_norm, start, length).unsqueeze(1);
}

std::string dtype_name(const at::Tensor& t) { return std::string(c10::toString(t.scalar_type())); }

void check_features(const at::Tensor& x, const char* name) {
  TORCH_CHECK_TYPE(at::isFloatingType(x.scalar_type()),
                   name, " must be a floating-point tensor, got ", dtype_name(x));
  TORCH_CHECK_VALUE(x.dim() == 2, name, " must have shape [rows, dim], got ", x.dim(),
                    " dimensions");
  TORCH_CHECK_VALUE(x.size(0) >= 1, name, " must have at least one row");
  TORCH_CHECK_VALUE(x.size(1) >= 1, name, " must have at least one column");
}

void check_labels(const at::Tensor& y, const char* name, const at::Tensor& rows_of,
                  const char* rows_name) {
  TORCH_CHECK_TYPE(at::isIntegralType(y.scalar_type(), /*includeBool=*/false),
                   name, " must be an integer tensor, got ", dtype_name(y));
  TORCH_CHECK_VALUE(y.dim() == 1, name, " must be one-dimensional, got ", y.dim(), " dimensions");
  TORCH_CHECK_VALUE(y.size(0) == rows_of.size(0), name, " has ", y.size(0), " entries but ",
                    rows_name, " has ", rows_of.size(0), " rows");
  TORCH_CHECK_VALUE(y.device() == rows_of.device(), name, " is on ", y.device(), " but ",
                    rows_name, " is on ", rows_of.device());
}

// Labels of `rows_of`'s rows: integer class ids [R], or multi-hot rows [R, C] (bool or 0/1
// integers, their values checked with the rows': prepare_multi_hot).
void check_label_rows(const at::Tensor& y, const char* name, const at::Tensor& rows_of,
                      const char* rows_name) {
  if (y.dim() != 2) return check_labels(y, name, rows_of, rows_name);
  TORCH_CHECK_TYPE(at::isIntegralType(y.scalar_type(), /*includeBool=*/true), name,
                   " as multi-hot rows must be a bool or integer tensor, got ", dtype_name(y));
  TORCH_CHECK_VALUE(y.size(1) >= 1, name, " as multi-hot rows must have at least one class");
  check_labels(y.select(1, 0).to(at::kLong), name, rows_of, rows_name);
}

constexpr const char* kNotFinite = " contains NaN or inf";

void check_finite(const at::Tensor& x, const char* name) {
  TORCH_CHECK_VALUE(at::isfinite(x).all().item<bool>(), name, kNotFinite);
}

}  // namespace

void check_arguments(const SupConArgs& a) {
  check_features(a.features, "features");
  check_label_rows(a.labels, "labels", a.features, "features");
  multi_label_rule(a);
  if (a.groups.has_value()) check_labels(*a.groups, "groups", a.features, "features");
  TORCH_CHECK_VALUE(a.contrast.has_value() == a.contrast_labels.has_value(),
                    "contrast and contrast_labels must be given together");
  const int64_t rows = a.features.size(0);
  if (a.contrast.has_value()) {
    const at::Tensor& c = *a.contrast;
    check_features(c, "contrast");
    TORCH_CHECK_VALUE(c.device() == a.features.device(), "contrast is on ", c.device(),
                      " but features is on ", a.features.device());
    TORCH_CHECK_TYPE(c.scalar_type() == a.features.scalar_type(), "contrast has dtype ",
                     dtype_name(c), " but features has ", dtype_name(a.features));
    TORCH_CHECK_VALUE(c.size(1) == a.features.size(1), "contrast has dimension ", c.size(1),
                      " but features has ", a.features.size(1));
    check_label_rows(*a.contrast_labels, "contrast_labels", c, "contrast");
    const at::Tensor& cl = *a.contrast_labels;
    const bool same_form =
        cl.dim() == a.labels.dim() && (cl.dim() == 1 || cl.size(1) == a.labels.size(1));
    TORCH_CHECK_VALUE(same_form,
                      "contrast_labels must take the form of labels (class ids, or multi-hot rows "
                      "of as many classes): labels has shape ", a.labels.sizes(),
                      ", contrast_labels ", cl.sizes());
    TORCH_CHECK_VALUE(a.groups.has_value() == a.contrast_groups.has_value(),
                      "with a contrast set, groups and contrast_groups must be given together");
    if (a.contrast_groups.has_value()) {
      check_labels(*a.contrast_groups, "contrast_groups", c, "contrast");
    }
    TORCH_CHECK_VALUE(a.num_anchors == rows,
                      "num_anchors must equal the number of feature rows with a contrast set");
    TORCH_CHECK_VALUE(a.anchor_offset == 0, "anchor_offset must be 0 with a contrast set, got ",
                      a.anchor_offset);
  } else {
    TORCH_CHECK_VALUE(!a.contrast_groups.has_value(), "contrast_groups given without contrast");
    TORCH_CHECK_VALUE(a.num_anchors >= 1 && a.num_anchors <= rows,
                      "num_anchors must lie in [1, ", rows, "], got ", a.num_anchors);
    TORCH_CHECK_VALUE(a.anchor_offset >= 0 && a.anchor_offset + a.num_anchors <= rows,
                      "anchor_offset must lie in [0, ", rows - a.num_anchors,
                      "] (num_anchors ", a.num_anchors, " of ", rows, " rows), got ",
                      a.anchor_offset);
  }
  const at::Tensor& t = a.temperature;
  TORCH_CHECK_TYPE(at::isFloatingType(t.scalar_type()),
                   "temperature must be a floating-point tensor, got ", dtype_name(t));
  TORCH_CHECK_VALUE(t.numel() == 1, "temperature must hold one value, got ", t.numel());
  TORCH_CHECK_VALUE(t.device().is_cpu() || t.device() == a.features.device(),
                    "temperature is on ", t.device(), " but features is on ", a.features.device());
}

MultiLabelRule multi_label_rule(const SupConArgs& a) {
  const c10::string_view rule = a.multi_label;
  TORCH_CHECK_VALUE(rule == "any" || rule == "jaccard",
                    "multi_label must be 'any' or 'jaccard', got '", std::string(rule), "'");
  if (a.labels.dim() == 1) return MultiLabelRule::kNone;
  return rule == "any" ? MultiLabelRule::kAny : MultiLabelRule::kJaccard;
}

double read_temperature(const SupConArgs& a) {
  const at::Tensor& t = a.temperature;
  // A host temperature is read in place; a device one costs the op's only host read.
  const double value =
      t.is_cpu() ? *t.to(at::kDouble).const_data_ptr<double>() : t.item<double>();
  TORCH_CHECK_VALUE(std::isfinite(value) && value > 0,
                    "temperature must be positive and finite, got ", value);
  return value;
}

namespace {

// The caller's rows made contiguous, and 1 / max(||x||, eps) per row in the compute dtype.
// With value_checks, NaN / inf in x is an error naming it: raised here, or queued in
// value_checks when preparing without host reads.
std::pair<at::Tensor, at::Tensor> rows_and_inv_norms(const at::Tensor& x, const char* name,
                                                     at::ScalarType ct, bool normalize,
                                                     DeferredValueChecks* value_checks,
                                                     bool without_host_reads) {
  at::Tensor rows = x.contiguous();
  const bool deferred = value_checks != nullptr && without_host_reads;
  if (deferred) value_checks->expect(at::isfinite(rows).all(), std::string(name) + kNotFinite);
  if (!normalize) {
    if (value_checks != nullptr && !deferred) check_finite(rows, name);
    return {rows, at::ones({rows.size(0)}, rows.options().dtype(ct))};
  }
  // The reduction accumulates in ct without a converted copy of the rows.
  at::Tensor norms = at::linalg_vector_norm(rows, 2, {1}, false, ct);
  // Finite norms mean finite rows: the scan of every element is needed only when a norm is not
  // finite (a NaN / inf, or finite values whose squares overflow).
  if (value_checks != nullptr && !deferred && !at::isfinite(norms).all().item<bool>()) {
    check_finite(rows, name);
  }
  return {rows, norms.clamp_min_(kNormEps).reciprocal_()};
}

// Compact class ids without learning the number of classes on the host: a new class starts
// wherever the sorted labels change, and its id counts the changes before it. The ids go back
// to label order by a scatter through the sort's permutation. Under
// torch.use_deterministic_algorithms(True), which some torch versions refuse CUDA's scatter
// under (a permutation has no colliding writes, but the check does not know it), by a gather
// through the inverse permutation instead: a second sort, about sixteen kernels on a GPU.
at::Tensor class_ids_by_sorting(const at::Tensor& labels) {
  const int64_t n = labels.size(0);
  auto [sorted, order] = labels.sort();
  at::Tensor starts = at::zeros({n}, labels.options());
  if (n > 1) starts.narrow(0, 1, n - 1).copy_(sorted.narrow(0, 1, n - 1) != sorted.narrow(0, 0, n - 1));
  const at::Tensor sorted_ids = starts.cumsum(0);
  if (at::globalContext().deterministicAlgorithms()) {
    return sorted_ids.index_select(0, order.argsort());
  }
  return at::empty_like(sorted_ids).scatter_(0, order, sorted_ids);
}

// Every row's values of a per-row tensor given for the features and, in a cross set, for the
// contrast rows: the features' rows first, as the class ids take them.
at::Tensor all_rows(const SupConProblem& p, const at::Tensor& features_side,
                    const std::optional<at::Tensor>& contrast_side) {
  return p.single_set ? features_side : at::cat({features_side, *contrast_side});
}

// Anchor and contrast rows of a tensor of every row's values (all_rows).
std::pair<at::Tensor, at::Tensor> split_rows(const SupConProblem& p, const at::Tensor& all) {
  if (p.single_set) return {rows_of(all, p.anchor_offset, p.m), all};
  return {all.narrow(0, 0, p.m), all.narrow(0, p.m, p.n)};
}

// The tiles' group mask (SupConProblem::anchor_group and the rest): the compact group ids and,
// for class ids, the pair classes from the labels of every row (all_rows) and their class ids;
// multi-hot labels are compared by their words instead.
void prepare_group_mask(SupConProblem& p, const SupConArgs& a, const at::Tensor& all_labels,
                        const at::Tensor& ids) {
  const int64_t rows = p.single_set ? p.n : p.m + p.n;
  // A row without a class gets the pair class -2 - row: int32 holds it below 2^31 - 2 rows.
  TORCH_CHECK_VALUE(rows < std::numeric_limits<int32_t>::max() - 2, "groups: at most 2^31 - 3 ",
                    "rows, got ", rows);
  const at::Tensor groups =
      as_type(all_rows(p, *a.groups, a.contrast_groups), at::kLong).clamp_min(-1);
  const at::Tensor group = at::where(groups < 0, -1, class_ids_by_sorting(groups)).to(at::kInt);
  std::tie(p.anchor_group, p.contrast_group) = split_rows(p, group);
  if (p.multi_label != MultiLabelRule::kNone) return;
  const at::Tensor own_class = -2 - at::arange(rows, ids.options());
  const at::Tensor pair_class = at::where(all_labels < 0, own_class, ids).to(at::kInt);
  std::tie(p.anchor_pair_class, p.contrast_pair_class) = split_rows(p, pair_class);
}

// SupConProblem::q_unit and z_unit where they fit in one chunk.
void keep_unit_rows(SupConProblem& p) {
  if ((p.single_set ? p.n : p.n + p.m) * p.d > chunk_elements()) return;
  p.z_unit = unit_chunk(p.z, p.z_inv_norm, 0, p.n);
  p.q_unit = p.single_set ? rows_of(p.z_unit, p.anchor_offset, p.m)
                          : unit_chunk(p.q, p.q_inv_norm, 0, p.m);
}

// class_words on the host: one read of each element, where the device's form below takes
// several passes over byte copies of the rows.
at::Tensor class_words_on_host(const at::Tensor& multi_hot, int64_t words) {
  const at::Tensor hot = multi_hot.contiguous();
  const int64_t rows = hot.size(0), classes = hot.size(1);
  at::Tensor out = at::zeros({rows, words}, hot.options().dtype(at::kLong));
  uint64_t* bits = reinterpret_cast<uint64_t*>(out.mutable_data_ptr<int64_t>());
  AT_DISPATCH_INTEGRAL_TYPES_AND(at::kBool, hot.scalar_type(), "scl_class_words", [&] {
    const scalar_t* values = hot.const_data_ptr<scalar_t>();
    at::parallel_for(0, rows, 256, [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) {
        for (int64_t c = 0; c < classes; ++c) {
          if (values[r * classes + c] != scalar_t(0)) {
            bits[r * words + c / 64] |= uint64_t{1} << (c % 64);
          }
        }
      }
    });
  });
  return out;
}

// Multi-hot rows [R, C] as ceil(C / 64) int64 words per row, bit c % 64 of word c / 64 for
// class c. Without host reads (a device's rows), packed a byte at a time (a sum of distinct
// powers of two never carries), the eight bytes of a word then read as one little-endian int64:
// byte traffic rather than int64's.
at::Tensor class_words(const at::Tensor& multi_hot, bool without_host_reads) {
  const int64_t rows = multi_hot.size(0), classes = multi_hot.size(1);
  const int64_t words = (classes + 63) / 64;
  if (!without_host_reads) return class_words_on_host(multi_hot, words);
  const at::Tensor bits =
      at::constant_pad_nd((multi_hot != 0).to(at::kByte), {0, words * 64 - classes});
  const at::Tensor shifts = at::arange(8, bits.options());
  const at::Tensor bytes =
      at::bitwise_left_shift(bits.view({rows, words, 8, 8}), shifts).sum(-1, false, at::kByte);
  return bytes.contiguous().view(at::kLong).view({rows, words});
}

// The multi-hot labels' part of the preparation (SupConProblem::multi_label): their values
// checked (0 or 1), the class words, and the zero class ids that only mark rows for the walk.
void prepare_multi_hot(SupConProblem& p, const SupConArgs& a, DeferredValueChecks* value_checks,
                       bool without_host_reads) {
  p.multi_label = multi_label_rule(a);
  const at::Tensor labels = all_rows(p, a.labels, a.contrast_labels);
  if (value_checks != nullptr && labels.scalar_type() != at::kBool) {
    const at::Tensor zero_or_one = ((labels == 0) | (labels == 1)).all();
    const char* message = "multi-hot labels must hold 0 or 1";
    if (without_host_reads) {
      value_checks->expect(zero_or_one, message);
    } else {
      TORCH_CHECK_VALUE(zero_or_one.item<bool>(), message);
    }
  }
  std::tie(p.anchor_words, p.contrast_words) =
      split_rows(p, class_words(labels, without_host_reads));
  p.anchor_class = at::zeros({p.m}, labels.options().dtype(at::kLong));
  p.contrast_class = at::zeros({p.n}, labels.options().dtype(at::kLong));
}

}  // namespace

bool prepare_without_host_reads(const at::Tensor& x) {
  return !x.is_cpu() || test_hooks().device_preparation;
}

at::Tensor SupConProblem::unit(Rows which, int64_t start, int64_t length) const {
  const bool anchors = which == Rows::kAnchors;
  const at::Tensor& cached = anchors ? q_unit : z_unit;
  if (cached.defined()) return rows_of(cached, start, length);
  return unit_chunk(anchors ? q : z, anchors ? q_inv_norm : z_inv_norm, start, length);
}

namespace {

// The preparation by the backend's fused step (TileKernels::prepare_rows): one sort of the
// contrast labels and one step per set of rows (the contrast rows first, which the class sums
// come from).
void prepare_fused(SupConProblem& p, const SupConArgs& a, DeferredValueChecks* value_checks,
                   const std::function<PreparedRows(const RowPreparationInputs&)>& prepare_rows) {
  const at::Tensor& contrast_labels = p.single_set ? a.labels : *a.contrast_labels;
  const at::Tensor sorted_labels = std::get<0>(contrast_labels.sort());
  const bool check_values = value_checks != nullptr;
  p.z = (p.single_set ? a.features : *a.contrast).contiguous();
  p.n = p.z.size(0);
  const PreparedRows z = prepare_rows({p.z, contrast_labels, sorted_labels, p.normalize,
                                      p.single_set, true, check_values, a.mean});
  p.z_inv_norm = z.inv_norm;
  p.contrast_class = z.row_class;
  p.class_sums = z.class_sums;
  p.mean_sums = z.mean_sums;
  PreparedRows q;
  if (p.single_set) {
    p.m = a.num_anchors;
    p.q = p.z.narrow(0, p.anchor_offset, p.m);
    p.q_inv_norm = p.z_inv_norm.narrow(0, p.anchor_offset, p.m);
    p.anchor_class = z.row_class.narrow(0, p.anchor_offset, p.m);
    // An output of the op: a tensor of its own, not a view into the rows' counts.
    p.num_positives = p.m == p.n ? z.num_positives
                                 : z.num_positives.narrow(0, p.anchor_offset, p.m).clone();
  } else {
    p.q = a.features.contiguous();
    p.m = p.q.size(0);
    q = prepare_rows(
        {p.q, a.labels, sorted_labels, p.normalize, false, false, check_values, false});
    p.q_inv_norm = q.inv_norm;
    p.anchor_class = q.row_class;
    p.num_positives = q.num_positives;
  }
  if (check_values) {  // the features' errors first
    const std::string not_finite(kNotFinite);
    if (!p.single_set) value_checks->expect_zero(q.non_finite, "features" + not_finite);
    value_checks->expect_zero(z.non_finite,
                              (p.single_set ? "features" : "contrast") + not_finite);
  }
}

}  // namespace

SupConProblem prepare_problem(
    const SupConArgs& a, const CallPlan& plan, DeferredValueChecks* value_checks,
    const std::function<PreparedRows(const RowPreparationInputs&)>& prepare_rows) {
  const bool without_host_reads = !plan.host_reads;

  SupConProblem p;
  p.single_set = !a.contrast.has_value();
  p.normalize = a.normalize;
  p.temperature = plan.temperature;
  p.deterministic = plan.deterministic;
  p.symmetric_backward_walk = plan.symmetric_backward_walk;
  if (p.temperature.is_in_memory()) {
    if (value_checks != nullptr) {
      const at::Tensor& t = p.temperature.tensor();
      const at::Tensor ok = at::isfinite(t) & (t > 0);
      value_checks->expect(ok.all(), "temperature must be positive and finite");
    }
  }
  p.d = a.features.size(1);
  p.anchor_offset = a.anchor_offset;
  p.compute_type = a.features.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  if (plan.fused_preparation) {
    prepare_fused(p, a, value_checks, prepare_rows);
    return p;
  }
  if (!p.single_set) {  // the features' errors first
    std::tie(p.q, p.q_inv_norm) =
        rows_and_inv_norms(a.features, "features", p.compute_type, a.normalize, value_checks,
                           without_host_reads);
  }
  std::tie(p.z, p.z_inv_norm) =
      rows_and_inv_norms(p.single_set ? a.features : *a.contrast,
                         p.single_set ? "features" : "contrast", p.compute_type, a.normalize,
                         value_checks, without_host_reads);
  p.n = p.z.size(0);
  if (p.single_set) {
    p.m = a.num_anchors;
    p.q = p.z.narrow(0, p.anchor_offset, p.m);
    p.q_inv_norm = p.z_inv_norm.narrow(0, p.anchor_offset, p.m);
  } else {
    p.m = p.q.size(0);
  }
  if (a.labels.dim() == 2) {
    prepare_multi_hot(p, a, value_checks, without_host_reads);
    if (a.groups.has_value()) prepare_group_mask(p, a, at::Tensor(), at::Tensor());
    keep_unit_rows(p);
    return p;
  }

  // Compact class ids, so that class sums have one row per class. Every negative label becomes
  // -1 and so one shared id: such rows are never anchors with positives, and their class's sums
  // are never read for an anchor that has one.
  const at::Tensor all_labels =
      as_type(all_rows(p, a.labels, a.contrast_labels), at::kLong).clamp_min(-1);
  // Off the CPU the number of classes is never read: per-class tensors get one row per label,
  // O(N) more rows (never N x N) against a stop of the device's queue.
  at::Tensor ids, counts;
  int64_t num_classes;
  if (without_host_reads) {
    ids = class_ids_by_sorting(all_labels);
    num_classes = all_labels.size(0);
  } else {
    at::Tensor classes;
    std::tie(classes, ids, counts) = at::_unique2(all_labels, /*sorted=*/false,
                                                  /*return_inverse=*/true,
                                                  /*return_counts=*/p.single_set);
    num_classes = classes.size(0);
  }
  at::Tensor anchor_valid;  // label >= 0: the anchor belongs to a class
  if (p.single_set) {
    p.contrast_class = ids;
    p.anchor_class = rows_of(ids, p.anchor_offset, p.m);
    anchor_valid = rows_of(a.labels, p.anchor_offset, p.m) >= 0;
  } else {
    p.anchor_class = ids.narrow(0, 0, p.m);
    p.contrast_class = ids.narrow(0, p.m, p.n);
    anchor_valid = a.labels >= 0;
  }
  if (a.groups.has_value()) prepare_group_mask(p, a, all_labels, ids);
  if (without_host_reads) {
    counts = at::zeros({num_classes}, ids.options())
                 .index_add_(0, p.contrast_class, at::ones_like(p.contrast_class));
  } else if (!p.single_set) {
    counts = at::bincount(p.contrast_class, {}, num_classes);
  }
  // The anchor's own row is among its class's count in single set: it is not its own positive.
  at::Tensor positives = counts.index_select(0, p.anchor_class);
  if (p.single_set) positives = positives - 1;
  p.num_positives = positives.masked_fill_(anchor_valid.logical_not(), 0);

  keep_unit_rows(p);
  p.class_sums = at::zeros({num_classes, p.d}, p.z_inv_norm.options());
  for_row_chunks(p.n, p.d, [&](int64_t start, int64_t length) {
    p.class_sums.index_add_(0, rows_of(p.contrast_class, start, length),
                            p.unit(Rows::kContrast, start, length));
  });
  return p;
}

at::Tensor anchor_losses(const SupConProblem& p, const at::Tensor& lse) {
  // q_i . (C_{y_i} - [self] q_i): the sum of anchor i's positive logits times t. Anchors without
  // positives get whatever their class row gives; the where() below drops it.
  at::Tensor positive_dots = at::empty({p.m}, p.z_inv_norm.options());
  for_row_chunks(p.m, p.d, [&](int64_t start, int64_t length) {
    const at::Tensor q_unit = p.unit(Rows::kAnchors, start, length);
    at::Tensor targets = p.class_sums.index_select(0, rows_of(p.anchor_class, start, length));
    if (p.single_set) targets.sub_(q_unit);
    at::Tensor out = rows_of(positive_dots, start, length);
    at::sum_out(out, q_unit * targets, {1});
  });
  // In float64: l_i is a small difference of two terms that grow with the logits.
  const at::Tensor mean_positive =
      as_type(positive_dots, at::kDouble).mul_(p.temperature.inv_t()).div_(p.num_positives.clamp_min(1));
  return as_type(at::where(p.num_positives > 0, lse - mean_positive, 0.0), p.compute_type);
}

void check_grad_loss(const SupConProblem& p, const at::Tensor& grad_loss, bool mean) {
  if (mean) {
    TORCH_CHECK_VALUE(grad_loss.dim() == 0, "grad_loss of the mean must be 0-dim, got shape ",
                      grad_loss.sizes());
  } else {
    TORCH_CHECK_VALUE(grad_loss.dim() == 1 && grad_loss.size(0) == p.m,
                      "grad_loss must have shape [", p.m, "], got ", grad_loss.sizes());
  }
  TORCH_CHECK_VALUE(grad_loss.device() == p.z.device(), "grad_loss is on ", grad_loss.device(),
                    " but features is on ", p.z.device());
}

at::Tensor mean_over_anchors_with_positives(const SupConProblem& p, const at::Tensor& losses) {
  return losses.sum() / at::count_nonzero(p.num_positives).clamp_min_(1);
}

at::Tensor per_anchor_grad_of_mean(const SupConProblem& p, const at::Tensor& grad_loss) {
  return (grad_loss / at::count_nonzero(p.num_positives).clamp_min_(1)).expand({p.m});
}

at::Tensor effective_anchor_grads(const SupConProblem& p, const at::Tensor& grad_loss) {
  return at::where(p.num_positives > 0, as_type(grad_loss, p.compute_type), 0.0);
}

at::Tensor positive_weights(const SupConProblem& p, const at::Tensor& g) {
  return g / p.num_positives.clamp_min(1).to(g.scalar_type());
}

at::Tensor weighted_class_sums(const SupConProblem& p, const at::Tensor& w) {
  at::Tensor weighted = at::zeros_like(p.class_sums);
  for_row_chunks(p.m, p.d, [&](int64_t start, int64_t length) {
    // unit() may return the kept unit rows themselves: never modified in place.
    weighted.index_add_(0, rows_of(p.anchor_class, start, length),
                        p.unit(Rows::kAnchors, start, length) *
                            rows_of(w, start, length).unsqueeze(1));
  });
  return weighted;
}

void add_positive_grads(const SupConProblem& p, const at::Tensor& g, const at::Tensor& dq,
                        const at::Tensor& dz) {
  // w_i = g_i / |P(i)|: dq_i -= (w_i / t) (C_{y_i} - [self] q_i), and every contrast row of
  // class c gets -(1/t) W_c with W_c = sum of w_i q_i over the anchors of class c; in single
  // set, the anchor's own row gives back its [self] share.
  const at::Tensor w = positive_weights(p, g);
  const at::Tensor weighted = weighted_class_sums(p, w);
  for_row_chunks(p.m, p.d, [&](int64_t start, int64_t length) {
    const at::Tensor w_part = rows_of(w, start, length).unsqueeze(1);
    const at::Tensor classes = rows_of(p.anchor_class, start, length);
    at::Tensor row_part = p.class_sums.index_select(0, classes).mul_(w_part);
    // In single set the anchor's own row was counted in its class sum: give it back.
    if (p.single_set) {
      const at::Tensor w_q = p.unit(Rows::kAnchors, start, length) * w_part;
      row_part.sub_(w_q);
      rows_of(dz, p.anchor_offset + start, length).add_(w_q, p.temperature.inv_t());
    }
    rows_of(dq, start, length).sub_(row_part, p.temperature.inv_t());
  });
  for_row_chunks(p.n, p.d, [&](int64_t start, int64_t length) {
    rows_of(dz, start, length)
        .sub_(weighted.index_select(0, rows_of(p.contrast_class, start, length)), p.temperature.inv_t());
  });
}

at::Tensor unit_dot(const SupConProblem& p, Rows rows, const at::Tensor& grads) {
  at::Tensor total = at::zeros({}, grads.options().dtype(at::kDouble));
  for_row_chunks(grads.size(0), p.d, [&](int64_t start, int64_t length) {
    total += (p.unit(rows, start, length) * rows_of(grads, start, length)).sum();
  });
  return total;
}

at::Tensor normalize_backward(const SupConProblem& p, Rows rows, const at::Tensor& d_unit,
                              at::ScalarType out_dtype) {
  if (!p.normalize) return as_type(d_unit, out_dtype);
  at::Tensor out = at::empty(d_unit.sizes(), d_unit.options().dtype(out_dtype));
  for_row_chunks(d_unit.size(0), p.d, [&](int64_t start, int64_t length) {
    const at::Tensor unit = p.unit(rows, start, length);
    const at::Tensor grad = rows_of(d_unit, start, length);
    const at::Tensor scale =
        rows_of(rows == Rows::kAnchors ? p.q_inv_norm : p.z_inv_norm, start, length);
    // Below eps the divisor is a constant and the gradient is no projection (as F.normalize).
    const at::Tensor radial = at::where(scale < 1.0 / kNormEps, (unit * grad).sum(1), 0.0);
    rows_of(out, start, length).copy_((grad - unit * radial.unsqueeze(1)) * scale.unsqueeze(1));
  });
  return out;
}

}  // namespace scl
