// Multi-hot positives through sums over class subsets on the CPU. A pair's weight depends on its
// rows only through a = |Y_i & Y_j|, n = |Y_i| and m = |Y_j|: h(a) = [a > 0] ("any") or
// a / (n + m - a) ("jaccard"), h(0) = 0. Written as a sum over the non-empty subsets T of the
// shared classes, h(a) = sum_T c_|T|(n, m) with c the inverse binomial transform of h, so that
//   sum_j w_ij u_j = sum_{T in Y_i, T != {}} sum_m c_|T|(n_i, m) S(T, m),
// S(T, m) the sum of u_j over the rows j of m classes that hold T; W_i and |P(i)| are the same
// sums over row counts, and the contrast rows' side is the transpose, summed over the anchors.
// The sums are per (subset, class count) key: every row adds itself to the keys of its 2^k - 1
// subsets, in row order, so results do not depend on the thread count. In float64: the
// alternating coefficients subtract sums of overlapping sets.
#include "class_subset_sums.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <array>
#include <cstdint>
#include <utility>
#include <vector>

#include "../core/supcon_problem.h"

namespace scl::cpu {
namespace {

constexpr int kMaxRowClasses = 8;
constexpr int64_t kSubsetsPerRow = 8;
// Columns of the sums a thread takes: the sums are added row by row, each thread over its own
// columns.
constexpr int64_t kColumnGrain = 16;

// The classes of each row, ascending: row r's are classes[start[r] .. start[r + 1]).
struct RowClasses {
  std::vector<int64_t> start{0};
  std::vector<int64_t> classes;

  int count(int64_t r) const { return static_cast<int>(start[r + 1] - start[r]); }
  const int64_t* of(int64_t r) const { return classes.data() + start[r]; }
};

const uint64_t* bits_of(const at::Tensor& words) {
  return reinterpret_cast<const uint64_t*>(words.const_data_ptr<int64_t>());
}

RowClasses row_classes(const at::Tensor& words) {
  const at::Tensor w = words.contiguous();
  const int64_t rows = w.size(0), k = w.size(1);
  const uint64_t* bits = bits_of(w);
  RowClasses out;
  out.start.reserve(rows + 1);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t i = 0; i < k; ++i) {
      for (uint64_t b = bits[r * k + i]; b != 0; b &= b - 1) {
        out.classes.push_back(i * 64 + __builtin_ctzll(b));
      }
    }
    out.start.push_back(static_cast<int64_t>(out.classes.size()));
  }
  return out;
}

// Whether one side's rows fit: none over kMaxRowClasses classes, their subsets within
// kSubsetsPerRow a row, besides two rows of kMaxRowClasses (a small batch may hold any).
bool side_fits(const at::Tensor& words) {
  const at::Tensor w = words.contiguous();
  const int64_t rows = w.size(0), k = w.size(1);
  const uint64_t* bits = bits_of(w);
  int64_t subsets = 0;
  for (int64_t r = 0; r < rows; ++r) {
    int classes = 0;
    for (int64_t i = 0; i < k; ++i) classes += __builtin_popcountll(bits[r * k + i]);
    if (classes > kMaxRowClasses) return false;
    subsets += (int64_t{1} << classes) - 1;
  }
  return subsets <= kSubsetsPerRow * rows + (int64_t{2} << kMaxRowClasses);
}

// A subset T of a row's classes and the number of classes of the rows summed under it.
struct SubsetKey {
  std::array<int64_t, kMaxRowClasses> classes;  // T ascending, then -1
  int size = 0;
  int row_classes = 0;

  bool operator==(const SubsetKey& other) const {
    return size == other.size && row_classes == other.row_classes && classes == other.classes;
  }
};

uint64_t hash_of(const SubsetKey& key) {
  uint64_t h = 0xcbf29ce484222325ULL ^ static_cast<uint64_t>(key.row_classes);
  for (int i = 0; i < key.size; ++i) {
    h = (h ^ static_cast<uint64_t>(key.classes[i])) * 0x100000001b3ULL;
  }
  return h ^ (h >> 29);
}

// Key ids by open addressing: a flat table, no allocation per key (a node-based map spends more
// on its nodes than the sums on their rows).
class SubsetIds {
 public:
  explicit SubsetIds(int64_t most_keys) {
    int64_t slots = 16;
    while (slots < 2 * most_keys) slots *= 2;
    slot_ids_.assign(slots, -1);
    mask_ = static_cast<uint64_t>(slots - 1);
  }

  // The key's id, a new one if it has none.
  int64_t add(const SubsetKey& key) {
    int64_t& id = slot_ids_[slot(key)];
    if (id < 0) {
      id = static_cast<int64_t>(keys_.size());
      keys_.push_back(key);
    }
    return id;
  }

  // The key's id, or -1.
  int64_t find(const SubsetKey& key) const { return slot_ids_[slot(key)]; }

  int64_t size() const { return static_cast<int64_t>(keys_.size()); }

 private:
  // The key's slot, or the empty slot where it would go.
  uint64_t slot(const SubsetKey& key) const {
    uint64_t s = hash_of(key) & mask_;
    while (slot_ids_[s] >= 0 && !(keys_[slot_ids_[s]] == key)) s = (s + 1) & mask_;
    return s;
  }

  std::vector<int64_t> slot_ids_;
  std::vector<SubsetKey> keys_;
  uint64_t mask_ = 0;
};

// visit(key) for every non-empty subset of row r's classes, key.row_classes left to the visitor.
template <typename Visit>
void for_each_subset(const RowClasses& rows, int64_t r, Visit&& visit) {
  const int k = rows.count(r);
  const int64_t* classes = rows.of(r);
  SubsetKey key;
  for (uint32_t mask = 1; mask < (1u << k); ++mask) {
    key.size = 0;
    for (int b = 0; b < k; ++b) {
      if ((mask >> b) & 1) key.classes[key.size++] = classes[b];
    }
    for (int b = key.size; b < kMaxRowClasses; ++b) key.classes[b] = -1;
    visit(key);
  }
}

// One side's rows summed per (subset, class count) key. A key that one row holds keeps that row
// in place of a copy: with many classes most keys are one row's, and the sums would otherwise
// take a few times the rows' memory.
class SubsetSums {
 public:
  // rows: [R, d] float64, contiguous (undefined: counts only); weight: [R] or nullptr for 1.
  // by_class_count: keys tell the rows' class counts apart (the weight depends on them).
  SubsetSums(const RowClasses& classes, int64_t count, bool by_class_count,
             const at::Tensor& rows, const double* weight)
      : weight_(weight) {
    int64_t subsets = 0;
    for (int64_t r = 0; r < count; ++r) subsets += (int64_t{1} << classes.count(r)) - 1;
    ids_ = SubsetIds(subsets);
    std::vector<std::pair<int64_t, int64_t>> entries;  // (row, key), in row order
    entries.reserve(subsets);
    for (int64_t r = 0; r < count; ++r) {
      const int k = classes.count(r);
      if (k == 0) continue;
      class_counts_ |= 1u << (by_class_count ? k : 0);
      for_each_subset(classes, r, [&](SubsetKey& key) {
        key.row_classes = by_class_count ? k : 0;
        const int64_t id = ids_.add(key);
        if (id == static_cast<int64_t>(rows_holding_.size())) {
          rows_holding_.push_back(0);
          first_row_.push_back(r);
        }
        ++rows_holding_[id];
        entries.emplace_back(r, id);
      });
    }
    if (!rows.defined()) return;
    d_ = rows.size(1);
    rows_ = rows.const_data_ptr<double>();
    int64_t summed = 0;
    sum_row_.assign(rows_holding_.size(), -1);
    for (size_t id = 0; id < rows_holding_.size(); ++id) {
      if (rows_holding_[id] > 1) sum_row_[id] = summed++;
    }
    sums_.assign(summed * d_, 0.0);
    at::parallel_for(0, d_, kColumnGrain, [&](int64_t c0, int64_t c1) {
      for (const auto& [r, id] : entries) {
        if (sum_row_[id] < 0) continue;
        const double w = weight_ ? weight_[r] : 1.0;
        double* sum = sums_.data() + sum_row_[id] * d_;
        const double* row = rows_ + r * d_;
        for (int64_t c = c0; c < c1; ++c) sum[c] += w * row[c];
      }
    });
  }

  int64_t find(const SubsetKey& key) const { return ids_.find(key); }
  bool has_class_count(int m) const { return ((class_counts_ >> m) & 1) != 0; }
  int64_t rows_holding(int64_t id) const { return rows_holding_[id]; }

  // into += c * (key id's sum)
  void add_to(int64_t id, double c, double* into) const {
    const double* sum = sum_of(id, c);
    for (int64_t k = 0; k < d_; ++k) into[k] += c * sum[k];
  }

 private:
  // The key's sum, or its one row, whose weight then joins c.
  const double* sum_of(int64_t id, double& c) const {
    if (sum_row_[id] >= 0) return sums_.data() + sum_row_[id] * d_;
    const int64_t r = first_row_[id];
    if (weight_) c *= weight_[r];
    return rows_ + r * d_;
  }

  SubsetIds ids_{0};
  std::vector<int64_t> rows_holding_;  // per key: how many rows hold it
  std::vector<int64_t> first_row_;     // per key: the first of them
  std::vector<int64_t> sum_row_;       // per key: its row of sums_, -1 for a key of one row
  std::vector<double> sums_;           // sum of weight_r x_r per key of several rows
  uint32_t class_counts_ = 0;          // bit m: a summed row holds m classes
  const double* rows_ = nullptr;
  const double* weight_ = nullptr;
  int64_t d_ = 0;
};

// visit(key id, |T|, m) for every key of `sums` that row r of `rows` matches: each non-empty
// subset T of its classes, with each class count m that a summed row holds (m = 0 where the
// keys do not tell class counts apart).
template <typename Visit>
void for_each_match(const SubsetSums& sums, const RowClasses& rows, int64_t r, Visit&& visit) {
  for_each_subset(rows, r, [&](SubsetKey& key) {
    for (int m = 0; m <= kMaxRowClasses; ++m) {
      if (!sums.has_class_count(m) || (m > 0 && m < key.size)) continue;
      key.row_classes = m;
      const int64_t id = sums.find(key);
      if (id >= 0) visit(id, key.size, m);
    }
  });
}

// c_t(n, m), what a shared subset of t classes adds to the weight of a pair of rows of n and m
// classes: for "any" (-1)^(t+1), which also counts the pairs; for "jaccard"
// sum_{s=1..t} (-1)^(t-s) C(t, s) s / (n + m - s).
class SubsetCoefficients {
 public:
  explicit SubsetCoefficients(MultiLabelRule rule) : by_class_count_(rule == MultiLabelRule::kJaccard) {
    double binomial[kMaxRowClasses + 1][kMaxRowClasses + 1] = {};
    for (int t = 0; t <= kMaxRowClasses; ++t) {
      binomial[t][0] = 1;
      for (int s = 1; s <= t; ++s) binomial[t][s] = binomial[t - 1][s - 1] + binomial[t - 1][s];
    }
    for (int t = 1; t <= kMaxRowClasses; ++t) {
      for (int n = t; n <= kMaxRowClasses; ++n) {
        for (int m = t; m <= kMaxRowClasses; ++m) {
          double c = 0;
          for (int s = 1; s <= t; ++s) {
            c += ((t - s) % 2 ? -1.0 : 1.0) * binomial[t][s] * s / (n + m - s);
          }
          jaccard_[t][n][m] = c;
        }
      }
    }
  }

  static double sign(int t) { return t % 2 ? 1.0 : -1.0; }
  // Whether the weight depends on the class counts: then the sums' keys tell them apart.
  bool by_class_count() const { return by_class_count_; }
  double weight(int t, int n, int m) const { return by_class_count_ ? jaccard_[t][n][m] : sign(t); }

 private:
  bool by_class_count_;
  double jaccard_[kMaxRowClasses + 1][kMaxRowClasses + 1][kMaxRowClasses + 1] = {};
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

bool fits_class_subsets(const SupConProblem& p) {
  return p.multi_label != MultiLabelRule::kNone && side_fits(p.anchor_words) &&
         side_fits(p.contrast_words);
}

MultiLabelPositives subset_positives(const SupConProblem& p) {
  const RowClasses anchors = row_classes(p.anchor_words);
  const SubsetCoefficients coefficients(p.multi_label);
  const SubsetSums columns(row_classes(p.contrast_words), p.n, coefficients.by_class_count(), {},
                           nullptr);
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
    for_each_match(column_sums, anchors, i, [&](int64_t id, int t, int mc) {
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
      for_each_match(anchor_sums, columns, j, [&](int64_t id, int t, int ma) {
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
