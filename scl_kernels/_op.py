"""Fake kernels and autograd for torch.ops.scl.supcon, whose schema and backends live in csrc/."""
import torch

from ._extension import library_loaded


def loss_dtype(dtype: torch.dtype) -> torch.dtype:
    """float32 for float16 / bfloat16 / float32 inputs, float64 for float64."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def _num_anchors(features, contrast, num_anchors):
    return num_anchors if contrast is None else features.shape[0]


def _fake_supcon(features, labels, contrast, contrast_labels, temperature, num_anchors, normalize):
    m = _num_anchors(features, contrast, num_anchors)
    dtype = loss_dtype(features.dtype)
    return (features.new_empty((m,), dtype=dtype), features.new_empty((m,), dtype=dtype),
            features.new_empty((m,), dtype=torch.int64))


def _fake_supcon_backward(grad_loss, features, labels, contrast, contrast_labels, temperature,
                          num_anchors, normalize, lse):
    grad_contrast = (features.new_empty((0, features.shape[1])) if contrast is None
                     else torch.empty_like(contrast))
    return torch.empty_like(features), grad_contrast, torch.empty_like(temperature)


def _setup_context(ctx, inputs, output):
    features, labels, contrast, contrast_labels, temperature, num_anchors, normalize = inputs
    _, lse, num_positives = output
    ctx.save_for_backward(features, labels, contrast, contrast_labels, temperature, lse)
    ctx.num_anchors = num_anchors
    ctx.normalize = normalize
    ctx.mark_non_differentiable(lse, num_positives)


def _backward(ctx, grad_loss, _grad_lse, _grad_num_positives):
    features, labels, contrast, contrast_labels, temperature, lse = ctx.saved_tensors
    grad_features, grad_contrast, grad_temperature = torch.ops.scl.supcon_backward(
        grad_loss, features, labels, contrast, contrast_labels, temperature, ctx.num_anchors,
        ctx.normalize, lse)
    needs = ctx.needs_input_grad
    return (grad_features if needs[0] else None, None,
            grad_contrast if contrast is not None and needs[2] else None, None,
            grad_temperature if needs[4] else None, None, None)


if library_loaded():
    torch.library.register_fake("scl::supcon")(_fake_supcon)
    torch.library.register_fake("scl::supcon_backward")(_fake_supcon_backward)
    torch.library.register_autograd("scl::supcon", _backward, setup_context=_setup_context)
