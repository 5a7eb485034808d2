// Fused tile kernels of the SupCon loss on the CPU (KERNEL_MATH.md sections 2-4). They take raw
// row-major pointers and know nothing of labels: positives are O(N*D) work done by the caller
// through class sums, so these kernels only produce the log-sum-exp per anchor (forward) and the
// softmax part of the gradient (backward). No N x N buffer: one tile per thread.
#pragma once

#include <cstdint>

namespace scl::cpu {

// Anchors q[m, d] against contrast rows z[n, d]; logits s_ij = q_i . z_j * inv_t.
// With self_column, anchor i never sees column i (single-set layouts, where q is z's first m rows).
template <typename T>
struct TileProblem {
  const T* q;
  int64_t m;
  const T* z;
  int64_t n;
  int64_t d;
  bool self_column;
  T inv_t;
};

// True when exp(s - 1/t) cannot underflow to zero for unit rows (|s| <= 1/t): the condition for
// the fixed shift that the symmetric schedule relies on.
template <typename T>
bool fixed_shift_is_safe(T inv_t);

// lse[i] = log sum_{j != i} exp(z_i . z_j * inv_t) over unit rows z[n, d], visiting only tiles
// I <= J: each exp serves a row sum and a column sum. Needs fixed_shift_is_safe(inv_t).
template <typename T>
void lse_symmetric(const T* z, int64_t n, int64_t d, T inv_t, T* lse);

// dz[n, d] += sum_j (G_ij + G_ji) z_j * inv_t with G_ij = g_i exp(s_ij - lse_i) for j != i:
// the softmax part of the single-set gradient, both anchor and contrast side, from the upper
// triangle of tiles. Rows with g_i == 0 contribute nothing, whatever their lse.
template <typename T>
void grad_symmetric(const T* z, int64_t n, int64_t d, T inv_t, const T* lse, const T* g, T* dz);

// lse[i] = log sum_{j in A(i)} exp(s_ij) with an online running maximum: any layout, any scale.
template <typename T>
void lse_plain(const TileProblem<T>& problem, T* lse);

// dq[m, d] += inv_t * sum_j G_ij z_j and dz[n, d] += inv_t * sum_i G_ij q_i, G as above.
// dq and dz must not overlap.
template <typename T>
void grad_plain(const TileProblem<T>& problem, const T* lse, const T* g, T* dq, T* dz);

}  // namespace scl::cpu
