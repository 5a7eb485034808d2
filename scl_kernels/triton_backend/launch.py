"""Launchers: tile configurations (autotuned per D and dtype on a GPU, one small fixed tile under
TRITON_INTERPRET=1), grids, and the column split that keeps a GPU busy when rows are few."""
import math
import os
from dataclasses import dataclass

import torch
import triton

from . import kernels

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
LOG2E = 1.0 / math.log(2.0)


def _configs(*tiles):
    """Tiles -> triton.Config. A short list picked for Hopper (each compiles for sm_90 within
    227 KiB of shared memory, see python_tests/test_triton_hopper_compile.py), so that autotuning
    a new D costs seconds."""
    if INTERPRET:  # numpy executes whole tiles: small ones still test every mask
        return [triton.Config({k: 32 for k in tiles[0].meta}, num_warps=1, num_stages=1)]
    return [triton.Config(t.meta, num_warps=t.warps, num_stages=t.stages) for t in tiles]


def _fits(configs, named_args, **_):
    """Drops tiles wider than the padded dimension (they only add masked work) and, for fp32
    inputs, the tiles whose buffers would not fit in shared memory at 4 bytes an element."""
    width = max(16, triton.next_power_of_2(named_args["D"]))
    wide = named_args["z_ptr"].element_size() > 2
    kept = [c for c in configs
            if all(c.kwargs.get(k, 16) <= width for k in ("BLOCK_K", "BLOCK_DO"))
            and not (wide and _config_key(c.kwargs, c.num_warps, c.num_stages) not in _FP32_TILES)]
    return kept or configs[-1:]


@dataclass
class Tile:
    meta: dict
    warps: int
    stages: int
    fp32: bool = False  # small enough for fp32 inputs too


def _config_key(meta, warps, stages):
    return tuple(sorted(meta.items())), warps, stages


def _tile(warps, stages, fp32=False, **meta):
    return Tile(meta, warps, stages, fp32)


PLAIN_TILES = [_tile(8, 3, BLOCK_M=128, BLOCK_N=128, BLOCK_K=64),
               _tile(4, 3, True, BLOCK_M=128, BLOCK_N=64, BLOCK_K=64),
               _tile(4, 3, BLOCK_M=64, BLOCK_N=128, BLOCK_K=64),
               _tile(8, 4, BLOCK_M=128, BLOCK_N=128, BLOCK_K=32),
               _tile(4, 2, True, BLOCK_M=64, BLOCK_N=64, BLOCK_K=32)]
SYMMETRIC_TILES = [_tile(8, 3, BLOCK=128, BLOCK_K=64),
                   _tile(8, 4, BLOCK=128, BLOCK_K=32),
                   _tile(4, 3, BLOCK=64, BLOCK_K=64),
                   _tile(4, 2, True, BLOCK=128, BLOCK_K=64),
                   _tile(4, 2, True, BLOCK=64, BLOCK_K=32)]
GRAD_TILES = [_tile(8, 3, BLOCK_M=128, BLOCK_N=64, BLOCK_K=64, BLOCK_DO=128),
              _tile(4, 3, BLOCK_M=64, BLOCK_N=64, BLOCK_K=64, BLOCK_DO=128),
              _tile(8, 2, BLOCK_M=128, BLOCK_N=64, BLOCK_K=32, BLOCK_DO=256),
              _tile(4, 3, True, BLOCK_M=64, BLOCK_N=64, BLOCK_K=64, BLOCK_DO=64),
              _tile(4, 2, True, BLOCK_M=64, BLOCK_N=32, BLOCK_K=32, BLOCK_DO=64)]
# Each kernel with its tiles, for the autotuners below and the Hopper compile test.
KERNEL_TILES = {
    kernels.lse_plain_kernel: PLAIN_TILES,
    kernels.lse_symmetric_kernel: SYMMETRIC_TILES,
    kernels.grad_rows_kernel: GRAD_TILES,
    kernels.grad_cols_kernel: GRAD_TILES,
}


def _autotuned(kernel, key, reset_to_zero=None):
    return triton.autotune(_configs(*KERNEL_TILES[kernel]), key=key, reset_to_zero=reset_to_zero,
                           prune_configs_by={"early_config_prune": _fits})(kernel)


_FP32_TILES = {_config_key(t.meta, t.warps, t.stages)
               for tiles in KERNEL_TILES.values() for t in tiles if t.fp32}
_KEY = ["D", "SELF_COLUMN"]
_lse_plain = _autotuned(kernels.lse_plain_kernel, _KEY)
_lse_symmetric = _autotuned(kernels.lse_symmetric_kernel, ["D"], ["row_sum_ptr"])
_grad_rows = _autotuned(kernels.grad_rows_kernel, _KEY + ["CONTRAST_SIDE", "SYMMETRIC"],
                        ["dq_ptr", "dz_ptr"])
_grad_cols = _autotuned(kernels.grad_cols_kernel, _KEY)


def uninitialized(shape, device):
    """fp32 buffers that the kernels must write in full (tests poison them with NaN)."""
    return torch.empty(shape, dtype=torch.float32, device=device)


def _precision(dtype):
    if INTERPRET:
        return "ieee"
    # fp32 inputs: three tf32 products recover fp32 accuracy on tensor cores.
    return "tf32x3" if dtype == torch.float32 else "tf32"


def _column_splits(rows, cols, device, min_rows_block=64, min_cols_block=128):
    """How many ways to split the column loop so that about two programs run per SM."""
    if INTERPRET or device.type != "cuda":
        return 1 if cols <= 64 else 2  # still exercises the split-and-merge path
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    row_blocks = triton.cdiv(rows, min_rows_block)
    return max(1, min(triton.cdiv(cols, min_cols_block), triton.cdiv(2 * sms, row_blocks)))


def lse_plain(q, z, q_scale, z_scale, inv_t, self_offset):
    """float64 log-sum-exp per anchor with an online maximum (any layout, any scale);
    self_offset >= 0: anchor i never sees row self_offset + i of z."""
    m, n, d = q.shape[0], z.shape[0], q.shape[1]
    splits = _column_splits(m, n, q.device)
    part_max = uninitialized((splits, m), q.device)
    part_sum = uninitialized((splits, m), q.device)
    grid = lambda meta: (triton.cdiv(m, meta["BLOCK_M"]), splits)  # noqa: E731
    _lse_plain[grid](q, z, q_scale, z_scale, part_max, part_sum, m, n, d, q.stride(0),
                     inv_t * LOG2E, max(self_offset, 0), splits, SELF_COLUMN=self_offset >= 0,
                     PRECISION=_precision(q.dtype))
    row_max = part_max.max(dim=0).values
    shift = torch.where(torch.isinf(row_max), 0.0, row_max)
    total = (part_sum * torch.exp2(part_max - shift)).sum(dim=0)
    # In float64: the maximum and log2(total) must add without rounding away the latter.
    return (shift.double() + torch.log2(total.double())) / LOG2E  # -inf: an anchor with no column


def lse_symmetric(z, scale, inv_t):
    """float64 log-sum-exp per row of a single set with the fixed shift 1/t (unit rows only)."""
    n, d = z.shape
    row_sum = torch.zeros(n, dtype=torch.float32, device=z.device)
    grid = lambda meta: (triton.cdiv(n, meta["BLOCK"]), triton.cdiv(n, meta["BLOCK"]))  # noqa: E731
    _lse_symmetric[grid](z, scale, row_sum, n, d, z.stride(0), inv_t * LOG2E,
                         PRECISION=_precision(z.dtype))
    shift2 = float(torch.tensor(inv_t * LOG2E, dtype=torch.float32))  # as the kernel rounds it
    return (shift2 + torch.log2(row_sum.double())) / LOG2E


def _base2_split(lse_hi, lse_lo):
    """lse * log2(e) as float32 (hi, lo) pairs; rows without columns (-inf) get (-inf, 0)."""
    lse2 = (lse_hi.double() + lse_lo.double()) * LOG2E
    hi = lse2.float()
    lo = torch.where(torch.isfinite(lse2), lse2 - hi.double(), 0.0).float()
    return hi.contiguous(), lo.contiguous()


def grad_plain(q, z, q_scale, z_scale, coef, lse_hi, lse_lo, inv_t, self_offset, deterministic):
    """(dq, dz) softmax parts w.r.t. unit rows; coef_i = g_i / t. Without `deterministic`, the
    contrast side is added by atomics from the same tiles; with it, a second kernel recomputes
    the tiles column-wise and no atomics are used."""
    m, n, d = q.shape[0], z.shape[0], q.shape[1]
    dq = torch.zeros(m, d, dtype=torch.float32, device=q.device)
    dz = torch.zeros(n, d, dtype=torch.float32, device=q.device)
    lse2_hi, lse2_lo = _base2_split(lse_hi, lse_lo)
    splits = 1 if deterministic else _column_splits(m, n, q.device)
    precision = _precision(q.dtype)
    offset, self_column = max(self_offset, 0), self_offset >= 0
    grid = lambda meta: (triton.cdiv(m, meta["BLOCK_M"]), triton.cdiv(d, meta["BLOCK_DO"]), splits)  # noqa: E731
    _grad_rows[grid](q, z, q_scale, z_scale, lse2_hi, lse2_lo, coef, dq, dz, m, n, d, q.stride(0),
                     inv_t * LOG2E, offset, splits, SELF_COLUMN=self_column,
                     CONTRAST_SIDE=not deterministic, SYMMETRIC=False, PRECISION=precision)
    if deterministic:
        grid = lambda meta: (triton.cdiv(n, meta["BLOCK_N"]), triton.cdiv(d, meta["BLOCK_DO"]))  # noqa: E731
        _grad_cols[grid](q, z, q_scale, z_scale, lse2_hi, lse2_lo, coef, dz, m, n, d, q.stride(0),
                         inv_t * LOG2E, offset, SELF_COLUMN=self_column, PRECISION=precision)
    return dq, dz


def grad_symmetric(z, scale, coef, inv_t, deterministic):
    """Softmax part of the single-set gradient w.r.t. unit rows, both sides, each row block
    summing its full rows of (G + G^T) (kernels.grad_rows_kernel, SYMMETRIC);
    coef_i = g_i exp(1/t - lse_i) / t. Atomics only where the columns are split for small N."""
    n, d = z.shape
    dz = torch.zeros(n, d, dtype=torch.float32, device=z.device)
    splits = 1 if deterministic else _column_splits(n, n, z.device)
    grid = lambda meta: (triton.cdiv(n, meta["BLOCK_M"]), triton.cdiv(d, meta["BLOCK_DO"]), splits)  # noqa: E731
    _grad_rows[grid](z, z, scale, scale, coef, coef, coef, dz, dz, n, n, d, z.stride(0),
                     inv_t * LOG2E, 0, splits, SELF_COLUMN=True, CONTRAST_SIDE=False,
                     SYMMETRIC=True, PRECISION=_precision(z.dtype))
    return dz
