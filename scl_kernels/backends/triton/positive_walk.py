"""The positive walk of the focal loss (docs/MATH.md, section 9, "The positive walk") in Triton:
per anchor, the sum over its positive pairs of u^gamma x (forward) or of hterm, and the pairs'
gradient w.r.t. the unit rows of both sides (backward), with u = 1 - pi and x = lse - s.

Anchors and contrast rows are sorted by class on the device, so that the positive pairs form
diagonal blocks: a program walks one tile of sorted anchors against the sorted contrast rows of
the classes it spans only, and the sort stays on the device (no host read: capturable). The rows
are copied in sorted order (O((m + n) D), against the walk's O(sum of class sizes^2 D)), so that
tiles are contiguous blocks fed as in kernels.py (tensor descriptors or masked loads, resident
or streamed rows); gathering them through the permutation instead takes a 64-bit address per
element and spilled registers on Hopper. Results are stored at the original rows. The contrast
side has its own pass over tiles of sorted contrast rows, so every output row has one owner:
deterministic, no atomics. Logits are in base 2, as in kernels.py, with lse split into float32
(hi, lo) (launch._base2_split).
"""
import math

import torch
import triton
import triton.language as tl

from . import kernels, launch
from .handles import CompiledKernels
from .tiles import _operands

LN2 = tl.constexpr(math.log(2.0))
# Below it, u = 1 - e^-x comes from its series: 1 - exp(-x) would cancel to a few correct bits.
SERIES_BELOW = tl.constexpr(0.5)


@triton.jit
def _one_minus_pi(x, pi):
    """u = 1 - e^-x for x >= 0, accurate to float32 for small x: the alternating series to x^9
    (relative truncation below x^9 / 10! < 1e-9 at x = 1/2) below SERIES_BELOW, and 1 - pi
    above, where pi <= e^-1/2 is subtracted exactly and leaves u within the error of exp."""
    series = x * (1 - x / 2 * (1 - x / 3 * (1 - x / 4 * (1 - x / 5 * (
        1 - x / 6 * (1 - x / 7 * (1 - x / 8 * (1 - x / 9))))))))
    return tl.where(x < SERIES_BELOW, series, 1 - pi)


@triton.jit
def _pair_terms(s2, lse2_hi, lse2_lo, gamma, BACKWARD: tl.constexpr):
    """Per pair, from base-2 logits s2 = s log2(e) against the row's lse2 = hi + lo: u^gamma x
    (forward) or hterm = u^gamma (1 + gamma pi x / u) (backward)."""
    # x >= 0 exactly; rounding may leave it a hair below, which u^gamma must not see.
    x2 = tl.maximum((lse2_hi - s2) + lse2_lo, 0.0)
    x = x2 * LN2
    pi = tl.exp2(-x2)
    u = _one_minus_pi(x, pi)
    positive = u > 0
    # 0^gamma: 1 at gamma = 0 (SupCon), 0 above.
    u_gamma = tl.where(positive, tl.exp2(gamma * tl.log2(tl.where(positive, u, 1.0))),
                       tl.where(gamma == 0, 1.0, 0.0))
    if BACKWARD:
        r = tl.where(positive, x / tl.where(positive, u, 1.0), 1.0)
        return u_gamma * (1 + gamma * pi * r)
    return u_gamma * x


@triton.jit
def _sorted_rows(row_ptr, class_ptr, first, count, invalid_class, BLOCK: tl.constexpr):
    """Sorted positions first.., whether they exist, their original rows and their classes
    (`invalid_class` past the end)."""
    pos = first + tl.arange(0, BLOCK)
    exists = pos < count
    rows = tl.load(row_ptr + pos, mask=exists, other=-1)
    classes = tl.load(class_ptr + pos, mask=exists, other=invalid_class)
    return pos, exists, rows, classes


@triton.jit
def _segment_span(lo_ptr, hi_ptr, pos, walked, count):
    """[lo, hi): the union of the walked rows' class segments on the other side (contiguous,
    since both sides are sorted by class); lo >= hi when no row is walked."""
    lo = tl.min(tl.where(walked, tl.load(lo_ptr + pos, mask=walked, other=0), count), axis=0)
    hi = tl.max(tl.where(walked, tl.load(hi_ptr + pos, mask=walked, other=0), 0), axis=0)
    return lo, hi


@triton.jit
def walk_anchors_kernel(q_desc, z_desc, zo_desc, q_ptr, z_ptr, rq_ptr, rz_ptr, anchor_row_ptr,
                        anchor_class_ptr, contrast_row_ptr, contrast_class_ptr, segment_lo_ptr,
                        segment_hi_ptr, lse2_hi_ptr, lse2_lo_ptr, grad_weight_ptr, loss_ptr,
                        hterm_ptr, dq_ptr, M, N, D, stride, scale_log2, gamma, self_offset,
                        SELF_COLUMN: tl.constexpr, BACKWARD: tl.constexpr, BLOCK_M: tl.constexpr,
                        BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_DO: tl.constexpr,
                        RESIDENT: tl.constexpr, USE_TMA: tl.constexpr, PRECISION: tl.constexpr):
    """One tile of sorted anchors (and, backward, one chunk of D) against the sorted contrast
    rows of its classes. Forward: loss_i = sum_p u^gamma x. Backward: hterm_i = sum_p hterm
    and dq_i = -(1/t) g_i sum_p hterm_ip unit(z_p), g_i = grad_weight_i and -(1/t) =
    -scale_log2 ln 2 applied once per row at the store. Every per-row vector is in sorted
    order; *_row_ptr hold the original rows."""
    row0 = tl.program_id(0) * BLOCK_M
    pos, exists, rows, classes = _sorted_rows(anchor_row_ptr, anchor_class_ptr, row0, M, -1,
                                              BLOCK_M)
    walked = exists & (classes >= 0)
    lo, hi = _segment_span(segment_lo_ptr, segment_hi_ptr, pos, walked, N)
    rq = tl.load(rq_ptr + pos, mask=exists, other=0.0)
    lse2_hi = tl.load(lse2_hi_ptr + pos, mask=walked, other=0.0)
    lse2_lo = tl.load(lse2_lo_ptr + pos, mask=walked, other=0.0)
    q_res = kernels._resident(q_desc, q_ptr, row0, M, D, stride, BLOCK_M, BLOCK_K, RESIDENT,
                              USE_TMA)
    d0 = tl.program_id(1) * BLOCK_DO
    douts = d0 + tl.arange(0, BLOCK_DO)
    total = tl.zeros((BLOCK_M,), dtype=tl.float32)
    dq = tl.zeros((BLOCK_M, BLOCK_DO), dtype=tl.float32)
    for c0 in range(lo, hi, BLOCK_N):
        _, col_exists, cols, col_classes = _sorted_rows(contrast_row_ptr, contrast_class_ptr, c0,
                                                        N, -2, BLOCK_N)
        rz = tl.load(rz_ptr + c0 + tl.arange(0, BLOCK_N), mask=col_exists, other=0.0)
        dots = kernels._dots(q_res, q_desc, q_ptr, row0, M, z_desc, z_ptr, c0, N, D, stride,
                             BLOCK_M, BLOCK_N, BLOCK_K, RESIDENT, False, USE_TMA, PRECISION)
        s2 = dots * rq[:, None] * (rz * scale_log2)[None, :]
        pairs = walked[:, None] & (classes[:, None] == col_classes[None, :])
        if SELF_COLUMN:
            pairs = pairs & (rows[:, None] + self_offset != cols[None, :])
        terms = tl.where(pairs, _pair_terms(s2, lse2_hi[:, None], lse2_lo[:, None], gamma,
                                            BACKWARD), 0.0)
        total += tl.sum(terms, axis=1)
        if BACKWARD:
            z_out = kernels._block(zo_desc, z_ptr, c0, d0, N, D, stride, BLOCK_N, BLOCK_DO,
                                   USE_TMA)
            dq = tl.dot((terms * rz[None, :]).to(z_out.dtype), z_out, dq,
                        input_precision=PRECISION)
    if BACKWARD:
        row_scale = tl.load(grad_weight_ptr + pos, mask=walked, other=0.0) * -(scale_log2 * LN2)
        tl.store(dq_ptr + rows[:, None] * D + douts[None, :], dq * row_scale[:, None],
                 mask=exists[:, None] & (douts < D)[None, :])
        if tl.program_id(1) == 0:
            tl.store(hterm_ptr + rows, total, mask=exists)
    else:
        tl.store(loss_ptr + rows, total, mask=exists)


@triton.jit
def walk_contrast_kernel(q_desc, z_desc, qo_desc, q_ptr, z_ptr, rq_ptr, rz_ptr, anchor_row_ptr,
                         anchor_class_ptr, contrast_row_ptr, contrast_class_ptr, segment_lo_ptr,
                         segment_hi_ptr, lse2_hi_ptr, lse2_lo_ptr, grad_weight_ptr, dz_ptr, M, N,
                         D, stride, scale_log2, gamma, self_offset, SELF_COLUMN: tl.constexpr,
                         BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                         BLOCK_DO: tl.constexpr, RESIDENT: tl.constexpr, USE_TMA: tl.constexpr,
                         PRECISION: tl.constexpr):
    """The transposed walk: one tile of sorted contrast rows (and one chunk of D) against the
    sorted anchors of its classes, dz_p = -(1/t) sum_i g_i hterm_ip unit(q_i). Anchors of class
    -1 sort before every contrast class, so no segment holds them."""
    col0 = tl.program_id(0) * BLOCK_N
    pos, col_exists, cols, col_classes = _sorted_rows(contrast_row_ptr, contrast_class_ptr, col0,
                                                      N, -2, BLOCK_N)
    lo, hi = _segment_span(segment_lo_ptr, segment_hi_ptr, pos, col_exists, M)
    rz = tl.load(rz_ptr + pos, mask=col_exists, other=0.0)
    z_res = kernels._resident(z_desc, z_ptr, col0, N, D, stride, BLOCK_N, BLOCK_K, RESIDENT,
                              USE_TMA)
    d0 = tl.program_id(1) * BLOCK_DO
    douts = d0 + tl.arange(0, BLOCK_DO)
    dz = tl.zeros((BLOCK_N, BLOCK_DO), dtype=tl.float32)
    for r0 in range(lo, hi, BLOCK_M):
        anchors, exists, rows, classes = _sorted_rows(anchor_row_ptr, anchor_class_ptr, r0, M, -1,
                                                      BLOCK_M)
        walked = exists & (classes >= 0)
        rq = tl.load(rq_ptr + anchors, mask=exists, other=0.0)
        lse2_hi = tl.load(lse2_hi_ptr + anchors, mask=walked, other=0.0)
        lse2_lo = tl.load(lse2_lo_ptr + anchors, mask=walked, other=0.0)
        grad_weight = tl.load(grad_weight_ptr + anchors, mask=walked, other=0.0)
        dots_t = kernels._dots(z_res, z_desc, z_ptr, col0, N, q_desc, q_ptr, r0, M, D, stride,
                               BLOCK_N, BLOCK_M, BLOCK_K, RESIDENT, False, USE_TMA, PRECISION)
        s2_t = dots_t * rz[:, None] * (rq * scale_log2)[None, :]
        pairs = walked[None, :] & (col_classes[:, None] == classes[None, :])
        if SELF_COLUMN:
            pairs = pairs & (cols[:, None] != rows[None, :] + self_offset)
        hterm_t = tl.where(pairs, _pair_terms(s2_t, lse2_hi[None, :], lse2_lo[None, :], gamma,
                                              True), 0.0)
        q_out = kernels._block(qo_desc, q_ptr, r0, d0, M, D, stride, BLOCK_M, BLOCK_DO, USE_TMA)
        dz = tl.dot((hterm_t * (grad_weight * rq)[None, :]).to(q_out.dtype), q_out, dz,
                    input_precision=PRECISION)
    tl.store(dz_ptr + cols[:, None] * D + douts[None, :], dz * -(scale_log2 * LN2),
             mask=col_exists[:, None] & (douts < D)[None, :])


WALK_ANCHORS = CompiledKernels(walk_anchors_kernel)
WALK_CONTRAST = CompiledKernels(walk_contrast_kernel)
# Blocks of the two walks, fixed rather than autotuned: the walk visits only the positive blocks,
# a small share of the softmax tiles' work. The per-pair terms hold more registers than a softmax
# tile, so the tiles are narrower than kernels.py's and the output chunks at most WALK_MAX_DO
# columns by element size: all compile for Hopper without spills (bench.static checks). Each walk's
# accumulator rows (anchors, contrast rows) are 64, as wgmma needs. The interpreter takes the
# smallest blocks tl.dot allows, so that small tests cross tile boundaries.
ANCHOR_TILE = launch.Tile(64, 32, 4, 2)
CONTRAST_TILE = launch.Tile(32, 64, 4, 2)
INTERPRETER_TILE = launch.Tile(16, 16, 1, 1)
WALK_MAX_DO = {2: 64, 4: 32}


def walk_tiles():
    """(tile of the anchor walk, tile of the contrast walk)."""
    if launch.INTERPRET:
        return INTERPRETER_TILE, INTERPRETER_TILE
    return ANCHOR_TILE, CONTRAST_TILE


def walk_width(d, element_size):
    """launch.row_width with the output chunk capped at WALK_MAX_DO."""
    width = launch.row_width(d, element_size)
    return launch.RowWidth(width.block_k, width.resident,
                           min(width.block_do, WALK_MAX_DO[element_size]))


def _sorted_by_class(classes):
    """(sorted classes, the sorting permutation, and it as int32 for the kernels): a stable sort
    on the device."""
    sorted_classes, order = torch.sort(classes, stable=True)
    return sorted_classes.contiguous(), order, order.to(torch.int32)


def _segments(sorted_classes, of):
    """[lo, hi) of each class of `of` in `sorted_classes` (int32, device side)."""
    lo = torch.searchsorted(sorted_classes, of, right=False, out_int32=True)
    hi = torch.searchsorted(sorted_classes, of, right=True, out_int32=True)
    return lo, hi


def _check_classes(anchor_class, contrast_class, m, n):
    for name, classes, rows in (("anchor_class", anchor_class, m),
                                ("contrast_class", contrast_class, n)):
        if classes.dtype != torch.int64:
            raise TypeError(f"{name} must be int64 class ids, got {classes.dtype}")
        if classes.shape != (rows,):
            raise ValueError(f"{name} must have shape ({rows},), got {tuple(classes.shape)}")


def _no_pairs(m, n, d, backward, device):
    """The outputs when one side has no rows (a tensor descriptor cannot describe it)."""
    empty = torch.empty(0, dtype=torch.float32, device=device)
    zeros = torch.zeros(m, dtype=torch.float32, device=device)
    if not backward:
        return zeros, empty, empty, empty
    return (empty, zeros, torch.zeros(m, d, dtype=torch.float32, device=device),
            torch.zeros(n, d, dtype=torch.float32, device=device))


def positive_walk(q, z, q_inv_norm, z_inv_norm, inv_t, self_offset, anchor_class, contrast_class,
                  lse_hi, lse_lo, gamma, grad_weight):
    """(loss_sum, hterm_sum, dq, dz), float32, the unused ones empty: forward only when
    grad_weight is empty (loss_sum), else the backward (hterm_sum, dq, dz)."""
    m, n, d = q.shape[0], z.shape[0], q.shape[1]
    _check_classes(anchor_class, contrast_class, m, n)
    backward = grad_weight.numel() > 0
    if m == 0 or n == 0:
        return _no_pairs(m, n, d, backward, q.device)
    q, z, q_scale, z_scale = _operands(q, z, q_inv_norm, z_inv_norm)
    anchor_sorted, anchor_order, anchor_rows = _sorted_by_class(anchor_class)
    contrast_sorted, contrast_order, contrast_rows = _sorted_by_class(contrast_class)
    lse2_hi, lse2_lo = launch._base2_split(lse_hi, lse_lo)
    tma = launch.use_tma(q.device)
    anchor_tile, contrast_tile = walk_tiles()
    width = walk_width(d, q.element_size())
    rows = launch._row_args(q.index_select(0, anchor_order), z.index_select(0, contrast_order),
                            tma, grad=True)
    gathered = grad_weight.float()[anchor_order] if backward else lse2_hi
    args = dict(**rows, rq_ptr=q_scale[anchor_order], rz_ptr=z_scale[contrast_order],
                anchor_row_ptr=anchor_rows, anchor_class_ptr=anchor_sorted,
                contrast_row_ptr=contrast_rows, contrast_class_ptr=contrast_sorted,
                lse2_hi_ptr=lse2_hi[anchor_order], lse2_lo_ptr=lse2_lo[anchor_order],
                grad_weight_ptr=gathered, M=m, N=n, D=d,
                # both sides' rows are padded alike when descriptors need it
                stride=rows["q_ptr"].stride(0), scale_log2=float(inv_t) * launch.LOG2E,
                gamma=float(gamma), self_offset=max(int(self_offset), 0),
                SELF_COLUMN=self_offset >= 0, USE_TMA=tma, PRECISION=launch._precision(q.dtype),
                **width.meta())
    empty = torch.empty(0, dtype=torch.float32, device=q.device)
    chunks = launch.cdiv(d, width.block_do) if backward else 1
    per_anchor = launch.uninitialized((m,), q.device)
    dq = launch.uninitialized((m, d), q.device) if backward else empty
    anchor_lo, anchor_hi = _segments(contrast_sorted, anchor_sorted)
    launch._set_descriptor_blocks({**args, **anchor_tile.meta(walk_anchors_kernel)})
    WALK_ANCHORS(
        (launch.cdiv(m, anchor_tile.block_m), chunks),
        **{k: v for k, v in args.items() if k != "qo_desc"}, segment_lo_ptr=anchor_lo,
        segment_hi_ptr=anchor_hi, loss_ptr=per_anchor, hterm_ptr=per_anchor,
        dq_ptr=dq if backward else per_anchor, BACKWARD=backward,
        **anchor_tile.meta(walk_anchors_kernel), num_warps=anchor_tile.warps,
        num_stages=anchor_tile.stages)
    if not backward:
        return per_anchor, empty, empty, empty
    dz = launch.uninitialized((n, d), q.device)
    contrast_lo, contrast_hi = _segments(anchor_sorted, contrast_sorted)
    launch._set_descriptor_blocks({**args, **contrast_tile.meta(walk_contrast_kernel)})
    WALK_CONTRAST(
        (launch.cdiv(n, contrast_tile.block_n), chunks),
        **{k: v for k, v in args.items() if k != "zo_desc"}, segment_lo_ptr=contrast_lo,
        segment_hi_ptr=contrast_hi, dz_ptr=dz, **contrast_tile.meta(walk_contrast_kernel),
        num_warps=contrast_tile.warps, num_stages=contrast_tile.stages)
    return empty, per_anchor, dq, dz
