// Autograd of a fused op pair (forward and backward schemas of csrc/op_schemas.h): forward saves
// the inputs and the float64 log-sum-exp (O(N)), backward calls the op's backward. In C++ rather
// than torch.library.register_autograd because a Python autograd wrapper costs more than the
// whole computation at fine-tuning batch sizes (measured in
// bench/decisions/2026-11-22-small-batches-baseline.md; the C++ autograd's gain in
// bench/decisions/2026-11-22-small-batches-shared-core.md). Each op pair registers
// supcon_autograd<Names> and supcon_backward_autograd<Names> for its Autograd key, Names giving its
// schema names (csrc/autograd.cpp, csrc/testing).
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/autograd.h>
#include <torch/library.h>

#include <optional>
#include <tuple>

#include "core/prepared_handoff.h"

namespace scl::autograd {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

using Outputs = std::tuple<at::Tensor, at::Tensor, at::Tensor>;
using ForwardSignature = Outputs(const at::Tensor&, const at::Tensor&,
                                 const std::optional<at::Tensor>&,
                                 const std::optional<at::Tensor>&, const at::Tensor&, int64_t,
                                 bool, int64_t, double, bool);
using BackwardSignature = Outputs(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                  const std::optional<at::Tensor>&,
                                  const std::optional<at::Tensor>&, const at::Tensor&, int64_t,
                                  bool, const at::Tensor&, int64_t, bool, double, bool);

inline std::optional<at::Tensor> present(const at::Tensor& t) {
  return t.defined() ? std::optional<at::Tensor>(t) : std::nullopt;
}

// One instantiation per op; Names supplies the schema names.
template <typename Names>
struct SupConFunction : public torch::autograd::Function<SupConFunction<Names>> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& features,
                               const at::Tensor& labels, const std::optional<at::Tensor>& contrast,
                               const std::optional<at::Tensor>& contrast_labels,
                               const at::Tensor& temperature, int64_t num_anchors, bool normalize,
                               int64_t anchor_offset, double focal_gamma, bool mean) {
    static const auto op = c10::Dispatcher::singleton()
                               .findSchemaOrThrow(Names::kForward, "")
                               .template typed<ForwardSignature>();
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    CaptureForward capture;
    auto [loss, lse, num_positives] = op.call(features, labels, contrast, contrast_labels,
                                              temperature, num_anchors, normalize, anchor_offset,
                                              focal_gamma, mean);
    ctx->save_for_backward({features, labels, contrast.value_or(at::Tensor()),
                            contrast_labels.value_or(at::Tensor()), temperature, lse});
    ctx->saved_data["prepared"] = capture.take();
    ctx->saved_data["num_anchors"] = num_anchors;
    ctx->saved_data["normalize"] = normalize;
    ctx->saved_data["anchor_offset"] = anchor_offset;
    ctx->saved_data["focal_gamma"] = focal_gamma;
    ctx->saved_data["mean"] = mean;
    ctx->mark_non_differentiable({lse, num_positives});
    // Gradients of lse and num_positives never exist: zeros for them would be two launches.
    ctx->set_materialize_grads(false);
    return {loss, lse, num_positives};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    static const auto op = c10::Dispatcher::singleton()
                               .findSchemaOrThrow(Names::kBackward, "")
                               .template typed<BackwardSignature>();
    // Through the dispatcher with autograd: under create_graph=True the gradients get
    // SupConBackwardFunction's node, which refuses a second derivative.
    const variable_list saved = ctx->get_saved_variables();
    const at::Tensor& contrast = saved[2];
    const at::Tensor& grad_loss = grads[0];
    variable_list out(10);  // one per forward argument
    if (!grad_loss.defined()) return out;
    const ReuseInBackward reuse(ctx->saved_data["prepared"]);
    // Absent optional tensors have no edge: temperature is input edge 2 without a contrast set.
    const bool temperature_grad = ctx->needs_input_grad(contrast.defined() ? 4 : 2);
    auto [grad_features, grad_contrast, grad_temperature] =
        op.call(grad_loss, saved[0], saved[1], present(contrast), present(saved[3]), saved[4],
                ctx->saved_data["num_anchors"].toInt(), ctx->saved_data["normalize"].toBool(),
                saved[5], ctx->saved_data["anchor_offset"].toInt(), temperature_grad,
                ctx->saved_data["focal_gamma"].toDouble(), ctx->saved_data["mean"].toBool());
    // The op computes the row gradients together; autograd drops those no input asked for.
    out[0] = grad_features;
    if (contrast.defined()) out[2] = grad_contrast;
    if (temperature_grad) out[4] = grad_temperature;
    return out;
  }
};

// The backward op's own autograd: no second derivative. Differentiating nothing instead would
// return a silently wrong (zero) second derivative.
template <typename Names>
struct SupConBackwardFunction : public torch::autograd::Function<SupConBackwardFunction<Names>> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& grad_loss,
                               const at::Tensor& features, const at::Tensor& labels,
                               const std::optional<at::Tensor>& contrast,
                               const std::optional<at::Tensor>& contrast_labels,
                               const at::Tensor& temperature, int64_t num_anchors, bool normalize,
                               const at::Tensor& lse, int64_t anchor_offset,
                               bool temperature_grad, double focal_gamma, bool mean) {
    static const auto op = c10::Dispatcher::singleton()
                               .findSchemaOrThrow(Names::kBackward, "")
                               .template typed<BackwardSignature>();
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    auto [grad_features, grad_contrast, grad_temperature] =
        op.call(grad_loss, features, labels, contrast, contrast_labels, temperature, num_anchors,
                normalize, lse, anchor_offset, temperature_grad, focal_gamma, mean);
    return {grad_features, grad_contrast, grad_temperature};
  }

  static variable_list backward(AutogradContext*, variable_list) {
    TORCH_CHECK(false,
                "scl_kernels' SupCon ops have no second derivative (create_graph=True through "
                "the loss); use backend='reference' for double backward");
    return {};
  }
};

template <typename Names>
Outputs supcon_backward_autograd(const at::Tensor& grad_loss, const at::Tensor& features,
                                 const at::Tensor& labels,
                                 const std::optional<at::Tensor>& contrast,
                                 const std::optional<at::Tensor>& contrast_labels,
                                 const at::Tensor& temperature, int64_t num_anchors,
                                 bool normalize, const at::Tensor& lse, int64_t anchor_offset,
                                 bool temperature_grad, double focal_gamma, bool mean) {
  const variable_list out = SupConBackwardFunction<Names>::apply(
      grad_loss, features, labels, contrast, contrast_labels, temperature, num_anchors, normalize,
      lse, anchor_offset, temperature_grad, focal_gamma, mean);
  return {out[0], out[1], out[2]};
}

template <typename Names>
Outputs supcon_autograd(const at::Tensor& features, const at::Tensor& labels,
                        const std::optional<at::Tensor>& contrast,
                        const std::optional<at::Tensor>& contrast_labels,
                        const at::Tensor& temperature, int64_t num_anchors, bool normalize,
                        int64_t anchor_offset, double focal_gamma, bool mean) {
  const variable_list out = SupConFunction<Names>::apply(
      features, labels, contrast, contrast_labels, temperature, num_anchors, normalize,
      anchor_offset, focal_gamma, mean);
  return {out[0], out[1], out[2]};
}

}  // namespace scl::autograd
