// Fused tile kernels of the SupCon loss on the CPU (docs/MATH.md sections 2-4). They take raw
// row-major pointers and know nothing of labels beyond the group mask: positives are O(N*D) work
// done by the caller through class sums, so these kernels only produce the log-sum-exp per
// anchor (forward) and the softmax part of the gradient (backward). No N x N buffer: one tile
// per thread.
//
// The kernels are compiled once per instruction set (supcon_tiles_kernels.h, included by
// supcon_tiles_<isa>.cpp), each copy in its own namespace, and tile_kernels_for picks one.
#pragma once

#include <cstdint>

#include "cpu_capability.h"

namespace scl::cpu {

// Anchors q[m, d] against contrast rows z[n, d]; logits s_ij = q_i . z_j * inv_t.
// With self_offset >= 0, anchor i never sees column self_offset + i (single-set layouts, where q
// is z's rows from self_offset on). With groups (non-null *_group), anchor i never sees a column
// j of its group whose pair class differs (scl::SupConProblem::anchor_group and the rest), or,
// for multi-hot labels (words > 0), that shares none of its classes: `words` 64-bit class words
// per row (scl::SupConProblem::anchor_words).
template <typename T>
struct TileProblem {
  const T* q;
  int64_t m;
  const T* z;
  int64_t n;
  int64_t d;
  int64_t self_offset;
  T inv_t;
  const int32_t* q_group = nullptr;
  const int32_t* z_group = nullptr;
  const int32_t* q_pair_class = nullptr;
  const int32_t* z_pair_class = nullptr;
  const uint64_t* q_words = nullptr;
  const uint64_t* z_words = nullptr;
  int64_t words = 0;
};

// One instruction set's copy of the kernels.
template <typename T>
struct TileKernelSet {
  // lse[i] = log sum_{j in A(i)} exp(z_i . z_j * inv_t) over unit rows z[n, d] (the problem's q
  // is z, its self_offset 0), visiting only tiles I <= J: each exp serves a row sum and a column
  // sum. Needs the fixed shift to be safe (scl::fixed_shift_is_safe).
  void (*lse_symmetric)(const TileProblem<T>& problem, double* lse);

  // dz[n, d] += sum_j exp(s_ij - inv_t) (coef_i + coef_j) z_j over j in A(i): the softmax part
  // of the single-set gradient, both anchor and contrast side, from the upper triangle of tiles,
  // with coef_i = g_i exp(1/t - lse_i) / t (0 for rows without gradient).
  void (*grad_symmetric)(const TileProblem<T>& problem, const T* coef, T* dz);

  // lse[i] = log sum_{j in A(i)} exp(s_ij) with an online running maximum: any layout, any scale.
  void (*lse_plain)(const TileProblem<T>& problem, double* lse);

  // dq[m, d] += sum_j G_ij z_j and dz[n, d] += sum_i G_ij q_i with
  // G_ij = coef_i exp(s_ij - lse_hi_i - lse_lo_i); rows with coef_i == 0 contribute nothing.
  // dq and dz must not overlap.
  void (*grad_plain)(const TileProblem<T>& problem, const T* coef, const T* lse_hi,
                     const T* lse_lo, T* dq, T* dz);
};

// The kernels compiled for `capability`, for float and double.
template <typename T>
const TileKernelSet<T>& tile_kernels_for(CpuCapability capability);

// Each instruction set's copy; the namespaces are the CPU_CAPABILITY names of its file.
namespace scl_default {
template <typename T>
const TileKernelSet<T>& tile_kernels();
}
namespace scl_avx2 {
template <typename T>
const TileKernelSet<T>& tile_kernels();
}
namespace scl_avx512 {
template <typename T>
const TileKernelSet<T>& tile_kernels();
}

}  // namespace scl::cpu
