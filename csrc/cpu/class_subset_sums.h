// Multi-hot positives through sums over class subsets (docs/MATH.md section 11, "Few classes a
// row: sums over class subsets"): what the multi-label SupCon loss (gamma = 0) takes from its
// positive pairs, W_i, |P(i)|, sum_j w_ij u_j and its transpose, from per-subset sums of rows,
// O((m + n) 2^k d) for rows of k classes in place of the pair walk's O(sum_c n_c^2 d). The
// walk's outputs, TileKernels::positive_walk and TileKernels::multi_label_positives
// (csrc/core/tile_kernels.h), for calls whose rows hold few classes (class_subsets::fits).
#pragma once

#include "../core/tile_kernels.h"

namespace scl::cpu {

MultiLabelPositives subset_positives(const SupConProblem& p);

// gamma == 0 only: the focal loss's terms are per pair.
PositiveWalkOutputs subset_walk(const SupConProblem& p, const PositiveWalkInputs& walk);

}  // namespace scl::cpu
