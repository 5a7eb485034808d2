"""Launchers: tile configurations (autotuned per D and dtype on a GPU, one small fixed tile under
TRITON_INTERPRET=1), grids, the column split that keeps a GPU busy when rows are few, and the
temperature's two forms. A training step runs them on every call, so they keep their host work
small: what depends only on D, the dtype or the device is computed once (functools.cache), the
autotuner's choice is kept per key (TileKernel) and, on a GPU, compiled kernels are launched
through their cached handles (handles.py)."""
import ctypes
import functools
import math
import operator
import struct
from dataclasses import dataclass, field
from typing import NamedTuple

import torch
import triton
from triton.tools.tensor_descriptor import TensorDescriptor

from . import kernels, triton_interpreter_enabled
from .handles import TRITON_RELEASE, CompiledKernels

INTERPRET = triton_interpreter_enabled()
LOG2E = 1.0 / math.log(2.0)


def cdiv(a, b):
    """triton.cdiv on the host: Triton's is a constexpr function, about 3 us a call there."""
    return -(-a // b)


def next_power_of_2(n):
    """The least power of two >= n (1 for n <= 1), as plain integer arithmetic."""
    return 1 << max(n - 1, 0).bit_length()


# By input element size: a padded row up to RESIDENT_WIDTH elements stays on chip for a
# program's life, wider rows stream in STREAM_K steps, and the backward writes its output in
# chunks of up to MAX_DO columns (one chunk: the column tile serves both of a tile's products).
# fp32 inputs take narrower ones: tf32x3 splits each operand into two in registers
# (bench/decisions/2026-11-22-triton-machine-code.md).
RESIDENT_WIDTH = {2: 256, 4: 64}
STREAM_K = {2: 64, 4: 32}
MAX_DO = {2: 128, 4: 64}
SHARED_MEMORY_BYTES = 227 * 1024  # per block on H100 / H200

# The newest triton release whose machine code bench.static.gpu_static has checked: a newer
# release is taken to allocate registers as that one does.
NEWEST_CHECKED_RELEASE = (3, 9)


@dataclass(frozen=True)
class Tile:
    """One autotuning candidate: the row and column blocks and the pipeline depth. The K and
    output widths follow from D (row_width)."""
    block_m: int
    block_n: int
    warps: int
    stages: int

    def meta(self, kernel):
        if kernel is kernels.lse_symmetric_kernel:  # square tiles of one set
            return {"BLOCK": self.block_m}
        return {"BLOCK_M": self.block_m, "BLOCK_N": self.block_n}


@dataclass(frozen=True)
class RowWidth:
    """How a kernel walks D: the K block, whether a program's rows stay on chip, and the output
    chunk of the backward."""
    block_k: int
    resident: bool
    block_do: int

    def meta(self):
        return {"BLOCK_K": self.block_k, "RESIDENT": self.resident, "BLOCK_DO": self.block_do}


def row_width(d, element_size):
    return _row_width(d, element_size, INTERPRET)


@functools.cache
def _row_width(d, element_size, interpret):
    padded = max(16, next_power_of_2(d))
    if interpret:  # numpy executes whole tiles: small ones still cover every path
        return RowWidth(padded, True, min(padded, 32)) if padded <= 64 else RowWidth(32, False, 32)
    resident = padded <= RESIDENT_WIDTH[element_size]
    return RowWidth(padded if resident else STREAM_K[element_size], resident,
                    min(padded, MAX_DO[element_size]))


def shared_bytes(kernel, tile, width, element_size):
    """Shared memory the kernel's pipelined operands take (a lower bound: the compiler adds
    scratch for reductions and layout changes; bench.static.gpu_static reports the real figure)."""
    k = width.block_k
    if width.resident:
        own, streamed = tile.block_m * k, tile.stages * tile.block_n * k
    else:
        own, streamed = tile.stages * tile.block_m * k, tile.stages * tile.block_n * k
    if "BLOCK_DO" in kernel.arg_names and not (width.resident and width.block_do == k):
        streamed += tile.stages * tile.block_n * width.block_do
    return (own + streamed) * element_size


@dataclass(frozen=True)
class KernelUse:
    """A kernel as one launcher uses it: the constexpr flags it passes (the widest of them where
    it varies, e.g. SELF_COLUMN) and the tiles autotuning may choose by input element size,
    all checked by bench.static.gpu_static to compile for Hopper without spilling (which is why the
    plain backward, holding both sides, and fp32 inputs get small tiles).

    Some tiles sit at the limit of 255 registers a thread, and triton releases allocate
    differently: spills_under maps (element size, tile) to the releases that compile it with
    spills (gpu_static with triton 3.6, 3.7, 3.8 and 3.9), and autotuning leaves it out there."""
    kernel: object
    flags: dict
    tiles: dict
    spills_under: dict = field(default_factory=dict)


KERNEL_USES = {
    "lse_plain": KernelUse(kernels.lse_plain_kernel,
                           dict(SELF_COLUMN=True, GROUPS=False, GROUP_WORDS=0), {
        2: [Tile(128, 128, 8, 3), Tile(64, 128, 4, 3), Tile(64, 64, 4, 2)],
        4: [Tile(128, 64, 8, 2), Tile(64, 64, 4, 2), Tile(64, 32, 4, 2)]}),
    "lse_symmetric": KernelUse(kernels.lse_symmetric_kernel, dict(GROUPS=False, GROUP_WORDS=0), {
        2: [Tile(128, 128, 8, 3), Tile(128, 128, 8, 2), Tile(64, 64, 4, 3), Tile(64, 64, 4, 2)],
        4: [Tile(64, 64, 4, 2)]}, spills_under={
        (2, Tile(128, 128, 8, 3)): {(3, 9)}, (2, Tile(128, 128, 8, 2)): {(3, 9)}}),
    "grad_plain": KernelUse(kernels.grad_rows_kernel,
                            dict(SELF_COLUMN=True, CONTRAST_SIDE=True, SYMMETRIC=False,
                                 GROUPS=False, GROUP_WORDS=0), {
        2: [Tile(128, 32, 8, 2)],
        4: [Tile(64, 32, 4, 2), Tile(64, 16, 4, 2)]}, spills_under={
        (4, Tile(64, 32, 4, 2)): {(3, 8), (3, 9)}}),
    "grad_symmetric": KernelUse(kernels.grad_rows_kernel,
                                dict(SELF_COLUMN=True, CONTRAST_SIDE=False, SYMMETRIC=True,
                                     GROUPS=False, GROUP_WORDS=0), {
        2: [Tile(128, 128, 8, 2), Tile(128, 64, 8, 3), Tile(128, 64, 8, 2), Tile(64, 32, 4, 2)],
        4: [Tile(128, 64, 8, 2), Tile(64, 32, 4, 2)]}, spills_under={
        (2, Tile(128, 128, 8, 2)): {(3, 7), (3, 9)}}),
    # Its tiles are transposed (column block first): 64 columns at least, for wgmma.
    "grad_columns": KernelUse(kernels.grad_cols_kernel,
                              dict(SELF_COLUMN=True, GROUPS=False, GROUP_WORDS=0), {
        2: [Tile(64, 64, 4, 3), Tile(64, 64, 4, 2)],
        4: [Tile(64, 64, 4, 2), Tile(32, 64, 4, 2)]}, spills_under={
        (4, Tile(64, 64, 4, 2)): {(3, 8)}}),
}


def candidate_tiles(use, d, element_size, release=TRITON_RELEASE):
    """The tiles autotuning tries for this use, D and element size under a triton release: those
    that release compiles without spilling and whose pipelined operands fit in shared memory with
    room to spare for the compiler's own scratch."""
    width = row_width(d, element_size)
    checked = min(release, NEWEST_CHECKED_RELEASE)
    tiles = [t for t in use.tiles[element_size]
             if checked not in use.spills_under.get((element_size, t), ())]
    fits = [t for t in tiles
            if shared_bytes(use.kernel, t, width, element_size) <= 0.85 * SHARED_MEMORY_BYTES]
    return fits or tiles[-1:]


DESCRIPTOR_BLOCKS = {  # descriptor argument -> (its rows block, its columns block)
    "q_desc": ("BLOCK_M", "BLOCK_K"), "z_desc": ("BLOCK_N", "BLOCK_K"),
    "qo_desc": ("BLOCK_M", "BLOCK_DO"), "zo_desc": ("BLOCK_N", "BLOCK_DO"),
}


def _descriptor_blocks(nargs):
    """(descriptor argument, its block shape) for each tensor descriptor in nargs, a launch's
    arguments and meta-parameters."""
    return tuple((name, [nargs.get(rows, nargs.get("BLOCK")), nargs[cols]])
                 for name, (rows, cols) in DESCRIPTOR_BLOCKS.items()
                 if nargs.get(name) is not None)


def _set_descriptor_blocks(nargs):
    """Gives each tensor descriptor the block shape of the configuration about to run."""
    for name, block_shape in _descriptor_blocks(nargs):
        nargs[name].block_shape = block_shape


def _configs(use):
    if INTERPRET:
        return [triton.Config(Tile(32, 32, 1, 1).meta(use.kernel), num_warps=1, num_stages=1,
                              pre_hook=_set_descriptor_blocks)]
    tiles = dict.fromkeys(t for by_size in use.tiles.values() for t in by_size)
    return [triton.Config(t.meta(use.kernel), num_warps=t.warps, num_stages=t.stages,
                          pre_hook=_set_descriptor_blocks) for t in tiles]


def _autotuned(name, key, reset_to_zero=None):
    use = KERNEL_USES[name]

    def prune(configs, named_args, **kwargs):
        # Triton <= 3.6 passes only the positional arguments as named_args, the rest as keywords
        # (the launchers pass keywords); later releases pass them all as named_args.
        args = {**kwargs, **named_args}
        kept = candidate_tiles(use, args["D"], args["z_ptr"].element_size())
        return [c for c in configs
                if any(c.kwargs == t.meta(use.kernel) and (c.num_warps, c.num_stages) ==
                       (t.warps, t.stages) for t in kept)]
    return triton.autotune(_configs(use), key=key, reset_to_zero=reset_to_zero,
                           prune_configs_by={"early_config_prune": prune})(use.kernel)


def n_bucket(rows):
    """The autotuning key's size class of a call whose grid runs over `rows` rows: the next
    power of two, at least 1,024. The best tile changes with N (a small grid wants small tiles
    to fill the SMs), but a key of N itself would tune again for every ragged last batch;
    the kernels receive the bucket only so that the autotuner can key on it."""
    return max(1024, 1 << max(0, rows - 1).bit_length())


class TileKernel:
    """An autotuned tile kernel as the launchers start it. The autotuner tunes a key's first call;
    its choice is then kept here, so that later calls find their configuration by one lookup
    instead of the autotuner's per-call Python (its key rebuilt from every argument, its hooks,
    three merges of the arguments), and start the kernel through CompiledKernels. The key is the
    autotuner's own (`keys`) and the rows' dtypes (the other tensors are the launchers' own, of
    fixed dtypes); it only picks the tile: the binary that runs is chosen by the whole
    specialisation (CompiledKernels)."""

    def __init__(self, autotuner):
        self.autotuner = autotuner
        self.kernel = CompiledKernels(autotuner.fn)
        self.tuning_key = operator.itemgetter(*autotuner.keys)
        self.chosen = {}

    def __call__(self, grid, args):
        """Launches over grid(meta) with the keyword arguments `args`, all but the tile's."""
        key = (self.tuning_key(args), args["z_ptr"].dtype,
               args["q_ptr"].dtype if "q_ptr" in args else None)
        chosen = self.chosen.get(key)
        if chosen is None:
            self.autotuner[grid](**args)
            config = self.autotuner.best_config.all_kwargs()
            # The key fixes which descriptors a call passes (USE_TMA) and their blocks (the
            # configuration, and the K and output widths, which follow from D and the dtype).
            self.chosen[key] = config, _descriptor_blocks({**args, **config})
            return
        config, blocks = chosen
        args.update(config)
        for name, block_shape in blocks:
            args[name].block_shape = block_shape
        self.kernel.launch(grid(args), (), args)


_KEY = ["D", "n_bucket", "SELF_COLUMN", "USE_TMA"]
_lse_plain = _autotuned("lse_plain", _KEY)
_lse_symmetric = _autotuned("lse_symmetric", ["D", "n_bucket", "USE_TMA"], ["row_sum_ptr"])
_grad_plain = _autotuned("grad_plain", _KEY + ["CONTRAST_SIDE"], ["dq_ptr", "dz_ptr"])
_grad_symmetric = _autotuned("grad_symmetric", _KEY, ["dq_ptr"])
_grad_columns = _autotuned("grad_columns", _KEY)
LSE_PLAIN, LSE_SYMMETRIC, GRAD_PLAIN, GRAD_SYMMETRIC, GRAD_COLUMNS = (
    TileKernel(tuner) for tuner in (_lse_plain, _lse_symmetric, _grad_plain, _grad_symmetric,
                                    _grad_columns))
COLUMN_TERMS = CompiledKernels(kernels.column_terms_kernel)
LSE_MERGE = CompiledKernels(kernels.lse_merge_kernel)


def uninitialized(shape, device):
    """fp32 buffers that the kernels must write in full (tests poison them with NaN)."""
    return torch.empty(shape, dtype=torch.float32, device=device)


def _precision(dtype):
    if INTERPRET:
        return "ieee"
    # fp32 inputs: three tf32 products recover fp32 accuracy on tensor cores.
    return "tf32x3" if dtype == torch.float32 else "tf32"


def column_splits(rows, cols, sms, min_rows_block=64, min_cols_block=128):
    """How many ways to split the column loop so that about two programs run per SM."""
    row_blocks = cdiv(rows, min_rows_block)
    return max(1, min(cdiv(cols, min_cols_block), cdiv(2 * sms, row_blocks)))


def symmetric_splits(n, sms):
    """Column splits of the symmetric forward, for about two programs per SM (a pair of row
    blocks holds nb + 1 tiles, so a split of it still spans many); blocks counted at the
    largest tile, since autotuning picks the tile after this is decided."""
    nb = cdiv(n, 128)
    return max(1, min(nb, cdiv(2 * sms, cdiv(nb, 2))))


@functools.cache
def _multiprocessors(device):
    return torch.cuda.get_device_properties(device).multi_processor_count


def _splits(device, small, split):
    """split(sms) on a GPU; in the interpreter 1 for small problems, else 2, which still
    exercises the split-and-merge path."""
    if INTERPRET or device.type != "cuda":
        return 1 if small else 2
    return split(_multiprocessors(device))


def use_tma(device):
    """Whether the kernels read rows through tensor descriptors: on Hopper or later, and in the
    interpreter (which runs them as plain loads); masked pointer loads elsewhere."""
    if device.type == "cuda":
        return _hopper_or_later(device)
    return INTERPRET


@functools.cache
def _hopper_or_later(device):
    return torch.cuda.get_device_capability(device)[0] >= 9


def tma_rows(x):
    """x with the 16-byte aligned base and row stride that tensor descriptors need: as it is, or
    copied into padded rows (an O(N D) copy; the descriptor's shape stops at D, so the padding
    is never read)."""
    if x.data_ptr() % 16 == 0 and (x.stride(0) * x.element_size()) % 16 == 0:
        return x
    per_row = 16 // x.element_size()
    padded = torch.empty(x.shape[0], cdiv(x.shape[1], per_row) * per_row, dtype=x.dtype,
                         device=x.device)[:, :x.shape[1]]
    return padded.copy_(x)


def _descriptors(x, count):
    """`count` tensor descriptors of x, each given its block shape per configuration
    (_set_descriptor_blocks). Made without the dataclass's checks, which cost half of one on
    every call and hold here by construction: x comes from tma_rows (16-byte aligned base and
    row stride, unit column stride), the core refuses empty rows and columns, and the block
    shape is a placeholder. They share x's shape and strides lists (nothing writes them), which
    halves the cost of each after the first."""
    shape, strides = list(x.shape), [x.stride(0), 1]
    descriptors = []
    for _ in range(count):
        descriptor = object.__new__(TensorDescriptor)
        descriptor.base, descriptor.shape, descriptor.strides = x, shape, strides
        descriptor.block_shape, descriptor.padding = [16, 16], "zero"
        descriptors.append(descriptor)
    return descriptors


def _row_args(q, z, tma, grad):
    """Descriptor and pointer arguments of the row matrices: without tma the descriptors are
    None; with grad, also the output chunks' (qo_desc, zo_desc)."""
    names = ("q_desc", "qo_desc") if grad else ("q_desc",)
    z_names = ("z_desc", "zo_desc") if grad else ("z_desc",)
    if not tma:
        return dict.fromkeys(names + z_names, None) | dict(q_ptr=q, z_ptr=z)
    if q is z:
        q = z = tma_rows(q)
        args = dict(zip(names + z_names, _descriptors(q, 2 * len(names))))
    else:
        q, z = tma_rows(q), tma_rows(z)
        args = dict(zip(names, _descriptors(q, len(names))))
        args.update(zip(z_names, _descriptors(z, len(names))))
    args.update(q_ptr=q, z_ptr=z)
    return args


def _fp32(x):
    """x rounded to float32 as the kernels hold it, in Python: a tensor for it would be two ATen
    calls and a read of its value on every call (bench/launch_count.py)."""
    try:
        return struct.unpack("f", struct.pack("f", x))[0]
    except OverflowError:  # beyond float32's range, as a float32 conversion gives
        return math.copysign(math.inf, x)


def float32_pair(x):
    """x as float32 hi + lo (hi + lo holds it to about 48 bits): how a float64 scalar reaches a
    kernel, which takes a Python float as float32."""
    hi = _fp32(x)
    return hi, _fp32(x - hi)


_LOG2E_PAIR = float32_pair(LOG2E)


class Temperature(NamedTuple):
    """The temperature of one op call as every launcher and kernel takes it, resolved once per
    call (temperature_of). `argument` is the kernels' one `temperature` argument
    (kernels.inverse_temperature): the [1] float64 tensor holding t in device memory, which the
    kernels read (`in_memory`), or the host's 1/t as the bits of its float64 (an int: Triton
    passes a Python float as float32)."""
    argument: object
    in_memory: bool

    @property
    def inv_t(self):
        """1/t on the host, which only a host value has (the symmetric schedule's fixed shift
        needs it: the core reads t on the host for that schedule)."""
        assert not self.in_memory, "the temperature is in device memory: no host 1/t"
        return struct.unpack("<d", struct.pack("<q", self.argument))[0]


def temperature_of(temperature, in_memory):
    """A stage op's temperature (scl::Temperature, csrc/core/temperature.h: `temperature`, a [1]
    float64 tensor holding t, in device memory with `in_memory`, else the host value the core
    read and checked, on the CPU) as one Temperature, once per op call. The host value is read
    in place, without an ATen call: the core's call reads t once, and a profile would count a
    second read as a host wait (bench/launch_count.py)."""
    if in_memory:
        return Temperature(temperature, True)
    # The stage ops are in the shipped library: reading another tensor's address would crash.
    if not temperature.is_cpu or temperature.dtype != torch.float64 or temperature.numel() != 1:
        raise ValueError(f"a host temperature must be [1] float64 on the CPU, got "
                         f"{tuple(temperature.shape)} {temperature.dtype} on {temperature.device}")
    t = ctypes.c_double.from_address(temperature.data_ptr()).value
    return Temperature(struct.unpack("<q", struct.pack("<d", 1.0 / t))[0], False)


# Every tile's column block divides this, so the column terms padded to it load without masks.
TERMS_PADDING = 128
ZERO_BLOCK = 1024  # fp32 a column-terms program zeroes per step (8 per thread at 4 warps)


def column_terms(scale, temperature, bias, coef=None, zeroed=None):
    """[N padded, 4] fp32 per-column terms of the tiles (kernels._column_terms): r log2(e)/t;
    `bias`, which the FFMA finishing a logit adds (-inf past the last column), or with `coef`,
    coef r instead (0 past it); r; and a zero that makes each column 16 bytes. Padding columns
    give every tile past the end zero terms. One kernel writes them all
    (kernels.column_terms_kernel), and sets `zeroed` (a contiguous fp32 tensor: the tile kernel's
    accumulator) to 0 on the way, which saves that buffer a zero-fill launch of its own.
    `temperature`: a Temperature."""
    n = scale.shape[0]
    padded = cdiv(n, TERMS_PADDING) * TERMS_PADDING
    terms = torch.empty(padded, 4, dtype=torch.float32, device=scale.device)
    COLUMN_TERMS(
        (padded // TERMS_PADDING,),
        scale, scale if coef is None else coef, terms, terms if zeroed is None else zeroed,
        temperature.argument, n, 0 if zeroed is None else zeroed.numel(),
        0.0 if coef is not None else _fp32(bias), HAS_COEF=coef is not None,
        ZEROES=zeroed is not None, BLOCK=TERMS_PADDING, ZERO_BLOCK=ZERO_BLOCK)
    return terms


def _common(q, tma, rows, output_chunks=True):
    """The arguments every tile kernel takes about its rows (read only: the caller copies
    them); output_chunks: with BLOCK_DO, which only the backward's kernels take."""
    return _row_constants(q.shape[1], q.stride(0), q.dtype, tma, rows, output_chunks, INTERPRET)


@functools.lru_cache(maxsize=1024)
def _row_constants(d, stride, dtype, tma, rows, output_chunks, interpret):
    """_common's arguments, computed once per row shape and kind of launch: a step's launches
    repeat them. `interpret` keys INTERPRET, which the widths and the precision follow."""
    meta = row_width(d, dtype.itemsize).meta()
    if not output_chunks:
        del meta["BLOCK_DO"]
    return dict(D=d, stride=stride, n_bucket=n_bucket(rows), USE_TMA=tma,
                PRECISION=_precision(dtype), **meta)


class GroupMask(NamedTuple):
    """The tiles' group mask (csrc/core/supcon_problem.h, SupConProblem::anchor_group and the
    rest): per anchor row and per contrast row the int32 compact group id (-1: none) and pair
    class; a pair of one group whose pair classes differ leaves the denominator. For multi-hot
    labels (`words` > 0) int32 words of each row's classes numbered within its group ([rows,
    words], multi_hot.group_class_words) stand in for the pair classes, and a pair of one group
    that shares no class leaves."""
    q_group: torch.Tensor
    z_group: torch.Tensor
    q_class: torch.Tensor
    z_class: torch.Tensor
    words: int = 0


def _group_args(groups, stand_in, anchors=True):
    """The kernels' group mask arguments: GROUPS, GROUP_WORDS and the ids' pointers
    (``stand_in``'s, never read, without groups); without ``anchors`` the contrast rows' only (a
    kernel of one set)."""
    ids = (dict(z_group_ptr=stand_in, z_class_ptr=stand_in) if groups is None
           else dict(z_group_ptr=groups.z_group, z_class_ptr=groups.z_class))
    if anchors:
        ids.update(dict(q_group_ptr=stand_in, q_class_ptr=stand_in) if groups is None
                   else dict(q_group_ptr=groups.q_group, q_class_ptr=groups.q_class))
    return dict(ids, GROUPS=groups is not None,
                GROUP_WORDS=0 if groups is None else groups.words)


def lse_plain(q, z, q_scale, z_scale, temperature, self_offset, groups=None):
    """float64 log-sum-exp per anchor with an online maximum (any layout, any scale);
    self_offset >= 0: anchor i never sees row self_offset + i of z; `temperature`: a
    Temperature; `groups`: a GroupMask, or None."""
    m, n = q.shape[0], z.shape[0]
    splits = _splits(q.device, n <= 64, lambda sms: column_splits(m, n, sms))
    part_max = uninitialized((splits, m), q.device)
    part_sum = uninitialized((splits, m), q.device)
    tma = use_tma(q.device)
    args = _row_args(q, z, tma, False)
    args.update(_common(q, tma, m, output_chunks=False), rq_ptr=q_scale,
                terms_ptr=column_terms(z_scale, temperature, 0.0), part_max_ptr=part_max,
                part_sum_ptr=part_sum, M=m, N=n, self_offset=max(self_offset, 0),
                num_splits=splits, SELF_COLUMN=self_offset >= 0, **_group_args(groups, q_scale))
    LSE_PLAIN(lambda meta: (cdiv(m, meta["BLOCK_M"]), splits), args)
    return merge_lse(part_max, part_sum, m, splits)  # -inf: an anchor with no column


MERGE_BLOCK = 256


def merge_lse(part_max, part_sum, m, splits, fixed_shift=None):
    """float64 [m] log-sum-exp from the splits' partial maxima and sums (kernels.lse_merge_kernel);
    with fixed_shift, the sums alone (part_max unread)."""
    lse = torch.empty(m, dtype=torch.float64, device=part_sum.device)
    LSE_MERGE(
        (cdiv(m, MERGE_BLOCK),),
        part_max, part_sum, lse, m, splits, 0.0 if fixed_shift is None else fixed_shift,
        *_LOG2E_PAIR, FIXED_SHIFT=fixed_shift is not None, BLOCK=MERGE_BLOCK)
    return lse


def symmetric_grid(n, block, splits):
    """Programs of the symmetric forward: row blocks paired (p, nb - 1 - p), times splits."""
    return (cdiv(cdiv(n, block), 2), splits)


def lse_symmetric(z, scale, temperature, groups=None):
    """float64 log-sum-exp per row of a single set with the fixed shift 1/t (unit rows only);
    `temperature`: a Temperature on the host (the core reads t for this schedule); `groups`: a
    GroupMask (its contrast rows' ids serve both sides), or None."""
    n = z.shape[0]
    # Padded like the column terms, so that no tile's adds need a mask; the column terms'
    # kernel zeroes it.
    row_sum = torch.empty(cdiv(n, TERMS_PADDING) * TERMS_PADDING, dtype=torch.float32,
                          device=z.device)
    splits = _splits(z.device, n <= 64, lambda sms: symmetric_splits(n, sms))
    tma = use_tma(z.device)
    shift2 = _fp32(temperature.inv_t * LOG2E)  # kernels.logit_scale's c
    z = tma_rows(z) if tma else z
    z_desc, = _descriptors(z, 1) if tma else (None,)
    args = dict(_common(z, tma, n, output_chunks=False), z_desc=z_desc, z_ptr=z,
                terms_ptr=column_terms(scale, temperature, -shift2, zeroed=row_sum),
                row_sum_ptr=row_sum, N=n, num_splits=splits,
                **_group_args(groups, scale, anchors=False))
    LSE_SYMMETRIC(lambda meta: symmetric_grid(n, meta["BLOCK"], splits), args)
    return merge_lse(row_sum, row_sum, n, 1, fixed_shift=shift2)


def _base2_split(lse_hi, lse_lo):
    """lse * log2(e) as float32 (hi, lo) pairs; rows without columns (-inf) get (-inf, 0)."""
    lse2 = (lse_hi.double() + lse_lo.double()) * LOG2E
    hi = lse2.float()
    lo = torch.where(torch.isfinite(lse2), lse2 - hi.double(), 0.0).float()
    return hi.contiguous(), lo.contiguous()


def grad_plain(q, z, q_scale, z_scale, coef, lse_hi, lse_lo, temperature, self_offset,
               deterministic, groups=None):
    """(dq, dz) softmax parts w.r.t. unit rows; coef_i = g_i / t. Without `deterministic`, the
    contrast side is added by atomics from the same tiles; with it, a second kernel recomputes
    the tiles column-wise and no atomics are used. `temperature`: a Temperature; `groups`: a
    GroupMask, or None."""
    m, n, d = q.shape[0], z.shape[0], q.shape[1]
    dq = torch.zeros(m, d, dtype=torch.float32, device=q.device)
    dz = torch.zeros(n, d, dtype=torch.float32, device=q.device)
    lse2_hi, lse2_lo = _base2_split(lse_hi, lse_lo)
    splits = 1 if deterministic else _splits(q.device, n <= 64,
                                              lambda sms: column_splits(m, n, sms))
    tma = use_tma(q.device)
    shared = _row_args(q, z, tma, True)
    shared.update(_common(q, tma, m), rq_ptr=q_scale,
                  terms_ptr=column_terms(z_scale, temperature, 0.0), lse2_hi_ptr=lse2_hi,
                  lse2_lo_ptr=lse2_lo, coef_ptr=coef, temperature=temperature.argument, M=m, N=n,
                  self_offset=max(self_offset, 0), SELF_COLUMN=self_offset >= 0,
                  **_group_args(groups, q_scale))
    rows = dict(shared, dq_ptr=dq, dz_ptr=dz, num_splits=splits, CONTRAST_SIDE=not deterministic,
                SYMMETRIC=False)
    GRAD_PLAIN(lambda meta: (cdiv(m, meta["BLOCK_M"]), cdiv(d, meta["BLOCK_DO"]), splits), rows)
    if deterministic:
        GRAD_COLUMNS(lambda meta: (cdiv(n, meta["BLOCK_N"]), cdiv(d, meta["BLOCK_DO"])),
                     dict(shared, dz_ptr=dz))
    return dq, dz


def grad_symmetric(z, scale, coef, temperature, deterministic, groups=None):
    """Softmax part of the single-set gradient w.r.t. unit rows, both sides, each row block
    summing its full rows of (G + G^T) (kernels.grad_rows_kernel, SYMMETRIC);
    coef_i = g_i exp(1/t - lse_i) / t. Atomics only where the columns are split for small N:
    then the column terms' kernel zeroes dz first; one split stores every element.
    `temperature`: a Temperature (on the host: the core reads t for this schedule); `groups`: a
    GroupMask (its contrast rows' ids serve both sides), or None."""
    n, d = z.shape
    if groups is not None:
        groups = groups._replace(q_group=groups.z_group, q_class=groups.z_class)
    dz = torch.empty(n, d, dtype=torch.float32, device=z.device)
    splits = 1 if deterministic else _splits(z.device, n <= 64,
                                              lambda sms: column_splits(n, n, sms))
    tma = use_tma(z.device)
    args = _row_args(z, z, tma, True)
    args.update(_common(z, tma, n), rq_ptr=scale,
                terms_ptr=column_terms(scale, temperature, None, coef,
                                       zeroed=dz if splits > 1 else None),
                lse2_hi_ptr=coef, lse2_lo_ptr=coef, coef_ptr=coef, dq_ptr=dz, dz_ptr=dz,
                temperature=temperature.argument, M=n, N=n, self_offset=0, num_splits=splits,
                SELF_COLUMN=True, CONTRAST_SIDE=False, SYMMETRIC=True,
                **_group_args(groups, scale))
    GRAD_SYMMETRIC(lambda meta: (cdiv(n, meta["BLOCK_M"]), cdiv(d, meta["BLOCK_DO"]), splits),
                   args)
    return dz
