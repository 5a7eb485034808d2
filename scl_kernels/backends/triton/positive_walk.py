"""The positive walk of the focal loss (docs/MATH.md, section 9, "The positive walk") and of
multi-hot labels (section 11) in Triton: per anchor, the sum over its positive pairs of
w u^gamma x (forward) or of w hterm, and the pairs' gradient w.r.t. the unit rows of both sides
(backward), with u = 1 - pi, x = lse - s and the pair's weight w (1 for class ids).

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

Multi-hot labels (a MULTI_LABEL specialisation: calls with class ids compile as before) enter
the same walk as entries, a row once per class it holds (_word_entries, from the class words:
multi_hot.py), sorted by class: a pair of rows sharing several classes meets under each and
counts under the lowest only, weighed by its rule (_pair_weights). A row's results come from
several entries, so the kernels store them per entry, each row's entries side by side, and a
segment sum in their fixed order adds them into rows (_rows_of_entries): still no atomics.
Memory: the entries' rows and results, O(entries D), and the words, O(N K). Their number is read
on the host (a nonzero), so that a multi-hot call waits for the device there and cannot be
captured in a CUDA graph.
"""
import math
from typing import NamedTuple, Optional

import torch
import triton
import triton.language as tl

from . import kernels, launch, multi_hot
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
def _popcount(x):
    """The set bits of each int32, by adding neighbouring fields (triton.language has no popcount;
    integer ops alone serve compiled and interpreted kernels alike). Right shifts of int32 are
    arithmetic: the first two masks clear the sign copies they bring in, and from there on every
    value is nonnegative."""
    x = x - ((x >> 1) & 0x55555555)
    x = (x & 0x33333333) + ((x >> 2) & 0x33333333)
    x = (x + (x >> 4)) & 0x0F0F0F0F
    x = x + (x >> 8)
    return (x + (x >> 16)) & 0x3F


@triton.jit
def _shared_words(lower, shared, w, a_base, a_valid, b_base, b_valid, low_word, low_bits,
                  JACCARD: tl.constexpr):
    """_pair_weights's step over half w: the classes below a's that both rows hold, OR-ed into
    `lower`, and (JACCARD) the classes both hold, counted into `shared`."""
    both = (tl.load(a_base + w, mask=a_valid, other=0)[:, None]
            & tl.load(b_base + w, mask=b_valid, other=0)[None, :])
    below = tl.where(w < low_word, -1, tl.where(w == low_word, low_bits, 0))
    lower |= both & below[:, None]
    if JACCARD:
        shared += _popcount(both)
    return lower, shared


@triton.jit
def _pair_weights(a_rows, a_classes, a_valid, a_words_ptr, a_count_ptr, b_rows, b_valid,
                  b_words_ptr, b_count_ptr, words, JACCARD: tl.constexpr, WEIGHT: tl.constexpr,
                  BLOCK_A: tl.constexpr, BLOCK_B: tl.constexpr):
    """[A, B] weights in WEIGHT of multi-hot rows a x rows b met under a's entry class (the
    caller keeps the pairs of entries of one class): 0 where a lower class is shared too, so that
    a pair counts under the lowest class the rows share only; else 1, or with JACCARD
    |Y_a & Y_b| / |Y_a | Y_b| (0 for rows sharing no class). The class words come as `words`
    int32 halves a row (bit c % 32 of half c // 32 for class c: the int64 words' little-endian
    halves), so that the per-pair bit operations take one register a value, not two; the class
    counts as int32 [rows]."""
    low = tl.maximum(a_classes, 0).to(tl.int32)  # entries past the end: any class, left out
    low_word = low // 32
    low_bits = ((tl.zeros_like(low) + 1) << (low % 32)) - 1
    a_base = a_words_ptr + a_rows.to(tl.int64) * words
    b_base = b_words_ptr + b_rows.to(tl.int64) * words
    lower = tl.zeros((BLOCK_A, BLOCK_B), dtype=tl.int32)
    shared = tl.zeros((BLOCK_A, BLOCK_B), dtype=tl.int32)
    for w in range(0, words):
        lower, shared = _shared_words(lower, shared, w, a_base, a_valid, b_base, b_valid,
                                      low_word, low_bits, JACCARD)
    first = lower == 0
    if JACCARD:
        together = (tl.load(a_count_ptr + a_rows, mask=a_valid, other=0)[:, None]
                    + tl.load(b_count_ptr + b_rows, mask=b_valid, other=0)[None, :] - shared)
        return tl.where(first, shared.to(WEIGHT) / tl.maximum(together, 1).to(WEIGHT), 0.0)
    return first.to(WEIGHT)


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
                        hterm_ptr, dq_ptr, slot_ptr, anchor_words_ptr, contrast_words_ptr,
                        anchor_count_ptr, contrast_count_ptr, M, N, D, stride, scale_log2, gamma,
                        self_offset, words, SELF_COLUMN: tl.constexpr, BACKWARD: tl.constexpr,
                        MULTI_LABEL: tl.constexpr, JACCARD: tl.constexpr, BLOCK_M: tl.constexpr,
                        BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_DO: tl.constexpr,
                        RESIDENT: tl.constexpr, USE_TMA: tl.constexpr, PRECISION: tl.constexpr):
    """One tile of sorted anchors (and, backward, one chunk of D) against the sorted contrast
    rows of its classes. Forward: loss_i = sum_p u^gamma x. Backward: hterm_i = sum_p hterm
    and dq_i = -(1/t) g_i sum_p hterm_ip unit(z_p), g_i = grad_weight_i and -(1/t) =
    -scale_log2 ln 2 applied once per row at the store. Every per-row vector is in sorted
    order; *_row_ptr hold the original rows. MULTI_LABEL: the sorted rows are entries, each
    pair's terms weighed by _pair_weights, and the results stored at the entries' slots
    (slot_ptr)."""
    row0 = tl.program_id(0) * BLOCK_M
    pos, exists, rows, classes = _sorted_rows(anchor_row_ptr, anchor_class_ptr, row0, M, -1,
                                              BLOCK_M)
    walked = exists & (classes >= 0)
    if MULTI_LABEL:
        out = tl.load(slot_ptr + pos, mask=exists, other=0).to(tl.int64)
        # Compared as int32 (classes < C), the pairs' class test holds half the registers, which
        # the pair test needs (bench.static).
        classes = classes.to(tl.int32)
    else:
        out = rows
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
        if MULTI_LABEL:
            col_classes = col_classes.to(tl.int32)
        rz = tl.load(rz_ptr + c0 + tl.arange(0, BLOCK_N), mask=col_exists, other=0.0)
        dots = kernels._dots(q_res, q_desc, q_ptr, row0, M, z_desc, z_ptr, c0, N, D, stride,
                             BLOCK_M, BLOCK_N, BLOCK_K, RESIDENT, False, USE_TMA, PRECISION)
        s2 = dots * rq[:, None] * (rz * scale_log2)[None, :]
        pairs = walked[:, None] & (classes[:, None] == col_classes[None, :])
        if SELF_COLUMN:
            pairs = pairs & (rows[:, None] + self_offset != cols[None, :])
        terms = _pair_terms(s2, lse2_hi[:, None], lse2_lo[:, None], gamma, BACKWARD)
        if MULTI_LABEL:
            weight = _pair_weights(rows, classes, exists, anchor_words_ptr, anchor_count_ptr,
                                   cols, col_exists, contrast_words_ptr, contrast_count_ptr,
                                   words, JACCARD, tl.float32, BLOCK_M, BLOCK_N)
            pairs = pairs & (weight > 0)
            if JACCARD:
                terms = terms * weight
        terms = tl.where(pairs, terms, 0.0)
        total += tl.sum(terms, axis=1)
        if BACKWARD:
            z_out = kernels._block(zo_desc, z_ptr, c0, d0, N, D, stride, BLOCK_N, BLOCK_DO,
                                   USE_TMA)
            dq = tl.dot((terms * rz[None, :]).to(z_out.dtype), z_out, dq,
                        input_precision=PRECISION)
    if BACKWARD:
        row_scale = tl.load(grad_weight_ptr + pos, mask=walked, other=0.0) * -(scale_log2 * LN2)
        tl.store(dq_ptr + out[:, None] * D + douts[None, :], dq * row_scale[:, None],
                 mask=exists[:, None] & (douts < D)[None, :])
        if tl.program_id(1) == 0:
            tl.store(hterm_ptr + out, total, mask=exists)
    else:
        tl.store(loss_ptr + out, total, mask=exists)


@triton.jit
def walk_contrast_kernel(q_desc, z_desc, qo_desc, q_ptr, z_ptr, rq_ptr, rz_ptr, anchor_row_ptr,
                         anchor_class_ptr, contrast_row_ptr, contrast_class_ptr, segment_lo_ptr,
                         segment_hi_ptr, lse2_hi_ptr, lse2_lo_ptr, grad_weight_ptr, dz_ptr,
                         slot_ptr, anchor_words_ptr, contrast_words_ptr, anchor_count_ptr,
                         contrast_count_ptr, M, N, D, stride, scale_log2, gamma, self_offset,
                         words, SELF_COLUMN: tl.constexpr, MULTI_LABEL: tl.constexpr,
                         JACCARD: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                         BLOCK_K: tl.constexpr, BLOCK_DO: tl.constexpr, RESIDENT: tl.constexpr,
                         USE_TMA: tl.constexpr, PRECISION: tl.constexpr):
    """The transposed walk: one tile of sorted contrast rows (and one chunk of D) against the
    sorted anchors of its classes, dz_p = -(1/t) sum_i g_i hterm_ip unit(q_i). Anchors of class
    -1 sort before every contrast class, so no segment holds them. MULTI_LABEL: as
    walk_anchors_kernel's, for the contrast rows' entries."""
    col0 = tl.program_id(0) * BLOCK_N
    pos, col_exists, cols, col_classes = _sorted_rows(contrast_row_ptr, contrast_class_ptr, col0,
                                                      N, -2, BLOCK_N)
    if MULTI_LABEL:
        out = tl.load(slot_ptr + pos, mask=col_exists, other=0).to(tl.int64)
    else:
        out = cols
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
        hterm_t = _pair_terms(s2_t, lse2_hi[None, :], lse2_lo[None, :], gamma, True)
        if MULTI_LABEL:
            weight = _pair_weights(cols, col_classes, col_exists, contrast_words_ptr,
                                   contrast_count_ptr, rows, exists, anchor_words_ptr,
                                   anchor_count_ptr, words, JACCARD, tl.float32, BLOCK_N,
                                   BLOCK_M)
            pairs = pairs & (weight > 0)
            if JACCARD:
                hterm_t = hterm_t * weight
        hterm_t = tl.where(pairs, hterm_t, 0.0)
        q_out = kernels._block(qo_desc, q_ptr, r0, d0, M, D, stride, BLOCK_M, BLOCK_DO, USE_TMA)
        dz = tl.dot((hterm_t * (grad_weight * rq)[None, :]).to(q_out.dtype), q_out, dz,
                    input_precision=PRECISION)
    tl.store(dz_ptr + out[:, None] * D + douts[None, :], dz * -(scale_log2 * LN2),
             mask=col_exists[:, None] & (douts < D)[None, :])


@triton.jit
def count_positives_kernel(anchor_row_ptr, anchor_class_ptr, contrast_row_ptr, contrast_class_ptr,
                           segment_lo_ptr, segment_hi_ptr, slot_ptr, anchor_words_ptr,
                           contrast_words_ptr, anchor_count_ptr, contrast_count_ptr,
                           positives_ptr, weight_sum_ptr, M, N, self_offset, words,
                           SELF_COLUMN: tl.constexpr, JACCARD: tl.constexpr,
                           BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """The pairs of walk_anchors_kernel's MULTI_LABEL walk without their terms: per sorted
    anchor entry, its positive pairs (int32) and the float64 sum of their weights, at its slot."""
    row0 = tl.program_id(0) * BLOCK_M
    pos, exists, rows, classes = _sorted_rows(anchor_row_ptr, anchor_class_ptr, row0, M, -1,
                                              BLOCK_M)
    lo, hi = _segment_span(segment_lo_ptr, segment_hi_ptr, pos, exists, N)
    positives = tl.zeros((BLOCK_M,), dtype=tl.int32)
    weight_sum = tl.zeros((BLOCK_M,), dtype=tl.float64)
    for c0 in range(lo, hi, BLOCK_N):
        _, col_exists, cols, col_classes = _sorted_rows(contrast_row_ptr, contrast_class_ptr, c0,
                                                        N, -2, BLOCK_N)
        pairs = exists[:, None] & (classes[:, None] == col_classes[None, :])
        if SELF_COLUMN:
            pairs = pairs & (rows[:, None] + self_offset != cols[None, :])
        weight = _pair_weights(rows, classes, exists, anchor_words_ptr, anchor_count_ptr, cols,
                               col_exists, contrast_words_ptr, contrast_count_ptr, words,
                               JACCARD, tl.float64, BLOCK_M, BLOCK_N)
        pairs = pairs & (weight > 0)
        positives += tl.sum(pairs.to(tl.int32), axis=1)
        weight_sum += tl.sum(tl.where(pairs, weight, 0.0), axis=1)
    out = tl.load(slot_ptr + pos, mask=exists, other=0)
    tl.store(positives_ptr + out, positives, mask=exists)
    tl.store(weight_sum_ptr + out, weight_sum, mask=exists)


WALK_ANCHORS = CompiledKernels(walk_anchors_kernel)
WALK_CONTRAST = CompiledKernels(walk_contrast_kernel)
COUNT_POSITIVES = CompiledKernels(count_positives_kernel)
# Blocks of the two walks, fixed rather than autotuned: the walk visits only the positive blocks,
# a small share of the softmax tiles' work. The per-pair terms hold more registers than a softmax
# tile, so the tiles are narrower than kernels.py's and the output chunks at most WALK_MAX_DO
# columns by element size. Each walk's accumulator rows (anchors, contrast rows) are 64, as wgmma
# needs. The interpreter takes the smallest blocks tl.dot allows, so that small tests cross tile
# boundaries. Multi-hot labels' pair test (_pair_weights) holds its words' tiles beside the
# terms: their walks take half as wide tiles on twice the warps, output chunks of at most
# MULTI_LABEL_MAX_DO columns and streamed fp32 rows (walk_width), which bench.static compiles
# for Hopper without spills at every D it checks (triton 3.9 spills a few bytes of the class
# ids' backward, whose tiles are older).
ANCHOR_TILE = launch.Tile(64, 32, 4, 2)
CONTRAST_TILE = launch.Tile(32, 64, 4, 2)
MULTI_LABEL_ANCHOR_TILE = launch.Tile(64, 16, 8, 2)
MULTI_LABEL_CONTRAST_TILE = launch.Tile(16, 64, 8, 2)
INTERPRETER_TILE = launch.Tile(16, 16, 1, 1)
WALK_MAX_DO = {2: 64, 4: 32}
MULTI_LABEL_MAX_DO = 32


def walk_tiles(multi_label=False):
    """(tile of the anchor walk, tile of the contrast walk)."""
    if launch.INTERPRET:
        return INTERPRETER_TILE, INTERPRETER_TILE
    if multi_label:
        return MULTI_LABEL_ANCHOR_TILE, MULTI_LABEL_CONTRAST_TILE
    return ANCHOR_TILE, CONTRAST_TILE


def walk_width(d, element_size, multi_label=False):
    """launch.row_width with the output chunk capped at WALK_MAX_DO (MULTI_LABEL_MAX_DO). Beside
    the multi-hot pair test, fp32 rows stream in launch.STREAM_K steps at any D: resident, their
    tf32x3 halves spill on Hopper."""
    width = launch.row_width(d, element_size)
    if not multi_label:
        return launch.RowWidth(width.block_k, width.resident,
                               min(width.block_do, WALK_MAX_DO[element_size]))
    if element_size == 4:
        width = launch.RowWidth(launch.STREAM_K[4], False, width.block_do)
    return launch.RowWidth(width.block_k, width.resident,
                           min(width.block_do, MULTI_LABEL_MAX_DO))


class Entries(NamedTuple):
    """One side of the walk in class order: its rows (class ids) or its rows' classes (multi-hot
    rows, one entry per class a row holds). For multi-hot rows also where each entry's results
    go: every row's entries side by side, in class order (`slots`, int32), the row r's from
    offsets[r] to offsets[r + 1] (int64 [rows + 1]), and the classes of each row (`counts`,
    int32, for the jaccard weight's union)."""
    classes: torch.Tensor  # ascending, int64
    order: torch.Tensor  # the row of each entry, int64: gathers the per-row inputs
    rows: torch.Tensor  # the same as int32, for the kernels
    slots: Optional[torch.Tensor] = None
    offsets: Optional[torch.Tensor] = None
    counts: Optional[torch.Tensor] = None


def _class_entries(classes):
    """Class ids: every row, by a stable sort on the device."""
    sorted_classes, order = torch.sort(classes, stable=True)
    return Entries(sorted_classes.contiguous(), order, order.to(torch.int32))


def _word_entries(words, walked=None):
    """Multi-hot rows: an entry per class of each row (multi_hot.set_bits), of the `walked` rows
    only where given. The set bits come by row, the slots' order; a stable sort by class gives
    the walk's."""
    by_row, by_row_classes, counts = multi_hot.set_bits(words, walked)
    classes, slots = torch.sort(by_row_classes, stable=True)
    order = by_row[slots]
    offsets = torch.nn.functional.pad(torch.cumsum(counts, 0), (1, 0))
    return Entries(classes.contiguous(), order, order.to(torch.int32), slots.to(torch.int32),
                   offsets, counts)


def _rows_of_entries(per_entry, entries):
    """Per-row sums of per-entry results stored at their slots: a segment sum over each row's
    entries in their fixed order (deterministic, no atomics); a row without an entry gets 0."""
    return torch.segment_reduce(per_entry, "sum", offsets=entries.offsets, axis=0, unsafe=True,
                                initial=0.0)


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


def _check_words(anchor_words, contrast_words, m, n):
    """The stage ops are public schemas: words the kernels would read past their rows are
    refused."""
    words = anchor_words.shape[1] if anchor_words.dim() == 2 else -1
    for name, given, rows in (("anchor_words", anchor_words, m),
                              ("contrast_words", contrast_words, n)):
        if given.dtype != torch.int64 or given.shape != (rows, words) or words < 1:
            raise ValueError(f"{name} must be int64 class words of shape ({rows}, K), K >= 1 as "
                             f"the other side's, got {given.dtype} {tuple(given.shape)}")


def _check_entries(anchors, columns, d):
    """The kernels address the rows copied in entry order with int32 offsets, as the call plan
    bounds the caller's rows (csrc/core/tile_kernels.h, max_rows_elements)."""
    entries = max(anchors.rows.numel(), columns.rows.numel())
    if entries * d >= 2**31:
        raise ValueError(f"multi-hot labels: {entries} entries (a row per class it holds) of "
                         f"{d} elements exceed the Triton walk's int32 offsets; use "
                         f"backend='cpu' or fewer classes a row")


def _no_pairs(m, n, d, backward, device):
    """The outputs when one side has no rows (a tensor descriptor cannot describe it)."""
    empty = torch.empty(0, dtype=torch.float32, device=device)
    zeros = torch.zeros(m, dtype=torch.float32, device=device)
    if not backward:
        return zeros, empty, empty, empty
    return (empty, zeros, torch.zeros(m, d, dtype=torch.float32, device=device),
            torch.zeros(n, d, dtype=torch.float32, device=device))


def _halves(words):
    """Class words as the kernels read them (_pair_weights): int32 halves, [rows, 2 K]."""
    return words.contiguous().view(torch.int32)


def _multi_label_args(anchors, columns, anchor_words, contrast_words, jaccard):
    """The kernels' multi-hot arguments, or stand-ins (never read) for class ids."""
    if anchor_words is None:
        stand_in = anchors.rows
        return dict(anchor_words_ptr=stand_in, contrast_words_ptr=stand_in,
                    anchor_count_ptr=stand_in, contrast_count_ptr=stand_in, words=0,
                    MULTI_LABEL=False, JACCARD=False)
    return dict(anchor_words_ptr=_halves(anchor_words), contrast_words_ptr=_halves(contrast_words),
                anchor_count_ptr=anchors.counts, contrast_count_ptr=columns.counts,
                words=2 * anchor_words.shape[1], MULTI_LABEL=True, JACCARD=bool(jaccard))


def positive_walk(q, z, q_inv_norm, z_inv_norm, inv_t, self_offset, anchor_class, contrast_class,
                  lse_hi, lse_lo, gamma, grad_weight, anchor_words, contrast_words, jaccard):
    """(loss_sum, hterm_sum, dq, dz), float32, the unused ones empty: forward only when
    grad_weight is empty (loss_sum), else the backward (hterm_sum, dq, dz). With the class
    words of multi-hot labels (else None) the pairs are theirs, weighed by "jaccard" or "any",
    and the classes only mark the anchors left out (-1)."""
    m, n, d = q.shape[0], z.shape[0], q.shape[1]
    _check_classes(anchor_class, contrast_class, m, n)
    backward = grad_weight.numel() > 0
    multi_label = anchor_words is not None
    if multi_label:
        _check_words(anchor_words, contrast_words, m, n)
        anchors = _word_entries(anchor_words, anchor_class >= 0)
        columns = _word_entries(contrast_words)
        _check_entries(anchors, columns, d)
    else:
        anchors, columns = _class_entries(anchor_class), _class_entries(contrast_class)
    walked_entries, column_entries = anchors.rows.numel(), columns.rows.numel()
    if walked_entries == 0 or column_entries == 0:
        return _no_pairs(m, n, d, backward, q.device)
    q, z, q_scale, z_scale = _operands(q, z, q_inv_norm, z_inv_norm)
    lse2_hi, lse2_lo = launch._base2_split(lse_hi, lse_lo)
    tma = launch.use_tma(q.device)
    anchor_tile, contrast_tile = walk_tiles(multi_label)
    width = walk_width(d, q.element_size(), multi_label)
    rows = launch._row_args(q.index_select(0, anchors.order), z.index_select(0, columns.order),
                            tma, grad=True)
    gathered = grad_weight.float()[anchors.order] if backward else lse2_hi
    args = dict(**rows, rq_ptr=q_scale[anchors.order], rz_ptr=z_scale[columns.order],
                anchor_row_ptr=anchors.rows, anchor_class_ptr=anchors.classes,
                contrast_row_ptr=columns.rows, contrast_class_ptr=columns.classes,
                lse2_hi_ptr=lse2_hi[anchors.order], lse2_lo_ptr=lse2_lo[anchors.order],
                grad_weight_ptr=gathered, M=walked_entries, N=column_entries, D=d,
                # both sides' rows are padded alike when descriptors need it
                stride=rows["q_ptr"].stride(0), scale_log2=float(inv_t) * launch.LOG2E,
                gamma=float(gamma), self_offset=max(int(self_offset), 0),
                SELF_COLUMN=self_offset >= 0, USE_TMA=tma, PRECISION=launch._precision(q.dtype),
                **_multi_label_args(anchors, columns, anchor_words, contrast_words, jaccard),
                **width.meta())
    empty = torch.empty(0, dtype=torch.float32, device=q.device)
    chunks = launch.cdiv(d, width.block_do) if backward else 1
    # Results by row for class ids; by entry, at its slot, for multi-hot rows.
    anchor_results = walked_entries if multi_label else m
    per_anchor = launch.uninitialized((anchor_results,), q.device)
    dq = launch.uninitialized((anchor_results, d), q.device) if backward else empty
    anchor_lo, anchor_hi = _segments(columns.classes, anchors.classes)
    launch._set_descriptor_blocks({**args, **anchor_tile.meta(walk_anchors_kernel)})
    WALK_ANCHORS(
        (launch.cdiv(walked_entries, anchor_tile.block_m), chunks),
        **{k: v for k, v in args.items() if k != "qo_desc"}, segment_lo_ptr=anchor_lo,
        segment_hi_ptr=anchor_hi, loss_ptr=per_anchor, hterm_ptr=per_anchor,
        dq_ptr=dq if backward else per_anchor,
        slot_ptr=anchors.slots if multi_label else anchors.rows, BACKWARD=backward,
        **anchor_tile.meta(walk_anchors_kernel), num_warps=anchor_tile.warps,
        num_stages=anchor_tile.stages)
    if multi_label:
        per_anchor = _rows_of_entries(per_anchor, anchors)
        dq = _rows_of_entries(dq, anchors) if backward else empty
    if not backward:
        return per_anchor, empty, empty, empty
    dz = launch.uninitialized((column_entries if multi_label else n, d), q.device)
    contrast_lo, contrast_hi = _segments(anchors.classes, columns.classes)
    launch._set_descriptor_blocks({**args, **contrast_tile.meta(walk_contrast_kernel)})
    WALK_CONTRAST(
        (launch.cdiv(column_entries, contrast_tile.block_n), chunks),
        **{k: v for k, v in args.items() if k != "zo_desc"}, segment_lo_ptr=contrast_lo,
        segment_hi_ptr=contrast_hi, dz_ptr=dz,
        slot_ptr=columns.slots if multi_label else columns.rows,
        **contrast_tile.meta(walk_contrast_kernel), num_warps=contrast_tile.warps,
        num_stages=contrast_tile.stages)
    if multi_label:
        dz = _rows_of_entries(dz, columns)
    return empty, per_anchor, dq, dz


def multi_label_positives(anchor_words, contrast_words, self_offset, jaccard):
    """(num_positives int64 [m], weight_sum float64 [m]): per anchor its positive pairs and the
    sum of their weights, from the pairs that positive_walk weighs."""
    m, n = anchor_words.shape[0], contrast_words.shape[0]
    _check_words(anchor_words, contrast_words, m, n)
    anchors, columns = _word_entries(anchor_words), _word_entries(contrast_words)
    device = anchor_words.device
    if anchors.rows.numel() == 0 or columns.rows.numel() == 0:
        return (torch.zeros(m, dtype=torch.int64, device=device),
                torch.zeros(m, dtype=torch.float64, device=device))
    walked_entries = anchors.rows.numel()
    positives = torch.empty(walked_entries, dtype=torch.int32, device=device)
    weight_sum = torch.empty(walked_entries, dtype=torch.float64, device=device)
    lo, hi = _segments(columns.classes, anchors.classes)
    tile = walk_tiles(multi_label=True)[0]
    COUNT_POSITIVES(
        (launch.cdiv(walked_entries, tile.block_m),),
        anchors.rows, anchors.classes, columns.rows, columns.classes, lo, hi, anchors.slots,
        _halves(anchor_words), _halves(contrast_words), anchors.counts, columns.counts,
        positives, weight_sum, walked_entries, columns.rows.numel(), max(int(self_offset), 0),
        2 * anchor_words.shape[1], SELF_COLUMN=self_offset >= 0, JACCARD=bool(jaccard),
        BLOCK_M=tile.block_m, BLOCK_N=tile.block_n, num_warps=tile.warps,
        num_stages=tile.stages)
    # Counts below 2^53 add exactly in float64: one segment sum serves both.
    sums = _rows_of_entries(torch.stack([positives.double(), weight_sum], 1), anchors)
    return sums[:, 0].long(), sums[:, 1].contiguous()
