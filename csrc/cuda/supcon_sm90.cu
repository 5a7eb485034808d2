// Host launchers of the wgmma + TMA family (sm90_kernels.cuh, sm90_launchers.cuh). The kernels
// are compiled for every architecture of the build but have bodies only for sm_90a; launch.cpp
// calls them only on a compute capability 9.0 device. This unit compiles the kernels without the
// group mask; a call with groups (its ids given) runs supcon_sm90_groups.cu's.
#include "sm90_launchers.cuh"

namespace scl::cuda::sm90 {

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

void grad_triangle(TriangleExchange exchange, const TileProblem& p, float* grad, int num_splits,
                   cudaStream_t stream) {
  by_groups(p, [&](auto groups) {
    Launchers<decltype(groups)::value>::grad_triangle(exchange, p, grad, num_splits, stream);
  });
}

void grad(GradWalk walk, const TileProblem& p, float* grad, int64_t grad_columns,
          cudaStream_t stream) {
  by_groups(p, [&](auto groups) {
    Launchers<decltype(groups)::value>::grad(walk, p, grad, grad_columns, stream);
  });
}

}  // namespace scl::cuda::sm90
