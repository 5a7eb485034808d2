"""The preparation of one set of rows in one Triton kernel (scl::TileKernels::prepare_rows, through
the op scl::supcon_triton_prepare_rows; csrc/core/tile_kernels.h states what it computes): each
row's inverse norm, its class id and positive count by binary search in the contrast rows' sorted
labels, its unit row added to its class's sum, and a count of the rows holding a NaN or inf. On a
GPU the core's ATen form of these steps is about two dozen launches (norms, a sort-based
numbering of the classes, counts, gathers, the class sums); here it is one per set of rows,
after one sort and one zeroed buffer, which also holds the forward mean's accumulators.
"""
import torch
import triton
import triton.language as tl

from .handles import CompiledKernels
from .launch import cdiv, next_power_of_2
from .tiles import kernel_rows

BLOCK_R = 32
MAX_BLOCK_D = 64
NORM_EPS = tl.constexpr(1e-12)  # torch.nn.functional.normalize's, as the core's kNormEps


@triton.jit
def _search(sorted_ptr, keys, n, steps, AFTER: tl.constexpr):
    """Per key, the first position in sorted[0:n] whose value is >= key (AFTER: > key); `steps`
    halvings (the bit length of n) narrow [0, n] to it."""
    lo = tl.zeros(keys.shape, dtype=tl.int64)
    hi = lo + n
    for _ in range(steps):
        open_range = lo < hi
        mid = (lo + hi) // 2
        value = tl.load(sorted_ptr + mid, mask=open_range, other=0).to(tl.int64)
        if AFTER:
            right = open_range & (value <= keys)
        else:
            right = open_range & (value < keys)
        lo = tl.where(right, mid + 1, lo)
        hi = tl.where(open_range & ~right, mid, hi)
    return lo


@triton.jit
def add_rows_to_classes(sums_ptr, x_ptr, rows, carries, classes, scale, D,
                        BLOCK_D: tl.constexpr):
    """sums[classes_r] += x_r * scale_r for the rows that `carries`, over D in BLOCK_D steps, by
    relaxed atomics (nothing reads a sum before the kernel ends); every [*, D] operand is
    contiguous."""
    for d0 in range(0, D, BLOCK_D):
        ks = d0 + tl.arange(0, BLOCK_D)
        inside = carries[:, None] & (ks < D)[None, :]
        x = tl.load(x_ptr + rows[:, None] * D + ks[None, :], mask=inside, other=0.0)
        tl.atomic_add(sums_ptr + classes[:, None] * D + ks[None, :],
                      x.to(tl.float32) * scale[:, None], mask=inside, sem="relaxed")


@triton.jit
def prepare_rows_kernel(x_ptr, labels_ptr, sorted_ptr, inv_norm_ptr, class_ptr, positives_ptr,
                        class_sums_ptr, non_finite_ptr, R, D, n, search_steps,
                        NORMALIZE: tl.constexpr, SELF_IN_CLASS: tl.constexpr,
                        CLASS_SUMS: tl.constexpr, CHECK_VALUES: tl.constexpr,
                        BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr):
    """One program per BLOCK_R rows: the labels' search, then a pass over D for the norms (and
    the NaN / inf count), then a second for the class sums (add_rows_to_classes)."""
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    valid = rows < R
    labels = tl.load(labels_ptr + rows, mask=valid, other=0).to(tl.int64)
    lower = _search(sorted_ptr, labels, n, search_steps, False)
    upper = _search(sorted_ptr, labels, n, search_steps, True)
    positives = upper - lower
    if SELF_IN_CLASS:
        positives -= 1
    positives = tl.where(labels >= 0, positives, 0)
    classes = tl.minimum(lower, n - 1)
    tl.store(class_ptr + rows, classes, mask=valid)
    tl.store(positives_ptr + rows, positives, mask=valid)

    squares = tl.zeros([BLOCK_R], dtype=tl.float32)
    bad = tl.zeros([BLOCK_R], dtype=tl.int32)
    for d0 in range(0, D, BLOCK_D):
        ks = d0 + tl.arange(0, BLOCK_D)
        inside = valid[:, None] & (ks < D)[None, :]
        x = tl.load(x_ptr + rows[:, None] * D + ks[None, :], mask=inside, other=0.0)
        x = x.to(tl.float32)
        squares += tl.sum(x * x, axis=1)
        if CHECK_VALUES:
            # x - x is 0 for a finite x and NaN for a NaN or an infinity
            bad += tl.sum(((x - x) != 0).to(tl.int32), axis=1)
    if NORMALIZE:
        # Correctly rounded, as the core's ATen norm and reciprocal are.
        scale = tl.div_rn(tl.full([BLOCK_R], 1.0, tl.float32),
                          tl.maximum(tl.sqrt_rn(squares), NORM_EPS))
    else:
        scale = tl.full([BLOCK_R], 1.0, tl.float32)
    tl.store(inv_norm_ptr + rows, scale, mask=valid)
    if CHECK_VALUES:
        tl.atomic_add(non_finite_ptr, tl.sum((bad > 0).to(tl.int32), axis=0), sem="relaxed")
    if CLASS_SUMS:
        add_rows_to_classes(class_sums_ptr, x_ptr, rows, valid, classes, scale, D, BLOCK_D)


PREPARE_ROWS = CompiledKernels(prepare_rows_kernel)


def prepare_rows(rows, labels, sorted_labels, normalize, self_in_class, class_sums,
                 check_values, mean_sums):
    """(inv_norm [R] float32, row_class [R] int64, num_positives [R] int64, class_sums [n, d]
    float32, non_finite [1] int32, mean_sums [3] float64 zeros), the last three empty when not
    asked for; the op's arguments: csrc/triton/stage_arguments.h. One zeroed buffer holds all
    three, the float64 accumulators at an even float offset (8-byte aligned)."""
    r, d = rows.shape
    n = sorted_labels.numel()
    rows = kernel_rows(rows)
    inv_norm = torch.empty(r, dtype=torch.float32, device=rows.device)
    row_class = torch.empty(r, dtype=torch.int64, device=rows.device)
    positives = torch.empty(r, dtype=torch.int64, device=rows.device)
    sums_size, count_size = n * d if class_sums else 0, 1 if check_values else 0
    mean_at = (sums_size + count_size + 1) // 2 * 2
    mean_size = 6 if mean_sums else 0
    # One split instead of a slice each: every view made from Python costs about as much as an
    # allocation.
    sums, non_finite, _, means = torch.zeros(
        mean_at + mean_size, dtype=torch.float32, device=rows.device).split_with_sizes(
        [sums_size, count_size, mean_at - sums_size - count_size, mean_size])
    sums = sums.view(n if class_sums else 0, d)
    non_finite = non_finite.view(torch.int32)
    means = means.view(torch.float64)
    # Sums not asked for get a placeholder pointer: their constexpr flag keeps the kernel off it.
    PREPARE_ROWS(
        (cdiv(r, BLOCK_R),),
        rows, labels.contiguous(), sorted_labels.contiguous(), inv_norm, row_class, positives,
        sums if class_sums else inv_norm, non_finite if check_values else row_class, r, d, n,
        n.bit_length(), NORMALIZE=normalize, SELF_IN_CLASS=self_in_class, CLASS_SUMS=class_sums,
        CHECK_VALUES=check_values, BLOCK_R=BLOCK_R,
        BLOCK_D=min(MAX_BLOCK_D, next_power_of_2(d)))
    return inv_norm, row_class, positives, sums, non_finite, means
