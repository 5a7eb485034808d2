// The fused O(N*D) stages' kernels (row_stages.h): one thread per row, 128 threads a block.
// Their work is memory-bound and small beside the tiles (a few reads of [N, D]); what they save
// is the launches and passes of the ATen steps they replace (docs/CUDA_KERNELS.md).
#include "row_stages.h"

namespace scl::cuda::row_stages {
namespace {

constexpr int kThreads = 128;

template <class Args, void (*kRow)(const Args&, int64_t)>
__global__ void __launch_bounds__(kThreads) rows_kernel(const Args args, int64_t count) {
  const int64_t r = int64_t(blockIdx.x) * kThreads + threadIdx.x;
  if (r < count) kRow(args, r);
}

template <class Args, void (*kRow)(const Args&, int64_t)>
void launch(const Args& args, int64_t count, const Device& device) {
  if (count == 0) return;
  const unsigned blocks = unsigned((count + kThreads - 1) / kThreads);
  rows_kernel<Args, kRow><<<blocks, kThreads, 0, device.stream>>>(args, count);
}

}  // namespace

void prepare_rows(const RowPreparation& a, const Device& device) {
  launch<RowPreparation, prepare_row>(a, a.count, device);
}

void anchor_losses(const AnchorLosses& a, const Device& device) {
  launch<AnchorLosses, anchor_loss>(a, a.count, device);
}

void anchor_weights(const AnchorWeightTerms& a, const Device& device) {
  launch<AnchorWeightTerms, anchor_weight>(a, a.count, device);
}

void assemble_backward(const BackwardAssemblyTerms& a, const Device& device) {
  launch<BackwardAssemblyTerms, assemble_row>(a, a.count, device);
}

void row_terms(const RowTermsArgs& a, const Device& device) {
  launch<RowTermsArgs, write_terms>(a, a.launch_rows(), device);
}

void lse_merge(const LseMerge& a, const Device& device) {
  launch<LseMerge, merge_lse>(a, a.rows, device);
}

}  // namespace scl::cuda::row_stages
