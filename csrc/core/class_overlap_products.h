// Multi-hot positives pair by pair on any device, for rows of any number of classes (docs/MATH.md
// section 11, "Many classes a row: class overlaps in blocks of pairs"). A block's class overlaps
// |Y_i & Y_j| are the product of its two sides' 0/1 class rows (a matrix product of small
// integers, exact), its weights h follow elementwise, and the positives' sums are the products
// of the weights with the unit rows. Blocks of at most chunk_elements() pairs, so nothing grows
// as N^2; ATen ops only. A backend without a positive walk of its own (CUDA C++) takes the
// multi-label SupCon loss (gamma = 0) from these where the rows hold too many classes for sums
// over class subsets (class_subset_gathers.h).
#pragma once

#include <cstdint>
#include <functional>

#include "tile_kernels.h"

namespace scl::class_overlaps {

// visit(i0, rows, j0, cols, w) for consecutive blocks of pairs: anchors i0 .. i0 + rows, contrast
// rows j0 .. j0 + cols, w their [rows, cols] float32 weights h(|Y_i & Y_j|) (> 0 exactly where
// the rows share a class), 0 for an anchor's own row.
using WeightBlockVisit = std::function<void(int64_t i0, int64_t rows, int64_t j0, int64_t cols,
                                            const at::Tensor& w)>;
void for_each_weight_block(const SupConProblem& p, const WeightBlockVisit& visit);

// What TileKernels::multi_label_positives gives.
MultiLabelPositives positives_by_products(const SupConProblem& p);

// What TileKernels::positive_walk gives, for gamma == 0.
PositiveWalkOutputs walk_by_products(const SupConProblem& p, const PositiveWalkInputs& walk);

}  // namespace scl::class_overlaps
