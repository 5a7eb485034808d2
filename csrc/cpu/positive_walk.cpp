// The positive walk on the CPU. Anchors and contrast rows are put in class order (stable sorts),
// so that an anchor's positives are one run of sorted columns and the positive pairs lie in
// diagonal blocks. Blocks of sorted anchors x sorted columns of the classes they span are
// multiplied through BLAS; the per-pair terms are ATen's vectorised elementwise ops on the block.
// Scratch is a few blocks per thread plus O(N*D) sorted copies: never an [m, n] buffer.
#include "positive_walk.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <vector>

#include "../core/supcon_problem.h"
#include "blas.h"

namespace scl::cpu {
namespace {

// 256 anchors x 1024 columns: a block's float32 terms are 1 MiB, and its GEMMs are long enough
// to run at BLAS speed.
constexpr int64_t kAnchorBlock = 256;
constexpr int64_t kColumnBlock = 1024;

int64_t num_blocks(int64_t rows, int64_t block) { return (rows + block - 1) / block; }

// The walk's operands in class order.
struct ClassOrder {
  int64_t walked = 0;          // anchors with positives
  int64_t d = 0;
  at::Tensor anchor_rows;      // [walked] int64: rows of q, by class
  at::Tensor anchor_class;     // [walked]
  at::Tensor self_column;      // [walked] the anchor's own row of z (single set); else undefined
  at::Tensor contrast_rows;    // [n] int64: rows of z, by class
  at::Tensor contrast_class;   // [n]
  // The run of sorted columns of each sorted anchor's class: [first_column, end_column).
  std::vector<int64_t> first_column, end_column;
  at::Tensor q, z;             // unit rows in this order, compute dtype, contiguous
  at::Tensor lse_hi, lse_lo;   // [walked]
  at::Tensor grad_weight;      // [walked]; undefined for the forward
};

// Unit rows `order` of `rows` in the compute dtype, formed as the tile kernels form them.
at::Tensor unit_rows_in_order(const at::Tensor& unit, const at::Tensor& rows,
                              const at::Tensor& inv_norm, const at::Tensor& order,
                              at::ScalarType ct) {
  if (unit.defined()) return unit.index_select(0, order).to(ct).contiguous();
  return (rows.index_select(0, order).to(ct) * inv_norm.index_select(0, order).to(ct).unsqueeze(1))
      .contiguous();
}

ClassOrder class_order(const SupConProblem& p, const PositiveWalkInputs& walk, int64_t walked,
                       at::ScalarType ct, bool forward_only) {
  ClassOrder o;
  o.walked = walked;
  o.d = p.z.size(1);
  // Anchors without positives (class -1) sort first: the walk starts after them.
  auto [anchor_class, anchor_order] = walk.anchor_class.sort(/*stable=*/true, 0, false);
  const int64_t skipped = anchor_class.size(0) - walked;
  o.anchor_rows = anchor_order.narrow(0, skipped, walked);
  o.anchor_class = anchor_class.narrow(0, skipped, walked);
  if (p.single_set) o.self_column = o.anchor_rows + p.anchor_offset;
  std::tie(o.contrast_class, o.contrast_rows) =
      walk.contrast_class.sort(/*stable=*/true, 0, false);
  const at::Tensor first = at::searchsorted(o.contrast_class, o.anchor_class, false, false);
  const at::Tensor end = at::searchsorted(o.contrast_class, o.anchor_class, false, true);
  o.first_column.assign(first.const_data_ptr<int64_t>(), first.const_data_ptr<int64_t>() + walked);
  o.end_column.assign(end.const_data_ptr<int64_t>(), end.const_data_ptr<int64_t>() + walked);
  o.q = unit_rows_in_order(p.q_unit, p.q, p.q_inv_norm, o.anchor_rows, ct);
  o.z = unit_rows_in_order(p.z_unit, p.z, p.z_inv_norm, o.contrast_rows, ct);
  o.lse_hi = walk.lse_hi.index_select(0, o.anchor_rows);
  o.lse_lo = walk.lse_lo.index_select(0, o.anchor_rows);
  if (!forward_only) o.grad_weight = walk.grad_weight.index_select(0, o.anchor_rows);
  return o;
}

// Sorted anchors [i0, i0 + rows) against sorted columns [j0, j0 + cols): block `anchor_block`
// of the anchors and `column_block` of the columns, cut to the classes the anchors span.
struct Block {
  int64_t anchor_block, column_block;
  int64_t i0, rows, j0, cols;
};

// Every block that holds a positive pair, in (anchor block, column block) order.
std::vector<Block> walk_blocks(const ClassOrder& o) {
  std::vector<Block> blocks;
  for (int64_t a = 0; a < num_blocks(o.walked, kAnchorBlock); ++a) {
    const int64_t i0 = a * kAnchorBlock, rows = std::min(kAnchorBlock, o.walked - i0);
    // Sorted anchors: the first one's class starts the span, the last one's ends it.
    const int64_t begin = o.first_column[i0], end = o.end_column[i0 + rows - 1];
    for (int64_t c = begin / kColumnBlock; c * kColumnBlock < end; ++c) {
      const int64_t j0 = std::max(begin, c * kColumnBlock);
      blocks.push_back({a, c, i0, rows, j0, std::min(end, (c + 1) * kColumnBlock) - j0});
    }
  }
  return blocks;
}

// Rounds of blocks in which no two blocks share anchor rows or columns: a round's blocks add into
// dq, dz and hterm_sum side by side without races, and every output row receives its blocks in
// the same order whatever the thread count (deterministic results). First fit, in block order:
// each block takes the first round that neither its anchor block nor its column block uses yet,
// so that the rounds are at most (blocks per anchor block) + (blocks per column block) - 1, and
// a band of blocks along the class diagonal does not become a staircase of one-block rounds.
std::vector<std::vector<Block>> race_free_rounds(const std::vector<Block>& blocks) {
  std::vector<std::vector<bool>> anchor_used, column_used;  // [block row][round]
  std::vector<std::vector<Block>> rounds;
  auto used = [](std::vector<std::vector<bool>>& table, int64_t row, size_t round) {
    if (row >= static_cast<int64_t>(table.size())) table.resize(row + 1);
    return round < table[row].size() && table[row][round];
  };
  auto mark = [](std::vector<bool>& rounds_of_row, size_t round) {
    if (round >= rounds_of_row.size()) rounds_of_row.resize(round + 1, false);
    rounds_of_row[round] = true;
  };
  for (const Block& b : blocks) {
    size_t round = 0;
    while (used(anchor_used, b.anchor_block, round) || used(column_used, b.column_block, round)) {
      ++round;
    }
    if (round == rounds.size()) rounds.emplace_back();
    rounds[round].push_back(b);
    mark(anchor_used[b.anchor_block], round);
    mark(column_used[b.column_block], round);
  }
  return rounds;
}

// x_ij = lse_i - s_ij over a block, as (lse_hi - s) + lse_lo (the split that lets a float32
// kernel subtract the float64 lse exactly), clamped at 0: it is >= 0 in exact arithmetic, the
// positive being one of lse's terms, and u^gamma needs u >= 0.
template <typename T>
at::Tensor excess(const ClassOrder& o, const Block& b, double inv_t) {
  at::Tensor s = at::empty({b.rows, b.cols}, o.z.options());
  gemm_row_major<T>(false, true, b.rows, b.cols, o.d, static_cast<T>(inv_t),
                    o.q.const_data_ptr<T>() + b.i0 * o.d, o.d,
                    o.z.const_data_ptr<T>() + b.j0 * o.d, o.d, T(0), s.mutable_data_ptr<T>(),
                    b.cols);
  return s.neg_()
      .add_(o.lse_hi.narrow(0, b.i0, b.rows).unsqueeze(1))
      .add_(o.lse_lo.narrow(0, b.i0, b.rows).unsqueeze(1))
      .clamp_min_(0);
}

// Whether (i, j) of a block is a positive pair: same class, and not the anchor's own row.
at::Tensor positive_pairs(const ClassOrder& o, const Block& b) {
  at::Tensor pairs = o.anchor_class.narrow(0, b.i0, b.rows).unsqueeze(1) ==
                     o.contrast_class.narrow(0, b.j0, b.cols).unsqueeze(0);
  if (o.self_column.defined()) {
    pairs.logical_and_(o.self_column.narrow(0, b.i0, b.rows).unsqueeze(1) !=
                       o.contrast_rows.narrow(0, b.j0, b.cols).unsqueeze(0));
  }
  return pairs;
}

// u = 1 - exp(-x) through expm1: no cancellation for small x.
at::Tensor one_minus_pi(const at::Tensor& x) { return at::expm1(-x).neg_(); }

// [walked] sum_p u^gamma x, sorted order. The blocks of an anchor block run on one thread, in
// order; anchor blocks run side by side.
template <typename T>
at::Tensor walk_losses(const ClassOrder& o, const std::vector<Block>& blocks, double inv_t,
                       double gamma) {
  at::Tensor sums = at::zeros({o.walked}, o.z.options());
  std::vector<size_t> starts;  // the first block of each anchor block
  for (size_t k = 0; k < blocks.size(); ++k) {
    if (k == 0 || blocks[k].anchor_block != blocks[k - 1].anchor_block) starts.push_back(k);
  }
  starts.push_back(blocks.size());
  at::parallel_for(0, static_cast<int64_t>(starts.size()) - 1, 1, [&](int64_t first, int64_t last) {
    for (int64_t a = first; a < last; ++a) {
      for (size_t k = starts[a]; k < starts[a + 1]; ++k) {
        const Block& b = blocks[k];
        const at::Tensor x = excess<T>(o, b, inv_t);
        at::Tensor terms = one_minus_pi(x).pow_(gamma).mul_(x);
        terms.masked_fill_(positive_pairs(o, b).logical_not_(), 0);
        sums.narrow(0, b.i0, b.rows).add_(terms.sum(1));
      }
    }
  });
  return sums;
}

// Sorted order: hterm_sum [walked] and the gradients dq [walked, d], dz [n, d] w.r.t. unit rows.
template <typename T>
void walk_grads(const ClassOrder& o, const std::vector<Block>& blocks, double inv_t,
                double gamma, at::Tensor& hterm_sum, at::Tensor& dq, at::Tensor& dz) {
  const T scale = static_cast<T>(-inv_t);
  for (const std::vector<Block>& round : race_free_rounds(blocks)) {
    at::parallel_for(0, static_cast<int64_t>(round.size()), 1, [&](int64_t first, int64_t last) {
      for (int64_t k = first; k < last; ++k) {
        const Block& b = round[k];
        const at::Tensor x = excess<T>(o, b, inv_t);
        const at::Tensor u = one_minus_pi(x);
        // hterm = u^gamma (1 + gamma pi x / u), with x / u -> 1 as x -> 0
        const at::Tensor focal_factor =
            at::where(u > 0, x / u, 1.0).mul_(at::exp(-x)).mul_(gamma).add_(1);
        at::Tensor weights = u.pow(gamma).mul_(focal_factor);
        weights.masked_fill_(positive_pairs(o, b).logical_not_(), 0);
        hterm_sum.narrow(0, b.i0, b.rows).add_(weights.sum(1));
        weights.mul_(o.grad_weight.narrow(0, b.i0, b.rows).unsqueeze(1));  // w_i hterm_ij
        const T* w = weights.const_data_ptr<T>();
        gemm_row_major<T>(false, false, b.rows, o.d, b.cols, scale, w, b.cols,
                          o.z.const_data_ptr<T>() + b.j0 * o.d, o.d, T(1),
                          dq.mutable_data_ptr<T>() + b.i0 * o.d, o.d);
        gemm_row_major<T>(true, false, b.cols, o.d, b.rows, scale, w, b.cols,
                          o.q.const_data_ptr<T>() + b.i0 * o.d, o.d, T(1),
                          dz.mutable_data_ptr<T>() + b.j0 * o.d, o.d);
      }
    });
  }
}

}  // namespace

PositiveWalkOutputs positive_walk(const SupConProblem& p, const PositiveWalkInputs& walk) {
  const at::ScalarType ct = walk.lse_hi.scalar_type();
  const at::TensorOptions options = walk.lse_hi.options();
  const bool forward_only = walk.grad_weight.numel() == 0;
  const int64_t m = p.q.size(0), n = p.z.size(0), d = p.z.size(1);
  const int64_t walked = (walk.anchor_class >= 0).sum().item<int64_t>();
  const at::Tensor none = at::empty({0}, options);
  PositiveWalkOutputs out{none, none, none, none};
  if (forward_only) {
    out.loss_sum = at::zeros({m}, options);
  } else {
    out.hterm_sum = at::zeros({m}, options);
    out.dq = at::zeros({m, d}, options);
    out.dz = at::zeros({n, d}, options);
  }
  if (walked == 0) return out;
  const ClassOrder o = class_order(p, walk, walked, ct, forward_only);
  const std::vector<Block> blocks = walk_blocks(o);
  AT_DISPATCH_FLOATING_TYPES(ct, "scl_positive_walk_cpu", [&] {
    if (forward_only) {
      out.loss_sum.index_copy_(0, o.anchor_rows,
                               walk_losses<scalar_t>(o, blocks, p.temperature.inv_t(), walk.gamma));
      return;
    }
    at::Tensor hterm_sum = at::zeros({walked}, options);
    at::Tensor dq = at::zeros({walked, d}, options);
    at::Tensor dz = at::zeros({n, d}, options);
    walk_grads<scalar_t>(o, blocks, p.temperature.inv_t(), walk.gamma, hterm_sum, dq, dz);
    out.hterm_sum.index_copy_(0, o.anchor_rows, hterm_sum);
    out.dq.index_copy_(0, o.anchor_rows, dq);
    out.dz.index_copy_(0, o.contrast_rows, dz);
  });
  return out;
}

}  // namespace scl::cpu
