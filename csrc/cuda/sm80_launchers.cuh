// Host launchers of the mma.sync family (sm80_kernels.cuh) for the kernels compiled with the
// group mask (kGroups) or without it: one instantiation per input type and walk, compiled for
// every architecture of the build. Each half is instantiated in a translation unit of its own
// (supcon_sm80.cu, supcon_sm80_groups.cu), so that a parallel build compiles them side by side.
#pragma once

#include "families.h"
#include "sm80_kernels.cuh"

namespace scl::cuda::sm80 {
namespace launching {

template <class Kernel>
void allow_shared(Kernel kernel, int bytes) {
  // Above 48 KB a kernel must opt in; the launch then reports any failure.
  cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
}

template <class F>
void by_type(ElementType type, F&& f) {
  switch (type) {
    case ElementType::kBFloat16: return f(cutlass::bfloat16_t{});
    case ElementType::kFloat16: return f(cutlass::half_t{});
    case ElementType::kFloat32: return f(float{});
  }
}

template <class T, Walk kWalk, bool kGroups>
void walk(const TileProblem& p, const WalkOutputs& out, dim3 grid, cudaStream_t stream) {
  constexpr int bytes = Config<T>::kSharedBytes;
  const auto kernel = walk_kernel<T, kWalk, kGroups>;
  allow_shared(kernel, bytes);
  kernel<<<grid, kThreads, bytes, stream>>>(p, out);
}

inline unsigned blocks(int64_t rows, int64_t block) { return unsigned((rows + block - 1) / block); }

}  // namespace launching

// The family's entry points (families.h) for kernels with or without the group mask, defined
// out of the class: not inline, so that the extern declaration below keeps the masked half out
// of supcon_sm80.cu.
template <bool kGroups>
struct Launchers {
  static void lse_plain(const TileProblem& p, float* part_max, float* part_sum, int num_splits,
                        cudaStream_t stream);
  static void lse_symmetric(const TileProblem& p, float* row_sum, int num_splits,
                            cudaStream_t stream);
  static void grad(GradWalk walk_kind, const TileProblem& p, float* grad, int64_t grad_columns,
                   cudaStream_t stream);
};

template <bool kGroups>
void Launchers<kGroups>::lse_plain(const TileProblem& p, float* part_max, float* part_sum,
                                   int num_splits, cudaStream_t stream) {
  const WalkOutputs out{part_max, part_sum, nullptr, nullptr, 0, num_splits};
  const dim3 grid(launching::blocks(p.own.rows, kBlockM), unsigned(num_splits));
  launching::by_type(p.type, [&](auto t) {
    launching::walk<decltype(t), Walk::kLsePlain, kGroups>(p, out, grid, stream);
  });
}

template <bool kGroups>
void Launchers<kGroups>::lse_symmetric(const TileProblem& p, float* row_sum, int num_splits,
                                       cudaStream_t stream) {
  const int64_t nb = launching::blocks(p.streamed.rows, kBlockN);
  const dim3 grid(unsigned((nb + 1) / 2), unsigned(num_splits));
  launching::by_type(p.type, [&](auto t) {
    using T = decltype(t);
    constexpr int bytes = Config<T>::kSharedBytes;
    const auto kernel = lse_symmetric_kernel<T, kGroups>;
    launching::allow_shared(kernel, bytes);
    kernel<<<grid, kThreads, bytes, stream>>>(p, row_sum, num_splits);
  });
}

template <bool kGroups>
void Launchers<kGroups>::grad(GradWalk walk_kind, const TileProblem& p, float* grad,
                              int64_t grad_columns, cudaStream_t stream) {
  const WalkOutputs out{nullptr, nullptr, nullptr, grad, grad_columns, 1};
  const dim3 grid(launching::blocks(p.own.rows, kBlockM),
                  launching::blocks(grad_columns, kBlockOut));
  launching::by_type(p.type, [&](auto t) {
    using T = decltype(t);
    switch (walk_kind) {
      case GradWalk::kRowsPlain:
        return launching::walk<T, Walk::kGradRowsPlain, kGroups>(p, out, grid, stream);
      case GradWalk::kRowsSymmetric:
        return launching::walk<T, Walk::kGradRowsSymmetric, kGroups>(p, out, grid, stream);
      case GradWalk::kColumns:
        return launching::walk<T, Walk::kGradColumns, kGroups>(p, out, grid, stream);
    }
  });
}

// The group-masked half is compiled in supcon_sm80_groups.cu.
extern template struct Launchers<true>;

}  // namespace scl::cuda::sm80
