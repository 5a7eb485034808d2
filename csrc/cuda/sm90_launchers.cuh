// Host launchers of the wgmma + TMA family (sm90_kernels.cuh) for the kernels compiled with the
// group mask (kGroups) or without it. Each half is instantiated in a translation unit of its own
// (supcon_sm90.cu, supcon_sm90_groups.cu), so that a parallel build compiles them side by side:
// one unit of both took 1.6x the time of the family's unit before the mask (nvcc, sm_90a).
#pragma once

#include <type_traits>

#include "families.h"
#include "sm90_kernels.cuh"

namespace scl::cuda::sm90 {
namespace launching {

inline unsigned blocks(int64_t rows) { return unsigned((rows + kBlock - 1) / kBlock); }

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

template <Walk kWalk, bool kGroups>
void run(const TileProblem& p, const WalkOutputs& o, cudaStream_t stream) {
  auto with_width = [&](auto t) {
    using T = decltype(t);
    if constexpr (is_triangle(kWalk)) {
      launch<T, kWalk, 128, kGroups>(p, o, stream);  // supports_triangle: D within 128
    } else if (resident_width(p.d) == 128) {
      launch<T, kWalk, 128, kGroups>(p, o, stream);
    } else {
      launch<T, kWalk, kMaxWidth, kGroups>(p, o, stream);
    }
  };
  if (p.type == ElementType::kBFloat16) {
    with_width(cutlass::bfloat16_t{});
  } else {
    with_width(cutlass::half_t{});
  }
}

}  // namespace launching

// The family's entry points (families.h) for kernels with or without the group mask, defined
// out of the class: not inline, so that the extern declaration below keeps the masked half out
// of supcon_sm90.cu.
template <bool kGroups>
struct Launchers {
  static void lse_plain(const TileProblem& p, float* part_max, float* part_sum, int num_splits,
                        cudaStream_t stream);
  static void lse_symmetric(const TileProblem& p, float* row_sum, int num_splits,
                            cudaStream_t stream);
  static void grad_triangle(TriangleExchange exchange, const TileProblem& p, float* grad,
                            int num_splits, cudaStream_t stream);
  static void grad(GradWalk walk, const TileProblem& p, float* grad, int64_t grad_columns,
                   cudaStream_t stream);
};

template <bool kGroups>
void Launchers<kGroups>::lse_plain(const TileProblem& p, float* part_max, float* part_sum,
                                   int num_splits, cudaStream_t stream) {
  launching::run<Walk::kLsePlain, kGroups>(
      p, {part_max, part_sum, nullptr, nullptr, 0, num_splits}, stream);
}

template <bool kGroups>
void Launchers<kGroups>::lse_symmetric(const TileProblem& p, float* row_sum, int num_splits,
                                       cudaStream_t stream) {
  launching::run<Walk::kLseSymmetric, kGroups>(
      p, {nullptr, nullptr, row_sum, nullptr, 0, num_splits}, stream);
}

template <bool kGroups>
void Launchers<kGroups>::grad_triangle(TriangleExchange exchange, const TileProblem& p,
                                       float* grad, int num_splits, cudaStream_t stream) {
  static_assert(kTriangleGradWidth == kBlock && kTermsPadding % (2 * kBlock) == 0);
  const WalkOutputs o{nullptr, nullptr, nullptr, grad, kTriangleGradWidth, num_splits};
  switch (exchange) {
    case TriangleExchange::kFenced: launching::run<Walk::kGradTriangle, kGroups>(p, o, stream); break;
    case TriangleExchange::kAsync: launching::run<Walk::kGradTriangleAsync, kGroups>(p, o, stream); break;
  }
}

template <bool kGroups>
void Launchers<kGroups>::grad(GradWalk walk, const TileProblem& p, float* grad,
                              int64_t grad_columns, cudaStream_t stream) {
  const WalkOutputs o{nullptr, nullptr, nullptr, grad, grad_columns, 1};
  switch (walk) {
    case GradWalk::kRowsSymmetric: launching::run<Walk::kGradRowsSymmetric, kGroups>(p, o, stream); break;
    case GradWalk::kRowsPlain: launching::run<Walk::kGradRowsPlain, kGroups>(p, o, stream); break;
    case GradWalk::kColumns: launching::run<Walk::kGradColumns, kGroups>(p, o, stream); break;
  }
}

// The group-masked half is compiled in supcon_sm90_groups.cu.
extern template struct Launchers<true>;

}  // namespace scl::cuda::sm90
