// The SupCon op written once for every backend: validation -> O(N*D) terms -> the backend's
// tile kernels -> gradient assembly. A backend's kernel of scl::supcon (or of its own op name)
// is these two functions with its TileKernels.
#pragma once

#include <ATen/ATen.h>

#include <string>
#include <tuple>

#include "supcon_problem.h"
#include "tile_kernels.h"

namespace scl {

// The plan of a call with these arguments (call_plan.h), described: scl_kernels.explain.
std::string supcon_plan(const TileKernels& kernels, const SupConArgs& args);

// (per-anchor loss in the loss dtype, float64 log-sum-exp per anchor, |P(i)| as int64)
OpOutputs supcon_forward(const TileKernels& kernels, const SupConArgs& args);

// (grad features, grad contrast ([0, D] without a contrast set), grad temperature: zeros
// unless temperature_grad)
OpOutputs supcon_backward(const TileKernels& kernels, const at::Tensor& grad_loss,
                          const SupConArgs& args, const at::Tensor& lse, bool temperature_grad);

// The op's kernels for TORCH_LIBRARY_IMPL, bound to one backend's tile kernels:
//   m.impl("supcon", &FusedOpKernels<cpu_kernels>::forward);
// Their parameters are the schemas' (call_arguments.h).
template <const TileKernels& (*kKernels)()>
struct FusedOpKernels {
  static OpOutputs forward(SCL_FORWARD_PARAMETERS) {
    return supcon_forward(kKernels(), {SCL_FORWARD_ARGUMENTS});
  }

  static std::string plan(SCL_FORWARD_PARAMETERS) {
    return supcon_plan(kKernels(), {SCL_FORWARD_ARGUMENTS});
  }

  static OpOutputs backward(SCL_BACKWARD_PARAMETERS) {
    return supcon_backward(kKernels(), grad_loss, {SCL_FORWARD_ARGUMENTS}, lse, temperature_grad);
  }
};

}  // namespace scl
