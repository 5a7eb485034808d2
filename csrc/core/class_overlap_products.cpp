#include "class_overlap_products.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "class_subset_gathers.h"
#include "supcon_problem.h"
#include "weight_product_walk.h"

namespace scl::class_overlaps {
namespace {

// The most classes whose overlaps a float16 product holds exactly (its integers end at 2^11);
// more classes take float32 (2^24). Each product accumulates in float32 either way. Told by the
// words' count, not the rows' class counts, so that the host reads nothing.
constexpr int64_t kHalfExactClasses = 2048;
// The most elements of one block's class rows (32 MiB of float16): past C = 4,096 classes the
// blocks narrow below 4,096 rows.
constexpr int64_t kClassRowElements = int64_t{1} << 24;

// Each row's classes as 0/1 values: [R, 64 K] of `type` from words [R, K].
at::Tensor class_rows(const at::Tensor& words, at::ScalarType type) {
  const at::Tensor bit = at::arange(64, words.options());
  return words.unsqueeze(2).bitwise_right_shift(bit).bitwise_and(1).flatten(1).to(type);
}

}  // namespace

// float32, as the tiles' products: every term of the sums below is a weight times a row (no
// cancelling coefficients, as the sums over class subsets have), and half the bytes of float64
// in the elementwise steps, which move N^2 elements each.
void for_each_weight_block(const SupConProblem& p, const WeightBlockVisit& visit) {
  if (p.m == 0 || p.n == 0) return;
  // The rows' class counts, for the union of "jaccard" only.
  const bool jaccard = p.multi_label == MultiLabelRule::kJaccard;
  const at::Tensor anchor_counts =
      jaccard ? class_subsets::class_counts(p.anchor_words).to(at::kFloat) : at::Tensor();
  const at::Tensor contrast_counts =
      jaccard ? class_subsets::class_counts(p.contrast_words).to(at::kFloat) : at::Tensor();
  const int64_t width = 64 * p.anchor_words.size(1);  // the classes the words can hold
  const at::ScalarType overlap_type = width <= kHalfExactClasses ? at::kHalf : at::kFloat;
  // Square blocks of chunk_elements() pairs, narrower where a block's class rows (64 K values
  // a row) would pass kClassRowElements: every temporary stays bounded whatever N and C.
  const int64_t elements = chunk_elements();
  const int64_t most_rows = kClassRowElements / std::max<int64_t>(1, width);
  const int64_t block_rows = std::max<int64_t>(
      1, std::min<int64_t>(std::llround(std::sqrt(double(elements))), most_rows));
  const int64_t block_cols =
      std::max<int64_t>(1, std::min<int64_t>(elements / block_rows, most_rows));
  for (int64_t i0 = 0; i0 < p.m; i0 += block_rows) {
    const int64_t rows = std::min(block_rows, p.m - i0);
    const at::Tensor anchors = class_rows(p.anchor_words.narrow(0, i0, rows), overlap_type);
    for (int64_t j0 = 0; j0 < p.n; j0 += block_cols) {
      const int64_t cols = std::min(block_cols, p.n - j0);
      const at::Tensor columns = class_rows(p.contrast_words.narrow(0, j0, cols), overlap_type);
      const at::Tensor shared = at::mm(anchors, columns.t()).to(at::kFloat);
      at::Tensor w;
      if (jaccard) {
        // |Y_i | Y_j| >= 1 wherever they share a class; elsewhere the clamp keeps 0 / 0 out
        const at::Tensor n = anchor_counts.narrow(0, i0, rows).unsqueeze(1);
        const at::Tensor m = contrast_counts.narrow(0, j0, cols).unsqueeze(0);
        w = shared / (n + m - shared).clamp_min(1.0);
      } else {
        w = (shared > 0).to(at::kFloat);
      }
      if (p.single_set) w.diagonal(i0 + p.anchor_offset - j0).zero_();
      visit(i0, rows, j0, cols, w);
    }
  }
}

MultiLabelPositives positives_by_products(const SupConProblem& p) {
  at::Tensor pairs = at::zeros({p.m}, p.z.options().dtype(at::kLong));
  at::Tensor weight = at::zeros({p.m}, p.z.options().dtype(at::kDouble));
  for_each_weight_block(p, [&](int64_t i0, int64_t rows, int64_t, int64_t, const at::Tensor& w) {
    pairs.narrow(0, i0, rows).add_((w > 0).sum(1));
    weight.narrow(0, i0, rows).add_(w.sum(1, false, at::kDouble));
  });
  return {pairs, weight};
}

PositiveWalkOutputs walk_by_products(const SupConProblem& p, const PositiveWalkInputs& walk) {
  const at::TensorOptions f64 = p.z.options().dtype(at::kDouble);
  return walk_by_weight_products(p, walk, [&](const at::Tensor& v, const at::Tensor& y) {
    // Each block's product in float32, the blocks added in float64.
    const at::Tensor v32 = v.to(at::kFloat);
    const at::Tensor y32 = y.defined() ? y.to(at::kFloat) : at::Tensor();
    at::Tensor forward = at::zeros({p.m, p.d}, f64);
    at::Tensor transposed = y.defined() ? at::zeros({p.n, p.d}, f64) : at::Tensor();
    for_each_weight_block(
        p, [&](int64_t i0, int64_t rows, int64_t j0, int64_t cols, const at::Tensor& w) {
          forward.narrow(0, i0, rows).add_(at::mm(w, v32.narrow(0, j0, cols)));
          if (y.defined()) {
            transposed.narrow(0, j0, cols).add_(at::mm(w.t(), y32.narrow(0, i0, rows)));
          }
        });
    return std::make_pair(forward, transposed);
  });
}

}  // namespace scl::class_overlaps
