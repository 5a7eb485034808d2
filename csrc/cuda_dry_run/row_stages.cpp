// The dry run's fused O(N*D) stages (csrc/cuda/row_stages.h): each launch is recorded as a
// profiler event, as the tile kernels' are (kernel_launches.cpp), and then its row function runs
// on the CPU row after row, so that the stages' per-row code, the one the CUDA kernels run, is
// tested here (python_tests/backends/test_cuda_row_stages.py).
#include <ATen/record_function.h>

#include <vector>

#include "cuda/row_stages.h"

namespace scl::cuda::row_stages {
namespace {

template <class Args, void (*kRow)(const Args&, int64_t)>
void run(const char* name, const Args& args, int64_t count) {
  if (count == 0) return;  // as the CUDA launch: no rows, no kernel
  RECORD_FUNCTION(name, std::vector<c10::IValue>());
  for (int64_t r = 0; r < count; ++r) kRow(args, r);
}

}  // namespace

void prepare_rows(const RowPreparation& a, const Device&) {
  run<RowPreparation, prepare_row>("cuda_kernel::row_stages.prepare_rows", a, a.count);
}

void anchor_losses(const AnchorLosses& a, const Device&) {
  run<AnchorLosses, anchor_loss>("cuda_kernel::row_stages.anchor_losses", a, a.count);
}

void anchor_weights(const AnchorWeightTerms& a, const Device&) {
  run<AnchorWeightTerms, anchor_weight>("cuda_kernel::row_stages.anchor_weights", a, a.count);
}

void assemble_backward(const BackwardAssemblyTerms& a, const Device&) {
  run<BackwardAssemblyTerms, assemble_row>("cuda_kernel::row_stages.assemble_backward", a, a.count);
}

void row_terms(const RowTermsArgs& a, const Device&) {
  run<RowTermsArgs, write_terms>("cuda_kernel::row_stages.row_terms", a, a.launch_rows());
}

void lse_merge(const LseMerge& a, const Device&) {
  run<LseMerge, merge_lse>("cuda_kernel::row_stages.lse_merge", a, a.rows);
}

}  // namespace scl::cuda::row_stages
