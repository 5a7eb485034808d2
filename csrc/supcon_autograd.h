// Autograd of a fused op pair (forward and backward schemas of csrc/core/call_arguments.h):
// forward saves the inputs and the float64 log-sum-exp (O(N)), backward calls the op's backward.
// In C++ rather than torch.library.register_autograd because a Python autograd wrapper costs
// more than the whole computation at fine-tuning batch sizes (measured in
// bench/decisions/2026-11-22-small-batches-baseline.md; the C++ autograd's gain in
// bench/decisions/2026-11-22-small-batches-shared-core.md). Each op pair registers
// supcon_autograd<Names> and supcon_backward_autograd<Names> for its Autograd key, Names giving
// its schema names (csrc/autograd.cpp, csrc/cuda_dry_run/ops.cpp).
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/autograd.h>
#include <torch/library.h>

#include <optional>
#include <string_view>
#include <type_traits>
#include <vector>

#include "core/call_arguments.h"
#include "core/prepared_handoff.h"

namespace scl::autograd {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// What forward keeps of one argument for backward: tensors go to save_for_backward in the
// arguments' order (an absent one as an undefined tensor), other values to saved_data by name.
inline void keep(AutogradContext*, const char*, const at::Tensor& value,
                 std::vector<at::Tensor>& tensors) {
  tensors.push_back(value);
}
inline void keep(AutogradContext*, const char*, const std::optional<at::Tensor>& value,
                 std::vector<at::Tensor>& tensors) {
  tensors.push_back(value.value_or(at::Tensor()));
}
template <typename Value>
void keep(AutogradContext* ctx, const char* name, Value value, std::vector<at::Tensor>&) {
  ctx->saved_data[name] = value;
}

// The argument back in backward; `next` walks the saved tensors in the order keep() saved them.
template <typename Value>
Value kept(AutogradContext* ctx, const char* name, const variable_list& saved, size_t& next) {
  if constexpr (std::is_same_v<Value, at::Tensor>) {
    return saved[next++];
  } else if constexpr (std::is_same_v<Value, std::optional<at::Tensor>>) {
    return present(saved[next++]);
  } else {
    return ctx->saved_data[name].to<Value>();
  }
}

// Whether an argument is an input edge of the node: autograd gives edges to the tensors present
// only, so needs_input_grad counts neither absent optional tensors nor other values.
inline bool is_edge(const at::Tensor& value) { return value.defined(); }
inline bool is_edge(const std::optional<at::Tensor>& value) {
  return value.has_value() && value->defined();
}
template <typename Value>
bool is_edge(const Value&) {
  return false;
}

#define SCL_NAME_STRING(type, name, schema) #name,
inline constexpr std::string_view kArgumentNames[] = {
    SCL_CALL_ARGUMENTS(SCL_NAME_STRING, SCL_NAME_STRING)};
#undef SCL_NAME_STRING

// An argument's position in the forward's arguments: its slot in the gradients backward returns.
constexpr size_t position_of(std::string_view name) {
  for (size_t i = 0; i < std::size(kArgumentNames); ++i) {
    if (kArgumentNames[i] == name) return i;
  }
  throw "no such argument";  // a compile-time error where a constant is asked for
}

// One instantiation per op; Names supplies the schema names.
template <typename Names>
struct SupConFunction : public torch::autograd::Function<SupConFunction<Names>> {
  static variable_list forward(AutogradContext* ctx, SCL_FORWARD_PARAMETERS) {
    static const auto op = c10::Dispatcher::singleton()
                               .findSchemaOrThrow(Names::kForward, "")
                               .template typed<ForwardSignature>();
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    CaptureForward capture;
    auto [loss, lse, num_positives] = op.call(SCL_FORWARD_ARGUMENTS);
    std::vector<at::Tensor> tensors;
#define SCL_KEEP(type, name, schema) keep(ctx, #name, name, tensors);
    SCL_CALL_ARGUMENTS(SCL_KEEP, SCL_KEEP)
#undef SCL_KEEP
    tensors.push_back(lse);
    ctx->save_for_backward(tensors);
    ctx->saved_data["prepared"] = capture.take();
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
    variable_list out(std::size(kArgumentNames));
    const at::Tensor& grad_loss = grads[0];
    if (!grad_loss.defined()) return out;
    const variable_list saved = ctx->get_saved_variables();
    size_t next = 0, edge = 0;
#define SCL_RESTORE(type, name, schema)                                             \
  const auto name = kept<std::decay_t<type>>(ctx, #name, saved, next);            \
  [[maybe_unused]] const size_t name##_edge = edge;                                \
  edge += is_edge(name);
    SCL_CALL_ARGUMENTS(SCL_RESTORE, SCL_RESTORE)
#undef SCL_RESTORE
    const at::Tensor& lse = saved[next];
    const ReuseInBackward reuse(ctx->saved_data["prepared"]);
    const bool temperature_grad = ctx->needs_input_grad(temperature_edge);
    auto [grad_features, grad_contrast, grad_temperature] = op.call(SCL_BACKWARD_ARGUMENTS);
    // The op computes the row gradients together; autograd drops those no input asked for.
    static constexpr size_t kFeatures = position_of("features");
    static constexpr size_t kContrast = position_of("contrast");
    static constexpr size_t kTemperature = position_of("temperature");
    out[kFeatures] = grad_features;
    if (contrast.has_value()) out[kContrast] = grad_contrast;
    if (temperature_grad) out[kTemperature] = grad_temperature;
    return out;
  }
};

// The backward op's own autograd: no second derivative. Differentiating nothing instead would
// return a silently wrong (zero) second derivative.
template <typename Names>
struct SupConBackwardFunction : public torch::autograd::Function<SupConBackwardFunction<Names>> {
  static variable_list forward(AutogradContext*, SCL_BACKWARD_PARAMETERS) {
    static const auto op = c10::Dispatcher::singleton()
                               .findSchemaOrThrow(Names::kBackward, "")
                               .template typed<BackwardSignature>();
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    auto [grad_features, grad_contrast, grad_temperature] = op.call(SCL_BACKWARD_ARGUMENTS);
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
OpOutputs supcon_backward_autograd(SCL_BACKWARD_PARAMETERS) {
  const variable_list out = SupConBackwardFunction<Names>::apply(SCL_BACKWARD_ARGUMENTS);
  return {out[0], out[1], out[2]};
}

template <typename Names>
OpOutputs supcon_autograd(SCL_FORWARD_PARAMETERS) {
  const variable_list out = SupConFunction<Names>::apply(SCL_FORWARD_ARGUMENTS);
  return {out[0], out[1], out[2]};
}

}  // namespace scl::autograd
