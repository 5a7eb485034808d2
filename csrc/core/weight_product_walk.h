// The multi-label SupCon loss's positive walk (gamma = 0) from two products with the pair
// weights W (w_ij, the anchor's own row 0): W v over the contrast rows, and in the backward
// W^T y over the anchors. However a backend forms them (class_subset_gathers.h: sums over class
// subsets; class_overlap_products.h: blocks of pairs), the terms that follow are these
// (docs/MATH.md section 11):
//   loss_i = W_i lse_i - (1/t) u_i . (W v)_i,
//   dq_i = -(1/t) a_i (W v)_i,   dz_j = -(1/t) (W^T (a u))_j,   a_i = g_i / W_i,
// all in float64, each anchor without positives left out.
#pragma once

#include <functional>
#include <utility>

#include "tile_kernels.h"

namespace scl {

// (W v, W^T y): [m, d] and [n, d] float64 from float64 v [n, d] and y [m, d]; the second is
// asked for (y defined) in the backward only.
using WeightProducts =
    std::function<std::pair<at::Tensor, at::Tensor>(const at::Tensor& v, const at::Tensor& y)>;

// What TileKernels::positive_walk gives, for gamma == 0.
PositiveWalkOutputs walk_by_weight_products(const SupConProblem& p, const PositiveWalkInputs& walk,
                                            const WeightProducts& products);

}  // namespace scl
