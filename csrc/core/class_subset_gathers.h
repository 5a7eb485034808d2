// Multi-hot positives through sums over class subsets (class_subsets.h) on any device: the keys,
// their matches and the sums are ATen ops on the rows' device (the sums gathers and index_add_s
// in float64); the host reads a few sizes. A backend without a positive walk of its own (CUDA
// C++) takes the multi-label SupCon loss (gamma = 0) from these where the rows fit them
// (fit_on_device), and from class_overlap_products.h where they do not.
#pragma once

#include "tile_kernels.h"

namespace scl::class_subsets {

// How many classes each row of class words ([R, K] int64) holds: [R] int64, on their device.
at::Tensor class_counts(const at::Tensor& words);

// The rule of fits (class_subsets.h), its counts made on the rows' device: one host read of two
// numbers per side.
bool fit_on_device(const SupConProblem& p);

// What TileKernels::multi_label_positives gives, for rows that fit.
MultiLabelPositives positives_by_gathers(const SupConProblem& p);

// What TileKernels::positive_walk gives, for gamma == 0 and rows that fit.
PositiveWalkOutputs walk_by_gathers(const SupConProblem& p, const PositiveWalkInputs& walk);

}  // namespace scl::class_subsets
