// The sums over class subsets as gathers: the contrast rows' entries (row j holds key k) and the
// anchors' matches (anchor i matches key k with coefficient c) are index tensors, so that
//   S = sum over entries of u_j into row k,  sum_j w_ij u_j = sum over matches of c S_k,
// and the transpose, sum_i a_i w_ij u_i, is the same two steps the other way round. Everything
// runs on the rows' device, the keys too: each row's classes from its words, its subsets as
// sorted class tuples, the keys as the distinct (tuple, class count) rows (at::unique_dim). The
// host reads a few sizes (the rows' largest class count, the entries' count), no row.
#include "class_subset_gathers.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <vector>

#include "class_subsets.h"
#include "supcon_problem.h"
#include "weight_product_walk.h"

namespace scl::class_subsets {
namespace {

// Elements of one gathered block: the gathers run in blocks of rows so that their temporaries
// stay near 256 MiB of float64 whatever the batch.
constexpr int64_t kGatherElements = int64_t{1} << 25;
// A tuple's empty slot: after every class when a tuple is sorted.
constexpr int64_t kNoClass = std::numeric_limits<int64_t>::max();

// The set bits of each byte (uint8 arithmetic, which wraps as the bit tricks need).
at::Tensor byte_popcount(const at::Tensor& bytes) {
  const at::Tensor pairs = bytes - bytes.bitwise_right_shift(1).bitwise_and(0x55);
  const at::Tensor nibbles =
      pairs.bitwise_and(0x33) + pairs.bitwise_right_shift(2).bitwise_and(0x33);
  return (nibbles + nibbles.bitwise_right_shift(4)).bitwise_and(0x0F);
}

// Each row's classes, ascending, then kNoClass: [R, kMaxRowClasses] int64, for rows of at most
// kMaxRowClasses classes (`counts`: class_counts of the words).
at::Tensor class_lists(const at::Tensor& words, const at::Tensor& counts) {
  const at::Tensor w = words.contiguous();
  const at::Tensor held = at::nonzero(w);  // (row, word) of the non-zero words, row-major
  const at::Tensor row = held.select(1, 0), word = held.select(1, 1);
  const at::Tensor value = w.index({row, word});
  const at::Tensor bits =
      value.unsqueeze(1).bitwise_right_shift(at::arange(64, w.options())).bitwise_and(1);
  const at::Tensor set = at::nonzero(bits);  // (word entry, bit), ascending: classes in order
  const at::Tensor entry = set.select(1, 0);
  const at::Tensor class_row = row.index_select(0, entry);
  const at::Tensor classes = word.index_select(0, entry) * 64 + set.select(1, 1);
  const at::Tensor first = counts.cumsum(0) - counts;
  const at::Tensor slot =
      at::arange(classes.size(0), w.options()) - first.index_select(0, class_row);
  at::Tensor lists = at::full({w.size(0), kMaxRowClasses}, kNoClass, w.options());
  lists.index_put_({class_row, slot}, classes);
  return lists;
}

// Every row's non-empty class subsets: the row of each and its tuple of classes (sorted, then
// kNoClass), with the subset's size.
struct Subsets {
  at::Tensor row;    // [E] int64
  at::Tensor tuple;  // [E, kMaxRowClasses] int64
  at::Tensor size;   // [E] int64
};

Subsets subsets_of(const at::Tensor& lists, const at::Tensor& counts) {
  const at::TensorOptions options = lists.options();
  const at::Tensor masks = at::arange(1, int64_t{1} << kMaxRowClasses, options);
  const at::Tensor limit = at::ones_like(counts).bitwise_left_shift(counts).unsqueeze(1);
  const at::Tensor pairs = at::nonzero(masks.unsqueeze(0) < limit);  // (row, mask - 1)
  const at::Tensor row = pairs.select(1, 0);
  const at::Tensor member = (pairs.select(1, 1) + 1)
                                .unsqueeze(1)
                                .bitwise_right_shift(at::arange(kMaxRowClasses, options))
                                .bitwise_and(1)
                                .to(at::kBool);
  const at::Tensor tuple = at::where(member, lists.index_select(0, row), kNoClass);
  return {row, std::get<0>(tuple.sort(1)), member.sum(1, false, at::kLong)};
}

// The tuples with a class count as a last column: the keys' rows.
at::Tensor keyed(const at::Tensor& tuple, const at::Tensor& class_count) {
  return at::cat({tuple, class_count.unsqueeze(1)}, 1);
}

// c_|T|(n, m) of SubsetCoefficients as a [kMax + 1]^3 float64 table on the device, indexed
// (t * (kMax + 1) + n) * (kMax + 1) + m.
at::Tensor coefficient_table(const SubsetCoefficients& c, const at::TensorOptions& options) {
  constexpr int kSide = kMaxRowClasses + 1;
  std::vector<double> table(kSide * kSide * kSide, 0.0);
  for (int t = 1; t < kSide; ++t) {
    for (int n = t; n < kSide; ++n) {
      for (int m = c.by_class_count() ? t : 0; m < kSide; ++m) {
        table[(t * kSide + n) * kSide + m] = c.weight(t, n, m);
      }
    }
  }
  return at::tensor(table, at::kDouble).to(options.device());
}

// The call's keys as index tensors on the rows' device.
struct KeyGathers {
  int64_t keys = 0;
  at::Tensor column_row, column_key;  // [E] int64: contrast row j holds key k
  at::Tensor anchor_row, anchor_key;  // [F] int64: anchor i matches key k
  at::Tensor weight, sign;            // [F] float64: c_|T|(n_i, m), and (-1)^(|T| + 1)
};

KeyGathers key_gathers(const SupConProblem& p, const at::Tensor& anchor_counts,
                       const at::Tensor& contrast_counts) {
  constexpr int64_t kSide = kMaxRowClasses + 1;
  const SubsetCoefficients coefficients(p.multi_label);
  const bool by_count = coefficients.by_class_count();
  const Subsets columns =
      subsets_of(class_lists(p.contrast_words, contrast_counts), contrast_counts);
  const Subsets anchors = subsets_of(class_lists(p.anchor_words, anchor_counts), anchor_counts);
  const at::Tensor column_keys =
      keyed(columns.tuple, by_count ? contrast_counts.index_select(0, columns.row)
                                    : at::zeros_like(columns.row));
  // An anchor's subset asks for every class count a contrast row holding it may have (m >= |T|
  // for "jaccard"; one key, m = 0, for "any").
  at::Tensor query = at::arange(anchors.row.size(0), anchors.row.options());
  at::Tensor query_count = at::zeros_like(query);
  if (by_count) {
    query = query.repeat_interleave(kMaxRowClasses);
    query_count = at::arange(1, kSide, query.options()).repeat(anchors.row.size(0));
    const at::Tensor possible = at::nonzero(query_count >= anchors.size.index_select(0, query))
                                    .squeeze(1);
    query = query.index_select(0, possible);
    query_count = query_count.index_select(0, possible);
  }
  const at::Tensor queries = keyed(anchors.tuple.index_select(0, query), query_count);
  const auto unique = at::unique_dim(at::cat({column_keys, queries}), 0, /*sorted=*/true,
                                     /*return_inverse=*/true);
  const at::Tensor& distinct = std::get<0>(unique);
  const at::Tensor& ids = std::get<1>(unique);
  const int64_t entries = column_keys.size(0);
  // The keys are the distinct rows that contrast rows hold, numbered in sorted order; a query
  // of another row matches nothing.
  const at::Tensor held = at::zeros({distinct.size(0)}, ids.options().dtype(at::kBool))
                              .index_fill_(0, ids.narrow(0, 0, entries), true);
  const at::Tensor key_of = held.cumsum(0) - 1;
  const int64_t keys = entries == 0 ? 0 : key_of[-1].item<int64_t>() + 1;
  const at::Tensor query_id = ids.narrow(0, entries, ids.size(0) - entries);
  const at::Tensor match = at::nonzero(held.index_select(0, query_id)).squeeze(1);
  const at::Tensor entry = query.index_select(0, match);
  const at::Tensor t = anchors.size.index_select(0, entry);
  const at::Tensor n = anchor_counts.index_select(0, anchors.row.index_select(0, entry));
  const at::Tensor m = query_count.index_select(0, match);
  const at::Tensor table = coefficient_table(coefficients, p.z.options());
  return {keys,
          columns.row,
          key_of.index_select(0, ids.narrow(0, 0, entries)),
          anchors.row.index_select(0, entry),
          key_of.index_select(0, query_id.index_select(0, match)),
          table.index_select(0, (t * kSide + n) * kSide + m),
          at::where(t.remainder(2) == 1, 1.0, -1.0).to(at::kDouble)};
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

}  // namespace

at::Tensor class_counts(const at::Tensor& words) {
  return byte_popcount(words.contiguous().view(at::kByte)).sum(1, false, at::kLong);
}

bool fit_on_device(const SupConProblem& p) {
  for (const at::Tensor& words : {p.anchor_words, p.contrast_words}) {
    if (words.size(0) == 0) continue;
    const at::Tensor counts = class_counts(words);
    const at::Tensor row_subsets =
        at::ones_like(counts).bitwise_left_shift(counts.clamp_max(kMaxRowClasses)) - 1;
    const at::Tensor subsets = at::where(counts <= kMaxRowClasses, row_subsets, 0).sum();
    const at::Tensor both = at::stack({counts.max(), subsets}).cpu();
    if (!side_counts_fit(both[0].item<int64_t>(), both[1].item<int64_t>(), counts.size(0))) {
      return false;
    }
  }
  return true;
}

MultiLabelPositives positives_by_gathers(const SupConProblem& p) {
  const at::Tensor anchor_counts = class_counts(p.anchor_words);
  const at::Tensor contrast_counts = class_counts(p.contrast_words);
  const KeyGathers g = key_gathers(p, anchor_counts, contrast_counts);
  const at::TensorOptions f64 = p.z.options().dtype(at::kDouble);
  const at::Tensor held =
      at::zeros({g.keys}, f64).index_add_(0, g.column_key, at::ones({g.column_key.size(0)}, f64));
  const at::Tensor held_by_match = held.index_select(0, g.anchor_key);
  at::Tensor count = at::zeros({p.m}, f64).index_add_(0, g.anchor_row, held_by_match * g.sign);
  at::Tensor weight = at::zeros({p.m}, f64).index_add_(0, g.anchor_row, held_by_match * g.weight);
  if (p.single_set) {
    // An anchor with a class is among the rows that hold its keys, with weight h(n) = 1.
    const at::Tensor own = (anchor_counts > 0).to(at::kDouble);
    count.sub_(own);
    weight.sub_(own);
  }
  const at::Tensor pairs = count.round().to(at::kLong);
  return {pairs, at::where(pairs > 0, weight, 0.0)};
}

PositiveWalkOutputs walk_by_gathers(const SupConProblem& p, const PositiveWalkInputs& walk) {
  const KeyGathers g =
      key_gathers(p, class_counts(p.anchor_words), class_counts(p.contrast_words));
  const at::TensorOptions f64 = p.z.options().dtype(at::kDouble);
  return walk_by_weight_products(p, walk, [&](const at::Tensor& v, const at::Tensor& y) {
    // W v: the contrast rows summed per key, gathered by the anchors' matches
    at::Tensor key_sums = at::zeros({g.keys, p.d}, f64);
    add_gathered(key_sums, g.column_key, v, g.column_row, {});
    at::Tensor forward = at::zeros({p.m, p.d}, f64);
    add_gathered(forward, g.anchor_row, key_sums, g.anchor_key, g.weight);
    // An anchor with a class is among the rows that hold its keys, with weight h(n) = 1.
    if (p.single_set) forward.sub_(v.narrow(0, p.anchor_offset, p.m));
    at::Tensor transposed;
    if (y.defined()) {
      // W^T y: the anchors summed per key with their coefficients, gathered by the contrast
      // rows' entries
      key_sums.zero_();
      add_gathered(key_sums, g.anchor_key, y, g.anchor_row, g.weight);
      transposed = at::zeros({p.n, p.d}, f64);
      add_gathered(transposed, g.column_row, key_sums, g.column_key, {});
      if (p.single_set) transposed.narrow(0, p.anchor_offset, p.m).sub_(y);
    }
    return std::make_pair(forward, transposed);
  });
}

}  // namespace scl::class_subsets
