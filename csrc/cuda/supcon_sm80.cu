// Host launchers of the mma.sync family (sm80_kernels.cuh): one instantiation per input type and
// walk, compiled for every architecture of the build.
#include <type_traits>

#include "families.h"
#include "sm80_kernels.cuh"

namespace scl::cuda::sm80 {
namespace {

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

// A call with groups (its ids given) runs the kernels compiled with the group mask.
template <class F>
void by_groups(const TileProblem& p, F&& f) {
  if (p.own_groups != nullptr) {
    f(std::true_type{});
  } else {
    f(std::false_type{});
  }
}

template <class T, Walk kWalk>
void walk(const TileProblem& p, const WalkOutputs& out, dim3 grid, cudaStream_t stream) {
  constexpr int bytes = Config<T>::kSharedBytes;
  by_groups(p, [&](auto groups) {
    const auto kernel = walk_kernel<T, kWalk, decltype(groups)::value>;
    allow_shared(kernel, bytes);
    kernel<<<grid, kThreads, bytes, stream>>>(p, out);
  });
}

unsigned blocks(int64_t rows, int64_t block) { return unsigned((rows + block - 1) / block); }

}  // namespace

void lse_plain(const TileProblem& p, float* part_max, float* part_sum, int num_splits,
               cudaStream_t stream) {
  const WalkOutputs out{part_max, part_sum, nullptr, nullptr, 0, num_splits};
  const dim3 grid(blocks(p.own.rows, kBlockM), unsigned(num_splits));
  by_type(p.type, [&](auto t) { walk<decltype(t), Walk::kLsePlain>(p, out, grid, stream); });
}

void lse_symmetric(const TileProblem& p, float* row_sum, int num_splits, cudaStream_t stream) {
  const int64_t nb = blocks(p.streamed.rows, kBlockN);
  const dim3 grid(unsigned((nb + 1) / 2), unsigned(num_splits));
  by_type(p.type, [&](auto t) {
    using T = decltype(t);
    constexpr int bytes = Config<T>::kSharedBytes;
    by_groups(p, [&](auto groups) {
      const auto kernel = lse_symmetric_kernel<T, decltype(groups)::value>;
      allow_shared(kernel, bytes);
      kernel<<<grid, kThreads, bytes, stream>>>(p, row_sum, num_splits);
    });
  });
}

void grad(GradWalk walk_kind, const TileProblem& p, float* grad, int64_t grad_columns,
          cudaStream_t stream) {
  const WalkOutputs out{nullptr, nullptr, nullptr, grad, grad_columns, 1};
  const dim3 grid(blocks(p.own.rows, kBlockM), blocks(grad_columns, kBlockOut));
  by_type(p.type, [&](auto t) {
    using T = decltype(t);
    switch (walk_kind) {
      case GradWalk::kRowsPlain: return walk<T, Walk::kGradRowsPlain>(p, out, grid, stream);
      case GradWalk::kRowsSymmetric: return walk<T, Walk::kGradRowsSymmetric>(p, out, grid, stream);
      case GradWalk::kColumns: return walk<T, Walk::kGradColumns>(p, out, grid, stream);
    }
  });
}

}  // namespace scl::cuda::sm80
