// Known false negatives with multi-hot labels for a group mask that compares one id per row
// (docs/MATH.md section 11, "Groups with multi-hot labels on a mask of ids"): a pair of one group
// leaves the denominator unless its rows share a class, which no single pair class per row can
// tell (sharing a class is no equivalence). So the mask is given ids that tell every row apart
// (own_pair_classes: every pair of one group leaves), and the pairs of one group that share a
// class, G(i), are put back beside the tiles, in blocks of pairs (class_overlap_products.h):
//   lse_i = log(exp(lse_tiles_i) + sum_{j in G(i)} exp(s_ij / t)),
//   dq_i += (1/t) g_i sum_{j in G(i)} p_ij v_j,   dz_j += (1/t) sum_{i : j in G(i)} g_i p_ij u_i,
// with p_ij = exp(s_ij / t - lse_i) and g_i the softmax part's weight of anchor i. ATen ops on
// the rows' device; no N x N buffer.
#pragma once

#include <utility>

#include "tile_kernels.h"

namespace scl::group_shared_class_pairs {

// Whether the call has multi-hot labels and groups (what these serve).
bool apply(const SupConProblem& p);

// The anchors' and the contrast rows' pair classes, [m] and [n] int32, equal for two rows only
// where they are one row (-2 - its index among the call's rows).
std::pair<at::Tensor, at::Tensor> own_pair_classes(const SupConProblem& p);

// The tiles' log-sum-exp (float64 [m], -inf where the mask left an anchor nothing) with G(i) added.
at::Tensor add_to_lse(const SupConProblem& p, const at::Tensor& lse);

// dq [m, d] and dz [n, d] float64 (gradients of the unit rows) of G(i)'s softmax terms, from the
// call's log-sum-exp (add_to_lse's) and the anchors' weights g (float64 [m]).
std::pair<at::Tensor, at::Tensor> softmax_grads(const SupConProblem& p, const at::Tensor& lse,
                                                const at::Tensor& g);

}  // namespace scl::group_shared_class_pairs
