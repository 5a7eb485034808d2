"""The Triton implementation of scl::supcon and scl::supcon_backward.

It is the CUDA kernel of torch.ops.scl.supcon, and also the whole of torch.ops.scl.supcon_triton,
which accepts CPU tensors under TRITON_INTERPRET=1 so that the Triton path is tested on machines
without a GPU. Deterministic algorithms (torch.use_deterministic_algorithms) select the
atomic-free schedule.
"""
import math

import torch

from .._op import loss_dtype
from . import launch
from .problem import (add_positive_grads, anchor_dot, anchor_losses, effective_grads, prepare,
                      temperature_grad, unit_backward)

# exp2(s2 - log2(e)/t) >= 2^(-2 log2(e)/t) must stay a normal fp32 number (KERNEL_MATH section 2).
_FIXED_SHIFT_MAX_INV_T = 0.95 * 126 / (2 * (1.0 / math.log(2.0)))


def fixed_shift_applies(single_set, m, n, normalize, temperature):
    """Single set with every row an anchor (S = S^T), unit rows and a temperature inside the
    fixed shift's range: the conditions of both symmetric kernels."""
    return single_set and m == n and normalize and 1.0 / temperature <= _FIXED_SHIFT_MAX_INV_T


def symmetric_schedule(single_set, m, n, normalize, temperature):
    """Whether the forward visits only the upper triangle of tiles (one exp per pair) rather
    than every tile: the fixed shift applies and deterministic algorithms are off (the triangle's
    row and column sums meet by atomics)."""
    return (fixed_shift_applies(single_set, m, n, normalize, temperature)
            and not torch.are_deterministic_algorithms_enabled())


def supcon_forward(features, labels, contrast, contrast_labels, temperature, num_anchors, normalize):
    p = prepare(features, labels, contrast, contrast_labels, temperature, num_anchors, normalize)
    if symmetric_schedule(p.single_set, p.m, p.n, p.normalize, 1.0 / p.inv_t):
        lse = launch.lse_symmetric(p.z, p.z_scale, p.inv_t)
    else:
        lse = launch.lse_plain(p.q, p.z, p.q_scale, p.z_scale, p.inv_t, p.single_set)
    dtype = loss_dtype(features.dtype)
    return anchor_losses(p, lse, dtype), lse.to(dtype), p.num_positives


def supcon_backward(grad_loss, features, labels, contrast, contrast_labels, temperature,
                    num_anchors, normalize, lse):
    p = prepare(features, labels, contrast, contrast_labels, temperature, num_anchors, normalize,
                check_values=False)
    g = effective_grads(p, grad_loss)
    lse = lse.float()
    deterministic = torch.are_deterministic_algorithms_enabled()
    if fixed_shift_applies(p.single_set, p.m, p.n, p.normalize, 1.0 / p.inv_t):
        # Zero-gradient rows must not evaluate exp(1/t - lse): lse may be -inf there.
        coef = torch.where(g != 0, g * torch.exp(p.inv_t - lse) * p.inv_t, 0.0).contiguous()
        dz = launch.grad_symmetric(p.z, p.z_scale, coef, p.inv_t, deterministic)
        dq = dz[: p.m]
        add_positive_grads(p, g, dq, dz)
        dot = anchor_dot(p, p.z, p.z_norm, dz) * 0.5  # each G_ij s_ij counted once per side
    else:
        coef = (g * p.inv_t).contiguous()
        dq, dz = launch.grad_plain(p.q, p.z, p.q_scale, p.z_scale, lse, coef, p.inv_t,
                                   p.single_set, deterministic)
        add_positive_grads(p, g, dq, dz)
        dot = anchor_dot(p, p.q, p.q_norm, dq)
        if p.single_set:
            dz[: p.m] += dq
    grad_t = temperature_grad(p, dot, temperature)
    if p.single_set:
        return (unit_backward(p, p.z, p.z_norm, dz, features.dtype),
                features.new_empty((0, p.d)), grad_t)
    return (unit_backward(p, p.q, p.q_norm, dq, features.dtype),
            unit_backward(p, p.z, p.z_norm, dz, contrast.dtype), grad_t)
