"""The backward's per-anchor weights in one Triton kernel (scl::TileKernels::anchor_weights, run
before the tiles in the op scl::supcon_triton_weights_grads_and_assembly, grouped_stages.py;
csrc/core/tile_kernels.h states the formulas): each anchor's upstream gradient kept where it has
positives, its positive weight, the tiles' coefficient for the schedule (and the log-sum-exp split
for the plain one), and its weighted unit row added to its class's sum (where the assembly needs
the weighted sums: classes > 0). On a GPU
the core's ATen form of these steps is about twenty launches (conversions, float64 arithmetic, an
exp, the weighted class sums); here it is one, after the sums' zeroed buffer where there are
sums.
"""
import torch
import triton
import triton.language as tl

from .handles import CompiledKernels
from .kernels import inverse_temperature
from .launch import cdiv, next_power_of_2
from .row_preparation import add_rows_to_classes

BLOCK_M = 32
MAX_BLOCK_D = 64


@triton.jit(do_not_specialize=["temperature"])
def anchor_weights_kernel(grad_ptr, counted_ptr, lse_ptr, positives_ptr, q_ptr, q_inv_norm_ptr,
                          class_ptr, weighted_ptr, weight_ptr, coef_ptr, lse_hi_ptr, lse_lo_ptr,
                          temperature, M, D, grad_stride, SYMMETRIC: tl.constexpr,
                          MEAN: tl.constexpr, WEIGHTED_SUMS: tl.constexpr,
                          BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr):
    """One program per BLOCK_M anchors: the scalars in float64 where the core takes them so
    (1/t: kernels.inverse_temperature of `temperature`, a launch.Temperature), then,
    with WEIGHTED_SUMS, one pass over D adding w_a u_a to its class's row by atomics. With MEAN,
    grad is the mean's and counted the number of anchors with positives (the forward's): each
    anchor's share is grad / counted, divided in float32 as autograd's division of the mean
    did."""
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    valid = rows < M
    positives = tl.load(positives_ptr + rows, mask=valid, other=0)
    g = tl.load(grad_ptr + rows * grad_stride, mask=valid, other=0.0).to(tl.float32)
    if MEAN:
        g = g / tl.maximum(tl.load(counted_ptr), 1.0).to(tl.float32)
    g = tl.where(positives > 0, g, 0.0)
    weight = g / tl.maximum(positives, 1).to(tl.float32)
    tl.store(weight_ptr + rows, weight, mask=valid)
    lse = tl.load(lse_ptr + rows, mask=valid, other=0.0)
    g64 = g.to(tl.float64)
    inv_t = tl.zeros([BLOCK_M], dtype=tl.float64) + inverse_temperature(temperature)
    if SYMMETRIC:
        # Zero-gradient rows must not evaluate exp(1/t - lse): lse may be -inf there.
        shifted = tl.where(g64 != 0, inv_t - lse, 0.0)
        coef = tl.where(g64 != 0, g64 * tl.exp(shifted) * inv_t, 0.0)
        tl.store(coef_ptr + rows, coef.to(tl.float32), mask=valid)
    else:
        tl.store(coef_ptr + rows, (g64 * inv_t).to(tl.float32), mask=valid)
        # A row without columns (lse -inf) has coef 0 and never reads its lse: lo 0 there,
        # without evaluating -inf - -inf.
        finite = lse > float("-inf")
        bounded = tl.where(finite, lse, 0.0)
        lo = bounded - bounded.to(tl.float32).to(tl.float64)
        tl.store(lse_hi_ptr + rows, lse.to(tl.float32), mask=valid)
        tl.store(lse_lo_ptr + rows, lo.to(tl.float32), mask=valid)
    if WEIGHTED_SUMS:
        scale = tl.load(q_inv_norm_ptr + rows, mask=valid, other=0.0) * weight
        classes = tl.load(class_ptr + rows, mask=valid, other=0)
        add_rows_to_classes(weighted_ptr, q_ptr, rows, valid & (weight != 0), classes, scale, D,
                            BLOCK_D)


ANCHOR_WEIGHTS = CompiledKernels(anchor_weights_kernel)


def anchor_weights(grad_loss, anchors_with_positives, lse, num_positives, q, q_inv_norm,
                   anchor_class, classes, temperature, symmetric):
    """(weight [m], weighted_sums [classes, d], coef [m], lse_hi, lse_lo), all float32, the lse
    parts None for the symmetric schedule; anchors_with_positives None, or the 0-dim count that
    divides a 0-dim grad_loss (the mean's); classes 0: no weighted sums (None); `temperature`: a
    launch.Temperature."""
    mean = anchors_with_positives is not None
    m, d = q.shape
    q = q.contiguous()
    weight, coef = (torch.empty(m, dtype=torch.float32, device=q.device) for _ in range(2))
    weighted_sums = (torch.zeros(classes, d, dtype=torch.float32, device=q.device)
                     if classes > 0 else None)
    lse_hi, lse_lo = (None, None) if symmetric else (
        torch.empty(m, dtype=torch.float32, device=q.device) for _ in range(2))
    # grad_loss as it comes: one value (0-dim, or expanded with stride 0) for a mean's gradient.
    # Placeholder pointers where a constexpr keeps the kernel off them: the weighted sums
    # without classes, the symmetric schedule's lse parts, the count without MEAN.
    lse = lse.double().contiguous()
    ANCHOR_WEIGHTS(
        (cdiv(m, BLOCK_M),),
        grad_loss, anchors_with_positives if mean else lse, lse, num_positives.contiguous(), q,
        q_inv_norm.contiguous(), anchor_class.contiguous(),
        coef if weighted_sums is None else weighted_sums, weight, coef,
        coef if symmetric else lse_hi, coef if symmetric else lse_lo,
        temperature.argument, m, d, grad_loss.stride(0) if grad_loss.dim() else 0,
        SYMMETRIC=symmetric, MEAN=mean, WEIGHTED_SUMS=classes > 0, BLOCK_M=BLOCK_M, BLOCK_D=min(MAX_BLOCK_D, next_power_of_2(d)))
    return weight, weighted_sums, coef, lse_hi, lse_lo
