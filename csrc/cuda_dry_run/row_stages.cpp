// The dry run's fused O(N*D) stages (csrc/cuda/row_stages.h): each launch is recorded as a
// profiler event, as the tile kernels' are (kernel_launches.cpp), and then run on the CPU: a
// warp stage's row by its 32 lanes one after another (their partial sums added, then each lane's
// writes), a thread stage's row by one call. So the stages' per-lane code, the one the CUDA
// kernels run, is tested here (python_tests/backends/test_cuda_dry_run.py).
#include <ATen/record_function.h>

#include <vector>

#include "cuda/row_stages.h"

namespace scl::cuda::row_stages {
namespace {

// Row r's total of its 32 lanes' partial sums, lane after lane.
template <class Stage>
Partial row_total(const typename Stage::Args& args, int64_t r) {
  Partial total;
  for (int lane = 0; lane < kLanes; ++lane) total = total + Stage::partial(args, r, {lane, kLanes});
  return total;
}

template <class Stage>
void run_warps(const char* name, const typename Stage::Args& args, int64_t count) {
  if (count == 0) return;  // as the CUDA launch: no rows, no kernel
  RECORD_FUNCTION(name, std::vector<c10::IValue>());
  for (int64_t r = 0; r < count; ++r) {
    const Partial total = row_total<Stage>(args, r);
    for (int lane = 0; lane < kLanes; ++lane) Stage::finish(args, r, {lane, kLanes}, total);
  }
}

template <class Args, void (*kRow)(const Args&, int64_t)>
void run_threads(const char* name, const Args& args, int64_t count) {
  if (count == 0) return;
  RECORD_FUNCTION(name, std::vector<c10::IValue>());
  for (int64_t r = 0; r < count; ++r) kRow(args, r);
}

}  // namespace

void prepare_rows(const RowPreparation& a, const Device&) {
  run_warps<PrepareRowsStage>("cuda_kernel::row_stages.prepare_rows", a, a.count);
}

void anchor_losses(const AnchorLosses& a, const Device&) {
  if (a.mean_sums == nullptr) {
    run_warps<AnchorLossesStage>("cuda_kernel::row_stages.anchor_losses", a, a.count);
    return;
  }
  // The mean's kernel: one block's rows in turn, then the last block's division (the device
  // adds blocks' sums in whatever order they finish).
  RECORD_FUNCTION("cuda_kernel::row_stages.anchor_mean", std::vector<c10::IValue>());
  for (int64_t r = 0; r < a.count; ++r) {
    a.mean_sums[0] += anchor_loss_value(a, r, row_total<AnchorLossesStage>(a, r));
    a.mean_sums[1] += a.num_positives[r] > 0 ? 1.0 : 0.0;
  }
  a.mean_sums[2] = 1.0;
  *a.loss = anchor_mean_of(a.mean_sums);
}

void anchor_weights(const AnchorWeightTerms& a, const Device&) {
  run_warps<AnchorWeightsStage>("cuda_kernel::row_stages.anchor_weights", a, a.count);
}

void assemble_backward(const BackwardAssemblyTerms& a, const Device&) {
  run_warps<AssemblyStage>("cuda_kernel::row_stages.assemble_backward", a, a.count);
}

void row_terms(const RowTermsArgs& a, const Device&) {
  run_threads<RowTermsArgs, write_terms>("cuda_kernel::row_stages.row_terms", a, a.launch_rows());
}

void lse_merge(const LseMerge& a, const Device&) {
  run_threads<LseMerge, merge_lse>("cuda_kernel::row_stages.lse_merge", a, a.rows);
}

}  // namespace scl::cuda::row_stages
