"""The Triton kernel of scl::hard_pairs_triton: per anchor, the least similar positive and the
most similar negative (docs/MATH.md, "Hard pairs").

One program per block of anchors walks every block of candidate rows: a tl.dot of raw rows over
D in BLOCK_K steps, scaled by both rows' inverse norms (as the CPU kernel rounds it), then a
masked minimum / maximum per anchor merged into running extremes. Candidate blocks come in
index order and a block replaces the running extreme only when strictly better, so ties go to
the lowest index. Nothing of size M x N is written and the host never waits.
"""
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from .handles import CompiledKernels
from .launch import INTERPRET, _precision, cdiv
from .tiles import KERNEL_DTYPES

NORM_EPS = 1e-12  # as torch.nn.functional.normalize
NO_INDEX = tl.constexpr(2**31 - 1)  # above every column index: a row without a candidate


@triton.jit
def _block_dots(q_ptr, z_ptr, rows, cols, M, N, D, q_stride, z_stride,
                BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                PRECISION: tl.constexpr):
    """[BLOCK_M, BLOCK_N] fp32 dot products of anchor rows `rows` and candidate rows `cols`."""
    ks = tl.arange(0, BLOCK_K)
    q_rows = q_ptr + rows.to(tl.int64)[:, None] * q_stride
    z_rows = z_ptr + cols.to(tl.int64)[:, None] * z_stride
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, D, BLOCK_K):
        k_ok = (k0 + ks < D)[None, :]
        a = tl.load(q_rows + (k0 + ks)[None, :], mask=(rows < M)[:, None] & k_ok, other=0.0)
        b = tl.load(z_rows + (k0 + ks)[None, :], mask=(cols < N)[:, None] & k_ok, other=0.0)
        acc = tl.dot(a, tl.trans(b), acc, input_precision=PRECISION)
    return acc


@triton.jit
def _merge(best, best_index, similarity, cols, candidates, LARGEST: tl.constexpr):
    """Running (extreme, lowest index) per row, merged with this block's candidates."""
    if LARGEST:
        values = tl.where(candidates, similarity, float("-inf"))
        block_best = tl.max(values, axis=1)
    else:
        values = tl.where(candidates, similarity, float("inf"))
        block_best = tl.min(values, axis=1)
    reached = candidates & (values == block_best[:, None])
    block_index = tl.min(tl.where(reached, cols[None, :], NO_INDEX), axis=1)
    if LARGEST:
        better = block_best > best
    else:
        better = block_best < best
    take = (block_index != NO_INDEX) & ((best_index == NO_INDEX) | better)
    return tl.where(take, block_best, best), tl.where(take, block_index, best_index)


@triton.jit
def _store(index_ptr, similarity_ptr, rows, row_ok, best, best_index):
    """Index -1 and similarity NaN for rows without a candidate."""
    found = best_index != NO_INDEX
    tl.store(index_ptr + rows, tl.where(found, best_index, -1).to(tl.int64), mask=row_ok)
    tl.store(similarity_ptr + rows, tl.where(found, best, float("nan")), mask=row_ok)


@triton.jit
def hard_pairs_kernel(q_ptr, z_ptr, q_scale_ptr, z_scale_ptr, q_labels_ptr, z_labels_ptr,
                      positive_index_ptr, positive_similarity_ptr, negative_index_ptr,
                      negative_similarity_ptr, M, N, D, q_stride, z_stride,
                      BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                      SINGLE_SET: tl.constexpr, NORMALIZE: tl.constexpr,
                      PRECISION: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = rows < M
    row_labels = tl.load(q_labels_ptr + rows, mask=row_ok, other=-1)
    if NORMALIZE:
        row_scale = tl.load(q_scale_ptr + rows, mask=row_ok, other=0.0)
    positive = tl.full((BLOCK_M,), float("inf"), tl.float32)
    positive_index = tl.full((BLOCK_M,), NO_INDEX, tl.int32)
    negative = tl.full((BLOCK_M,), float("-inf"), tl.float32)
    negative_index = tl.full((BLOCK_M,), NO_INDEX, tl.int32)
    for c0 in range(0, N, BLOCK_N):
        cols = c0 + tl.arange(0, BLOCK_N)
        col_ok = cols < N
        similarity = _block_dots(q_ptr, z_ptr, rows, cols, M, N, D, q_stride, z_stride,
                                 BLOCK_M, BLOCK_N, BLOCK_K, PRECISION)
        if NORMALIZE:
            col_scale = tl.load(z_scale_ptr + cols, mask=col_ok, other=0.0)
            similarity = similarity * row_scale[:, None] * col_scale[None, :]
        col_labels = tl.load(z_labels_ptr + cols, mask=col_ok, other=-1)
        candidates = row_ok[:, None] & col_ok[None, :]
        if SINGLE_SET:
            candidates = candidates & (rows[:, None] != cols[None, :])
        same_class = (row_labels[:, None] == col_labels[None, :]) & (row_labels >= 0)[:, None]
        positive, positive_index = _merge(positive, positive_index, similarity, cols,
                                          candidates & same_class, False)
        negative, negative_index = _merge(negative, negative_index, similarity, cols,
                                          candidates & ~same_class, True)
    _store(positive_index_ptr, positive_similarity_ptr, rows, row_ok, positive, positive_index)
    _store(negative_index_ptr, negative_similarity_ptr, rows, row_ok, negative, negative_index)


@dataclass(frozen=True)
class HardPairsTile:
    block_m: int
    block_n: int
    block_k: int
    warps: int
    stages: int

    def meta(self):
        return {"BLOCK_M": self.block_m, "BLOCK_N": self.block_n, "BLOCK_K": self.block_k}


HARD_PAIRS = CompiledKernels(hard_pairs_kernel)
# By input element size; bench.static.gpu_static compiles each for Hopper and checks that it
# does not spill. fp32 takes the narrower K step: tf32x3 splits each operand in registers.
TILES = {2: HardPairsTile(128, 64, 32, 8, 2), 4: HardPairsTile(64, 64, 32, 4, 2)}
# Triton's interpreter runs whole tiles in numpy: small ones still cross every block edge.
INTERPRETER_TILE = HardPairsTile(32, 32, 32, 1, 1)


def tile_for(element_size):
    return INTERPRETER_TILE if INTERPRET else TILES[element_size]


def _kernel_rows(x):
    """Rows as the kernel reads them: unit stride along D, float64 as float32."""
    x = x if x.dtype in KERNEL_DTYPES else x.float()
    return x if x.stride(1) == 1 else x.contiguous()


def _inverse_norms(rows):
    return (torch.linalg.vector_norm(rows, dim=1, dtype=torch.float32)
            .clamp_min_(NORM_EPS).reciprocal_())


def _check(features, labels, contrast, contrast_labels):
    """The shapes the kernel's addressing relies on (the front end has checked them all)."""
    sides = [("features", features, "labels", labels)]
    if (contrast is None) != (contrast_labels is None):
        raise ValueError("contrast and contrast_labels must be given together")
    if contrast is not None:
        sides.append(("contrast", contrast, "contrast_labels", contrast_labels))
    for rows_name, rows, labels_name, row_labels in sides:
        if rows.dim() != 2 or 0 in rows.shape or rows.shape[1] != features.shape[1]:
            raise ValueError(f"{rows_name} must have shape [rows, {features.shape[1]}], "
                             f"got {tuple(rows.shape)}")
        if row_labels.shape != rows.shape[:1]:
            raise ValueError(f"{labels_name} must have shape [{rows.shape[0]}], "
                             f"got {tuple(row_labels.shape)}")
        for name, tensor in ((rows_name, rows), (labels_name, row_labels)):
            if tensor.device != features.device:
                raise ValueError(f"{name} is on {tensor.device} but features is on {features.device}")


def hard_pairs(features, labels, contrast, contrast_labels, normalize):
    """scl::hard_pairs_triton: (positive index, similarity, negative index, similarity), the
    similarities in float32 whatever the input dtype."""
    _check(features, labels, contrast, contrast_labels)
    q = _kernel_rows(features)
    z = q if contrast is None else _kernel_rows(contrast)
    q_labels = labels.to(torch.int64).contiguous()
    z_labels = q_labels if contrast is None else contrast_labels.to(torch.int64).contiguous()
    m, n, d = q.shape[0], z.shape[0], q.shape[1]
    if normalize:
        q_scale = _inverse_norms(q)
        z_scale = q_scale if contrast is None else _inverse_norms(z)
    else:  # never read: NORMALIZE=False
        q_scale = z_scale = torch.empty(1, dtype=torch.float32, device=q.device)
    out = [torch.empty(m, dtype=dtype, device=q.device)
           for dtype in (torch.int64, torch.float32, torch.int64, torch.float32)]
    tile = tile_for(q.element_size())
    HARD_PAIRS(
        (cdiv(m, tile.block_m),),
        q, z, q_scale, z_scale, q_labels, z_labels, *out, m, n, d, q.stride(0), z.stride(0),
        SINGLE_SET=contrast is None, NORMALIZE=normalize, PRECISION=_precision(q.dtype),
        num_warps=tile.warps, num_stages=tile.stages, **tile.meta())
    return tuple(out)
