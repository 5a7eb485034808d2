// The two kernel families behind launch.h: mma.sync (sm80) for every case, wgmma + TMA (sm90)
// for 16-bit inputs on sm_90a (sm90_shape.h says which problems). launch.cpp chooses between
// them; the dry run (csrc/cuda_dry_run) records these calls instead of launching.
#pragma once

#include <cstdint>
#include <type_traits>

#include "launch.h"
#include "sm90_shape.h"
#include "tile_args.h"

namespace scl::cuda {

// f(std::true_type) for a call with groups (its ids given), which runs the kernels compiled with
// the group mask, f(std::false_type) otherwise.
template <class F>
void by_groups(const TileProblem& p, F&& f) {
  if (p.own_groups != nullptr) {
    f(std::true_type{});
  } else {
    f(std::false_type{});
  }
}

namespace sm80 {
constexpr int kLseBlockRows = 64;
void lse_plain(const TileProblem& p, float* part_max, float* part_sum, int num_splits,
               cudaStream_t stream);
void lse_symmetric(const TileProblem& p, float* row_sum, int num_splits, cudaStream_t stream);
void grad(GradWalk walk, const TileProblem& p, float* grad, int64_t grad_columns,
          cudaStream_t stream);
}  // namespace sm80

namespace sm90 {
constexpr int kLseBlockRows = 128;
void lse_plain(const TileProblem& p, float* part_max, float* part_sum, int num_splits,
               cudaStream_t stream);
void lse_symmetric(const TileProblem& p, float* row_sum, int num_splits, cudaStream_t stream);
void grad(GradWalk walk, const TileProblem& p, float* grad, int64_t grad_columns,
          cudaStream_t stream);
// The symmetric backward over the upper triangle by cluster pairs (launch.h,
// grad_symmetric_triangle).
void grad_triangle(TriangleExchange exchange, const TileProblem& p, float* grad, int num_splits,
                   cudaStream_t stream);
}  // namespace sm90

}  // namespace scl::cuda
