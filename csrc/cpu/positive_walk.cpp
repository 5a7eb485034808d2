// The positive walk on the CPU. Each anchor and each contrast row enters the walk once per
// class it belongs to (one class for class ids; every class of a multi-hot row), and these
// entries are put in class order (stable sorts), so that an anchor entry's positives are one run
// of sorted column entries and the positive pairs lie in diagonal blocks. Blocks of sorted
// anchor entries x sorted column entries of the classes they span are multiplied through BLAS
// on gathered copies of their rows; the per-pair terms are ATen's vectorised elementwise ops on
// the block. A multi-hot pair sharing several classes is met once per shared class and counted
// under the lowest (docs/MATH.md section 11). Scratch is a bounded number of blocks plus the
// unit rows and O(entries) indices: never an [m, n] buffer.
#include "positive_walk.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <vector>

#include "../core/class_subsets.h"
#include "../core/supcon_problem.h"
#include "blas.h"
#include "class_subset_sums.h"

namespace scl::cpu {
namespace {

// 256 anchors x 1024 columns: a block's float32 terms are 1 MiB, and its GEMMs are long enough
// to run at BLAS speed. An anchor block ends at a class boundary once it holds kAnchorBlockCut
// entries, so that a large class's anchors meet its columns alone rather than those of the class
// after it too (small classes still share blocks, whose GEMMs would be too short alone).
constexpr int64_t kAnchorBlock = 256;
constexpr int64_t kAnchorBlockCut = 64;
constexpr int64_t kColumnBlock = 1024;
// Blocks computed side by side before their results are added, in block order, to the rows they
// belong to (a row has entries in several blocks): the scratch's bound, and every output row
// receives its blocks in the same order whatever the thread count (deterministic results).
constexpr int64_t kBlocksInFlight = 64;

// Rows entered once per class, in class order.
struct Entries {
  at::Tensor rows;     // [entries] int64
  at::Tensor classes;  // [entries] int64, ascending
};

Entries in_class_order(const at::Tensor& rows, const at::Tensor& classes) {
  auto [sorted, order] = classes.sort(/*stable=*/true, 0, false);
  return {rows.index_select(0, order), sorted};
}

// Class ids: every row whose class is >= 0, once.
Entries class_id_entries(const at::Tensor& row_class) {
  const at::Tensor rows = at::nonzero(row_class >= 0).squeeze(1);
  return in_class_order(rows, row_class.index_select(0, rows));
}

// Multi-hot rows: every marked row once per set bit of its class words ([R, K] int64).
Entries class_word_entries(const at::Tensor& words, const at::Tensor& marked) {
  const int64_t rows = words.size(0), k = words.size(1);
  const uint64_t* bits = reinterpret_cast<const uint64_t*>(words.const_data_ptr<int64_t>());
  const bool* keep = marked.const_data_ptr<bool>();
  std::vector<int64_t> entry_rows, entry_classes;
  for (int64_t r = 0; r < rows; ++r) {
    if (!keep[r]) continue;
    for (int64_t w = 0; w < k; ++w) {
      for (uint64_t b = bits[r * k + w]; b != 0; b &= b - 1) {
        entry_rows.push_back(r);
        entry_classes.push_back(w * 64 + __builtin_ctzll(b));
      }
    }
  }
  const auto as_tensor = [](const std::vector<int64_t>& v) {
    return at::tensor(at::ArrayRef<int64_t>(v), at::kLong);
  };
  return in_class_order(as_tensor(entry_rows), as_tensor(entry_classes));
}

// The walk's operands: entries in class order, the unit rows in row order (gathered block by
// block), and for multi-hot labels the class words and their popcounts.
struct ClassOrder {
  Entries anchors, columns;
  int64_t d = 0;
  int64_t self_offset = -1;  // single set: anchor row r's own column is r + self_offset
  // The run of sorted column entries of each sorted anchor entry's class: [first, end).
  std::vector<int64_t> first_column, end_column;
  at::Tensor q, z;            // unit rows [m, d] and [n, d], compute dtype, contiguous; undefined
                              // where the walk only counts
  at::Tensor lse_hi, lse_lo;  // [anchor entries]; undefined where the walk only counts
  at::Tensor grad_weight;     // [anchor entries]; undefined for the forward
  MultiLabelRule rule = MultiLabelRule::kNone;
  at::Tensor anchor_words;        // [m, K] int64, contiguous
  at::Tensor column_entry_words;  // [column entries, K]: each entry's row's, read in runs
  at::Tensor anchor_counts, column_entry_counts;  // classes per row (jaccard), likewise
  // Their data, read per pair (a tensor's checked accessor per pair would cost more than the
  // pair's own work).
  int64_t words = 0;
  const uint64_t* anchor_bits = nullptr;        // [m, K], by row
  const uint64_t* column_entry_bits = nullptr;  // [column entries, K], in entry order
  const int64_t* anchor_count = nullptr;        // [m]
  const int64_t* column_entry_count = nullptr;  // [column entries]

  int64_t walked() const { return anchors.rows.size(0); }
};

// The unit rows in the compute dtype, formed as the tile kernels form them.
at::Tensor unit_rows(const at::Tensor& unit, const at::Tensor& rows, const at::Tensor& inv_norm,
                     at::ScalarType ct) {
  if (unit.defined()) return unit.to(ct).contiguous();
  return (rows.to(ct) * inv_norm.to(ct).unsqueeze(1)).contiguous();
}

// The set bits of a word, branch-free: the portable build has no popcnt instruction, and the
// compiler's builtin then calls a library routine, which a jaccard weight pays per pair.
inline int64_t bit_count(uint64_t x) {
  x -= (x >> 1) & 0x5555555555555555ULL;
  x = (x & 0x3333333333333333ULL) + ((x >> 2) & 0x3333333333333333ULL);
  x = (x + (x >> 4)) & 0x0F0F0F0F0F0F0F0FULL;
  return static_cast<int64_t>((x * 0x0101010101010101ULL) >> 56);
}

at::Tensor popcounts(const at::Tensor& words) {
  at::Tensor counts = at::zeros({words.size(0)}, words.options());
  const uint64_t* bits = reinterpret_cast<const uint64_t*>(words.const_data_ptr<int64_t>());
  int64_t* out = counts.mutable_data_ptr<int64_t>();
  const int64_t k = words.size(1);
  for (int64_t r = 0; r < words.size(0); ++r) {
    for (int64_t w = 0; w < k; ++w) out[r] += bit_count(bits[r * k + w]);
  }
  return counts;
}

// The entries of the anchors marked in `walked_anchors` (bool [m]) and of every contrast row;
// the unit rows and the per-entry values are the caller's to add.
ClassOrder class_order(const SupConProblem& p, const at::Tensor& walked_anchors) {
  ClassOrder o;
  o.d = p.z.size(1);
  o.self_offset = p.self_offset();
  o.rule = p.multi_label;
  if (o.rule == MultiLabelRule::kNone) {
    o.anchors = class_id_entries(at::where(walked_anchors, p.anchor_class, -1));
    o.columns = class_id_entries(p.contrast_class);
  } else {
    o.anchor_words = p.anchor_words.contiguous();
    const at::Tensor column_words = p.contrast_words.contiguous();
    o.anchors = class_word_entries(o.anchor_words, walked_anchors.contiguous());
    o.columns = class_word_entries(column_words, at::ones({p.n}, walked_anchors.options()));
    o.column_entry_words = column_words.index_select(0, o.columns.rows);
    o.words = o.anchor_words.size(1);
    o.anchor_bits = reinterpret_cast<const uint64_t*>(o.anchor_words.const_data_ptr<int64_t>());
    o.column_entry_bits =
        reinterpret_cast<const uint64_t*>(o.column_entry_words.const_data_ptr<int64_t>());
    if (o.rule == MultiLabelRule::kJaccard) {
      o.anchor_counts = popcounts(o.anchor_words);
      o.column_entry_counts = popcounts(o.column_entry_words);
      o.anchor_count = o.anchor_counts.const_data_ptr<int64_t>();
      o.column_entry_count = o.column_entry_counts.const_data_ptr<int64_t>();
    }
  }
  // Both lists ascend: one merge finds every anchor entry's run of columns.
  const int64_t* anchor_classes = o.anchors.classes.const_data_ptr<int64_t>();
  const int64_t* column_classes = o.columns.classes.const_data_ptr<int64_t>();
  const int64_t columns = o.columns.classes.size(0);
  o.first_column.resize(o.walked());
  o.end_column.resize(o.walked());
  int64_t first = 0, end = 0;
  for (int64_t a = 0; a < o.walked(); ++a) {
    while (first < columns && column_classes[first] < anchor_classes[a]) ++first;
    end = std::max(end, first);
    while (end < columns && column_classes[end] == anchor_classes[a]) ++end;
    o.first_column[a] = first;
    o.end_column[a] = end;
  }
  return o;
}

// Sorted anchor entries [i0, i0 + rows) against sorted column entries [j0, j0 + cols), cut to
// the classes the anchors span.
struct Block {
  int64_t i0, rows, j0, cols;
};

// Every block that holds a positive pair, in (anchor block, column block) order, grouped by
// anchor block (`anchor_starts[a]` is the first block of anchor block a, and one past the last
// closes the list).
struct Blocks {
  std::vector<Block> blocks;
  std::vector<size_t> anchor_starts;
};

Blocks walk_blocks(const ClassOrder& o) {
  Blocks out;
  const int64_t* classes = o.anchors.classes.const_data_ptr<int64_t>();
  for (int64_t i0 = 0, rows = 0; i0 < o.walked(); i0 += rows) {
    out.anchor_starts.push_back(out.blocks.size());
    int64_t stop = std::min(i0 + kAnchorBlock, o.walked());
    int64_t cut = stop;
    const auto same_class_across = [&](int64_t at) { return classes[at - 1] == classes[at]; };
    while (cut < o.walked() && cut > i0 + kAnchorBlockCut && same_class_across(cut)) --cut;
    if (cut < o.walked() && !same_class_across(cut)) stop = cut;
    rows = stop - i0;
    // Sorted anchors: the first one's class starts the span, the last one's ends it.
    const int64_t begin = o.first_column[i0], end = o.end_column[i0 + rows - 1];
    for (int64_t c = begin / kColumnBlock; c * kColumnBlock < end; ++c) {
      const int64_t j0 = std::max(begin, c * kColumnBlock);
      out.blocks.push_back({i0, rows, j0, std::min(end, (c + 1) * kColumnBlock) - j0});
    }
  }
  out.anchor_starts.push_back(out.blocks.size());
  return out;
}

// visit(i, j, w) for every positive pair of block b (i, j within the block) and its weight w > 0:
// the anchor entry's run of its class's columns, but its own row. A multi-hot pair met under
// class c counts only where c is the lowest class the two rows share: none of the anchor's
// classes below c is the column's. Its weight is 1 ("any") or |Y_i & Y_j| / |Y_i | Y_j|
// ("jaccard").
template <typename Visit>
void for_each_positive_pair(const ClassOrder& o, const Block& b, Visit&& visit) {
  const int64_t* anchor_rows = o.anchors.rows.const_data_ptr<int64_t>();
  const int64_t* anchor_classes = o.anchors.classes.const_data_ptr<int64_t>();
  const int64_t* column_rows = o.columns.rows.const_data_ptr<int64_t>();
  const int64_t k = o.words;
  std::vector<uint64_t> lower(k);  // the anchor's classes below the entry's
  for (int64_t i = 0; i < b.rows; ++i) {
    const int64_t a = b.i0 + i, anchor = anchor_rows[a];
    const int64_t own = o.self_offset >= 0 ? anchor + o.self_offset : -1;
    const int64_t begin = std::max(o.first_column[a], b.j0);
    const int64_t end = std::min(o.end_column[a], b.j0 + b.cols);
    if (o.rule == MultiLabelRule::kNone) {
      for (int64_t j = begin; j < end; ++j) {
        if (column_rows[j] != own) visit(i, j - b.j0, 1.0);
      }
      continue;
    }
    const int64_t cls = anchor_classes[a], word = cls / 64;
    const uint64_t* x = o.anchor_bits + anchor * k;
    uint64_t any_lower = 0;
    for (int64_t w = 0; w <= word; ++w) {
      lower[w] = w < word ? x[w] : x[w] & ((uint64_t{1} << (cls % 64)) - 1);
      any_lower |= lower[w];
    }
    for (int64_t j = begin; j < end; ++j) {
      if (column_rows[j] == own) continue;
      const uint64_t* y = o.column_entry_bits + j * k;
      if (any_lower != 0) {
        uint64_t shared_lower = 0;
        for (int64_t w = 0; w <= word; ++w) shared_lower |= lower[w] & y[w];
        if (shared_lower != 0) continue;  // counted under a lower class
      }
      if (o.rule == MultiLabelRule::kAny) {
        visit(i, j - b.j0, 1.0);
        continue;
      }
      int64_t shared = 0;
      for (int64_t w = 0; w < k; ++w) shared += bit_count(x[w] & y[w]);
      const int64_t together = o.anchor_count[anchor] + o.column_entry_count[j] - shared;
      visit(i, j - b.j0, static_cast<double>(shared) / static_cast<double>(together));
    }
  }
}

// [rows, cols] pair weights of block b in the compute dtype, 0 off its positive pairs.
template <typename T>
at::Tensor pair_weights(const ClassOrder& o, const Block& b) {
  at::Tensor weights = at::zeros({b.rows, b.cols}, o.z.options());
  T* out = weights.mutable_data_ptr<T>();
  for_each_positive_pair(o, b, [&](int64_t i, int64_t j, double w) {
    out[i * b.cols + j] = static_cast<T>(w);
  });
  return weights;
}

// Block b's unit rows, gathered in entry order.
struct BlockRows {
  at::Tensor q, z;  // [rows, d], [cols, d]
  at::Tensor anchor_rows, column_rows;
};

BlockRows gather(const ClassOrder& o, const Block& b) {
  BlockRows g;
  g.anchor_rows = o.anchors.rows.narrow(0, b.i0, b.rows);
  g.column_rows = o.columns.rows.narrow(0, b.j0, b.cols);
  g.q = o.q.index_select(0, g.anchor_rows);
  g.z = o.z.index_select(0, g.column_rows);
  return g;
}

// x_ij = lse_i - s_ij over a block, as (lse_hi - s) + lse_lo (the split that lets a float32
// kernel subtract the float64 lse exactly). For the focal loss clamped at 0: it is >= 0 in exact
// arithmetic, the positive being one of lse's terms, and u^gamma needs u >= 0.
template <typename T>
at::Tensor excess(const ClassOrder& o, const Block& b, const BlockRows& g, double inv_t,
                  bool clamp) {
  at::Tensor s = at::empty({b.rows, b.cols}, o.z.options());
  gemm_row_major<T>(false, true, b.rows, b.cols, o.d, static_cast<T>(inv_t),
                    g.q.const_data_ptr<T>(), o.d, g.z.const_data_ptr<T>(), o.d, T(0),
                    s.mutable_data_ptr<T>(), b.cols);
  s.neg_()
      .add_(o.lse_hi.narrow(0, b.i0, b.rows).unsqueeze(1))
      .add_(o.lse_lo.narrow(0, b.i0, b.rows).unsqueeze(1));
  return clamp ? s.clamp_min_(0) : s;
}

// u = 1 - exp(-x) through expm1: no cancellation for small x.
at::Tensor one_minus_pi(const at::Tensor& x) { return at::expm1(-x).neg_(); }

// Runs compute(block) for every block, kBlocksInFlight side by side, then add(block, result) for
// each of them in block order on the calling thread.
template <typename Result, typename Compute, typename Add>
void walk_in_order(const std::vector<Block>& blocks, Compute&& compute, Add&& add) {
  const int64_t total = static_cast<int64_t>(blocks.size());
  std::vector<Result> results(std::min(total, kBlocksInFlight));
  for (int64_t first = 0; first < total; first += kBlocksInFlight) {
    const int64_t count = std::min(kBlocksInFlight, total - first);
    at::parallel_for(0, count, 1, [&](int64_t begin, int64_t end) {
      for (int64_t k = begin; k < end; ++k) results[k] = compute(blocks[first + k]);
    });
    for (int64_t k = 0; k < count; ++k) add(blocks[first + k], results[k]);
  }
}

// [m] sum_p w_p u^gamma x (gamma > 0) or sum_p w_p x (gamma = 0), by anchor row.
template <typename T>
at::Tensor walk_losses(const ClassOrder& o, const Blocks& walk, int64_t m, double inv_t,
                       double gamma) {
  at::Tensor sums = at::zeros({m}, o.z.options());
  walk_in_order<at::Tensor>(
      walk.blocks,
      [&](const Block& b) {
        const BlockRows g = gather(o, b);
        const at::Tensor x = excess<T>(o, b, g, inv_t, /*clamp=*/gamma > 0);
        at::Tensor terms = gamma > 0 ? one_minus_pi(x).pow_(gamma).mul_(x) : x;
        return terms.mul_(pair_weights<T>(o, b)).sum(1);
      },
      [&](const Block& b, const at::Tensor& row_sums) {
        sums.index_add_(0, o.anchors.rows.narrow(0, b.i0, b.rows), row_sums);
      });
  return sums;
}

// One block's part of the backward: hterm sums per anchor entry, dq per anchor entry, dz per
// column entry.
struct BlockGrads {
  at::Tensor hterm_sum, dq, dz;
};

// hterm_sum [m] and the gradients dq [m, d], dz [n, d] w.r.t. unit rows, by row.
template <typename T>
void walk_grads(const ClassOrder& o, const Blocks& walk, double inv_t, double gamma,
                at::Tensor& hterm_sum, at::Tensor& dq, at::Tensor& dz) {
  const T scale = static_cast<T>(-inv_t);
  walk_in_order<BlockGrads>(
      walk.blocks,
      [&](const Block& b) {
        const BlockRows g = gather(o, b);
        at::Tensor weights = pair_weights<T>(o, b);
        if (gamma > 0) {
          const at::Tensor x = excess<T>(o, b, g, inv_t, /*clamp=*/true);
          const at::Tensor u = one_minus_pi(x);
          // hterm = u^gamma (1 + gamma pi x / u), with x / u -> 1 as x -> 0; 1 without focus
          const at::Tensor focal_factor =
              at::where(u > 0, x / u, 1.0).mul_(at::exp(-x)).mul_(gamma).add_(1);
          weights.mul_(u.pow(gamma).mul_(focal_factor));
        }
        BlockGrads out{weights.sum(1), at::empty({b.rows, o.d}, o.z.options()),
                       at::empty({b.cols, o.d}, o.z.options())};
        weights.mul_(o.grad_weight.narrow(0, b.i0, b.rows).unsqueeze(1));  // w_i hterm_ij
        const T* w = weights.const_data_ptr<T>();
        gemm_row_major<T>(false, false, b.rows, o.d, b.cols, scale, w, b.cols,
                          g.z.const_data_ptr<T>(), o.d, T(0), out.dq.mutable_data_ptr<T>(),
                          o.d);
        gemm_row_major<T>(true, false, b.cols, o.d, b.rows, scale, w, b.cols,
                          g.q.const_data_ptr<T>(), o.d, T(0), out.dz.mutable_data_ptr<T>(),
                          o.d);
        return out;
      },
      [&](const Block& b, const BlockGrads& part) {
        const at::Tensor anchor_rows = o.anchors.rows.narrow(0, b.i0, b.rows);
        hterm_sum.index_add_(0, anchor_rows, part.hterm_sum);
        dq.index_add_(0, anchor_rows, part.dq);
        dz.index_add_(0, o.columns.rows.narrow(0, b.j0, b.cols), part.dz);
      });
}

// Multi-hot rows of few classes take sums over class subsets (class_subset_sums.h) in place of
// the pairs, where the terms are not per pair (the focal loss's are).
bool by_class_subsets(const SupConProblem& p) {
  return class_subsets::takes_class_subsets([&] { return class_subsets::fits(p); });
}

}  // namespace

PositiveWalkOutputs positive_walk(const SupConProblem& p, const PositiveWalkInputs& walk) {
  if (walk.gamma == 0 && by_class_subsets(p)) return subset_walk(p, walk);
  const at::ScalarType ct = walk.lse_hi.scalar_type();
  const at::TensorOptions options = walk.lse_hi.options();
  const bool forward_only = walk.grad_weight.numel() == 0;
  const int64_t m = p.q.size(0), n = p.z.size(0), d = p.z.size(1);
  const at::Tensor none = at::empty({0}, options);
  PositiveWalkOutputs out{none, none, none, none};
  if (forward_only) {
    out.loss_sum = at::zeros({m}, options);
  } else {
    out.hterm_sum = at::zeros({m}, options);
    out.dq = at::zeros({m, d}, options);
    out.dz = at::zeros({n, d}, options);
  }
  const at::Tensor walked = walk.anchor_class >= 0;
  if (!walked.any().item<bool>()) return out;
  ClassOrder o = class_order(p, walked);
  o.q = unit_rows(p.q_unit, p.q, p.q_inv_norm, ct);
  o.z = unit_rows(p.z_unit, p.z, p.z_inv_norm, ct);
  o.lse_hi = walk.lse_hi.index_select(0, o.anchors.rows);
  o.lse_lo = walk.lse_lo.index_select(0, o.anchors.rows);
  if (!forward_only) o.grad_weight = walk.grad_weight.index_select(0, o.anchors.rows);
  const Blocks blocks = walk_blocks(o);
  AT_DISPATCH_FLOATING_TYPES(ct, "scl_positive_walk_cpu", [&] {
    if (forward_only) {
      out.loss_sum = walk_losses<scalar_t>(o, blocks, m, p.temperature.inv_t(), walk.gamma);
    } else {
      walk_grads<scalar_t>(o, blocks, p.temperature.inv_t(), walk.gamma, out.hterm_sum, out.dq,
                           out.dz);
    }
  });
  return out;
}

MultiLabelPositives multi_label_positives(const SupConProblem& p) {
  if (by_class_subsets(p)) return subset_positives(p);
  const at::TensorOptions options = p.z.options();
  MultiLabelPositives out{at::zeros({p.m}, options.dtype(at::kLong)),
                          at::zeros({p.m}, options.dtype(at::kDouble))};
  const ClassOrder o = class_order(p, at::ones({p.m}, options.dtype(at::kBool)));
  if (o.walked() == 0) return out;
  // Per anchor entry: an anchor block's entries are its own, so anchor blocks run side by side.
  std::vector<int64_t> counts(o.walked(), 0);
  std::vector<double> weights(o.walked(), 0.0);
  const Blocks walk = walk_blocks(o);
  const int64_t anchor_blocks = static_cast<int64_t>(walk.anchor_starts.size()) - 1;
  at::parallel_for(0, anchor_blocks, 1, [&](int64_t first, int64_t last) {
    for (size_t k = walk.anchor_starts[first]; k < walk.anchor_starts[last]; ++k) {
      const Block& b = walk.blocks[k];
      for_each_positive_pair(o, b, [&](int64_t i, int64_t, double w) {
        ++counts[b.i0 + i];
        weights[b.i0 + i] += w;
      });
    }
  });
  out.num_positives.index_add_(
      0, o.anchors.rows, at::tensor(at::ArrayRef<int64_t>(counts), at::kLong));
  out.weight_sum.index_add_(0, o.anchors.rows,
                            at::tensor(at::ArrayRef<double>(weights), at::kDouble));
  return out;
}

}  // namespace scl::cpu
