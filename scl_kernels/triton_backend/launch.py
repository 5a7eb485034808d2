"""Launchers: tile configurations (autotuned per D and dtype on a GPU, one small fixed tile under
TRITON_INTERPRET=1), grids, and the column split that keeps a GPU busy when rows are few."""
import math
import os

import torch
import triton

from . import kernels

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
LOG2E = 1.0 / math.log(2.0)


def _configs(space, warps=(4, 8), stages=(2, 3)):
    if INTERPRET:  # numpy executes whole tiles: small ones still test every mask
        return [triton.Config({k: 32 for k in space[0]}, num_warps=1, num_stages=1)]
    return [triton.Config(dict(c), num_warps=w, num_stages=s) for c in space for w in warps for s in stages]


def _fits_dim(configs, named_args, **_):
    """Drops tiles wider than the padded dimension: they only add masked work."""
    width = max(16, triton.next_power_of_2(named_args["D"]))
    kept = [c for c in configs if all(c.kwargs.get(k, 16) <= width for k in ("BLOCK_K", "BLOCK_DO"))]
    return kept or configs[:1]


_PLAIN_TILES = [{"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk}
                for bm in (64, 128) for bn in (64, 128) for bk in (32, 64, 128)]
_GRAD_TILES = [{"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "BLOCK_DO": bd}
               for bm in (64, 128) for bn in (64,) for bk in (32, 64) for bd in (64, 128, 256)]
_SYM_TILES = [{"BLOCK": b, "BLOCK_K": bk} for b in (64, 128) for bk in (32, 64, 128)]
_SYM_GRAD_TILES = [{"BLOCK": b, "BLOCK_K": bk, "BLOCK_DO": bd}
                   for b in (64, 128) for bk in (32, 64) for bd in (64, 128, 256)]

_KEY = ["D", "SELF_COLUMN"]
_lse_plain = triton.autotune(_configs(_PLAIN_TILES), key=_KEY,
                             prune_configs_by={"early_config_prune": _fits_dim})(kernels.lse_plain_kernel)
_lse_symmetric = triton.autotune(_configs(_SYM_TILES), key=["D"], reset_to_zero=["row_sum_ptr"],
                                 prune_configs_by={"early_config_prune": _fits_dim})(kernels.lse_symmetric_kernel)
_grad_rows = triton.autotune(_configs(_GRAD_TILES), key=_KEY + ["CONTRAST_SIDE"],
                             reset_to_zero=["dq_ptr", "dz_ptr"],
                             prune_configs_by={"early_config_prune": _fits_dim})(kernels.grad_rows_kernel)
_grad_cols = triton.autotune(_configs(_GRAD_TILES), key=_KEY,
                             prune_configs_by={"early_config_prune": _fits_dim})(kernels.grad_cols_kernel)
_grad_symmetric = triton.autotune(_configs(_SYM_GRAD_TILES), key=["D"], reset_to_zero=["dz_ptr"],
                                  prune_configs_by={"early_config_prune": _fits_dim})(kernels.grad_symmetric_kernel)


def _precision(dtype):
    # fp32 inputs: three tf32 products recover fp32 accuracy on tensor cores.
    return "tf32x3" if dtype == torch.float32 and not INTERPRET else "ieee" if INTERPRET else "tf32"


def _column_splits(rows, cols, device, min_rows_block=64, min_cols_block=128):
    """How many ways to split the column loop so that about two programs run per SM."""
    if INTERPRET or device.type != "cuda":
        return 1 if cols <= 64 else 2  # still exercises the split-and-merge path
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    row_blocks = triton.cdiv(rows, min_rows_block)
    return max(1, min(triton.cdiv(cols, min_cols_block), triton.cdiv(2 * sms, row_blocks)))


def lse_plain(q, z, q_scale, z_scale, inv_t, self_column):
    """Base-e log-sum-exp per anchor with an online maximum (any layout, any scale)."""
    m, n, d = q.shape[0], z.shape[0], q.shape[1]
    splits = _column_splits(m, n, q.device)
    part_max = torch.empty(splits, m, dtype=torch.float32, device=q.device)
    part_sum = torch.empty_like(part_max)
    grid = lambda meta: (triton.cdiv(m, meta["BLOCK_M"]), splits)  # noqa: E731
    _lse_plain[grid](q, z, q_scale, z_scale, part_max, part_sum, m, n, d, q.stride(0),
                     inv_t * LOG2E, splits, SELF_COLUMN=self_column, PRECISION=_precision(q.dtype))
    row_max = part_max.max(dim=0).values
    shift = torch.where(torch.isinf(row_max), 0.0, row_max)
    total = (part_sum * torch.exp2(part_max - shift)).sum(dim=0)
    return (shift + torch.log2(total)) / LOG2E  # log2(0) = -inf for an anchor with no column


def lse_symmetric(z, scale, inv_t):
    """Log-sum-exp per row of a single set with the fixed shift 1/t (unit rows only)."""
    n, d = z.shape
    row_sum = torch.zeros(n, dtype=torch.float32, device=z.device)
    grid = lambda meta: (triton.cdiv(n, meta["BLOCK"]), triton.cdiv(n, meta["BLOCK"]))  # noqa: E731
    _lse_symmetric[grid](z, scale, row_sum, n, d, z.stride(0), inv_t * LOG2E,
                         PRECISION=_precision(z.dtype))
    return inv_t + torch.log(row_sum)


def grad_plain(q, z, q_scale, z_scale, lse, coef, inv_t, self_column, deterministic):
    """(dq, dz) softmax parts w.r.t. unit rows; coef_i = g_i / t. Without `deterministic`, the
    contrast side is added by atomics from the same tiles; with it, a second kernel recomputes
    the tiles column-wise and no atomics are used."""
    m, n, d = q.shape[0], z.shape[0], q.shape[1]
    dq = torch.zeros(m, d, dtype=torch.float32, device=q.device)
    dz = torch.zeros(n, d, dtype=torch.float32, device=q.device)
    lse2 = (lse * LOG2E).contiguous()
    splits = 1 if deterministic else _column_splits(m, n, q.device)
    precision = _precision(q.dtype)
    grid = lambda meta: (triton.cdiv(m, meta["BLOCK_M"]), triton.cdiv(d, meta["BLOCK_DO"]), splits)  # noqa: E731
    _grad_rows[grid](q, z, q_scale, z_scale, lse2, coef, dq, dz, m, n, d, q.stride(0),
                     inv_t * LOG2E, splits, SELF_COLUMN=self_column,
                     CONTRAST_SIDE=not deterministic, PRECISION=precision)
    if deterministic:
        grid = lambda meta: (triton.cdiv(n, meta["BLOCK_N"]), triton.cdiv(d, meta["BLOCK_DO"]))  # noqa: E731
        _grad_cols[grid](q, z, q_scale, z_scale, lse2, coef, dz, m, n, d, q.stride(0),
                         inv_t * LOG2E, SELF_COLUMN=self_column, PRECISION=precision)
    return dq, dz


def grad_symmetric(z, scale, coef, inv_t):
    """Softmax part of the single-set gradient w.r.t. unit rows, both sides, by atomics;
    coef_i = g_i exp(1/t - lse_i) / t."""
    n, d = z.shape
    dz = torch.zeros(n, d, dtype=torch.float32, device=z.device)
    grid = lambda meta: (triton.cdiv(n, meta["BLOCK"]), triton.cdiv(n, meta["BLOCK"]),  # noqa: E731
                         triton.cdiv(d, meta["BLOCK_DO"]))
    _grad_symmetric[grid](z, scale, coef, dz, n, d, z.stride(0), inv_t * LOG2E,
                          PRECISION=_precision(z.dtype))
    return dz
