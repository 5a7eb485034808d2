"""The forward's finish in one Triton kernel (scl::TileKernels::anchor_losses, run after the
tiles in the op scl::supcon_triton_lse_and_losses, grouped_stages.py): per anchor,
l_i = lse_i - u_i . (C_{y_i} - [self] u_i) / (t |P(i)|), 0 without positives (docs/MATH.md,
"Forward"). On a GPU the core's ATen form of the same
step is a dozen launches (a gather of class-sum rows, a subtraction, a product, a row sum, the
float64 arithmetic); here it is one. With mean (the caller's "mean" reduction inside the op) the
same kernel also reduces: each program adds its anchors' loss and count of anchors with positives
into a zeroed float64 buffer and takes a ticket; the last program to finish divides, so the mean
costs no launch of its own (the preparation's fill zeroes the buffer; docs/MATH.md, "The mean").
"""
import torch
import triton
import triton.language as tl

from .handles import CompiledKernels
from .kernels import inverse_temperature
from .launch import cdiv, next_power_of_2

BLOCK_M = 32
MAX_BLOCK_D = 64


@triton.jit(do_not_specialize=["temperature"])
def anchor_losses_kernel(q_ptr, q_inv_norm_ptr, class_sums_ptr, anchor_class_ptr,
                         num_positives_ptr, lse_ptr, out_ptr, mean_sums_ptr, temperature, M, D,
                         q_stride, sums_stride, SINGLE_SET: tl.constexpr, MEAN: tl.constexpr,
                         BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr):
    """One program per BLOCK_M anchors: the dot product u_i . (C_{y_i} - [self] u_i) in the
    dtype of the class sums (the core's compute dtype), over D in BLOCK_D steps; then the mean
    over positives and the difference from lse in float64, stored in the class sums' dtype, or,
    with MEAN, added to mean_sums = [loss sum, anchors with positives, programs done] (float64,
    zeroed), the last program storing the mean. 1/t in float64: kernels.inverse_temperature of
    `temperature` (launch.Temperature)."""
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    valid = rows < M
    classes = tl.load(anchor_class_ptr + rows, mask=valid, other=0)
    scale = tl.load(q_inv_norm_ptr + rows, mask=valid, other=0.0)
    dot = tl.zeros([BLOCK_M], dtype=class_sums_ptr.dtype.element_ty)
    for d0 in range(0, D, BLOCK_D):
        ks = d0 + tl.arange(0, BLOCK_D)
        inside = valid[:, None] & (ks < D)[None, :]
        x = tl.load(q_ptr + rows[:, None] * q_stride + ks[None, :], mask=inside, other=0.0)
        unit = x.to(dot.dtype) * scale[:, None]
        target = tl.load(class_sums_ptr + classes[:, None] * sums_stride + ks[None, :],
                         mask=inside, other=0.0)
        if SINGLE_SET:
            target = target - unit
        dot += tl.sum(unit * target, axis=1)
    positives = tl.load(num_positives_ptr + rows, mask=valid, other=0)
    lse = tl.load(lse_ptr + rows, mask=valid, other=0.0)
    scaled = dot.to(tl.float64) * inverse_temperature(temperature)
    mean_positive = scaled / tl.maximum(positives, 1).to(tl.float64)
    loss = tl.where(positives > 0, lse - mean_positive, 0.0)
    if MEAN:
        # acq_rel atomics: the ticket's release orders this program's two adds before it, and
        # the last ticket's acquire sees every program's.
        tl.atomic_add(mean_sums_ptr, tl.sum(loss))
        tl.atomic_add(mean_sums_ptr + 1, tl.sum((positives > 0).to(tl.float64)))
        done = tl.atomic_add(mean_sums_ptr + 2, 1.0) + 1.0
        if done == tl.num_programs(0):
            total = tl.atomic_add(mean_sums_ptr, 0.0)
            counted = tl.atomic_add(mean_sums_ptr + 1, 0.0)
            tl.store(out_ptr, (total / tl.maximum(counted, 1.0)).to(out_ptr.dtype.element_ty))
    else:
        tl.store(out_ptr + rows, loss.to(out_ptr.dtype.element_ty), mask=valid)


ANCHOR_LOSSES = CompiledKernels(anchor_losses_kernel)


def anchor_losses(q, q_inv_norm, class_sums, anchor_class, num_positives, lse, temperature,
                  single_set, mean_sums):
    """[m] per-anchor losses in class_sums' dtype, or, given mean_sums (the zeroed float64
    [loss sum, anchors with positives, programs done]; else None), their 0-dim mean over the
    anchors with positives, mean_sums left holding the totals; `temperature`: a
    launch.Temperature."""
    m, d = q.shape
    q = q.contiguous()
    mean = mean_sums is not None
    out = torch.empty(() if mean else m, dtype=class_sums.dtype, device=q.device)
    if mean and m == 0:  # no program would store the mean
        return out.zero_()
    # Without mean the kernel never touches mean_sums: lse stands in for its pointer.
    ANCHOR_LOSSES(
        (cdiv(m, BLOCK_M),),
        q, q_inv_norm.contiguous(), class_sums.contiguous(), anchor_class.contiguous(),
        num_positives.contiguous(), lse, out, mean_sums if mean else lse,
        temperature.argument, m, d, q.stride(0), class_sums.stride(0), SINGLE_SET=single_set,
        MEAN=mean, BLOCK_M=BLOCK_M, BLOCK_D=min(MAX_BLOCK_D, next_power_of_2(d)))
    return out
