"""The Triton kernels' machine code for Hopper, without a GPU: each kernel compiled with every
tile its autotuner can choose, specialised as Triton's JIT specialises it at run time, read
(bench/static/sass.py) and priced by the issue-slot model (bench/static/issue_slots.py). Run it
through python -m bench.static.gpu_static, which says what it needs."""
import sys
from dataclasses import asdict, dataclass

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from bench.static import attention_reference, issue_slots, sass
from scl_kernels.backends.triton import kernels, launch

HOPPER = GPUTarget("cuda", 90, 32)
ELEMENT_SIZE = {"bf16": 2, "fp16": 2, "fp32": 4}
USES = launch.KERNEL_USES
HEADLINE = dict(n=65536, d=128, dtype="bf16")
# A kernel's `temperature` as the launchers usually pass it: the host's 1/t as its float64's bits
# (launch.Temperature; a temperature in device memory is a *fp64 instead).
TEMPERATURE = "i64"


@dataclass(frozen=True)
class Case:
    use: str  # a key of launch.KERNEL_USES
    dtype: str
    d: int
    tile: launch.Tile


def _precision(dtype):
    return "tf32x3" if dtype == "fp32" else "tf32"


def _compile(kernel, signature, constexprs, divisible, warps, stages):
    attrs = {(kernel.arg_names.index(name),): [["tt.divisibility", 16]] for name in divisible}
    source = ASTSource(fn=kernel, signature=signature, constexprs=constexprs, attrs=attrs)
    return triton.compile(source, target=HOPPER, options={"num_warps": warps,
                                                          "num_stages": stages})


def specialisation(case):
    """(signature, constexprs, arguments divisible by 16) as the JIT sees a launch of this case
    on Hopper: rows through tensor descriptors (launch.use_tma), 16-byte aligned buffers, N a
    multiple of 16 (the headline sizes), D and the row stride multiples of 16 only when D is,
    and one column split (num_splits == 1 becomes a constant) for the backward at large N."""
    use = USES[case.use]
    kernel = use.kernel
    width = launch.row_width(case.d, ELEMENT_SIZE[case.dtype])
    meta = {**case.tile.meta(kernel), **width.meta(), **use.flags, "USE_TMA": True,
            "PRECISION": _precision(case.dtype)}
    if "num_splits" in kernel.arg_names and case.use != "lse_symmetric":
        meta["num_splits"] = 1
    blocks = {"BLOCK_M": case.tile.block_m, "BLOCK_N": case.tile.block_n,
              "BLOCK": case.tile.block_m, **width.meta()}
    signature, constexprs, divisible = {}, {}, []
    for name in kernel.arg_names:
        if name in meta:
            signature[name], constexprs[name] = "constexpr", meta[name]
        elif name.endswith("_desc"):
            rows, cols = launch.DESCRIPTOR_BLOCKS[name]
            signature[name] = f"tensordesc<{case.dtype}{[blocks[rows], blocks[cols]]}>"
        elif name in ("q_ptr", "z_ptr"):
            signature[name] = "*" + case.dtype
            divisible.append(name)
        elif name.endswith("_ptr"):
            signature[name] = "*fp32"
            divisible.append(name)
        elif name == "temperature":
            signature[name] = TEMPERATURE
        else:
            signature[name] = "i32"
            if name in ("M", "N", "n_bucket") or (name in ("D", "stride") and case.d % 16 == 0):
                divisible.append(name)
    return kernel, signature, constexprs, divisible


def analyse(compiled, warps, inner_trips):
    """What the machine code of one compiled kernel says."""
    instructions, resources = sass.disassemble(compiled.asm["cubin"])
    loop = sass.tile_loop(instructions)
    per_tile = sass.weighted_counts(instructions, loop, inner_trips) if loop else {}
    outside = sass.outside_counts(instructions)
    fmas = sass.tensor_fmas(per_tile, warps)
    loop_instructions = sum(per_tile.values()) * warps
    opcodes = [i.base for i in instructions]
    return {
        "registers": resources["registers"],
        "spill_bytes": resources["local_bytes"] + resources["stack_bytes"],
        "spill_instructions": sum(1 for op in opcodes if op in ("STL", "LDL")),
        "shared_bytes": compiled.metadata.shared,
        "loop_hgmma": any(c.startswith("HGMMA") for c in per_tile),
        "loop_tma": any(c.startswith("UTMALDG") for c in per_tile),
        "tma": "UTMALDG" in opcodes,
        "loop_classes": sass.by_class(per_tile),
        "outside_classes": sass.by_class(outside),
        "tile_fmas": fmas,
        "tensor_input": sass.tensor_input(per_tile) or "BF16",
        "per_1000_fmas": 1000 * loop_instructions / fmas if fmas else None,
    }


def compile_case(case):
    kernel, signature, constexprs, divisible = specialisation(case)
    width = launch.row_width(case.d, ELEMENT_SIZE[case.dtype])
    inner_trips = 1 if width.resident else triton.cdiv(case.d, width.block_k)
    compiled = _compile(kernel, signature, constexprs, divisible, case.tile.warps,
                        case.tile.stages)
    return {**asdict(case), **analyse(compiled, case.tile.warps, inner_trips)}


def compile_reference():
    kernel, signature, constexprs, warps, stages = attention_reference.source()
    compiled = _compile(kernel, signature, constexprs, ["seq_len"], warps, stages)
    return {"kernel": "attention_reference", **analyse(compiled, warps, 1)}


def compile_hard_pairs(dtype):
    """scl_kernels.hard_pairs's Triton kernel with its tile for this dtype (it has one per
    element size, launched with masked pointer loads), single set and normalised."""
    from scl_kernels.backends.triton import hard_pairs
    tile = hard_pairs.TILES[ELEMENT_SIZE[dtype]]
    kernel = hard_pairs.hard_pairs_kernel
    constexprs = {**tile.meta(), "SINGLE_SET": True, "NORMALIZE": True,
                  "PRECISION": _precision(dtype)}
    rows = ("q_ptr", "z_ptr")
    signature = {name: ("constexpr" if name in constexprs else
                        f"*{dtype}" if name in rows else
                        "*i64" if "labels" in name or "index" in name else
                        "*fp32" if name.endswith("_ptr") else "i32") for name in kernel.arg_names}
    compiled = _compile(kernel, signature, constexprs,
                        [n for n in kernel.arg_names if n.endswith("_ptr")], tile.warps,
                        tile.stages)
    return _single_config_record(
        "hard_pairs", dtype, compiled,
        f"{tile.block_m}x{tile.block_n}x{tile.block_k} w{tile.warps} s{tile.stages}")


def _stage_signature(kernel, constexprs, pointers, floats):
    """A fused stage's signature: its constexprs, pointers (fp32 unless `pointers` names another
    type), the temperature (TEMPERATURE), the float32 scalars named in `floats`, every other
    scalar an int32."""
    return {name: ("constexpr" if name in constexprs else
                   pointers.get(name, "*fp32") if name.endswith("_ptr") else
                   TEMPERATURE if name == "temperature" else
                   "fp32" if name in floats else "i32") for name in kernel.arg_names}


def compile_fused_stages():
    """The kernels of the call's O(N D) stages, one configuration each: the launchers' per-column
    terms (kernels.column_terms_kernel; the coefficient form of the symmetric backward and the
    bias form, each zeroing its tile kernel's accumulator), the forward's per-anchor losses
    (anchor_losses.anchor_losses_kernel, bf16 rows, single set), the backward's assembly, the
    preparation, the backward's per-anchor weights, the log-sum-exp's merge and the positive
    walk with its multi-hot positives' count."""
    from scl_kernels.backends.triton import anchor_losses
    records = []
    kernel = kernels.column_terms_kernel
    for has_coef in (False, True):
        constexprs = {"HAS_COEF": has_coef, "ZEROES": True, "BLOCK": launch.TERMS_PADDING,
                      "ZERO_BLOCK": launch.ZERO_BLOCK}
        signature = _stage_signature(kernel, constexprs, {}, ("bias",))
        compiled = _compile(kernel, signature, constexprs, ["terms_ptr"], 4, 1)
        records.append(_single_config_record(
            "column_terms", "fp32", compiled,
            f"{launch.TERMS_PADDING} columns, {'coef' if has_coef else 'bias'}, zeroing"))
    tile = f"{anchor_losses.BLOCK_M} anchors x {anchor_losses.MAX_BLOCK_D} columns"
    records.extend(_stage_records(
        anchor_losses.anchor_losses_kernel, "anchor_losses", "bf16",
        {"q_ptr": "*bf16", "anchor_class_ptr": "*i64", "num_positives_ptr": "*i64",
         "lse_ptr": "*fp64", "mean_sums_ptr": "*fp64"}, (),
        [({"SINGLE_SET": True, "MEAN": mean, "BLOCK_M": anchor_losses.BLOCK_M,
           "BLOCK_D": anchor_losses.MAX_BLOCK_D}, tile + (", mean" if mean else ""))
         for mean in (False, True)]))
    records.append(_compile_backward_assembly())
    records.append(_compile_row_preparation())
    records.extend(_compile_anchor_weights())
    records.extend(_compile_lse_merge())
    records.extend(_compile_positive_walks())
    return records


def _compile_lse_merge():
    """The log-sum-exp's float64 merge (kernels.lse_merge_kernel) in both forms."""
    return _stage_records(
        kernels.lse_merge_kernel, "lse_merge", "fp32", {"lse_ptr": "*fp64"},
        ("fixed_shift", "log2e_hi", "log2e_lo"),
        [({"FIXED_SHIFT": fixed_shift, "BLOCK": launch.MERGE_BLOCK},
          f"{launch.MERGE_BLOCK} rows, {'fixed shift' if fixed_shift else 'running maxima'}")
         for fixed_shift in (False, True)])


def _stage_records(kernel, use, dtype, pointers, floats, forms):
    """One record per (constexprs, description) form of a fused stage's kernel, compiled with 4
    warps and one stage."""
    records = []
    for constexprs, tile_text in forms:
        signature = _stage_signature(kernel, constexprs, pointers, floats)
        compiled = _compile(kernel, signature, constexprs, [], 4, 1)
        records.append(_single_config_record(use, dtype, compiled, tile_text))
    return records


# The positive walk's pointers that are not fp32 (positive_walk.py): the sorted positions' rows
# and slots, the classes (int64), the class words (int32 halves), the class counts.
WALK_POINTERS = {"anchor_row_ptr": "*i32", "contrast_row_ptr": "*i32", "anchor_class_ptr": "*i64",
                 "contrast_class_ptr": "*i64", "segment_lo_ptr": "*i32", "segment_hi_ptr": "*i32",
                 "slot_ptr": "*i32", "anchor_words_ptr": "*i32", "contrast_words_ptr": "*i32",
                 "anchor_count_ptr": "*i32", "contrast_count_ptr": "*i32",
                 "positives_ptr": "*i32", "weight_sum_ptr": "*fp64"}
WALK_DIMS = (64, 128, 256, 768)  # resident rows of either dtype, and streamed ones


def _compile_positive_walks():
    """The positive walk of multi-hot labels (positive_walk.py, MULTI_LABEL) with its tiles on
    Hopper, single set, rows through tensor descriptors at every D of WALK_DIMS, bf16 and fp32:
    the anchors' walk forward and backward and the contrast rows' walk, under either rule; then
    the multi-hot positives' count (count_positives_kernel) under either rule. The class ids'
    walk (the focal loss's) is not held to it: triton 3.9 spills a few bytes of its backward."""
    from scl_kernels.backends.triton import positive_walk
    anchor_tile, contrast_tile = positive_walk.walk_tiles(multi_label=True)
    records = []
    for dtype in ("bf16", "fp32"):
        for d in WALK_DIMS:
            width = positive_walk.walk_width(d, ELEMENT_SIZE[dtype], multi_label=True)
            for kernel, tile, backward in ((positive_walk.walk_anchors_kernel, anchor_tile, False),
                                           (positive_walk.walk_anchors_kernel, anchor_tile, True),
                                           (positive_walk.walk_contrast_kernel, contrast_tile,
                                            True)):
                for jaccard in (False, True):
                    records.append(_compile_walk(kernel, tile, width, dtype, d, backward,
                                                 jaccard))
    for jaccard in (False, True):
        constexprs = {"SELF_COLUMN": True, "JACCARD": jaccard, "BLOCK_M": anchor_tile.block_m,
                      "BLOCK_N": anchor_tile.block_n}
        kernel = positive_walk.count_positives_kernel
        signature = _stage_signature(kernel, constexprs, WALK_POINTERS, ())
        compiled = _compile(kernel, signature, constexprs,
                            [n for n in kernel.arg_names if n.endswith("_ptr")],
                            anchor_tile.warps, 1)
        records.append(_single_config_record(
            "multi_label_positives", "-", compiled,
            f"{anchor_tile.block_m}x{anchor_tile.block_n} w{anchor_tile.warps}, "
            f"{'jaccard' if jaccard else 'any'}"))
    return records


def _compile_walk(kernel, tile, width, dtype, d, backward, jaccard):
    """One multi-hot form of a walk kernel, specialised as the JIT specialises its launch."""
    constexprs = {**tile.meta(kernel), **width.meta(), "SELF_COLUMN": True, "MULTI_LABEL": True,
                  "JACCARD": jaccard, "USE_TMA": True, "PRECISION": _precision(dtype)}
    if "BACKWARD" in kernel.arg_names:
        constexprs["BACKWARD"] = backward
    blocks = {"BLOCK_M": tile.block_m, "BLOCK_N": tile.block_n, **width.meta()}
    signature = _stage_signature(kernel, constexprs,
                                 {"q_ptr": f"*{dtype}", "z_ptr": f"*{dtype}", **WALK_POINTERS},
                                 ("scale_log2", "gamma"))
    for name in kernel.arg_names:
        if name.endswith("_desc"):
            rows, cols = launch.DESCRIPTOR_BLOCKS[name]
            signature[name] = f"tensordesc<{dtype}{[blocks[rows], blocks[cols]]}>"
    compiled = _compile(kernel, signature, constexprs,
                        [n for n in kernel.arg_names if n.endswith("_ptr")], tile.warps,
                        tile.stages)
    use = "walk_anchors" if kernel.__name__ == "walk_anchors_kernel" else "walk_contrast"
    record = _single_config_record(
        use, dtype, compiled,
        f"{tile_text(asdict(tile))}, D={d}, {'backward' if backward else 'forward'}, "
        f"{'jaccard' if jaccard else 'any'}")
    record["hgmma"] = any(i.base.startswith("HGMMA")
                          for i in sass.disassemble(compiled.asm["cubin"])[0])
    return record


def _compile_row_preparation():
    """The preparation (row_preparation.prepare_rows_kernel) in its largest form: bf16 rows with
    the norms, the NaN / inf count and the class sums."""
    from scl_kernels.backends.triton import row_preparation
    kernel = row_preparation.prepare_rows_kernel
    constexprs = {"NORMALIZE": True, "SELF_IN_CLASS": True, "CLASS_SUMS": True,
                  "CHECK_VALUES": True, "BLOCK_R": row_preparation.BLOCK_R,
                  "BLOCK_D": row_preparation.MAX_BLOCK_D}
    pointers = {"x_ptr": "*bf16", "labels_ptr": "*i64", "sorted_ptr": "*i64", "class_ptr": "*i64",
                "positives_ptr": "*i64", "non_finite_ptr": "*i32"}
    signature = _stage_signature(kernel, constexprs, pointers, ())
    compiled = _compile(kernel, signature, constexprs, [], 4, 1)
    return _single_config_record(
        "row_preparation", "bf16", compiled,
        f"{row_preparation.BLOCK_R} rows x {row_preparation.MAX_BLOCK_D} columns, every step")


def _compile_anchor_weights():
    """The backward's per-anchor weights (anchor_weights.anchor_weights_kernel), bf16 rows, for
    each schedule (the plain one also splits the log-sum-exp), for the mean's gradient, with the
    weighted class sums and, the single set's form, without."""
    from scl_kernels.backends.triton import anchor_weights
    tile = f"{anchor_weights.BLOCK_M} anchors x {anchor_weights.MAX_BLOCK_D} columns"
    return _stage_records(
        anchor_weights.anchor_weights_kernel, "anchor_weights", "bf16",
        {"q_ptr": "*bf16", "lse_ptr": "*fp64", "positives_ptr": "*i64", "class_ptr": "*i64",
         "counted_ptr": "*fp64"}, (),
        [({"SYMMETRIC": symmetric, "MEAN": True, "WEIGHTED_SUMS": sums,
           "BLOCK_M": anchor_weights.BLOCK_M, "BLOCK_D": anchor_weights.MAX_BLOCK_D},
          f"{tile}, {'symmetric' if symmetric else 'plain'}"
          + ("" if sums else ", no weighted sums"))
         for symmetric, sums in ((True, True), (False, True), (True, False))])


def _compile_backward_assembly():
    """The backward's assembly (backward_assembly.assemble_backward_kernel) in its largest form:
    bf16 rows of a single set with every term (the plain schedule's anchor side, the positive
    pairs of both sides, the projection)."""
    from scl_kernels.backends.triton import backward_assembly
    kernel = backward_assembly.assemble_backward_kernel
    constexprs = {"EXTRA": True, "ANCHOR_PART": True, "SELF_IN_CLASS": True, "ROW_PART": True,
                  "CLASS_SHARES_WEIGHT": False, "NORMALIZE": True, "BLOCK_R": backward_assembly.BLOCK_R,
                  "BLOCK_D": backward_assembly.MAX_BLOCK_D}
    pointers = {"x_ptr": "*bf16", "out_ptr": "*bf16", "anchor_class_ptr": "*i64",
                "row_class_ptr": "*i64"}
    signature = _stage_signature(kernel, constexprs, pointers, ("max_inv_norm",))
    compiled = _compile(kernel, signature, constexprs, [], 4, 1)
    return _single_config_record(
        "backward_assembly", "bf16", compiled,
        f"{backward_assembly.BLOCK_R} rows x {backward_assembly.MAX_BLOCK_D} columns, every term")


def _single_config_record(use, dtype, compiled, tile_text):
    instructions, resources = sass.disassemble(compiled.asm["cubin"])
    opcodes = [i.base for i in instructions]
    return {"use": use, "dtype": dtype, "d": "any", "tile": None, "tile_text": tile_text,
            "registers": resources["registers"],
            "spill_bytes": resources["local_bytes"] + resources["stack_bytes"],
            "spill_instructions": sum(1 for op in opcodes if op in ("STL", "LDL")),
            "shared_bytes": compiled.metadata.shared}


def cases(dims, dtypes):
    for name, use in USES.items():
        for dtype in dtypes:
            for d in dims:
                for tile in launch.candidate_tiles(use, d, ELEMENT_SIZE[dtype]):
                    yield Case(name, dtype, d, tile)


def problems(result):
    """Why a compiled tile is not fit to keep (empty: it is)."""
    found = []
    if result["spill_bytes"] or result["spill_instructions"]:
        found.append(f"spills {result['spill_bytes']} B ({result['spill_instructions']} STL/LDL)")
    if result["shared_bytes"] > launch.SHARED_MEMORY_BYTES:
        found.append(f"{result['shared_bytes']} B of shared memory")
    return found


# ------------------------------------------------------------------------------------------
# Predicted times of the symmetric schedule
# ------------------------------------------------------------------------------------------

@dataclass
class Step:
    """One kernel launch of the schedule, with the tile that the model picks for it."""
    seconds: float
    result: dict
    tile_cost: issue_slots.TileCost
    tiles: int

    @property
    def loop_instructions(self):
        return self.tiles * sum(self.result["loop_classes"].values()) * self.result["tile"]["warps"]

    @property
    def fmas(self):
        return self.tiles * self.result["tile_fmas"]


def _costs(result):
    warps = result["tile"]["warps"]
    tile = issue_slots.cost(result["loop_classes"], result["tile_fmas"],
                            result["tensor_input"], warps)
    program = issue_slots.cost(result["outside_classes"], 0, result["tensor_input"], warps)
    return tile, program


def symmetric_work(use, tile, n, d, element_size):
    """(tiles, programs) that the symmetric schedule's launchers give a kernel at this size."""
    width = launch.row_width(d, element_size)
    if use == "lse_symmetric":
        nb = triton.cdiv(n, tile["block_m"])
        splits = launch.symmetric_splits(n, issue_slots.H100.sms)  # as the launcher: before tuning
        return nb * (nb + 1) // 2, triton.cdiv(nb, 2) * splits
    chunks = triton.cdiv(d, width.block_do)
    row_blocks = triton.cdiv(n, tile["block_m"])
    splits = launch.column_splits(n, n, issue_slots.H100.sms)
    return row_blocks * triton.cdiv(n, tile["block_n"]) * chunks, row_blocks * chunks * splits


def predict(results, n, d, dtype):
    """{step: (seconds, result of the fastest tile)} for the symmetric forward and backward, and
    the floor of the schedule: N^2 D / 2 multiply-adds and N^2 / 2 exps forward (the upper
    triangle), 2 N^2 D and N^2 backward (full rows, two products per tile)."""
    predicted = {}
    for step, use in (("forward", "lse_symmetric"), ("backward", "grad_symmetric")):
        options = []
        for r in results:
            if (r["use"], r["d"], r["dtype"]) != (use, d, dtype) or problems(r):
                continue
            tiles, programs = symmetric_work(use, r["tile"], n, d, ELEMENT_SIZE[dtype])
            tile_cost, program_cost = _costs(r)
            t = issue_slots.seconds(tiles, tile_cost, programs, program_cost)
            options.append(Step(t, r, tile_cost, tiles))
        if not options:
            return None
        # Within 1% of the fastest, the tile that issues least per multiply-add: the model
        # cannot tell them apart, and issue slots to spare hide latency it does not model.
        fastest = min(o.seconds for o in options)
        predicted[step] = min((o for o in options if o.seconds <= 1.01 * fastest),
                              key=lambda o: o.result["per_1000_fmas"])
    kind = "TF32" if dtype == "fp32" else "BF16"
    floor = (issue_slots.floor_seconds(n * n * d / 2, n * n / 2, kind)
             + issue_slots.floor_seconds(2 * n * n * d, n * n, kind))
    return predicted, floor


# ------------------------------------------------------------------------------------------
# Report
# ------------------------------------------------------------------------------------------

def tile_text(tile):
    return f"{tile['block_m']}x{tile['block_n']} w{tile['warps']} s{tile['stages']}"


def report(results, reference, dims, out=sys.stdout):
    def emit(line=""):
        print(line, file=out, flush=True)

    emit("Static GPU check, sm_90 (Triton %s; machine code, no GPU). Times are predictions."
         % triton.__version__)
    emit()
    emit(f"{'kernel (launch.KERNEL_USES)':<28}{'dtype':<6}{'D':>5}  {'tile':<18}{'regs':>5}"
         f"{'spill B':>8}{'STL/LDL':>8}{'smem KiB':>9}  {'HGMMA':<6}{'TMA':<5}"
         f"{'loop/tile':>10}{'per 1k FMA':>11}  loop classes per warp and tile")
    for r in results:
        per_k = f"{r['per_1000_fmas']:.2f}" if r["per_1000_fmas"] else "-"
        classes = " ".join(f"{k}:{v}" for k, v in sorted(r["loop_classes"].items(),
                                                         key=lambda kv: -kv[1]))
        emit(f"{r['use']:<28}{r['dtype']:<6}{r['d']:>5}  "
             f"{tile_text(r['tile']):<18}{r['registers']:>5}{r['spill_bytes']:>8}"
             f"{r['spill_instructions']:>8}{r['shared_bytes'] / 1024:>9.0f}  "
             f"{'yes' if r['loop_hgmma'] else 'no':<6}{'yes' if r['loop_tma'] else 'no':<5}"
             f"{sum(r['loop_classes'].values()):>10}{per_k:>11}  {classes}")
    emit()
    emit(f"reference (bench/static/attention_reference.py, 128x128, head dim 128, bf16, w8 s3): "
         f"{reference['per_1000_fmas']:.2f} loop warp instructions per 1,000 tensor FMAs, "
         f"{reference['registers']} registers, {reference['spill_bytes']} B spilled")
    emit()
    emit("Predicted symmetric schedule (single set, contrast_mode='all'), bf16, issue-slot "
         f"model of an {issue_slots.H100.name}: {issue_slots.H100.sms} SMs at "
         f"{issue_slots.H100.clock_hz / 1e9:.2f} GHz")
    emit(f"{'N':>8}{'D':>6}  {'forward ms':>11} {'bound':<7}{'backward ms':>12} {'bound':<7}"
         f"{'fwd+bwd ms':>11}{'floor ms':>10}{'ratio':>7}  tiles (fwd / bwd)")
    headline = None
    for n in (65536, 262144):
        for d in (128, 256, 768):
            if d not in dims:
                continue
            out_ = predict(results, n, d, "bf16")
            if out_ is None:
                continue
            predicted, floor = out_
            fwd, bwd = predicted["forward"], predicted["backward"]
            total = fwd.seconds + bwd.seconds
            emit(f"{n:>8}{d:>6}  {fwd.seconds * 1e3:>11.3f} {fwd.tile_cost.bound:<7}"
                 f"{bwd.seconds * 1e3:>12.3f} {bwd.tile_cost.bound:<7}{total * 1e3:>11.3f}"
                 f"{floor * 1e3:>10.3f}{total / floor:>7.2f}  "
                 f"{tile_text(fwd.result['tile'])} / {tile_text(bwd.result['tile'])}")
            if (n, d) == (HEADLINE["n"], HEADLINE["d"]):
                headline = (total, floor, fwd, bwd)
    if headline:
        total, floor, fwd, bwd = headline
        together = 1000 * (fwd.loop_instructions + bwd.loop_instructions) / (fwd.fmas + bwd.fmas)
        emit()
        emit(f"loop warp instructions per 1,000 tensor FMAs at the headline, with the tiles "
             f"above: forward {fwd.result['per_1000_fmas']:.2f}, backward "
             f"{bwd.result['per_1000_fmas']:.2f}, fwd+bwd {together:.2f} "
             f"({together / reference['per_1000_fmas']:.2f}x the reference's "
             f"{reference['per_1000_fmas']:.2f})")
        emit(f"predicted fwd+bwd N={HEADLINE['n']} D={HEADLINE['d']} {HEADLINE['dtype']}: "
             f"{total * 1e3:.2f} ms (floor {floor * 1e3:.2f} ms, X/Y = {total / floor:.2f})")
