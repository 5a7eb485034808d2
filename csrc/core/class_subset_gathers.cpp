// The sums over class subsets as gathers: the contrast rows' entries (row j holds key k) and the
// anchors' matches (anchor i matches key k with coefficient c) are index tensors, so that
//   S = sum over entries of u_j into row k,  sum_j w_ij u_j = sum over matches of c S_k,
// and the transpose, sum_i a_i w_ij u_i, is the same two steps the other way round. Everything
// that grows with the rows runs on their device; the index tensors are built on the host from
// the class words (one copy of N * ceil(C / 64) words), so a call waits for its labels there.
#include "class_subset_gathers.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "class_subsets.h"
#include "supcon_problem.h"

namespace scl::class_subsets {
namespace {

// Elements of one gathered block: the gathers run in blocks of rows so that their temporaries
// stay near 256 MiB of float64 whatever the batch.
constexpr int64_t kGatherElements = int64_t{1} << 25;

at::Tensor on_device(const std::vector<int64_t>& values, const at::TensorOptions& options) {
  return at::tensor(at::ArrayRef<int64_t>(values), at::kLong).to(options.device());
}

at::Tensor on_device(const std::vector<double>& values, const at::TensorOptions& options) {
  return at::tensor(at::ArrayRef<double>(values), at::kDouble).to(options.device());
}

// The call's keys as index tensors on the rows' device.
struct KeyGathers {
  int64_t keys = 0;
  at::Tensor column_row, column_key;  // [E] int64: contrast row j holds key k
  at::Tensor anchor_row, anchor_key;  // [F] int64: anchor i matches key k
  at::Tensor weight, sign;            // [F] float64: c_|T|(n_i, m), and (-1)^(|T| + 1)
};

KeyGathers key_gathers(const SupConProblem& p) {
  const RowClasses anchors = row_classes(p.anchor_words);
  const SubsetCoefficients coefficients(p.multi_label);
  const SubsetIndex columns(row_classes(p.contrast_words), p.n, coefficients.by_class_count());
  std::vector<int64_t> column_row, column_key;
  column_row.reserve(columns.entries().size());
  column_key.reserve(columns.entries().size());
  for (const auto& [row, key] : columns.entries()) {
    column_row.push_back(row);
    column_key.push_back(key);
  }
  std::vector<int64_t> anchor_row, anchor_key;
  std::vector<double> weight, sign;
  for (int64_t i = 0; i < p.m; ++i) {
    const int n = anchors.count(i);
    for_each_match(columns, anchors, i, [&](int64_t key, int t, int m) {
      anchor_row.push_back(i);
      anchor_key.push_back(key);
      weight.push_back(coefficients.weight(t, n, m));
      sign.push_back(SubsetCoefficients::sign(t));
    });
  }
  const at::TensorOptions options = p.z.options();
  return {columns.keys(),          on_device(column_row, options), on_device(column_key, options),
          on_device(anchor_row, options), on_device(anchor_key, options),
          on_device(weight, options),     on_device(sign, options)};
}

// into[to[e]] += scale[e] * from[at[e]] for every e, rows of [*, d] float64, in blocks.
void add_gathered(at::Tensor& into, const at::Tensor& to, const at::Tensor& from,
                  const at::Tensor& at_rows, const at::Tensor& scale) {
  const int64_t count = to.size(0);
  const int64_t block = std::max<int64_t>(1, kGatherElements / std::max<int64_t>(1, from.size(1)));
  for (int64_t start = 0; start < count; start += block) {
    const int64_t length = std::min(block, count - start);
    at::Tensor rows = from.index_select(0, at_rows.narrow(0, start, length));
    if (scale.defined()) rows.mul_(scale.narrow(0, start, length).unsqueeze(1));
    into.index_add_(0, to.narrow(0, start, length), rows);
  }
}

// x / t, in place: t from the device where it stays there (Temperature::is_in_memory).
at::Tensor& times_inv_t(const SupConProblem& p, at::Tensor& x) {
  return p.temperature.is_in_memory() ? x.div_(p.temperature.tensor())
                                      : x.mul_(p.temperature.inv_t());
}

// Whether each anchor holds a class ([m] bool): in single set its own row is among the rows that
// hold its keys, with weight h(n) = 1, and is taken out.
at::Tensor anchors_with_classes(const SupConProblem& p) { return (p.anchor_words != 0).any(1); }

}  // namespace

MultiLabelPositives positives_by_gathers(const SupConProblem& p, const char* backend) {
  TORCH_CHECK_VALUE(fits(p), "backend='", backend,
                    "' takes multi-hot rows of at most ", kMaxRowClasses,
                    " classes, about 8 class subsets a row on average (its positives are sums "
                    "over class subsets, docs/MATH.md section 11); this call's rows hold up to ",
                    std::max(most_row_classes(p.anchor_words), most_row_classes(p.contrast_words)),
                    " classes: backend='cpu' or 'triton' takes any");
  const KeyGathers g = key_gathers(p);
  const at::TensorOptions f64 = p.z.options().dtype(at::kDouble);
  const at::Tensor held =
      at::zeros({g.keys}, f64).index_add_(0, g.column_key, at::ones({g.column_key.size(0)}, f64));
  const at::Tensor held_by_match = held.index_select(0, g.anchor_key);
  at::Tensor count = at::zeros({p.m}, f64).index_add_(0, g.anchor_row, held_by_match * g.sign);
  at::Tensor weight = at::zeros({p.m}, f64).index_add_(0, g.anchor_row, held_by_match * g.weight);
  if (p.single_set) {
    const at::Tensor own = anchors_with_classes(p).to(at::kDouble);
    count.sub_(own);
    weight.sub_(own);
  }
  const at::Tensor pairs = count.round().to(at::kLong);
  return {pairs, at::where(pairs > 0, weight, 0.0)};
}

PositiveWalkOutputs walk_by_gathers(const SupConProblem& p, const PositiveWalkInputs& walk) {
  TORCH_CHECK(walk.gamma == 0, "walk_by_gathers: the focal loss's terms are per pair");
  const at::ScalarType ct = walk.lse_hi.scalar_type();
  const at::TensorOptions f64 = p.z.options().dtype(at::kDouble);
  const KeyGathers g = key_gathers(p);
  const at::Tensor u = p.unit(Rows::kAnchors, 0, p.m).to(at::kDouble);
  const at::Tensor v = p.unit(Rows::kContrast, 0, p.n).to(at::kDouble);
  const at::Tensor walked = (walk.anchor_class >= 0).unsqueeze(1);
  const at::Tensor none = at::empty({0}, walk.lse_hi.options());
  // sum_j w_ij u_j over anchor i's positives
  at::Tensor key_sums = at::zeros({g.keys, p.d}, f64);
  add_gathered(key_sums, g.column_key, v, g.column_row, {});
  at::Tensor positive_sums = at::zeros({p.m, p.d}, f64);
  add_gathered(positive_sums, g.anchor_row, key_sums, g.anchor_key, g.weight);
  if (p.single_set) positive_sums.sub_(u);
  positive_sums.masked_fill_(walked.logical_not(), 0.0);
  if (walk.grad_weight.numel() == 0) {
    // sum_p w_ip (lse_i - s_ip) = W_i lse_i - (1/t) u_i . sum_p w_ip u_p
    at::Tensor dots = (u * positive_sums).sum(1);
    const at::Tensor lse = walk.lse_hi.to(at::kDouble) + walk.lse_lo.to(at::kDouble);
    const at::Tensor loss = p.positive_weight * lse - times_inv_t(p, dots);
    return {at::where(walked.squeeze(1), loss, 0.0).to(ct), none, none, none};
  }
  const at::Tensor a =
      at::where(walked, walk.grad_weight.to(at::kDouble).unsqueeze(1), 0.0);  // [m, 1]
  // dq_i = -(1/t) a_i sum_p w_ip u_p
  at::Tensor dq = positive_sums.mul_(a).neg_();
  // dz_j = -(1/t) sum_i a_i w_ij u_i: the anchors summed per key with their a_i, gathered by the
  // contrast rows' entries.
  const at::Tensor weighted = u * a;
  key_sums.zero_();
  add_gathered(key_sums, g.anchor_key, weighted, g.anchor_row, g.weight);
  at::Tensor dz = at::zeros({p.n, p.d}, f64);
  add_gathered(dz, g.column_row, key_sums, g.column_key, {});
  if (p.single_set) dz.narrow(0, p.anchor_offset, p.m).sub_(weighted);
  dz.neg_();
  const at::Tensor hterm = at::where(walked.squeeze(1), p.positive_weight, 0.0);
  return {none, hterm.to(ct), times_inv_t(p, dq).to(ct), times_inv_t(p, dz).to(ct)};
}

}  // namespace scl::class_subsets
