"""Fake kernels and autograd for the scl ops.

The schemas of torch.ops.scl.supcon and torch.ops.scl.supcon_triton (the same op with the
Triton tile kernels) live in csrc/scl_ops.cpp; both share the fakes and autograd below.
"""
import functools

import torch

from ._extension import library_loaded

# The fused ops, each with its backward: scl::<name> and scl::<name>_backward.
FUSED_OPS = ("supcon", "supcon_triton")


def loss_dtype(dtype: torch.dtype) -> torch.dtype:
    """float32 for float16 / bfloat16 / float32 inputs, float64 for float64."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def _check_devices(features, labels, contrast, contrast_labels, temperature):
    """The fakes run instead of a real kernel whenever one argument is on the meta device, so
    they repeat the kernels' device checks; a CPU temperature goes with any device."""
    for name, tensor in (("labels", labels), ("contrast", contrast), ("contrast_labels", contrast_labels)):
        if tensor is not None and tensor.device != features.device:
            raise ValueError(f"{name} is on {tensor.device} but features is on {features.device}")
    if temperature.device not in (features.device, torch.device("cpu")):
        raise ValueError(f"temperature is on {temperature.device} but features is on {features.device}")


def _fake_forward(features, labels, contrast, contrast_labels, temperature, num_anchors, normalize,
                  anchor_offset=0):
    _check_devices(features, labels, contrast, contrast_labels, temperature)
    m = num_anchors if contrast is None else features.shape[0]
    return (features.new_empty((m,), dtype=loss_dtype(features.dtype)),
            features.new_empty((m,), dtype=torch.float64),
            features.new_empty((m,), dtype=torch.int64))


def _fake_backward(grad_loss, features, labels, contrast, contrast_labels, temperature,
                   num_anchors, normalize, lse, anchor_offset=0):
    _check_devices(features, labels, contrast, contrast_labels, temperature)
    grad_contrast = (features.new_empty((0, features.shape[1])) if contrast is None
                     else torch.empty_like(contrast))
    return torch.empty_like(features), grad_contrast, torch.empty_like(temperature)


def _setup_context(ctx, inputs, output):
    (features, labels, contrast, contrast_labels, temperature, num_anchors, normalize,
     *anchor_offset) = inputs
    _, lse, num_positives = output
    ctx.save_for_backward(features, labels, contrast, contrast_labels, temperature, lse)
    ctx.num_anchors = num_anchors
    ctx.normalize = normalize
    ctx.anchor_offset = anchor_offset[0] if anchor_offset else 0
    ctx.mark_non_differentiable(lse, num_positives)


def _backward(backward_op, ctx, grad_loss, _grad_lse, _grad_num_positives):
    features, labels, contrast, contrast_labels, temperature, lse = ctx.saved_tensors
    grad_features, grad_contrast, grad_temperature = backward_op(
        grad_loss, features, labels, contrast, contrast_labels, temperature, ctx.num_anchors,
        ctx.normalize, lse, ctx.anchor_offset)
    needs = ctx.needs_input_grad
    return (grad_features if needs[0] else None, None,
            grad_contrast if contrast is not None and needs[2] else None, None,
            grad_temperature if needs[4] else None, None, None, None)


def _refuse_double_backward(ctx, *grads):
    raise RuntimeError("scl_kernels' SupCon ops have no second derivative (create_graph=True "
                       "through the loss); use backend='reference' for double backward")


def _register_fakes_and_autograd(name: str) -> None:
    torch.library.register_fake(f"scl::{name}")(_fake_forward)
    torch.library.register_fake(f"scl::{name}_backward")(_fake_backward)
    backward_op = getattr(torch.ops.scl, f"{name}_backward").default
    torch.library.register_autograd(f"scl::{name}", functools.partial(_backward, backward_op),
                                    setup_context=_setup_context)
    # Without an autograd kernel, create_graph=True would silently differentiate nothing.
    torch.library.register_autograd(f"scl::{name}_backward", _refuse_double_backward,
                                    setup_context=lambda ctx, inputs, output: None)


if library_loaded():
    for _name in FUSED_OPS:
        _register_fakes_and_autograd(_name)
