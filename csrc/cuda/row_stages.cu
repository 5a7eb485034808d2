// The fused O(N*D) stages' kernels (row_stages.h): a warp per row for the stages that walk a
// row's columns (lanes on consecutive elements, the row's totals by shuffles), a thread per row
// for the row terms and the merge; 128 threads a block. Their work is memory-bound and small
// beside the tiles (a few reads of [N, D]); what they save is the launches and passes of the ATen
// steps they replace (docs/CUDA_KERNELS.md).
#include "row_stages.h"

#include <algorithm>

namespace scl::cuda::row_stages {
namespace {

constexpr int kThreads = 128;
constexpr int kRowsPerBlock = kThreads / kLanes;

__device__ __forceinline__ Partial warp_sum(Partial p) {
  for (int offset = kLanes / 2; offset > 0; offset /= 2) {
    p.first += __shfl_xor_sync(0xffffffffu, p.first, offset);
    p.second += __shfl_xor_sync(0xffffffffu, p.second, offset);
  }
  return p;
}

// Row r is warp r % 4 of block r / 4; a warp's rows are uniform, so whole warps exit together.
template <class Stage>
__global__ void __launch_bounds__(kThreads) warp_rows_kernel(const typename Stage::Args args, int64_t count) {
  const int64_t r = int64_t(blockIdx.x) * kRowsPerBlock + threadIdx.x / kLanes;
  if (r >= count) return;
  const Lane lane{int(threadIdx.x % kLanes), kLanes};
  Stage::finish(args, r, lane, warp_sum(Stage::partial(args, r, lane)));
}

// The mean of the per-anchor losses in one launch: a block's warps take rows in turn, each
// keeping its rows' loss sum and count; the block adds its totals to mean_sums by one atomic
// each and takes a ticket, and the block that takes the last one stores the mean.
__global__ void __launch_bounds__(kThreads) anchor_mean_kernel(const AnchorLosses a) {
  const int warp = threadIdx.x / kLanes;
  const Lane lane{int(threadIdx.x % kLanes), kLanes};
  double sum = 0.0, counted = 0.0;
  for (int64_t r = int64_t(blockIdx.x) * kRowsPerBlock + warp; r < a.count;
       r += int64_t(gridDim.x) * kRowsPerBlock) {
    sum += anchor_loss_value(a, r, warp_sum(anchor_loss_partial(a, r, lane)));
    counted += a.num_positives[r] > 0 ? 1.0 : 0.0;
  }
  __shared__ double warp_totals[kRowsPerBlock][2];
  if (lane.leader()) warp_totals[warp][0] = sum, warp_totals[warp][1] = counted;
  __syncthreads();
  if (threadIdx.x != 0) return;
  for (int w = 1; w < kRowsPerBlock; ++w) sum += warp_totals[w][0], counted += warp_totals[w][1];
  atomicAdd(&a.mean_sums[0], sum);
  atomicAdd(&a.mean_sums[1], counted);
  __threadfence();  // this block's sums before its ticket
  if (atomicAdd(&a.mean_sums[2], 1.0) + 1.0 != double(gridDim.x)) return;
  __threadfence();  // every block's sums after the last ticket
  const double totals[2] = {atomicAdd(&a.mean_sums[0], 0.0), atomicAdd(&a.mean_sums[1], 0.0)};
  *a.loss = anchor_mean_of(totals);
}

template <class Args, void (*kRow)(const Args&, int64_t)>
__global__ void __launch_bounds__(kThreads) thread_rows_kernel(const Args args, int64_t count) {
  const int64_t r = int64_t(blockIdx.x) * kThreads + threadIdx.x;
  if (r < count) kRow(args, r);
}

template <class Stage>
void launch_warps(const typename Stage::Args& args, int64_t count, const Device& device) {
  if (count == 0) return;
  const unsigned blocks = unsigned((count + kRowsPerBlock - 1) / kRowsPerBlock);
  warp_rows_kernel<Stage><<<blocks, kThreads, 0, device.stream>>>(args, count);
}

template <class Args, void (*kRow)(const Args&, int64_t)>
void launch_threads(const Args& args, int64_t count, const Device& device) {
  if (count == 0) return;
  const unsigned blocks = unsigned((count + kThreads - 1) / kThreads);
  thread_rows_kernel<Args, kRow><<<blocks, kThreads, 0, device.stream>>>(args, count);
}

}  // namespace

void prepare_rows(const RowPreparation& a, const Device& device) {
  launch_warps<PrepareRowsStage>(a, a.count, device);
}

void anchor_losses(const AnchorLosses& a, const Device& device) {
  if (a.mean_sums == nullptr) {
    launch_warps<AnchorLossesStage>(a, a.count, device);
    return;
  }
  // Enough blocks to fill the SMs a few times over; more would only add atomics.
  const int64_t needed = (a.count + kRowsPerBlock - 1) / kRowsPerBlock;
  const unsigned blocks =
      unsigned(std::max<int64_t>(1, std::min<int64_t>(needed, 8 * int64_t(device.sm_count))));
  anchor_mean_kernel<<<blocks, kThreads, 0, device.stream>>>(a);
}

void anchor_weights(const AnchorWeightTerms& a, const Device& device) {
  launch_warps<AnchorWeightsStage>(a, a.count, device);
}

void assemble_backward(const BackwardAssemblyTerms& a, const Device& device) {
  launch_warps<AssemblyStage>(a, a.count, device);
}

void row_terms(const RowTermsArgs& a, const Device& device) {
  launch_threads<RowTermsArgs, write_terms>(a, a.launch_rows(), device);
}

void lse_merge(const LseMerge& a, const Device& device) {
  launch_threads<LseMerge, merge_lse>(a, a.rows, device);
}

}  // namespace scl::cuda::row_stages
