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
std::tuple<at::Tensor, at::Tensor, at::Tensor> supcon_forward(const TileKernels& kernels,
                                                              const SupConArgs& args);

// (grad features, grad contrast ([0, D] without a contrast set), grad temperature: zeros
// unless temperature_grad)
std::tuple<at::Tensor, at::Tensor, at::Tensor> supcon_backward(const TileKernels& kernels,
                                                               const at::Tensor& grad_loss,
                                                               const SupConArgs& args,
                                                               const at::Tensor& lse,
                                                               bool temperature_grad);

// The op's two kernels for TORCH_LIBRARY_IMPL, bound to one backend's tile kernels:
//   m.impl("supcon", &FusedOpKernels<cpu_kernels>::forward);
template <const TileKernels& (*kKernels)()>
struct FusedOpKernels {
  static std::tuple<at::Tensor, at::Tensor, at::Tensor> forward(
      const at::Tensor& features, const at::Tensor& labels, const std::optional<at::Tensor>& contrast,
      const std::optional<at::Tensor>& contrast_labels, const at::Tensor& temperature,
      int64_t num_anchors, bool normalize, int64_t anchor_offset, double focal_gamma, bool mean) {
    return supcon_forward(kKernels(), {features, labels, contrast, contrast_labels, temperature,
                                       num_anchors, normalize, anchor_offset, focal_gamma, mean});
  }

  static std::string plan(const at::Tensor& features, const at::Tensor& labels,
                          const std::optional<at::Tensor>& contrast,
                          const std::optional<at::Tensor>& contrast_labels,
                          const at::Tensor& temperature, int64_t num_anchors, bool normalize,
                          int64_t anchor_offset, double focal_gamma, bool mean) {
    return supcon_plan(kKernels(), {features, labels, contrast, contrast_labels, temperature,
                                    num_anchors, normalize, anchor_offset, focal_gamma, mean});
  }

  static std::tuple<at::Tensor, at::Tensor, at::Tensor> backward(
      const at::Tensor& grad_loss, const at::Tensor& features, const at::Tensor& labels,
      const std::optional<at::Tensor>& contrast, const std::optional<at::Tensor>& contrast_labels,
      const at::Tensor& temperature, int64_t num_anchors, bool normalize, const at::Tensor& lse,
      int64_t anchor_offset, bool temperature_grad, double focal_gamma, bool mean) {
    return supcon_backward(kKernels(), grad_loss,
                           {features, labels, contrast, contrast_labels, temperature, num_anchors,
                            normalize, anchor_offset, focal_gamma, mean},
                           lse, temperature_grad);
  }
};

}  // namespace scl
