"""The backward's assembly for one output's rows in one Triton kernel
(scl::TileKernels::assemble_backward, through the op scl::supcon_triton_assemble_backward, and
after the tiles in scl::supcon_triton_weights_grads_and_assembly, grouped_stages.py;
csrc/core/tile_kernels.h states the formula): the tiles' gradient w.r.t. the unit rows plus the
positive pairs' part, then back through the normalisation, and each row's u . d for the
temperature's gradient. On a GPU the core's ATen form of these steps is about three dozen
launches (gathers of class-sum rows, products, subtractions, row sums, the projection); here it is
one per output.
"""
import torch
import triton
import triton.language as tl

from .handles import CompiledKernels
from .kernels import inverse_temperature
from .launch import cdiv, next_power_of_2, temperature_of

BLOCK_R = 16
MAX_BLOCK_D = 64


@triton.jit
def _row_gradient(x_ptr, grads_ptr, extra_ptr, class_sums_ptr, weighted_ptr, rows, anchors,
                  is_anchor, valid, scale, anchor_scale, anchor_class, row_class, ks, D,
                  inv_t, EXTRA: tl.constexpr, ANCHOR_PART: tl.constexpr,
                  SELF_IN_CLASS: tl.constexpr, ROW_PART: tl.constexpr,
                  CLASS_SHARES_WEIGHT: tl.constexpr):
    """The unit rows u and the gradient d w.r.t. them, columns ks of the block's rows (float32).
    Every [*, D] operand is contiguous: D is each one's row stride."""
    inside = valid[:, None] & (ks < D)[None, :]
    unit = tl.load(x_ptr + rows[:, None] * D + ks[None, :], mask=inside,
                   other=0.0).to(tl.float32) * scale[:, None]
    d = tl.load(grads_ptr + rows[:, None] * D + ks[None, :], mask=inside, other=0.0)
    at_anchor = is_anchor[:, None] & (ks < D)[None, :]
    if EXTRA:
        d += tl.load(extra_ptr + anchors[:, None] * D + ks[None, :], mask=at_anchor,
                     other=0.0)
    if ANCHOR_PART:
        target = tl.load(class_sums_ptr + anchor_class[:, None] * D + ks[None, :],
                         mask=at_anchor, other=0.0)
        if CLASS_SHARES_WEIGHT:
            # W_c = w_r C_c: the contrast part is the class sum once more
            target = 2 * target
        if SELF_IN_CLASS:
            # the anchor's own row: out of its class sum, and its own share as a column
            target = target - 2 * unit
        d -= anchor_scale[:, None] * target
    if ROW_PART:
        d -= inv_t * tl.load(weighted_ptr + row_class[:, None] * D + ks[None, :],
                             mask=inside, other=0.0)
    return unit, d


@triton.jit(do_not_specialize=["temperature"])
def assemble_backward_kernel(x_ptr, inv_norm_ptr, grads_ptr, extra_ptr, anchor_weight_ptr,
                             anchor_class_ptr, class_sums_ptr, row_class_ptr, weighted_ptr,
                             out_ptr, dot_ptr, temperature, R, D, anchor_offset,
                             anchor_count, max_inv_norm, EXTRA: tl.constexpr,
                             ANCHOR_PART: tl.constexpr, SELF_IN_CLASS: tl.constexpr,
                             ROW_PART: tl.constexpr, CLASS_SHARES_WEIGHT: tl.constexpr,
                             NORMALIZE: tl.constexpr, BLOCK_R: tl.constexpr,
                             BLOCK_D: tl.constexpr):
    """One program per BLOCK_R rows, two passes over D in BLOCK_D steps: the first sums
    u . d, which the projection needs, the second writes the rows' gradients. 1/t in float32:
    kernels.inverse_temperature of `temperature` (launch.Temperature), rounded once."""
    inv_t = inverse_temperature(temperature).to(tl.float32)
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    valid = rows < R
    scale = tl.load(inv_norm_ptr + rows, mask=valid, other=0.0)
    anchors = rows - anchor_offset
    is_anchor = valid & (anchors >= 0) & (anchors < anchor_count)
    anchor_scale = tl.zeros([BLOCK_R], dtype=tl.float32)
    anchor_class = tl.zeros([BLOCK_R], dtype=tl.int64)
    row_class = tl.zeros([BLOCK_R], dtype=tl.int64)
    if ANCHOR_PART:
        anchor_scale = tl.load(anchor_weight_ptr + anchors, mask=is_anchor, other=0.0) * inv_t
        anchor_class = tl.load(anchor_class_ptr + anchors, mask=is_anchor, other=0)
    if ROW_PART:
        row_class = tl.load(row_class_ptr + rows, mask=valid, other=0)
    dot = tl.zeros([BLOCK_R], dtype=tl.float32)
    for d0 in range(0, D, BLOCK_D):
        unit, d = _row_gradient(x_ptr, grads_ptr, extra_ptr, class_sums_ptr, weighted_ptr, rows,
                                anchors, is_anchor, valid, scale, anchor_scale, anchor_class,
                                row_class, d0 + tl.arange(0, BLOCK_D), D, inv_t, EXTRA,
                                ANCHOR_PART, SELF_IN_CLASS, ROW_PART, CLASS_SHARES_WEIGHT)
        dot += tl.sum(unit * d, axis=1)
    tl.store(dot_ptr + rows, dot, mask=valid)
    # Rows shorter than eps are divided by eps, a constant: scaled, not projected.
    radial = tl.where(scale < max_inv_norm, dot, 0.0)
    for d0 in range(0, D, BLOCK_D):
        ks = d0 + tl.arange(0, BLOCK_D)
        unit, d = _row_gradient(x_ptr, grads_ptr, extra_ptr, class_sums_ptr, weighted_ptr, rows,
                                anchors, is_anchor, valid, scale, anchor_scale, anchor_class,
                                row_class, ks, D, inv_t, EXTRA, ANCHOR_PART, SELF_IN_CLASS,
                                ROW_PART, CLASS_SHARES_WEIGHT)
        if NORMALIZE:
            d = (d - unit * radial[:, None]) * scale[:, None]
        tl.store(out_ptr + rows[:, None] * D + ks[None, :],
                 d.to(out_ptr.dtype.element_ty), mask=valid[:, None] & (ks < D)[None, :])


ASSEMBLE_BACKWARD = CompiledKernels(assemble_backward_kernel)


def assemble_backward(rows, inv_norm, grads, extra, anchor_offset, anchor_weight, anchor_class,
                      class_sums, self_in_class, row_class, weighted_sums, class_shares_weight,
                      temperature, temperature_in_memory, normalize, max_inv_norm, out_dtype):
    """The op: (grad [R, d] in out_dtype, unit_dot [R] float32); an empty extra, anchor_weight
    or row_class leaves its term out; `temperature` and `temperature_in_memory`: the call's
    temperature (launch.temperature_of); the arguments: csrc/triton/stage_arguments.h."""
    has_row_part = row_class.numel() > 0
    return assemble(rows, inv_norm, grads, extra if extra.numel() > 0 else None, anchor_offset,
                    anchor_weight if anchor_weight.numel() > 0 else None, anchor_class,
                    class_sums, self_in_class, row_class if has_row_part else None,
                    weighted_sums if has_row_part else None, class_shares_weight,
                    temperature_of(temperature, temperature_in_memory), normalize, max_inv_norm,
                    out_dtype)


def assemble(rows, inv_norm, grads, extra, anchor_offset, anchor_weight, anchor_class,
             class_sums, self_in_class, row_class, weighted_sums, class_shares_weight,
             temperature, normalize, max_inv_norm, out_dtype):
    """assemble_backward with None for a term left out and `temperature` a launch.Temperature."""
    r, d = rows.shape
    rows = rows.contiguous()
    grads = grads.float().contiguous()
    out = torch.empty((r, d), dtype=out_dtype, device=rows.device)
    dots = torch.empty(r, dtype=torch.float32, device=rows.device)
    if r == 0 or d == 0:
        return out, dots.zero_()
    # Terms left out get a placeholder pointer: their constexpr flag keeps the kernel off it.
    has_extra, anchor_part = extra is not None, anchor_weight is not None
    row_part = row_class is not None
    extra = extra.float().contiguous() if has_extra else grads
    anchor_count = extra.shape[0] if has_extra else anchor_weight.numel() if anchor_part else 0
    ASSEMBLE_BACKWARD(
        (cdiv(r, BLOCK_R),), rows, inv_norm.float().contiguous(), grads, extra,
        anchor_weight.float().contiguous() if anchor_part else grads,
        anchor_class.contiguous(), class_sums.float().contiguous(),
        row_class.contiguous() if row_part else anchor_class,
        weighted_sums.float().contiguous() if row_part else grads,
        out, dots, temperature.argument, r, d, anchor_offset, anchor_count, float(max_inv_norm),
        EXTRA=has_extra, ANCHOR_PART=anchor_part, SELF_IN_CLASS=self_in_class,
        ROW_PART=row_part, CLASS_SHARES_WEIGHT=class_shares_weight, NORMALIZE=normalize,
        BLOCK_R=BLOCK_R, BLOCK_D=min(MAX_BLOCK_D, next_power_of_2(d)))
    return out, dots
