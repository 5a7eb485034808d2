// The two kernel families behind launch.h: mma.sync (sm80) for every case, wgmma + TMA (sm90)
// for 16-bit inputs on sm_90a. launch.cpp chooses between them.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "launch.h"
#include "tile_args.h"

namespace scl::cuda {

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
// Whether the wgmma kernels take this problem (16-bit inputs, D within their resident block).
bool supports(const TileProblem& p, const Device& device);
void lse_plain(const TileProblem& p, float* part_max, float* part_sum, int num_splits,
               cudaStream_t stream);
void lse_symmetric(const TileProblem& p, float* row_sum, int num_splits, cudaStream_t stream);
void grad(GradWalk walk, const TileProblem& p, float* grad, int64_t grad_columns,
          cudaStream_t stream);
// Whether the triangle backward takes a problem supports() takes (D within 128).
bool supports_triangle(const TileProblem& p);
// The symmetric backward over the upper triangle by cluster pairs (launch.h,
// grad_symmetric_triangle).
void grad_triangle(const TileProblem& p, float* grad, int num_splits, cudaStream_t stream);
}  // namespace sm90

}  // namespace scl::cuda
