// Host launchers of the wgmma + TMA family (sm90_kernels.cuh). The kernels are compiled for
// every architecture of the build but have bodies only for sm_90a; launch.cpp calls them only
// on a compute capability 9.0 device.
#include "families.h"
#include "sm90_kernels.cuh"

namespace scl::cuda::sm90 {
namespace {

template <class T, Walk kWalk>
void launch(Params<T> params, dim3 grid, cudaStream_t stream) {
  constexpr int bytes = int(sizeof(SharedStorage<T>));
  cudaFuncSetAttribute(walk_kernel<T, kWalk>, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
  walk_kernel<T, kWalk><<<grid, kThreads, bytes, stream>>>(params);
}

template <Walk kWalk>
void run(const TileProblem& p, Params<cutlass::bfloat16_t> proto, dim3 grid, cudaStream_t stream) {
  auto with_type = [&](auto t) {
    using T = decltype(t);
    Params<T> params{p, make_block_tma<T>(p.own, p.d), make_block_tma<T>(p.streamed, p.d),
                     proto.part_max, proto.part_sum, proto.row_sum, proto.grad,
                     proto.grad_columns, proto.num_splits};
    launch<T, kWalk>(params, grid, stream);
  };
  if (p.type == ElementType::kBFloat16) {
    with_type(cutlass::bfloat16_t{});
  } else {
    with_type(cutlass::half_t{});
  }
}

unsigned blocks(int64_t rows) { return unsigned((rows + kBlock - 1) / kBlock); }

Params<cutlass::bfloat16_t> outputs(float* part_max, float* part_sum, float* row_sum, float* grad,
                                    int64_t grad_columns, int num_splits) {
  Params<cutlass::bfloat16_t> o{};
  o.part_max = part_max;
  o.part_sum = part_sum;
  o.row_sum = row_sum;
  o.grad = grad;
  o.grad_columns = grad_columns;
  o.num_splits = num_splits;
  return o;
}

}  // namespace

bool supports(const TileProblem& p, const Device& device) {
  return device.compute_capability == 90 && p.type != ElementType::kFloat32 && p.d <= kWidth &&
         p.own.rows < (int64_t{1} << 31) && p.streamed.rows < (int64_t{1} << 31);
}

bool supports_grad(GradWalk walk, const TileProblem& p, const Device& device) {
  return walk != GradWalk::kColumns && supports(p, device);
}

void lse_plain(const TileProblem& p, float* part_max, float* part_sum, int num_splits,
               cudaStream_t stream) {
  run<Walk::kLsePlain>(p, outputs(part_max, part_sum, nullptr, nullptr, 0, num_splits),
                       dim3(blocks(p.own.rows), unsigned(num_splits)), stream);
}

void lse_symmetric(const TileProblem& p, float* row_sum, int num_splits, cudaStream_t stream) {
  run<Walk::kLseSymmetric>(p, outputs(nullptr, nullptr, row_sum, nullptr, 0, num_splits),
                           dim3(blocks(p.own.rows), unsigned(num_splits)), stream);
}

void grad(GradWalk walk, const TileProblem& p, float* grad, int64_t grad_columns,
          cudaStream_t stream) {
  const auto o = outputs(nullptr, nullptr, nullptr, grad, grad_columns, 1);
  auto chunks = [&](Walk w) { return unsigned((grad_columns + grad_width(w) - 1) / grad_width(w)); };
  if (walk == GradWalk::kRowsSymmetric) {
    run<Walk::kGradRowsSymmetric>(p, o, dim3(blocks(p.own.rows), chunks(Walk::kGradRowsSymmetric)), stream);
  } else {
    run<Walk::kGradRowsPlain>(p, o, dim3(blocks(p.own.rows), chunks(Walk::kGradRowsPlain)), stream);
  }
}

}  // namespace scl::cuda::sm90
