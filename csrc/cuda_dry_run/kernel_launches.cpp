// The dry run's kernel families (csrc/cuda/families.h). Each launch is a profiler event named
// "cuda_kernel::<family>.<walk>"; then, unless the tests skip it (TestHooks), the walk's result is
// computed on the CPU from the same operands: every own row against every streamed row, through
// the per-row terms' views and the per-element arithmetic the kernels use (walk_terms.h), with
// float64 dot products and sums. That is the walk's definition, not the kernels' order of
// operations (nor their 16-bit rounding of the backward's weights): it checks that the glue
// (csrc/cuda/supcon_cuda.cpp: the row terms, the merges, the fused stages) hands the kernels
// what they expect, on any machine. Skipping leaves the outputs as allocated, for counting launches
// at sizes where O(N^2 D) on the CPU would take too long (bench.launch_count).
#include <ATen/record_function.h>
#include <c10/util/Exception.h>

#include <cmath>
#include <limits>
#include <vector>

#include "core/test_hooks.h"
#include "cuda/families.h"
#include "cuda/row_stages.h"
#include "cuda/walk_terms.h"

namespace scl::cuda {
namespace {

bool record_launch(const char* name) {
  RECORD_FUNCTION(name, std::vector<c10::IValue>());
  return !test_hooks().dry_run_skips_tiles;
}

double element(const TileProblem& p, const RowMatrix& rows, int64_t row, int64_t column) {
  return row_stages::Rows{p.type, rows.data, rows.stride}.at(row, column);
}

float row_dot(const TileProblem& p, int64_t own_row, int64_t streamed_row) {
  double sum = 0.0;
  for (int64_t k = 0; k < p.d; ++k) sum += element(p, p.own, own_row, k) * element(p, p.streamed, streamed_row, k);
  return float(sum);
}

// Whether anchor `anchor` meets its own column `column` (TileProblem::self_offset).
bool self_pair(const TileProblem& p, int64_t anchor, int64_t column) {
  return p.self_offset >= 0 && column == anchor + p.self_offset;
}

// Whether the group mask takes own row `own` and streamed row `streamed` out of the denominator
// (TileProblem::own_groups), by the kernels' test.
bool group_pair(const TileProblem& p, int64_t own, int64_t streamed) {
  return p.own_groups != nullptr && tile_math::group_masks_pair(p.own_groups[own], p.streamed_groups[streamed]);
}

constexpr float kInf = std::numeric_limits<float>::infinity();

// The plain forward: each anchor's base-2 (max, sum) in split 0, the other splits empty.
void emulate_lse_plain(const TileProblem& p, float* part_max, float* part_sum, int num_splits) {
  using W = WalkTerms<Walk::kLsePlain>;
  const int64_t m = p.own.rows;
  std::vector<float> logits;
  for (int64_t i = 0; i < m; ++i) {
    const W::Own anchor = W::Own::of(p.own_terms[i]);
    logits.clear();
    float top = -kInf;
    for (int64_t j = 0; j < p.streamed.rows; ++j) {
      if (self_pair(p, i, j) || group_pair(p, i, j)) continue;
      logits.push_back(W::logit2(row_dot(p, i, j), anchor, W::Streamed::of(p.streamed_terms[j])));
      top = std::fmax(top, logits.back());
    }
    double sum = 0.0;
    for (const float s2 : logits) sum += std::exp2(double(s2) - double(top));
    part_max[i] = top;
    part_sum[i] = float(sum);
    for (int split = 1; split < num_splits; ++split) {
      part_max[split * m + i] = -kInf;
      part_sum[split * m + i] = 0.0f;
    }
  }
}

// The symmetric forward: each row's sum of 2^s2 under the fixed shift over every other row.
void emulate_lse_symmetric(const TileProblem& p, float* row_sum) {
  using W = WalkTerms<Walk::kLseSymmetric>;
  for (int64_t i = 0; i < p.own.rows; ++i) {
    const W::Own row = W::Own::of(p.own_terms[i]);
    double sum = 0.0;
    for (int64_t j = 0; j < p.streamed.rows; ++j) {
      if (j != i && !group_pair(p, i, j)) sum += std::exp2(double(W::logit2(row_dot(p, i, j), row, W::Streamed::of(p.streamed_terms[j]))));
    }
    row_sum[i] += float(sum);
  }
}

// A backward walk: each own row's sum over the streamed rows of weight * streamed row, over
// `columns` columns of `grad` (row stride `stride`; added into it when `add`). The plain rows
// walk applies its anchor's coef at the end, as the kernels do.
template <Walk kWalk>
void emulate_grad(const TileProblem& p, float* grad, int64_t columns, int64_t stride, bool add) {
  using W = WalkTerms<kWalk>;
  std::vector<double> sums(columns);
  for (int64_t i = 0; i < p.own.rows; ++i) {
    const typename W::Own own = W::Own::of(p.own_terms[i]);
    std::fill(sums.begin(), sums.end(), 0.0);
    for (int64_t j = 0; j < p.streamed.rows; ++j) {
      const bool self = kWalk == Walk::kGradRowsPlain ? self_pair(p, i, j)
                        : kWalk == Walk::kGradColumns ? self_pair(p, j, i)
                                                      : i == j;
      if (self || group_pair(p, i, j)) continue;
      const typename W::Streamed streamed = W::Streamed::of(p.streamed_terms[j]);
      const double w = W::weight(W::logit2(row_dot(p, i, j), own, streamed), own, streamed);
      for (int64_t k = 0; k < columns; ++k) sums[k] += w * element(p, p.streamed, j, k);
    }
    double scale = 1.0;
    if constexpr (kWalk == Walk::kGradRowsPlain) scale = own.coef;
    for (int64_t k = 0; k < columns; ++k) {
      const float value = float(sums[k] * scale);
      grad[i * stride + k] = add ? grad[i * stride + k] + value : value;
    }
  }
}

void emulate_grad_walk(GradWalk walk, const TileProblem& p, float* grad, int64_t columns) {
  switch (walk) {
    case GradWalk::kRowsPlain: return emulate_grad<Walk::kGradRowsPlain>(p, grad, columns, columns, false);
    case GradWalk::kRowsSymmetric: return emulate_grad<Walk::kGradRowsSymmetric>(p, grad, columns, columns, false);
    case GradWalk::kColumns: return emulate_grad<Walk::kGradColumns>(p, grad, columns, columns, false);
  }
}

const char* grad_walk_name(GradWalk walk, bool sm90) {
  switch (walk) {
    case GradWalk::kRowsPlain: return sm90 ? "cuda_kernel::sm90.grad_rows_plain" : "cuda_kernel::sm80.grad_rows_plain";
    case GradWalk::kRowsSymmetric: return sm90 ? "cuda_kernel::sm90.grad_rows_symmetric" : "cuda_kernel::sm80.grad_rows_symmetric";
    case GradWalk::kColumns: return sm90 ? "cuda_kernel::sm90.grad_columns" : "cuda_kernel::sm80.grad_columns";
  }
  return "cuda_kernel::unknown";
}

}  // namespace

namespace sm80 {
void lse_plain(const TileProblem& p, float* part_max, float* part_sum, int num_splits, cudaStream_t) {
  if (record_launch("cuda_kernel::sm80.lse_plain")) emulate_lse_plain(p, part_max, part_sum, num_splits);
}
void lse_symmetric(const TileProblem& p, float* row_sum, int, cudaStream_t) {
  if (record_launch("cuda_kernel::sm80.lse_symmetric")) emulate_lse_symmetric(p, row_sum);
}
void grad(GradWalk walk, const TileProblem& p, float* grad, int64_t grad_columns, cudaStream_t) {
  if (record_launch(grad_walk_name(walk, false))) emulate_grad_walk(walk, p, grad, grad_columns);
}
}  // namespace sm80

namespace sm90 {
void lse_plain(const TileProblem& p, float* part_max, float* part_sum, int num_splits, cudaStream_t) {
  if (record_launch("cuda_kernel::sm90.lse_plain")) emulate_lse_plain(p, part_max, part_sum, num_splits);
}
void lse_symmetric(const TileProblem& p, float* row_sum, int, cudaStream_t) {
  if (record_launch("cuda_kernel::sm90.lse_symmetric")) emulate_lse_symmetric(p, row_sum);
}
void grad(GradWalk walk, const TileProblem& p, float* grad, int64_t grad_columns, cudaStream_t) {
  if (record_launch(grad_walk_name(walk, true))) emulate_grad_walk(walk, p, grad, grad_columns);
}
// Both exchanges compute the same sums; only their synchronisation differs, which the CPU
// cannot check (the GPU tests and compute-sanitizer do).
void grad_triangle(TriangleExchange exchange, const TileProblem& p, float* grad, int, cudaStream_t) {
  if (record_launch(exchange == TriangleExchange::kAsync ? "cuda_kernel::sm90.grad_triangle_async"
                                                         : "cuda_kernel::sm90.grad_triangle")) {
    emulate_grad<Walk::kGradTriangle>(p, grad, p.d, kTriangleGradWidth, true);
  }
}
}  // namespace sm90

}  // namespace scl::cuda
