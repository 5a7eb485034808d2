#include "class_subsets.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <string>

#include "test_hooks.h"

namespace scl::class_subsets {
namespace {

constexpr int64_t kSubsetsPerRow = 8;

// The words on the host, contiguous: one copy from a device (the keys are built on the host).
at::Tensor host_words(const at::Tensor& words) { return words.to(at::kCPU).contiguous(); }

const uint64_t* bits_of(const at::Tensor& words) {
  return reinterpret_cast<const uint64_t*>(words.const_data_ptr<int64_t>());
}

// visit(classes) with each row's class count, in row order.
template <typename Visit>
void for_each_row_count(const at::Tensor& host, Visit&& visit) {
  const int64_t rows = host.size(0), k = host.size(1);
  const uint64_t* bits = bits_of(host);
  for (int64_t r = 0; r < rows; ++r) {
    int classes = 0;
    for (int64_t i = 0; i < k; ++i) classes += __builtin_popcountll(bits[r * k + i]);
    visit(classes);
  }
}

bool side_fits(const at::Tensor& words) {
  const at::Tensor host = host_words(words);
  int64_t most = 0, subsets = 0;
  for_each_row_count(host, [&](int classes) {
    most = std::max<int64_t>(most, classes);
    if (classes <= kMaxRowClasses) subsets += (int64_t{1} << classes) - 1;
  });
  return side_counts_fit(most, subsets, host.size(0));
}

uint64_t hash_of(const SubsetKey& key) {
  uint64_t h = 0xcbf29ce484222325ULL ^ static_cast<uint64_t>(key.row_classes);
  for (int i = 0; i < key.size; ++i) {
    h = (h ^ static_cast<uint64_t>(key.classes[i])) * 0x100000001b3ULL;
  }
  return h ^ (h >> 29);
}

}  // namespace

// None over kMaxRowClasses classes, the subsets within kSubsetsPerRow a row, besides two rows of
// kMaxRowClasses (a small batch may hold any).
bool side_counts_fit(int64_t most, int64_t subsets, int64_t rows) {
  return most <= kMaxRowClasses &&
         subsets <= kSubsetsPerRow * rows + (int64_t{2} << kMaxRowClasses);
}

bool takes_class_subsets(const std::function<bool()>& rows_fit) {
  const std::string& forced = test_hooks().multi_label_positives;
  if (forced == "pair_walk") return false;
  const bool fit = rows_fit();
  TORCH_CHECK(fit || forced != "class_subsets",
              "the test hook multi_label_positives=\"class_subsets\" was set, but the rows hold "
              "too many classes for sums over class subsets");
  return fit;
}

bool fits(const SupConProblem& p) {
  return p.multi_label != MultiLabelRule::kNone && side_fits(p.anchor_words) &&
         side_fits(p.contrast_words);
}

RowClasses row_classes(const at::Tensor& words) {
  const at::Tensor host = host_words(words);
  const int64_t rows = host.size(0), k = host.size(1);
  const uint64_t* bits = bits_of(host);
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

SubsetIds::SubsetIds(int64_t most_keys) {
  int64_t slots = 16;
  while (slots < 2 * most_keys) slots *= 2;
  slot_ids_.assign(slots, -1);
  mask_ = static_cast<uint64_t>(slots - 1);
}

int64_t SubsetIds::add(const SubsetKey& key) {
  int64_t& id = slot_ids_[slot(key)];
  if (id < 0) {
    id = static_cast<int64_t>(keys_.size());
    keys_.push_back(key);
  }
  return id;
}

uint64_t SubsetIds::slot(const SubsetKey& key) const {
  uint64_t s = hash_of(key) & mask_;
  while (slot_ids_[s] >= 0 && !(keys_[slot_ids_[s]] == key)) s = (s + 1) & mask_;
  return s;
}

SubsetIndex::SubsetIndex(const RowClasses& classes, int64_t count, bool by_class_count) {
  int64_t subsets = 0;
  for (int64_t r = 0; r < count; ++r) subsets += (int64_t{1} << classes.count(r)) - 1;
  ids_ = SubsetIds(subsets);
  entries_.reserve(subsets);
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
      entries_.emplace_back(r, id);
    });
  }
}

SubsetCoefficients::SubsetCoefficients(MultiLabelRule rule)
    : by_class_count_(rule == MultiLabelRule::kJaccard) {
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

}  // namespace scl::class_subsets
