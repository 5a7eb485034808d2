// The CUDA tile kernels as host functions: torch-free (plain pointers, a stream), so that the ATen
// glue (supcon_cuda.cpp) is the only file that knows about tensors. Each function picks the
// kernel family for the device (wgmma on sm_90a for 16-bit inputs, mma.sync otherwise), sizes the
// grid and launches on `stream`; none synchronises with the host.
#pragma once

#ifdef SCL_CUDA_DRY_RUN
// The dry run (csrc/cuda_dry_run) builds this layer without CUDA: a stream is only a handle.
struct CUstream_st;
using cudaStream_t = CUstream_st*;
#else
#include <cuda_runtime.h>
#endif

#include <cstdint>

#include "tile_args.h"

namespace scl::cuda {

struct Device {
  int compute_capability;  // major * 10 + minor
  int sm_count;
  cudaStream_t stream;
};

// Column splits of the plain forward for this problem (the glue sizes part_* with it).
int lse_plain_splits(const TileProblem& p, const Device& device);
// Base-2 running (max, sum) per own row and column split: part_* are [splits, own rows].
void lse_plain(const TileProblem& p, float* part_max, float* part_sum, int num_splits,
               const Device& device);

// Row sums of 2^(s2 - log2(e)/t) over the upper triangle (own = streamed = the single set);
// row_sum holds streamed_rows rounded up to kTermsPadding floats, zeroed by the caller.
void lse_symmetric(const TileProblem& p, float* row_sum, const Device& device);

enum class GradWalk { kRowsPlain, kRowsSymmetric, kColumns };
// The softmax part of the gradient of the own rows, fp32 [own rows, grad_columns], every element
// written (no atomics: deterministic).
void grad(GradWalk walk, const TileProblem& p, float* grad, int64_t grad_columns,
          const Device& device);
// The symmetric backward (what grad(kRowsSymmetric, ...) computes) over the upper triangle, for
// the problems the sm_90a kernels take at D <= 128: added by atomics (not bitwise reproducible)
// into `grad`, [own rows rounded up to kTermsPadding, kTriangleGradWidth] fp32, zeroed by the
// caller (whole 16-byte vectors, no bounds to check; the columns past D stay zero).
bool symmetric_triangle_supported(const TileProblem& p, const Device& device);
constexpr int64_t kTriangleGradWidth = 128;
// How a cluster pair's programs swap their column partials: kFenced, the default, by stores and
// cluster-scope release arrives (GPU-scope fences in every tile); kAsync, opt-in and not yet run
// on a GPU, by st.async counted on the receiver's mbarrier (docs/CUDA_KERNELS.md).
enum class TriangleExchange { kFenced, kAsync };
void grad_symmetric_triangle(TriangleExchange exchange, const TileProblem& p, float* grad,
                             const Device& device);

}  // namespace scl::cuda
