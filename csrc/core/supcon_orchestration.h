// The SupCon op written once for every backend: validation -> O(N*D) terms -> the backend's
// tile kernels -> gradient assembly. A backend's kernel of scl::supcon (or of its own op name)
// is these two functions with its TileKernels.
#pragma once

#include <ATen/ATen.h>

#include <tuple>

#include "supcon_problem.h"
#include "tile_kernels.h"

namespace scl {

// (per-anchor loss in the loss dtype, float64 log-sum-exp per anchor, |P(i)| as int64)
std::tuple<at::Tensor, at::Tensor, at::Tensor> supcon_forward(const TileKernels& kernels,
                                                              const SupConArgs& args);

// (grad features, grad contrast ([0, D] without a contrast set), grad temperature)
std::tuple<at::Tensor, at::Tensor, at::Tensor> supcon_backward(const TileKernels& kernels,
                                                               const at::Tensor& grad_loss,
                                                               const SupConArgs& args,
                                                               const at::Tensor& lse);

// True when exp(s - 1/t) cannot underflow for unit rows (|s| <= 1/t) in `compute_type`: the
// condition of the fixed shift that the symmetric schedule relies on.
bool fixed_shift_is_safe(double inv_t, at::ScalarType compute_type);

}  // namespace scl
