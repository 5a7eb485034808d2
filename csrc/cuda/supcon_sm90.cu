// Host launchers of the wgmma + TMA family (sm90_kernels.cuh). The kernels are compiled for
// every architecture of the build but have bodies only for sm_90a; launch.cpp calls them only
// on a compute capability 9.0 device.
#include <type_traits>

#include "families.h"
#include "sm90_kernels.cuh"

namespace scl::cuda::sm90 {
namespace {

unsigned blocks(int64_t rows) { return unsigned((rows + kBlock - 1) / kBlock); }

constexpr bool is_triangle(Walk walk) { return walk == Walk::kGradTriangle || walk == Walk::kGradTriangleAsync; }

template <class T, Walk kWalk, int kWidth, bool kGroups>
void launch(const TileProblem& p, const WalkOutputs& o, cudaStream_t stream) {
  constexpr bool triangle = is_triangle(kWalk);
  constexpr int bytes = int(sizeof(WalkStorage<T, kWalk, kWidth>));
  static_assert(bytes <= 227 * 1024, "more shared memory than an H100 block may have");
  const bool lse = kWalk == Walk::kLsePlain || kWalk == Walk::kLseSymmetric;
  // grid.y: the splits of the lse walks and the triangle, the gradient's column chunks of the
  // others. The triangle's grid.x is whole cluster pairs (an odd last block with padding).
  const unsigned y = lse || triangle ? unsigned(o.num_splits)
                                     : unsigned((o.grad_columns + kGradWidth - 1) / kGradWidth);
  const unsigned x = triangle ? 2 * ((blocks(p.own.rows) + 1) / 2) : blocks(p.own.rows);
  const Params<T, kWidth> params{p, make_block_tma<T, kWidth>(p.own, p.d), make_block_tma<T, kWidth>(p.streamed, p.d), o};
  const auto kernel = walk_kernel<T, kWalk, kWidth, kGroups>;
  cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
  // The triangle's programs run in clusters of two (cluster_pair.cuh); the others alone.
  cudaLaunchAttribute cluster{};
  cluster.id = cudaLaunchAttributeClusterDimension;
  cluster.val.clusterDim.x = 2;
  cluster.val.clusterDim.y = cluster.val.clusterDim.z = 1;
  cudaLaunchConfig_t config{dim3(x, y), dim3(kThreads), size_t(bytes), stream, &cluster, triangle ? 1u : 0u};
  cudaLaunchKernelEx(&config, kernel, params);
}

template <Walk kWalk>
void run(const TileProblem& p, const WalkOutputs& o, cudaStream_t stream) {
  // A call with groups (its ids given) runs the kernels compiled with the group mask.
  auto with_groups = [&](auto t, auto width) {
    using T = decltype(t);
    if (p.own_groups != nullptr) {
      launch<T, kWalk, decltype(width)::value, true>(p, o, stream);
    } else {
      launch<T, kWalk, decltype(width)::value, false>(p, o, stream);
    }
  };
  auto with_width = [&](auto t) {
    if constexpr (is_triangle(kWalk)) {
      with_groups(t, std::integral_constant<int, 128>{});  // supports_triangle: D within 128
    } else if (resident_width(p.d) == 128) {
      with_groups(t, std::integral_constant<int, 128>{});
    } else {
      with_groups(t, std::integral_constant<int, kMaxWidth>{});
    }
  };
  if (p.type == ElementType::kBFloat16) {
    with_width(cutlass::bfloat16_t{});
  } else {
    with_width(cutlass::half_t{});
  }
}

}  // namespace

void lse_plain(const TileProblem& p, float* part_max, float* part_sum, int num_splits,
               cudaStream_t stream) {
  run<Walk::kLsePlain>(p, {part_max, part_sum, nullptr, nullptr, 0, num_splits}, stream);
}

void lse_symmetric(const TileProblem& p, float* row_sum, int num_splits, cudaStream_t stream) {
  run<Walk::kLseSymmetric>(p, {nullptr, nullptr, row_sum, nullptr, 0, num_splits}, stream);
}

void grad_triangle(TriangleExchange exchange, const TileProblem& p, float* grad, int num_splits,
                   cudaStream_t stream) {
  static_assert(kTriangleGradWidth == kBlock && kTermsPadding % (2 * kBlock) == 0);
  const WalkOutputs o{nullptr, nullptr, nullptr, grad, kTriangleGradWidth, num_splits};
  switch (exchange) {
    case TriangleExchange::kFenced: run<Walk::kGradTriangle>(p, o, stream); break;
    case TriangleExchange::kAsync: run<Walk::kGradTriangleAsync>(p, o, stream); break;
  }
}

void grad(GradWalk walk, const TileProblem& p, float* grad, int64_t grad_columns,
          cudaStream_t stream) {
  const WalkOutputs o{nullptr, nullptr, nullptr, grad, grad_columns, 1};
  switch (walk) {
    case GradWalk::kRowsSymmetric: run<Walk::kGradRowsSymmetric>(p, o, stream); break;
    case GradWalk::kRowsPlain: run<Walk::kGradRowsPlain>(p, o, stream); break;
    case GradWalk::kColumns: run<Walk::kGradColumns>(p, o, stream); break;
  }
}

}  // namespace scl::cuda::sm90
