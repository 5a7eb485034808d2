// Host launchers of the mma.sync family (sm80_kernels.cuh, sm80_launchers.cuh), compiled for
// every architecture of the build. This unit compiles the kernels without the group mask; a
// call with groups (its ids given) runs supcon_sm80_groups.cu's.
#include "sm80_launchers.cuh"

namespace scl::cuda::sm80 {

template struct Launchers<false>;

void lse_plain(const TileProblem& p, float* part_max, float* part_sum, int num_splits,
               cudaStream_t stream) {
  by_groups(p, [&](auto groups) {
    Launchers<decltype(groups)::value>::lse_plain(p, part_max, part_sum, num_splits, stream);
  });
}

void lse_symmetric(const TileProblem& p, float* row_sum, int num_splits, cudaStream_t stream) {
  by_groups(p, [&](auto groups) {
    Launchers<decltype(groups)::value>::lse_symmetric(p, row_sum, num_splits, stream);
  });
}

void grad(GradWalk walk, const TileProblem& p, float* grad, int64_t grad_columns,
          cudaStream_t stream) {
  by_groups(p, [&](auto groups) {
    Launchers<decltype(groups)::value>::grad(walk, p, grad, grad_columns, stream);
  });
}

}  // namespace scl::cuda::sm80
