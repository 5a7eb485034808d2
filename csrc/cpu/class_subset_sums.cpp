// Multi-hot positives through sums over class subsets on the CPU: the keys are
// class_subsets.h's; each side's rows are summed per key in float64 (the alternating
// coefficients subtract sums of overlapping sets), every row added in row order, so results do
// not depend on the thread count.
#include "class_subset_sums.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <cstdint>
#include <utility>
#include <vector>

#include "../core/class_subsets.h"
#include "../core/supcon_problem.h"

namespace scl::cpu {
namespace {

using class_subsets::RowClasses;
using class_subsets::SubsetCoefficients;
using class_subsets::SubsetIndex;
using class_subsets::for_each_match;
using class_subsets::row_classes;

// Columns of the sums a thread takes: the sums are added row by row, each thread over its own
// columns.
constexpr int64_t kColumnGrain = 16;

// One side's rows summed per (subset, class count) key. A key that one row holds keeps that row
// in place of a copy: with many classes most keys are one row's, and the sums would otherwise
// take a few times the rows' memory.
class SubsetSums {
 public:
  // rows: [R, d] float64, contiguous; weight: [R] or nullptr for 1.
  // by_class_count: keys tell the rows' class counts apart (the weight depends on them).
  SubsetSums(const RowClasses& classes, int64_t count, bool by_class_count,
             const at::Tensor& rows, const double* weight)
      : index_(classes, count, by_class_count),
        rows_(rows.const_data_ptr<double>()),
        weight_(weight),
        d_(rows.size(1)) {
    int64_t summed = 0;
    sum_row_.assign(index_.keys(), -1);
    for (int64_t id = 0; id < index_.keys(); ++id) {
      if (index_.rows_holding(id) > 1) sum_row_[id] = summed++;
    }
    sums_.assign(summed * d_, 0.0);
    at::parallel_for(0, d_, kColumnGrain, [&](int64_t c0, int64_t c1) {
      for (const auto& [r, id] : index_.entries()) {
        if (sum_row_[id] < 0) continue;
        const double w = weight_ ? weight_[r] : 1.0;
        double* sum = sums_.data() + sum_row_[id] * d_;
        const double* row = rows_ + r * d_;
        for (int64_t c = c0; c < c1; ++c) sum[c] += w * row[c];
      }
    });
  }

  const SubsetIndex& index() const { return index_; }

  // into += c * (key id's sum)
  void add_to(int64_t id, double c, double* into) const {
    const double* sum = sum_of(id, c);
    for (int64_t k = 0; k < d_; ++k) into[k] += c * sum[k];
  }

 private:
  // The key's sum, or its one row, whose weight then joins c.
  const double* sum_of(int64_t id, double& c) const {
    if (sum_row_[id] >= 0) return sums_.data() + sum_row_[id] * d_;
    const int64_t r = index_.first_row(id);
    if (weight_) c *= weight_[r];
    return rows_ + r * d_;
  }

  SubsetIndex index_;
  std::vector<int64_t> sum_row_;  // per key: its row of sums_, -1 for a key of one row
  std::vector<double> sums_;      // sum of weight_r x_r per key of several rows
  const double* rows_;
  const double* weight_;
  int64_t d_;
};

double dot(const double* a, const double* b, int64_t d) {
  double total = 0;
  for (int64_t c = 0; c < d; ++c) total += a[c] * b[c];
  return total;
}

// Unit rows in float64: the tiles' unit rows (SupConProblem::unit), widened.
at::Tensor unit_rows64(const SupConProblem& p, Rows which, int64_t count) {
  return p.unit(which, 0, count).to(at::kDouble).contiguous();
}

}  // namespace

MultiLabelPositives subset_positives(const SupConProblem& p) {
  const RowClasses anchors = row_classes(p.anchor_words);
  const SubsetCoefficients coefficients(p.multi_label);
  const SubsetIndex columns(row_classes(p.contrast_words), p.n, coefficients.by_class_count());
  const at::TensorOptions options = p.z.options();
  MultiLabelPositives out{at::zeros({p.m}, options.dtype(at::kLong)),
                          at::zeros({p.m}, options.dtype(at::kDouble))};
  int64_t* pairs = out.num_positives.mutable_data_ptr<int64_t>();
  double* weights = out.weight_sum.mutable_data_ptr<double>();
  const int self = p.single_set ? 1 : 0;  // the anchor's own row holds its classes
  at::parallel_for(0, p.m, 64, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const int n = anchors.count(i);
      if (n == 0) continue;
      double count = 0, weight = 0;
      for_each_match(columns, anchors, i, [&](int64_t id, int t, int m) {
        const double rows = static_cast<double>(columns.rows_holding(id));
        count += SubsetCoefficients::sign(t) * rows;
        weight += coefficients.weight(t, n, m) * rows;
      });
      pairs[i] = static_cast<int64_t>(count) - self;
      weights[i] = pairs[i] > 0 ? weight - self : 0.0;
    }
  });
  return out;
}

PositiveWalkOutputs subset_walk(const SupConProblem& p, const PositiveWalkInputs& walk) {
  TORCH_CHECK(walk.gamma == 0, "subset_walk: the focal loss needs the pair walk");
  const at::ScalarType ct = walk.lse_hi.scalar_type();
  const at::TensorOptions options = walk.lse_hi.options();
  const int64_t m = p.m, n = p.n, d = p.d;
  const RowClasses anchors = row_classes(p.anchor_words);
  const RowClasses columns = row_classes(p.contrast_words);
  const SubsetCoefficients coefficients(p.multi_label);
  const at::Tensor u = unit_rows64(p, Rows::kAnchors, m);
  const at::Tensor v = unit_rows64(p, Rows::kContrast, n);
  const double* u_data = u.const_data_ptr<double>();
  const at::Tensor walked_mask = (walk.anchor_class >= 0).contiguous();
  const bool* walked = walked_mask.const_data_ptr<bool>();
  const double inv_t = p.temperature.inv_t();
  const SubsetSums column_sums(columns, n, coefficients.by_class_count(), v, nullptr);
  // sum_j w_ij u_j over anchor i's positives, into `into` ([d]): its own row taken out in single
  // set, where the sums hold it with weight 1.
  const auto positive_sum = [&](int64_t i, double* into) {
    std::fill(into, into + d, 0.0);
    const int classes = anchors.count(i);
    for_each_match(column_sums.index(), anchors, i, [&](int64_t id, int t, int mc) {
      column_sums.add_to(id, coefficients.weight(t, classes, mc), into);
    });
    if (p.single_set) {
      for (int64_t k = 0; k < d; ++k) into[k] -= u_data[i * d + k];
    }
  };
  const at::Tensor weight_sum = p.positive_weight.contiguous();
  const double* w_sum = weight_sum.const_data_ptr<double>();
  const at::Tensor none = at::empty({0}, options);
  if (walk.grad_weight.numel() == 0) {
    const at::Tensor hi = walk.lse_hi.to(at::kDouble).contiguous();
    const at::Tensor lo = walk.lse_lo.to(at::kDouble).contiguous();
    const double* lse_hi = hi.const_data_ptr<double>();
    const double* lse_lo = lo.const_data_ptr<double>();
    at::Tensor loss = at::zeros({m}, options.dtype(at::kDouble));
    double* out = loss.mutable_data_ptr<double>();
    at::parallel_for(0, m, 64, [&](int64_t begin, int64_t end) {
      std::vector<double> sum(d);
      for (int64_t i = begin; i < end; ++i) {
        if (!walked[i]) continue;
        positive_sum(i, sum.data());
        // sum_p w_ip (lse_i - s_ip) = W_i lse_i - (1/t) u_i . sum_p w_ip u_p
        out[i] = w_sum[i] * (lse_hi[i] + lse_lo[i]) - inv_t * dot(u_data + i * d, sum.data(), d);
      }
    });
    return {loss.to(ct), none, none, none};
  }
  const at::Tensor g = at::where(walked_mask, walk.grad_weight.to(at::kDouble), 0.0).contiguous();
  const double* grad_weight = g.const_data_ptr<double>();
  at::Tensor dq = at::zeros({m, d}, options.dtype(at::kDouble));
  at::Tensor dz = at::zeros({n, d}, options.dtype(at::kDouble));
  double* dq_data = dq.mutable_data_ptr<double>();
  double* dz_data = dz.mutable_data_ptr<double>();
  // dq_i = -(1/t) w_i sum_p w_ip u_p
  at::parallel_for(0, m, 64, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      if (!walked[i]) continue;
      double* row = dq_data + i * d;
      positive_sum(i, row);
      for (int64_t k = 0; k < d; ++k) row[k] *= -inv_t * grad_weight[i];
    }
  });
  // dz_j = -(1/t) sum_i w_i w_ij u_i: the anchors summed per key with their w_i, matched by the
  // contrast rows' subsets.
  const SubsetSums anchor_sums(anchors, m, coefficients.by_class_count(), u, grad_weight);
  at::parallel_for(0, n, 64, [&](int64_t begin, int64_t end) {
    for (int64_t j = begin; j < end; ++j) {
      const int classes = columns.count(j);
      if (classes == 0) continue;
      double* row = dz_data + j * d;
      for_each_match(anchor_sums.index(), columns, j, [&](int64_t id, int t, int ma) {
        anchor_sums.add_to(id, coefficients.weight(t, ma, classes), row);
      });
      const int64_t own = j - p.anchor_offset;
      if (p.single_set && own >= 0 && own < m) {
        for (int64_t k = 0; k < d; ++k) row[k] -= grad_weight[own] * u_data[own * d + k];
      }
      for (int64_t k = 0; k < d; ++k) row[k] *= -inv_t;
    }
  });
  const at::Tensor hterm = at::where(walked_mask, weight_sum, 0.0);
  return {none, hterm.to(ct), dq.to(ct), dz.to(ct)};
}

}  // namespace scl::cpu
