// The keys of the sums over class subsets (docs/MATH.md section 11, "Few classes a row: sums over
// class subsets"), shared by the CPU's float64 loops (csrc/cpu/class_subset_sums.cpp) and the
// device's gathers (class_subset_gathers.cpp, which builds its keys on the device from the same
// rule and coefficients). A pair's weight depends on its rows only through
// a = |Y_i & Y_j|, n = |Y_i| and m = |Y_j|: h(a) = [a > 0] ("any") or a / (n + m - a)
// ("jaccard"), h(0) = 0. Written as a sum over the non-empty subsets T of the shared classes,
// h(a) = sum_T c_|T|(n, m) with c the inverse binomial transform of h, so that
//   sum_j w_ij u_j = sum_{T in Y_i, T != {}} sum_m c_|T|(n_i, m) S(T, m),
// S(T, m) the sum of u_j over the rows j of m classes that hold T. This file finds the keys
// (T, m) and which rows hold and match them, on the host; the sums are the callers'.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <utility>
#include <vector>

#include <ATen/ATen.h>

#include "supcon_problem.h"

namespace scl::class_subsets {

constexpr int kMaxRowClasses = 8;

// Whether the call has multi-hot labels whose rows are few-classed enough for the sums: every
// row at most kMaxRowClasses classes, and on each side at most 8 subsets a row on average (the
// work of the sums, and their memory, stay within a few passes over the rows). Reads the class
// words on the host.
bool fits(const SupConProblem& p);

// Whether a multi-hot call takes the sums over class subsets, `rows_fit` telling whether its
// rows fit them (fits, or a device's count of the same): the test hook multi_label_positives
// may send it past them to the pairs ("pair_walk", rows_fit unasked), or insist on them
// ("class_subsets": an error where the rows do not fit).
bool takes_class_subsets(const std::function<bool()>& rows_fit);

// The rule of fits for one side of `rows` rows, from its largest class count `most` and the
// number of non-empty class subsets of its rows of at most kMaxRowClasses classes, `subsets`
// (the device's gathers count them there).
bool side_counts_fit(int64_t most, int64_t subsets, int64_t rows);

// The classes of each row, ascending: row r's are classes[start[r] .. start[r + 1]).
struct RowClasses {
  std::vector<int64_t> start{0};
  std::vector<int64_t> classes;

  int count(int64_t r) const { return static_cast<int>(start[r + 1] - start[r]); }
  const int64_t* of(int64_t r) const { return classes.data() + start[r]; }
  int64_t rows() const { return static_cast<int64_t>(start.size()) - 1; }
};

// From class words, read on the host (copied there if they are on a device).
RowClasses row_classes(const at::Tensor& words);

// A subset T of a row's classes and the number of classes of the rows summed under it (0 where
// the keys do not tell class counts apart).
struct SubsetKey {
  std::array<int64_t, kMaxRowClasses> classes;  // T ascending, then -1
  int size = 0;
  int row_classes = 0;

  bool operator==(const SubsetKey& other) const {
    return size == other.size && row_classes == other.row_classes && classes == other.classes;
  }
};

// Key ids by open addressing: a flat table, no allocation per key (a node-based map spends more
// on its nodes than the sums on their rows).
class SubsetIds {
 public:
  explicit SubsetIds(int64_t most_keys);

  // The key's id, a new one if it has none.
  int64_t add(const SubsetKey& key);
  // The key's id, or -1.
  int64_t find(const SubsetKey& key) const { return slot_ids_[slot(key)]; }
  int64_t size() const { return static_cast<int64_t>(keys_.size()); }

 private:
  // The key's slot, or the empty slot where it would go.
  uint64_t slot(const SubsetKey& key) const;

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

// One side's keys: every row's entry under each subset of its classes (row order), and per key
// how many rows hold it and the first of them.
class SubsetIndex {
 public:
  // The first `count` rows of `classes`; by_class_count: keys tell the rows' class counts apart
  // (the weight depends on them).
  SubsetIndex(const RowClasses& classes, int64_t count, bool by_class_count);

  int64_t find(const SubsetKey& key) const { return ids_.find(key); }
  int64_t keys() const { return ids_.size(); }
  bool has_class_count(int m) const { return ((class_counts_ >> m) & 1) != 0; }
  int64_t rows_holding(int64_t id) const { return rows_holding_[id]; }
  int64_t first_row(int64_t id) const { return first_row_[id]; }
  // (row, key id) for every row and every non-empty subset of its classes, in row order.
  const std::vector<std::pair<int64_t, int64_t>>& entries() const { return entries_; }

 private:
  SubsetIds ids_{0};
  std::vector<int64_t> rows_holding_;
  std::vector<int64_t> first_row_;
  std::vector<std::pair<int64_t, int64_t>> entries_;
  uint32_t class_counts_ = 0;  // bit m: a row of m classes holds keys
};

// visit(key id, |T|, m) for every key of `index` that row r of `rows` matches: each non-empty
// subset T of its classes, with each class count m that a row of the index holds (m = 0 where
// the keys do not tell class counts apart).
template <typename Visit>
void for_each_match(const SubsetIndex& index, const RowClasses& rows, int64_t r, Visit&& visit) {
  for_each_subset(rows, r, [&](SubsetKey& key) {
    for (int m = 0; m <= kMaxRowClasses; ++m) {
      if (!index.has_class_count(m) || (m > 0 && m < key.size)) continue;
      key.row_classes = m;
      const int64_t id = index.find(key);
      if (id >= 0) visit(id, key.size, m);
    }
  });
}

// c_t(n, m), what a shared subset of t classes adds to the weight of a pair of rows of n and m
// classes: for "any" (-1)^(t+1), which also counts the pairs; for "jaccard"
// sum_{s=1..t} (-1)^(t-s) C(t, s) s / (n + m - s).
class SubsetCoefficients {
 public:
  explicit SubsetCoefficients(MultiLabelRule rule);

  static double sign(int t) { return t % 2 ? 1.0 : -1.0; }
  // Whether the weight depends on the class counts: then the sums' keys tell them apart.
  bool by_class_count() const { return by_class_count_; }
  double weight(int t, int n, int m) const {
    return by_class_count_ ? jaccard_[t][n][m] : sign(t);
  }

 private:
  bool by_class_count_;
  double jaccard_[kMaxRowClasses + 1][kMaxRowClasses + 1][kMaxRowClasses + 1] = {};
};

}  // namespace scl::class_subsets
