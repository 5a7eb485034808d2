"""Triton kernels of the SupCon loss (docs/MATH.md sections 2-4).

Every kernel reads raw rows and a per-row scale r (1 / max(||x||, eps), or 1 without
normalisation) and forms logits in base 2: s2_ij = (x_i . x_j) * r_i * r_j * log2(e) / t, so that
normalisation costs one multiply per logit instead of a pass over the rows, and exp is exp2.
Products accumulate in fp32 whatever the input dtype. Nothing of size N x N is ever written.
"""
import triton
import triton.language as tl


@triton.jit
def _dot_tile(a_ptr, a_rows, a_mask, b_ptr, b_rows, b_mask, D, stride,
              BLOCK_A: tl.constexpr, BLOCK_B: tl.constexpr, BLOCK_K: tl.constexpr,
              PRECISION: tl.constexpr):
    """[BLOCK_A, BLOCK_B] fp32 dot products of rows a_rows and b_rows over all D columns."""
    acc = tl.zeros((BLOCK_A, BLOCK_B), dtype=tl.float32)
    for k0 in range(0, D, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        k_mask = ks < D
        a = tl.load(a_ptr + a_rows[:, None] * stride + ks[None, :],
                    mask=a_mask[:, None] & k_mask[None, :], other=0.0)
        b = tl.load(b_ptr + b_rows[:, None] * stride + ks[None, :],
                    mask=b_mask[:, None] & k_mask[None, :], other=0.0)
        acc = tl.dot(a, tl.trans(b), acc, input_precision=PRECISION)
    return acc


@triton.jit
def _logits2(a_ptr, a_rows, a_mask, a_scale, b_ptr, b_rows, b_mask, b_scale, D, stride,
             scale_log2, self_offset, SELF_COLUMN: tl.constexpr, BLOCK_A: tl.constexpr,
             BLOCK_B: tl.constexpr, BLOCK_K: tl.constexpr, PRECISION: tl.constexpr):
    """Base-2 logits of one tile, -inf outside either row range and, with SELF_COLUMN, where a
    row meets itself: b row a_row + self_offset (a_rows and b_rows index the same set)."""
    dots = _dot_tile(a_ptr, a_rows, a_mask, b_ptr, b_rows, b_mask, D, stride,
                     BLOCK_A, BLOCK_B, BLOCK_K, PRECISION)
    s2 = dots * (a_scale[:, None] * b_scale[None, :]) * scale_log2
    valid = a_mask[:, None] & b_mask[None, :]
    if SELF_COLUMN:
        valid = valid & (a_rows[:, None] + self_offset != b_rows[None, :])
    return tl.where(valid, s2, float("-inf"))


@triton.jit
def _column_tile(q_ptr, rows, row_mask, rq, z_ptr, rz_ptr, c0, col_end, D, stride, scale_log2,
                 self_offset, SELF_COLUMN: tl.constexpr, BLOCK_M: tl.constexpr,
                 BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PRECISION: tl.constexpr):
    """The column tile starting at c0 of a row block's loop: (columns, their mask, their scales,
    masked base-2 logits)."""
    cols = c0 + tl.arange(0, BLOCK_N)
    col_mask = cols < col_end
    rz = tl.load(rz_ptr + cols, mask=col_mask, other=0.0)
    s2 = _logits2(q_ptr, rows, row_mask, rq, z_ptr, cols, col_mask, rz, D, stride, scale_log2,
                  self_offset, SELF_COLUMN, BLOCK_M, BLOCK_N, BLOCK_K, PRECISION)
    return cols, col_mask, rz, s2


@triton.jit
def _column_split(N, num_splits, split, BLOCK_N: tl.constexpr):
    """[begin, end) of this program's share of the columns, in whole BLOCK_N tiles."""
    per_split = tl.cdiv(tl.cdiv(N, BLOCK_N), num_splits) * BLOCK_N
    begin = split * per_split
    return begin, tl.minimum(begin + per_split, N)


@triton.jit
def lse_plain_kernel(q_ptr, z_ptr, rq_ptr, rz_ptr, part_max_ptr, part_sum_ptr, M, N, D, stride,
                     scale_log2, self_offset, num_splits, SELF_COLUMN: tl.constexpr,
                     BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                     PRECISION: tl.constexpr):
    """Online base-2 log-sum-exp of one row block over one split of the columns.

    Writes the running (max, sum) pair of each row to its split's slot; splitting the columns is
    what keeps the GPU busy when there are few row blocks."""
    pid_m = tl.program_id(0)
    split = tl.program_id(1)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    row_mask = rows < M
    rq = tl.load(rq_ptr + rows, mask=row_mask, other=0.0)
    run_max = tl.full((BLOCK_M,), float("-inf"), dtype=tl.float32)
    run_sum = tl.zeros((BLOCK_M,), dtype=tl.float32)
    col_begin, col_end = _column_split(N, num_splits, split, BLOCK_N)
    for c0 in range(col_begin, col_end, BLOCK_N):
        _, _, _, s2 = _column_tile(q_ptr, rows, row_mask, rq, z_ptr, rz_ptr, c0, col_end, D,
                                   stride, scale_log2, self_offset, SELF_COLUMN, BLOCK_M, BLOCK_N,
                                   BLOCK_K, PRECISION)
        new_max = tl.maximum(run_max, tl.max(s2, axis=1))
        # A row whose columns are all masked so far keeps max -inf; shift it by 0 instead.
        shift = tl.where(new_max == float("-inf"), 0.0, new_max)
        run_sum = run_sum * tl.exp2(run_max - shift) + tl.sum(tl.exp2(s2 - shift[:, None]), axis=1)
        run_max = new_max
    tl.store(part_max_ptr + split * M + rows, run_max, mask=row_mask)
    tl.store(part_sum_ptr + split * M + rows, run_sum, mask=row_mask)


@triton.jit
def lse_symmetric_kernel(z_ptr, r_ptr, row_sum_ptr, N, D, stride, scale_log2,
                         BLOCK: tl.constexpr, BLOCK_K: tl.constexpr, PRECISION: tl.constexpr):
    """Row sums of exp2(s2 - log2(e)/t) from one upper-triangle tile I <= J of Z Z^T.

    The fixed shift (s <= 1/t for unit rows) makes the terms of row i and of column j the same
    numbers, so one exp serves both sums (docs/MATH.md section 4). Launched on an nb x nb grid
    of which the lower triangle returns at once."""
    bi = tl.program_id(0)
    bj = tl.program_id(1)
    if bj < bi:
        return
    rows = bi * BLOCK + tl.arange(0, BLOCK)
    cols = bj * BLOCK + tl.arange(0, BLOCK)
    row_mask = rows < N
    col_mask = cols < N
    ri = tl.load(r_ptr + rows, mask=row_mask, other=0.0)
    rj = tl.load(r_ptr + cols, mask=col_mask, other=0.0)
    s2 = _logits2(z_ptr, rows, row_mask, ri, z_ptr, cols, col_mask, rj, D, stride, scale_log2,
                  0, True, BLOCK, BLOCK, BLOCK_K, PRECISION)
    e = tl.exp2(s2 - scale_log2)
    tl.atomic_add(row_sum_ptr + rows, tl.sum(e, axis=1), mask=row_mask)
    if bi != bj:
        tl.atomic_add(row_sum_ptr + cols, tl.sum(e, axis=0), mask=col_mask)


@triton.jit
def grad_rows_kernel(q_ptr, z_ptr, rq_ptr, rz_ptr, lse2_hi_ptr, lse2_lo_ptr, coef_ptr, dq_ptr,
                     dz_ptr, M, N, D, stride, scale_log2, self_offset, num_splits,
                     SELF_COLUMN: tl.constexpr,
                     CONTRAST_SIDE: tl.constexpr, SYMMETRIC: tl.constexpr, BLOCK_M: tl.constexpr,
                     BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_DO: tl.constexpr,
                     PRECISION: tl.constexpr):
    """Softmax part of the gradient for one row block, one chunk of output columns and one split
    of the contrast columns, from tiles G that live only in registers.

    Plain: G_ij = coef_i 2^(s2_ij - lse2_i) with coef_i = g_i / t and lse2 = lse2_hi + lse2_lo
    (split so that the subtraction is exact near the row maximum); dq_i += sum_j G_ij r_j z_j
    (anchor side) and, with CONTRAST_SIDE, dz_j += sum_i G_ij r_i q_i by atomics from the same
    tile.

    SYMMETRIC (single set, unit rows, fixed shift): G_ij + G_ji = E_ij (coef_i + coef_j) with
    E = 2^(s2 - log2(e)/t) and coef_i = g_i e^(1/t - lse_i) / t, so the row block's whole
    gradient, both sides, is dq_I = sum_J (G + G^T)_IJ r_J z_J over full rows: no atomics and no
    lse in the loop, at the price of visiting every tile rather than the upper triangle (4 N^2 D
    FLOPs instead of 3, but N^2 / BLOCK * D fewer atomic adds, which would dominate on a GPU)."""
    pid_m = tl.program_id(0)
    d_chunk = tl.program_id(1)
    split = tl.program_id(2)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    row_mask = rows < M
    douts = d_chunk * BLOCK_DO + tl.arange(0, BLOCK_DO)
    dout_mask = douts < D
    rq = tl.load(rq_ptr + rows, mask=row_mask, other=0.0)
    coef = tl.load(coef_ptr + rows, mask=row_mask, other=0.0)
    if not SYMMETRIC:
        # Rows that carry no gradient must not evaluate 2^(s - lse): their lse may be -inf.
        lse2_hi = tl.where(coef != 0.0, tl.load(lse2_hi_ptr + rows, mask=row_mask, other=0.0),
                           float("inf"))
        lse2_lo = tl.load(lse2_lo_ptr + rows, mask=row_mask, other=0.0)
    q_chunk = tl.load(q_ptr + rows[:, None] * stride + douts[None, :],
                      mask=row_mask[:, None] & dout_mask[None, :], other=0.0)
    dq = tl.zeros((BLOCK_M, BLOCK_DO), dtype=tl.float32)
    col_begin, col_end = _column_split(N, num_splits, split, BLOCK_N)
    for c0 in range(col_begin, col_end, BLOCK_N):
        # Masked (-inf) before exp2: the self logit may exceed lse, which leaves it out.
        cols, col_mask, rz, s2 = _column_tile(q_ptr, rows, row_mask, rq, z_ptr, rz_ptr, c0,
                                              col_end, D, stride, scale_log2, self_offset,
                                              SELF_COLUMN, BLOCK_M, BLOCK_N, BLOCK_K, PRECISION)
        if SYMMETRIC:
            coef_cols = tl.load(coef_ptr + cols, mask=col_mask, other=0.0)
            g = tl.exp2(s2 - scale_log2) * (coef[:, None] + coef_cols[None, :])
        else:
            g = tl.exp2((s2 - lse2_hi[:, None]) - lse2_lo[:, None]) * coef[:, None]
        z_chunk = tl.load(z_ptr + cols[:, None] * stride + douts[None, :],
                          mask=col_mask[:, None] & dout_mask[None, :], other=0.0)
        dq = tl.dot((g * rz[None, :]).to(z_chunk.dtype), z_chunk, dq, input_precision=PRECISION)
        if CONTRAST_SIDE:
            dz = tl.dot(tl.trans(g * rq[:, None]).to(q_chunk.dtype), q_chunk,
                        input_precision=PRECISION)
            tl.atomic_add(dz_ptr + cols[:, None] * D + douts[None, :], dz,
                          mask=col_mask[:, None] & dout_mask[None, :])
    dq_ptrs = dq_ptr + rows[:, None] * D + douts[None, :]
    dq_mask = row_mask[:, None] & dout_mask[None, :]
    if num_splits == 1:
        tl.store(dq_ptrs, dq, mask=dq_mask)
    else:
        tl.atomic_add(dq_ptrs, dq, mask=dq_mask)


@triton.jit
def grad_cols_kernel(q_ptr, z_ptr, rq_ptr, rz_ptr, lse2_hi_ptr, lse2_lo_ptr, coef_ptr, dz_ptr, M,
                     N, D, stride, scale_log2, self_offset, SELF_COLUMN: tl.constexpr,
                     BLOCK_M: tl.constexpr,
                     BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_DO: tl.constexpr,
                     PRECISION: tl.constexpr):
    """Contrast side without atomics (deterministic mode): one column block owns its dz rows
    and recomputes the transposed tiles of every row block."""
    pid_n = tl.program_id(0)
    d_chunk = tl.program_id(1)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    col_mask = cols < N
    douts = d_chunk * BLOCK_DO + tl.arange(0, BLOCK_DO)
    dout_mask = douts < D
    rz = tl.load(rz_ptr + cols, mask=col_mask, other=0.0)
    dz = tl.zeros((BLOCK_N, BLOCK_DO), dtype=tl.float32)
    for r0 in range(0, M, BLOCK_M):
        rows = r0 + tl.arange(0, BLOCK_M)
        row_mask = rows < M
        rq = tl.load(rq_ptr + rows, mask=row_mask, other=0.0)
        coef = tl.load(coef_ptr + rows, mask=row_mask, other=0.0)
        lse2_hi = tl.where(coef != 0.0, tl.load(lse2_hi_ptr + rows, mask=row_mask, other=0.0),
                           float("inf"))
        lse2_lo = tl.load(lse2_lo_ptr + rows, mask=row_mask, other=0.0)
        # The transposed tile: column j meets anchor i where j == i + self_offset.
        s2_t = _logits2(z_ptr, cols, col_mask, rz, q_ptr, rows, row_mask, rq, D, stride,
                        scale_log2, -self_offset, SELF_COLUMN, BLOCK_N, BLOCK_M, BLOCK_K,
                        PRECISION)
        g_t = tl.exp2((s2_t - lse2_hi[None, :]) - lse2_lo[None, :]) * coef[None, :]
        q_chunk = tl.load(q_ptr + rows[:, None] * stride + douts[None, :],
                          mask=row_mask[:, None] & dout_mask[None, :], other=0.0)
        dz = tl.dot((g_t * rq[None, :]).to(q_chunk.dtype), q_chunk, dz, input_precision=PRECISION)
    tl.store(dz_ptr + cols[:, None] * D + douts[None, :], dz,
             mask=col_mask[:, None] & dout_mask[None, :])
