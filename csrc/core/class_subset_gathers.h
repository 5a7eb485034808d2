// Multi-hot positives through sums over class subsets (class_subsets.h) on any device: the keys,
// their matches and the sums are ATen ops on the rows' device (the sums gathers and index_add_s
// in float64); the host reads a few sizes. A backend without a positive walk of its own (CUDA C++) takes the
// multi-label SupCon loss (gamma = 0) from these, for rows of at most 8 classes.
#pragma once

#include "tile_kernels.h"

namespace scl::class_subsets {

// What TileKernels::multi_label_positives gives; a ValueError where the rows do not fit (fits),
// naming `backend`.
MultiLabelPositives positives_by_gathers(const SupConProblem& p, const char* backend);

// What TileKernels::positive_walk gives, for gamma == 0 and rows that fit.
PositiveWalkOutputs walk_by_gathers(const SupConProblem& p, const PositiveWalkInputs& walk);

}  // namespace scl::class_subsets
