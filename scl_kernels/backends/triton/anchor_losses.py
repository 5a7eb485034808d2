"""The forward's finish in one Triton kernel (scl::TileKernels::anchor_losses, through the op
scl::supcon_triton_anchor_losses): per anchor, l_i = lse_i - u_i . (C_{y_i} - [self] u_i) / (t
|P(i)|), 0 without positives (docs/MATH.md, "Forward"). On a GPU the core's ATen form of the same
step is a dozen launches (a gather of class-sum rows, a subtraction, a product, a row sum, the
float64 arithmetic); here it is one.
"""
import torch
import triton
import triton.language as tl

from .launch import float32_pair

BLOCK_M = 32
MAX_BLOCK_D = 64


@triton.jit
def anchor_losses_kernel(q_ptr, q_inv_norm_ptr, class_sums_ptr, anchor_class_ptr,
                         num_positives_ptr, lse_ptr, out_ptr, M, D, q_stride, sums_stride,
                         inv_t_hi, inv_t_lo, SINGLE_SET: tl.constexpr, BLOCK_M: tl.constexpr,
                         BLOCK_D: tl.constexpr):
    """One program per BLOCK_M anchors: the dot product u_i . (C_{y_i} - [self] u_i) in the
    dtype of the class sums (the core's compute dtype), over D in BLOCK_D steps; then the mean
    over positives and the difference from lse in float64, stored in the class sums' dtype.
    1/t arrives as a float32 (hi, lo) pair, since Triton passes a Python float as float32."""
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
    dot = dot.to(tl.float64)
    # Each float32 half widens exactly to float64 beside a float64 operand.
    mean_positive = (dot * inv_t_hi + dot * inv_t_lo) / tl.maximum(positives, 1).to(tl.float64)
    loss = tl.where(positives > 0, lse - mean_positive, 0.0)
    tl.store(out_ptr + rows, loss.to(out_ptr.dtype.element_ty), mask=valid)


def anchor_losses(q, q_inv_norm, class_sums, anchor_class, num_positives, lse, inv_t,
                  single_set):
    """[m] per-anchor losses in class_sums' dtype (the op's schema: csrc/scl_ops.cpp)."""
    m, d = q.shape
    q = q.contiguous()
    out = torch.empty(m, dtype=class_sums.dtype, device=q.device)
    anchor_losses_kernel[(triton.cdiv(m, BLOCK_M),)](
        q, q_inv_norm.contiguous(), class_sums.contiguous(), anchor_class.contiguous(),
        num_positives.contiguous(), lse.contiguous(), out, m, d, q.stride(0),
        class_sums.stride(0), *float32_pair(inv_t), SINGLE_SET=single_set, BLOCK_M=BLOCK_M,
        BLOCK_D=min(MAX_BLOCK_D, triton.next_power_of_2(d)))
    return out
