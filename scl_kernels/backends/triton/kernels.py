"""Triton kernels of the SupCon loss (docs/MATH.md sections 2-4).

Every kernel reads raw rows and a per-row scale r (1 / max(||x||, eps), or 1 without
normalisation) and forms logits in base 2: s2_ij = (x_i . x_j) * r_i * r_j * log2(e) / t, so that
normalisation costs one multiply per logit instead of a pass over the rows, and exp is exp2. The
column factor r_j log2(e) / t is one vector per tile, so a logit costs one FMUL and one FFMA
(which also adds the shift or the column's -inf bound). Products accumulate in fp32 whatever the
input dtype. Nothing of size N x N is ever written.

How the tiles are fed (bench/decisions/2026-11-22-triton-machine-code.md):
- USE_TMA: row blocks come through tensor descriptors (TMA bulk copies on Hopper), whose
  out-of-range rows and columns read as zeros (rows without a 16-byte aligned stride are first
  copied into padded rows, launch.tma_rows); before Hopper, through masked pointer loads.
- RESIDENT: when a padded row (BLOCK_K >= D) fits on chip, a program loads its row block once
  and keeps it while the column tiles stream; otherwise every tile loops over D in BLOCK_K steps.
- Only tiles that hold a self column are masked (MASKED=True); a column past the end gets -inf
  (or a zero coefficient) from its per-column vector, which costs nothing per logit.
- Atomics are relaxed: each adds into a sum that nothing reads before the kernel ends.
"""
import triton
import triton.language as tl


@triton.jit
def _block(desc, ptr, row0, k0, n_rows, D, stride, BLOCK_R: tl.constexpr, BLOCK_K: tl.constexpr,
           USE_TMA: tl.constexpr):
    """Rows row0.. and columns k0.. of a row-major [n_rows, D] matrix, zero outside it."""
    if USE_TMA:
        return desc.load([row0, k0])
    rows = row0 + tl.arange(0, BLOCK_R)
    ks = k0 + tl.arange(0, BLOCK_K)
    return tl.load(ptr + rows[:, None] * stride + ks[None, :],
                   mask=(rows < n_rows)[:, None] & (ks < D)[None, :], other=0.0)


@triton.jit
def _dots(res, a_desc, a_ptr, a0, a_rows, b_desc, b_ptr, b0, b_rows, D, stride,
          BLOCK_A: tl.constexpr, BLOCK_B: tl.constexpr, BLOCK_K: tl.constexpr,
          RESIDENT: tl.constexpr, RESIDENT_B: tl.constexpr, USE_TMA: tl.constexpr,
          PRECISION: tl.constexpr):
    """[BLOCK_A, BLOCK_B] fp32 dot products of rows a0.. and b0.. over all D columns. With
    RESIDENT, `res` is the whole a block (b block with RESIDENT_B), already on chip."""
    if RESIDENT:
        if RESIDENT_B:
            a = _block(a_desc, a_ptr, a0, 0, a_rows, D, stride, BLOCK_A, BLOCK_K, USE_TMA)
            return tl.dot(a, tl.trans(res), input_precision=PRECISION)
        b = _block(b_desc, b_ptr, b0, 0, b_rows, D, stride, BLOCK_B, BLOCK_K, USE_TMA)
        return tl.dot(res, tl.trans(b), input_precision=PRECISION)
    acc = tl.zeros((BLOCK_A, BLOCK_B), dtype=tl.float32)
    for k0 in range(0, D, BLOCK_K):
        a = _block(a_desc, a_ptr, a0, k0, a_rows, D, stride, BLOCK_A, BLOCK_K, USE_TMA)
        b = _block(b_desc, b_ptr, b0, k0, b_rows, D, stride, BLOCK_B, BLOCK_K, USE_TMA)
        acc = tl.dot(a, tl.trans(b), acc, input_precision=PRECISION)
    return acc


@triton.jit
def _resident(desc, ptr, row0, n_rows, D, stride, BLOCK_R: tl.constexpr, BLOCK_K: tl.constexpr,
              RESIDENT: tl.constexpr, USE_TMA: tl.constexpr):
    """The program's own row block, loaded once when it fits on chip (else a placeholder)."""
    if RESIDENT:
        rows = _block(desc, ptr, row0, 0, n_rows, D, stride, BLOCK_R, BLOCK_K, USE_TMA)
    else:
        rows = tl.zeros((16, 16), dtype=tl.float32)
    return rows


LOG2E = tl.constexpr(1.4426950408889634)  # log2(e), the float64 nearest it


@triton.jit
def inverse_temperature(temperature):
    """1/t in float64 from a kernel's one temperature argument (launch.Temperature): a pointer
    to t in device memory ([1] float64, which a call left unread on the host), or the host's 1/t
    as the bits of its float64 in an int64 (Triton passes a Python float as float32). The form
    is the argument's type, so each specialisation compiles one branch; either way 1/t is the
    same float64 division of t, so results do not depend on where t was read."""
    if temperature.dtype.is_ptr():
        inv_t = 1.0 / tl.load(temperature)
    else:
        inv_t = temperature.to(tl.float64, bitcast=True)
    return inv_t


@triton.jit
def logit_scale(temperature):
    """log2(e) / t rounded to float32 once, the tiles' logit scale (inverse_temperature)."""
    return (tl.full([], LOG2E, tl.float64) * inverse_temperature(temperature)).to(tl.float32)


@triton.jit(do_not_specialize=["temperature"])
def column_terms_kernel(scale_ptr, coef_ptr, terms_ptr, zeroed_ptr, temperature, N,
                        zeroed_count, bias, HAS_COEF: tl.constexpr, ZEROES: tl.constexpr,
                        BLOCK: tl.constexpr, ZERO_BLOCK: tl.constexpr):
    """Writes the per-column terms that _column_terms reads, four fp32 per column, every column
    of the padded array: r log2(e)/t; `bias` (-inf past the last column) or, HAS_COEF, coef r
    (0 past it); r (0 past it); 0. One launch in place of the half-dozen tensor ops that would
    fill the columns one by one. ZEROES: the programs also set the zeroed_count fp32 at
    zeroed_ptr to 0, each its contiguous share: the accumulator that the tile kernel launched
    next adds into, zeroed here instead of by a launch of its own. log2(e)/t: logit_scale of
    `temperature` (launch.Temperature)."""
    scale_log2 = logit_scale(temperature)
    program = tl.program_id(0)
    cols = program * BLOCK + tl.arange(0, BLOCK)
    valid = cols < N
    r = tl.load(scale_ptr + cols, mask=valid, other=0.0)
    if HAS_COEF:
        second = tl.load(coef_ptr + cols, mask=valid, other=0.0) * r
    else:
        second = tl.where(valid, bias, float("-inf"))
    tl.store(terms_ptr + cols * 4, r * scale_log2)
    tl.store(terms_ptr + cols * 4 + 1, second)
    tl.store(terms_ptr + cols * 4 + 2, r)
    tl.store(terms_ptr + cols * 4 + 3, tl.zeros_like(r))
    if ZEROES:
        share = tl.cdiv(tl.cdiv(zeroed_count, tl.num_programs(0)), ZERO_BLOCK) * ZERO_BLOCK
        begin = program * share
        end = tl.minimum(begin + share, zeroed_count)
        for start in range(begin, end, ZERO_BLOCK):
            offsets = start + tl.arange(0, ZERO_BLOCK)
            tl.store(zeroed_ptr + offsets, tl.zeros((ZERO_BLOCK,), dtype=tl.float32),
                     mask=offsets < end)


@triton.jit
def lse_merge_kernel(part_max_ptr, part_sum_ptr, lse_ptr, M, num_splits, fixed_shift, log2e_hi,
                     log2e_lo, FIXED_SHIFT: tl.constexpr, BLOCK: tl.constexpr):
    """The float64 log-sum-exp of each row from its column splits' base-2 partial sums
    ([num_splits, M] each): with the running maxima (the plain schedule), the sums rescaled to
    the largest; with FIXED_SHIFT (the symmetric one), one sum per row under the fixed shift.
    lse = (shift + log2(total)) / log2(e) in float64, so that log2(total) is not rounded away
    beside a large shift; log2(e) arrives as a float32 hi + lo pair (Triton passes a Python
    float as float32). One launch in place of the dozen tensor ops of the merge."""
    rows = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    valid = rows < M
    if FIXED_SHIFT:
        shift = tl.zeros([BLOCK], dtype=tl.float32) + fixed_shift
        total = tl.load(part_sum_ptr + rows, mask=valid, other=1.0)
    else:
        row_max = tl.full([BLOCK], float("-inf"), tl.float32)
        for split in range(num_splits):
            row_max = tl.maximum(row_max, tl.load(part_max_ptr + split * M + rows, mask=valid,
                                                  other=float("-inf")))
        # A row without columns keeps -inf: shifted by 0, its total is 0 and its lse -inf.
        shift = tl.where(row_max > float("-inf"), row_max, 0.0)
        total = tl.zeros([BLOCK], dtype=tl.float32)
        for split in range(num_splits):
            part = tl.load(part_max_ptr + split * M + rows, mask=valid, other=float("-inf"))
            total += tl.load(part_sum_ptr + split * M + rows, mask=valid,
                             other=0.0) * tl.exp2(part - shift)
    log2e = tl.zeros([BLOCK], dtype=tl.float64) + log2e_hi + log2e_lo
    empty = total == 0  # log2 of 1 there, so that no log2(0) is ever evaluated
    log_total = tl.log2(tl.where(empty, 1.0, total).to(tl.float64))
    lse = tl.where(empty, float("-inf"), (shift.to(tl.float64) + log_total) / log2e)
    tl.store(lse_ptr + rows, lse, mask=valid)


@triton.jit
def _column_terms(terms_ptr, c0, BLOCK_N: tl.constexpr):
    """Columns c0.. and their two terms (launch.column_terms): r log2(e)/t, and what the FFMA
    finishing a logit adds (a bias, -inf past the last column) or, for the symmetric backward,
    coef r. Each column's pair is 8 contiguous bytes of a padded array: one vector load per
    two columns, no mask."""
    cols = c0 + tl.arange(0, BLOCK_N)
    scaled, second = tl.split(tl.load(terms_ptr + cols[:, None] * 4 + tl.arange(0, 2)[None, :]))
    return cols, scaled, second


@triton.jit
def _column_scale(terms_ptr, c0, BLOCK_N: tl.constexpr):
    """r of columns c0.. (0 past the last): the third of each column's terms."""
    return tl.load(terms_ptr + (c0 + tl.arange(0, BLOCK_N)) * 4 + 2)


@triton.jit
def _unmask_self(s2, rows, cols, self_offset, MASKED: tl.constexpr):
    """-inf where anchor row meets its own column (row + self_offset), in tiles that hold one."""
    if MASKED:
        return tl.where(rows[:, None] + self_offset == cols[None, :], float("-inf"), s2)
    return s2


@triton.jit
def _group_pairs(a, b, a_group_ptr, a_class_ptr, a_count, b_group_ptr, b_class_ptr, b_count,
                 GROUP_WORDS: tl.constexpr):
    """[A, B] True where row a and row b are in one group (id >= 0) without being a positive
    pair: the pairs that known false negatives take out of the denominator (docs/MATH.md section
    11). Their pair classes differ or, with GROUP_WORDS > 0 (multi-hot labels, whose positive
    pairs are no equivalence: *_class_ptr hold each row's GROUP_WORDS int32 words of its classes
    numbered within its group, multi_hot.group_class_words), they share no class. Rows past the
    ends are in no group."""
    group_a = tl.load(a_group_ptr + a, mask=a < a_count, other=-1)
    group_b = tl.load(b_group_ptr + b, mask=b < b_count, other=-1)
    if GROUP_WORDS == 0:
        class_a = tl.load(a_class_ptr + a, mask=a < a_count, other=0)
        class_b = tl.load(b_class_ptr + b, mask=b < b_count, other=0)
        unrelated = class_a[:, None] != class_b[None, :]
    else:
        a_words = a_class_ptr + a.to(tl.int64) * GROUP_WORDS
        b_words = b_class_ptr + b.to(tl.int64) * GROUP_WORDS
        unrelated = (tl.load(a_words, mask=a < a_count, other=0)[:, None]
                     & tl.load(b_words, mask=b < b_count, other=0)[None, :]) == 0
        for w in tl.static_range(1, GROUP_WORDS):
            unrelated &= (tl.load(a_words + w, mask=a < a_count, other=0)[:, None]
                          & tl.load(b_words + w, mask=b < b_count, other=0)[None, :]) == 0
    return (group_a[:, None] == group_b[None, :]) & (group_a[:, None] >= 0) & unrelated


@triton.jit
def _unmask_groups(s2, rows, cols, q_group_ptr, q_class_ptr, M, z_group_ptr, z_class_ptr, N,
                   GROUPS: tl.constexpr, GROUP_WORDS: tl.constexpr):
    """-inf on the pairs of rows x cols that groups take out (_group_pairs), where the call has
    groups; every tile is masked then, not only those of the self columns."""
    if GROUPS:
        return tl.where(_group_pairs(rows, cols, q_group_ptr, q_class_ptr, M, z_group_ptr,
                                     z_class_ptr, N, GROUP_WORDS), float("-inf"), s2)
    return s2


@triton.jit
def _self_tiles(row0, self_offset, col_begin, col_end, SELF_COLUMN: tl.constexpr,
                BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """[lo, hi): the column tiles of this program's loop, starting at col_begin in BLOCK_N steps,
    that meet the self columns row0 + self_offset ... + BLOCK_M - 1 (lo == hi: none)."""
    if SELF_COLUMN:
        first = row0 + self_offset
        lo = col_begin + tl.maximum(first - col_begin, 0) // BLOCK_N * BLOCK_N
        hi = col_begin + tl.cdiv(tl.maximum(first + BLOCK_M - col_begin, 0), BLOCK_N) * BLOCK_N
        lo = tl.minimum(lo, col_end)
        return lo, tl.maximum(lo, tl.minimum(hi, col_end))
    return col_end, col_end


@triton.jit
def _column_split(N, num_splits, split, BLOCK_N: tl.constexpr):
    """[begin, end) of this program's share of the columns, in whole BLOCK_N tiles."""
    per_split = tl.cdiv(tl.cdiv(N, BLOCK_N), num_splits) * BLOCK_N
    begin = split * per_split
    return begin, tl.minimum(begin + per_split, N)


@triton.jit
def _online_lse(q_res, q_desc, q_ptr, row0, rows, rq, z_desc, z_ptr, terms_ptr,
                c_lo, c_hi, run_max, run_sum, M, N, D, stride, self_offset, q_group_ptr,
                q_class_ptr, z_group_ptr, z_class_ptr,
                MASKED: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                BLOCK_K: tl.constexpr, RESIDENT: tl.constexpr, USE_TMA: tl.constexpr,
                PRECISION: tl.constexpr, GROUPS: tl.constexpr, GROUP_WORDS: tl.constexpr):
    """Online base-2 (max, sum) of the rows over the column tiles c_lo, c_lo + BLOCK_N, ...
    before c_hi."""
    for c0 in range(c_lo, c_hi, BLOCK_N):
        cols, rz_scaled, bias = _column_terms(terms_ptr, c0, BLOCK_N)
        dots = _dots(q_res, q_desc, q_ptr, row0, M, z_desc, z_ptr, c0, N, D, stride, BLOCK_M,
                     BLOCK_N, BLOCK_K, RESIDENT, False, USE_TMA, PRECISION)
        s2 = tl.fma(dots * rz_scaled[None, :], rq[:, None], bias[None, :])
        s2 = _unmask_self(s2, rows, cols, self_offset, MASKED)
        s2 = _unmask_groups(s2, rows, cols, q_group_ptr, q_class_ptr, M, z_group_ptr, z_class_ptr,
                            N, GROUPS, GROUP_WORDS)
        new_max = tl.maximum(run_max, tl.max(s2, axis=1))
        # A row whose columns are all masked so far keeps max -inf; shift it by 0 instead.
        shift = tl.where(new_max == float("-inf"), 0.0, new_max)
        run_sum = run_sum * tl.exp2(run_max - shift) + tl.sum(tl.exp2(s2 - shift[:, None]), axis=1)
        run_max = new_max
    return run_max, run_sum


@triton.jit
def lse_plain_kernel(q_desc, z_desc, q_ptr, z_ptr, rq_ptr, terms_ptr, part_max_ptr,
                     part_sum_ptr, q_group_ptr, q_class_ptr, z_group_ptr, z_class_ptr, M, N, D,
                     stride, n_bucket, self_offset, num_splits, SELF_COLUMN: tl.constexpr,
                     BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                     RESIDENT: tl.constexpr, USE_TMA: tl.constexpr, PRECISION: tl.constexpr,
                     GROUPS: tl.constexpr, GROUP_WORDS: tl.constexpr):
    """Online base-2 log-sum-exp of one row block over one split of the columns.

    Writes the running (max, sum) pair of each row to its split's slot; splitting the columns is
    what keeps the GPU busy when there are few row blocks. GROUPS: the group mask's ids
    (_group_pairs, with GROUP_WORDS) at q_group_ptr and the rest."""
    pid_m = tl.program_id(0)
    split = tl.program_id(1)
    row0 = pid_m * BLOCK_M
    rows = row0 + tl.arange(0, BLOCK_M)
    row_mask = rows < M
    rq = tl.load(rq_ptr + rows, mask=row_mask, other=0.0)
    q_res = _resident(q_desc, q_ptr, row0, M, D, stride, BLOCK_M, BLOCK_K, RESIDENT, USE_TMA)
    run_max = tl.full((BLOCK_M,), float("-inf"), dtype=tl.float32)
    run_sum = tl.zeros((BLOCK_M,), dtype=tl.float32)
    col_begin, col_end = _column_split(N, num_splits, split, BLOCK_N)
    self_lo, self_hi = _self_tiles(row0, self_offset, col_begin, col_end, SELF_COLUMN, BLOCK_M,
                                   BLOCK_N)
    # Tiles before, on and after the self columns; only those on them are masked.
    run_max, run_sum = _online_lse(q_res, q_desc, q_ptr, row0, rows, rq, z_desc, z_ptr,
                                   terms_ptr, col_begin, self_lo, run_max, run_sum, M, N,
                                   D, stride, self_offset, q_group_ptr, q_class_ptr,
                                   z_group_ptr, z_class_ptr, False, BLOCK_M, BLOCK_N, BLOCK_K,
                                   RESIDENT, USE_TMA, PRECISION, GROUPS, GROUP_WORDS)
    run_max, run_sum = _online_lse(q_res, q_desc, q_ptr, row0, rows, rq, z_desc, z_ptr,
                                   terms_ptr, self_lo, self_hi, run_max, run_sum, M, N,
                                   D, stride, self_offset, q_group_ptr, q_class_ptr,
                                   z_group_ptr, z_class_ptr, True, BLOCK_M, BLOCK_N, BLOCK_K,
                                   RESIDENT, USE_TMA, PRECISION, GROUPS, GROUP_WORDS)
    run_max, run_sum = _online_lse(q_res, q_desc, q_ptr, row0, rows, rq, z_desc, z_ptr,
                                   terms_ptr, self_hi, col_end, run_max, run_sum,
                                   M, N, D, stride, self_offset, q_group_ptr, q_class_ptr,
                                   z_group_ptr, z_class_ptr, False, BLOCK_M, BLOCK_N, BLOCK_K,
                                   RESIDENT, USE_TMA, PRECISION, GROUPS, GROUP_WORDS)
    tl.store(part_max_ptr + split * M + rows, run_max, mask=row_mask)
    tl.store(part_sum_ptr + split * M + rows, run_sum, mask=row_mask)


@triton.jit
def _symmetric_row_block(z_desc, z_ptr, terms_ptr, row_sum_ptr, z_group_ptr, z_class_ptr, bi,
                         j_lo, j_hi, N, D, stride, BLOCK: tl.constexpr, BLOCK_K: tl.constexpr,
                         RESIDENT: tl.constexpr, USE_TMA: tl.constexpr, PRECISION: tl.constexpr,
                         GROUPS: tl.constexpr, GROUP_WORDS: tl.constexpr):
    """Column blocks j_lo <= J < j_hi (all >= bi) of row block bi. Tiles are computed transposed,
    E^T = 2^(s2 - log2(e)/t) with rows J and columns I: the sums of block J (flushed every tile)
    are then row sums, which stay inside groups of 4 threads, and the sums of block I
    accumulate element-wise in registers and are reduced across threads once at the end."""
    i0 = bi * BLOCK
    cols_i = i0 + tl.arange(0, BLOCK)
    ri = _column_scale(terms_ptr, i0, BLOCK)
    q_res = _resident(z_desc, z_ptr, i0, N, D, stride, BLOCK, BLOCK_K, RESIDENT, USE_TMA)
    acc_i = tl.zeros((BLOCK, BLOCK), dtype=tl.float32)
    # Off-diagonal tiles: no self column; rows past N (in J = nb - 1 only) have bias -inf.
    for bj in range(tl.maximum(j_lo, bi + 1), j_hi):
        j0 = bj * BLOCK
        rows_j, rj_scaled, bias = _column_terms(terms_ptr, j0, BLOCK)
        dots = _dots(q_res, z_desc, z_ptr, j0, N, z_desc, z_ptr, i0, N, D, stride, BLOCK, BLOCK,
                     BLOCK_K, RESIDENT, True, USE_TMA, PRECISION)
        s2 = tl.fma(dots * rj_scaled[:, None], ri[None, :], bias[:, None])
        e = tl.exp2(_unmask_groups(s2, rows_j, cols_i, z_group_ptr, z_class_ptr, N, z_group_ptr,
                                   z_class_ptr, N, GROUPS, GROUP_WORDS))
        acc_i += e
        tl.atomic_add(row_sum_ptr + rows_j, tl.sum(e, axis=1), sem="relaxed")
    if j_lo <= bi and bi < j_hi:  # the diagonal tile: its own rows only, self excluded
        _, ri_scaled, bias = _column_terms(terms_ptr, i0, BLOCK)
        dots = _dots(q_res, z_desc, z_ptr, i0, N, z_desc, z_ptr, i0, N, D, stride, BLOCK, BLOCK,
                     BLOCK_K, RESIDENT, True, USE_TMA, PRECISION)
        s2 = tl.fma(dots * ri_scaled[:, None], ri[None, :], bias[:, None])
        s2 = _unmask_groups(s2, cols_i, cols_i, z_group_ptr, z_class_ptr, N, z_group_ptr,
                            z_class_ptr, N, GROUPS, GROUP_WORDS)
        acc_i += tl.exp2(_unmask_self(s2, cols_i, cols_i, 0, True))
    # Columns past N collect terms too, in row_sum's padding, which the launcher drops.
    tl.atomic_add(row_sum_ptr + cols_i, tl.sum(acc_i, axis=0), sem="relaxed")


@triton.jit
def lse_symmetric_kernel(z_desc, z_ptr, terms_ptr, row_sum_ptr, z_group_ptr, z_class_ptr, N, D,
                         stride, n_bucket, num_splits, BLOCK: tl.constexpr, BLOCK_K: tl.constexpr,
                         RESIDENT: tl.constexpr, USE_TMA: tl.constexpr, PRECISION: tl.constexpr,
                         GROUPS: tl.constexpr, GROUP_WORDS: tl.constexpr):
    """Row sums of exp2(s2 - log2(e)/t) from the upper-triangle tiles I <= J of Z Z^T.

    The fixed shift (s <= 1/t for unit rows) makes the terms of row i and of column j the same
    numbers, so one exp serves both sums (docs/MATH.md section 4). Only the triangle is
    launched: program p pairs row block p (nb - p tiles) with row block nb - 1 - p (p + 1 tiles),
    nb + 1 tiles in all for every p, and its column split takes a share of that sequence."""
    pair = tl.program_id(0)
    split = tl.program_id(1)
    nb = tl.cdiv(N, BLOCK)
    per_split = tl.cdiv(nb + 1, num_splits)
    t_lo = split * per_split
    t_hi = t_lo + per_split
    first = nb - pair  # tiles of row block `pair`: J = pair .. nb - 1
    _symmetric_row_block(z_desc, z_ptr, terms_ptr, row_sum_ptr, z_group_ptr, z_class_ptr, pair,
                         pair + t_lo, pair + tl.minimum(t_hi, first), N, D, stride, BLOCK,
                         BLOCK_K, RESIDENT, USE_TMA, PRECISION, GROUPS, GROUP_WORDS)
    partner = nb - 1 - pair
    if partner != pair and t_hi > first:
        _symmetric_row_block(z_desc, z_ptr, terms_ptr, row_sum_ptr, z_group_ptr, z_class_ptr,
                             partner, partner + tl.maximum(t_lo - first, 0),
                             tl.minimum(partner + t_hi - first, nb), N, D, stride, BLOCK, BLOCK_K,
                             RESIDENT, USE_TMA, PRECISION, GROUPS, GROUP_WORDS)


@triton.jit
def _grad_tiles(dq, q_res, q_chunk, q_desc, z_desc, zo_desc, q_ptr, z_ptr, row0, rows, rq,
                coef, lse2_hi, lse2_lo, terms_ptr, dz_ptr, d0, c_lo, c_hi, M, N,
                D, stride, scale_log2, self_offset, q_group_ptr, q_class_ptr, z_group_ptr,
                z_class_ptr, MASKED: tl.constexpr,
                CONTRAST_SIDE: tl.constexpr, SYMMETRIC: tl.constexpr, BLOCK_M: tl.constexpr,
                BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_DO: tl.constexpr,
                RESIDENT: tl.constexpr, USE_TMA: tl.constexpr, PRECISION: tl.constexpr,
                GROUPS: tl.constexpr, GROUP_WORDS: tl.constexpr):
    """dq += G~ Z over the column tiles c_lo, c_lo + BLOCK_N, ... < c_hi (grad_rows_kernel)."""
    douts = d0 + tl.arange(0, BLOCK_DO)
    for c0 in range(c_lo, c_hi, BLOCK_N):
        # `second`: the bias (plain), -inf past the last column, or coef_j r_j (symmetric), 0
        # there; either way G_ij = 0 past it.
        cols, rz_scaled, second = _column_terms(terms_ptr, c0, BLOCK_N)
        if RESIDENT:
            z_tile = _block(z_desc, z_ptr, c0, 0, N, D, stride, BLOCK_N, BLOCK_K, USE_TMA)
            dots = tl.dot(q_res, tl.trans(z_tile), input_precision=PRECISION)
        else:
            dots = _dots(q_res, q_desc, q_ptr, row0, M, z_desc, z_ptr, c0, N, D, stride, BLOCK_M,
                         BLOCK_N, BLOCK_K, False, False, USE_TMA, PRECISION)
        if RESIDENT and BLOCK_DO == BLOCK_K:  # one output chunk: the tile already on chip
            z_out = z_tile
        else:
            z_out = _block(zo_desc, z_ptr, c0, d0, N, D, stride, BLOCK_N, BLOCK_DO, USE_TMA)
        if SYMMETRIC:
            s2 = tl.fma(dots * rz_scaled[None, :], rq[:, None], -scale_log2)
        else:
            s2 = tl.fma(dots * rz_scaled[None, :], rq[:, None], second[None, :])  # the bias
        # Masked (-inf) before exp2: the self logit may exceed lse, which leaves it out.
        s2 = _unmask_self(s2, rows, cols, self_offset, MASKED)
        s2 = _unmask_groups(s2, rows, cols, q_group_ptr, q_class_ptr, M, z_group_ptr, z_class_ptr,
                            N, GROUPS, GROUP_WORDS)
        if SYMMETRIC:
            # coef_i r_j + coef_j r_j, with `coef` = coef_i t / log2(e) against r_j log2(e) / t
            g = tl.exp2(s2) * tl.fma(coef[:, None], rz_scaled[None, :], second[None, :])
        else:
            p = tl.exp2((s2 - lse2_hi[:, None]) - lse2_lo[:, None])
            g = p * rz_scaled[None, :]  # the row's coef t / log2(e) comes once, at the end
        dq = tl.dot(g.to(z_out.dtype), z_out, dq, input_precision=PRECISION)
        if CONTRAST_SIDE:
            g_t = tl.trans(p * (coef * rq)[:, None]).to(q_chunk.dtype)
            dz = tl.dot(g_t, q_chunk, input_precision=PRECISION)
            tl.atomic_add(dz_ptr + cols[:, None] * D + douts[None, :], dz,
                          mask=(cols < N)[:, None] & (douts < D)[None, :], sem="relaxed")
    return dq


@triton.jit(do_not_specialize=["temperature"])
def grad_rows_kernel(q_desc, z_desc, qo_desc, zo_desc, q_ptr, z_ptr, rq_ptr, terms_ptr,
                     lse2_hi_ptr, lse2_lo_ptr, coef_ptr, dq_ptr, dz_ptr, q_group_ptr, q_class_ptr,
                     z_group_ptr, z_class_ptr, temperature, M, N,
                     D, stride, n_bucket, self_offset, num_splits, SELF_COLUMN: tl.constexpr,
                     CONTRAST_SIDE: tl.constexpr, SYMMETRIC: tl.constexpr, BLOCK_M: tl.constexpr,
                     BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_DO: tl.constexpr,
                     RESIDENT: tl.constexpr, USE_TMA: tl.constexpr, PRECISION: tl.constexpr,
                     GROUPS: tl.constexpr, GROUP_WORDS: tl.constexpr):
    """Softmax part of the gradient for one row block, one chunk of output columns and one split
    of the contrast columns, from tiles G that live only in registers.

    Plain: G_ij = coef_i 2^(s2_ij - lse2_i) with coef_i = g_i / t and lse2 = lse2_hi + lse2_lo
    (split so that the subtraction is exact near the row maximum); dq_i += coef_i sum_j
    2^(s2_ij - lse2_i) r_j z_j (anchor side, coef_i applied once per row at the end) and, with
    CONTRAST_SIDE, dz_j += sum_i G_ij r_i q_i by atomics from the same tile.

    SYMMETRIC (single set, unit rows, fixed shift): G_ij + G_ji = E_ij (coef_i + coef_j) with
    E = 2^(s2 - log2(e)/t) and coef_i = g_i e^(1/t - lse_i) / t, so the row block's whole
    gradient, both sides, is dq_I = sum_J (G + G^T)_IJ r_J z_J over full rows: no atomics and no
    lse in the loop, at the price of visiting every tile rather than the upper triangle (4 N^2 D
    FLOPs instead of 3, but N^2 / BLOCK * D fewer atomic adds, which would dominate on a GPU).
    log2(e)/t: logit_scale of `temperature` (launch.Temperature), as column_terms_kernel's."""
    scale_log2 = logit_scale(temperature)
    pid_m = tl.program_id(0)
    d_chunk = tl.program_id(1)
    split = tl.program_id(2)
    row0 = pid_m * BLOCK_M
    rows = row0 + tl.arange(0, BLOCK_M)
    row_mask = rows < M
    d0 = d_chunk * BLOCK_DO
    douts = d0 + tl.arange(0, BLOCK_DO)
    dout_mask = douts < D
    rq = tl.load(rq_ptr + rows, mask=row_mask, other=0.0)
    coef = tl.load(coef_ptr + rows, mask=row_mask, other=0.0)
    if SYMMETRIC:
        lse2_hi = coef
        lse2_lo = coef
        coef = coef / scale_log2
    else:
        # Rows that carry no gradient must not evaluate 2^(s - lse): their lse may be -inf.
        lse2_hi = tl.where(coef != 0.0, tl.load(lse2_hi_ptr + rows, mask=row_mask, other=0.0),
                           float("inf"))
        lse2_lo = tl.load(lse2_lo_ptr + rows, mask=row_mask, other=0.0)
    q_res = _resident(q_desc, q_ptr, row0, M, D, stride, BLOCK_M, BLOCK_K, RESIDENT, USE_TMA)
    if CONTRAST_SIDE:
        q_chunk = _block(qo_desc, q_ptr, row0, d0, M, D, stride, BLOCK_M, BLOCK_DO, USE_TMA)
    else:
        q_chunk = q_res
    dq = tl.zeros((BLOCK_M, BLOCK_DO), dtype=tl.float32)
    col_begin, col_end = _column_split(N, num_splits, split, BLOCK_N)
    self_lo, self_hi = _self_tiles(row0, self_offset, col_begin, col_end, SELF_COLUMN, BLOCK_M,
                                   BLOCK_N)
    # Tiles before, on and after the self columns; only those on them are masked.
    dq = _grad_tiles(dq, q_res, q_chunk, q_desc, z_desc, zo_desc, q_ptr, z_ptr, row0, rows, rq,
                     coef, lse2_hi, lse2_lo, terms_ptr, dz_ptr, d0, col_begin, self_lo,
                     M, N, D, stride, scale_log2, self_offset, q_group_ptr, q_class_ptr,
                     z_group_ptr, z_class_ptr, False, CONTRAST_SIDE, SYMMETRIC, BLOCK_M, BLOCK_N, BLOCK_K,
                     BLOCK_DO, RESIDENT, USE_TMA, PRECISION, GROUPS, GROUP_WORDS)
    dq = _grad_tiles(dq, q_res, q_chunk, q_desc, z_desc, zo_desc, q_ptr, z_ptr, row0, rows, rq,
                     coef, lse2_hi, lse2_lo, terms_ptr, dz_ptr, d0, self_lo, self_hi,
                     M, N, D, stride, scale_log2, self_offset, q_group_ptr, q_class_ptr,
                     z_group_ptr, z_class_ptr, True, CONTRAST_SIDE, SYMMETRIC, BLOCK_M, BLOCK_N, BLOCK_K,
                     BLOCK_DO, RESIDENT, USE_TMA, PRECISION, GROUPS, GROUP_WORDS)
    dq = _grad_tiles(dq, q_res, q_chunk, q_desc, z_desc, zo_desc, q_ptr, z_ptr, row0, rows, rq,
                     coef, lse2_hi, lse2_lo, terms_ptr, dz_ptr, d0, self_hi, col_end,
                     M, N, D, stride, scale_log2, self_offset, q_group_ptr, q_class_ptr,
                     z_group_ptr, z_class_ptr, False, CONTRAST_SIDE, SYMMETRIC, BLOCK_M, BLOCK_N, BLOCK_K,
                     BLOCK_DO, RESIDENT, USE_TMA, PRECISION, GROUPS, GROUP_WORDS)
    if not SYMMETRIC:
        dq = dq * (coef / scale_log2)[:, None]
    dq_ptrs = dq_ptr + rows[:, None] * D + douts[None, :]
    dq_mask = row_mask[:, None] & dout_mask[None, :]
    if num_splits == 1:
        tl.store(dq_ptrs, dq, mask=dq_mask)
    else:
        tl.atomic_add(dq_ptrs, dq, mask=dq_mask, sem="relaxed")


@triton.jit(do_not_specialize=["temperature"])
def grad_cols_kernel(q_desc, z_desc, qo_desc, zo_desc, q_ptr, z_ptr, rq_ptr, terms_ptr,
                     lse2_hi_ptr, lse2_lo_ptr, coef_ptr, dz_ptr, q_group_ptr, q_class_ptr,
                     z_group_ptr, z_class_ptr, temperature, M, N, D, stride, n_bucket,
                     self_offset, SELF_COLUMN: tl.constexpr, BLOCK_M: tl.constexpr,
                     BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_DO: tl.constexpr,
                     RESIDENT: tl.constexpr, USE_TMA: tl.constexpr, PRECISION: tl.constexpr,
                     GROUPS: tl.constexpr, GROUP_WORDS: tl.constexpr):
    """Contrast side without atomics (deterministic mode): one column block owns its dz rows
    and recomputes the transposed tiles of every row block. Anchors past M have coef 0 and
    lse +inf, so they add exact zeros. log2(e)/t: logit_scale of `temperature`."""
    scale_log2 = logit_scale(temperature)
    pid_n = tl.program_id(0)
    d_chunk = tl.program_id(1)
    col0 = pid_n * BLOCK_N
    cols = col0 + tl.arange(0, BLOCK_N)
    col_mask = cols < N
    d0 = d_chunk * BLOCK_DO
    douts = d0 + tl.arange(0, BLOCK_DO)
    rz = _column_scale(terms_ptr, col0, BLOCK_N)
    z_res = _resident(z_desc, z_ptr, col0, N, D, stride, BLOCK_N, BLOCK_K, RESIDENT, USE_TMA)
    dz = tl.zeros((BLOCK_N, BLOCK_DO), dtype=tl.float32)
    for r0 in range(0, M, BLOCK_M):
        rows = r0 + tl.arange(0, BLOCK_M)
        row_mask = rows < M
        rq = tl.load(rq_ptr + rows, mask=row_mask, other=0.0)
        coef = tl.load(coef_ptr + rows, mask=row_mask, other=0.0)
        lse2_hi = tl.where(coef != 0.0, tl.load(lse2_hi_ptr + rows, mask=row_mask, other=0.0),
                           float("inf"))
        lse2_lo = tl.load(lse2_lo_ptr + rows, mask=row_mask, other=0.0)
        dots_t = _dots(z_res, z_desc, z_ptr, col0, N, q_desc, q_ptr, r0, M, D, stride, BLOCK_N,
                       BLOCK_M, BLOCK_K, RESIDENT, False, USE_TMA, PRECISION)
        s2_t = dots_t * (rq * scale_log2)[None, :] * rz[:, None]
        if SELF_COLUMN:  # column j meets anchor i where j == i + self_offset
            s2_t = _unmask_self(s2_t, cols, rows, -self_offset, True)
        s2_t = _unmask_groups(s2_t, cols, rows, z_group_ptr, z_class_ptr, N, q_group_ptr,
                              q_class_ptr, M, GROUPS, GROUP_WORDS)
        g_t = tl.exp2((s2_t - lse2_hi[None, :]) - lse2_lo[None, :]) * (coef * rq)[None, :]
        q_chunk = _block(qo_desc, q_ptr, r0, d0, M, D, stride, BLOCK_M, BLOCK_DO, USE_TMA)
        dz = tl.dot(g_t.to(q_chunk.dtype), q_chunk, dz, input_precision=PRECISION)
    tl.store(dz_ptr + cols[:, None] * D + douts[None, :], dz,
             mask=col_mask[:, None] & (douts < D)[None, :])
