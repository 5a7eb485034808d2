"""The CUDA C++ kernels (csrc/cuda) from their machine code, without a GPU: nvcc compiles both
kernel families for sm_80 and sm_90a as the build does; cuobjdump gives each kernel's
registers, spills and SASS; bench/static/sass.py finds the tile loop; bench/static/issue_slots.py
turns it into a predicted time for the headline case. Every time it prints is a prediction.

    python -m bench.static.cuda_static [--json FILE]

Used by python -m bench.static.gpu_static (beside the Triton kernels) and
python_tests/static_checks/test_gpu_static.py.
"""
import argparse
import hashlib
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor

from bench.static import issue_slots, sass
from bench.static.requirements import CUDA_NEEDS, CUOBJDUMP, TRITON_PIN, cutlass_include

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SOURCES = ("supcon_sm80.cu", "supcon_sm80_groups.cu", "supcon_sm90.cu", "supcon_sm90_groups.cu",
           "row_stages.cu")
# The fused O(N*D) stages' kernels (row_stages.h), no tensor cores: the function in a kernel's
# mangled name that tells which stage it is -> the stage.
ROW_STAGES = {"prepare_row_partial": "prepare_rows", "anchor_loss_partial": "anchor_losses",
              "anchor_mean_kernel": "anchor_mean", "anchor_weight_partial": "anchor_weights",
              "assemble_row_partial": "assemble_backward", "write_terms": "row_terms",
              "merge_lse": "lse_merge"}
ARCHS = ("sm_80", "sm_90a")
# The flags of the build (setup.py): the same code as the extension's.
FLAGS = ["-std=c++20", "-O3", "--use_fast_math", "--expt-relaxed-constexpr", "-DNDEBUG"]
HEADLINE = dict(n=65536, d=128)
# Also predicted: the widest D the wgmma kernels take (their 256-wide form).
WIDE = dict(n=65536, d=256)
# sm_90a: a program is a producer warpgroup and two consumer warpgroups; one trip of the
# consumers' loop is one 128-row streamed tile for the program's 128 rows.
SM90_BLOCK, SM90_CONSUMER_WARPS = 128, 8
SM90_GRAD_CHUNK = 128  # gradient columns per backward program (kGradWidth)
# L2's rate of fp32 vector reductions measured on an H100 by bench/static/l2_reduce_probe.cu
# (bench/results/gpu_h100_2026-11-23: 16-byte reductions 3.34 TB/s, TMA bulk ones 3.31 TB/s): the
# triangle backward's cluster pairs send every column block's partial gradient through it once
# per pair of programs.
L2_REDUCTION_BYTES_PER_S = 3.3e12

# The sm90 walk_kernel's Walk argument by value (csrc/cuda/walk_terms.h): how the mangled and
# demangled names say which walk a kernel is.
WALKS = ("kLsePlain", "kLseSymmetric", "kGradRowsPlain", "kGradRowsSymmetric", "kGradColumns",
         "kGradTriangle", "kGradTriangleAsync")
# Walks whose tile loop is known to hold GPU-scope fences, and the change that removes them: such
# a kernel is reported as an expected failure, not a problem; one whose fences are gone is a
# problem until it leaves this list, so that the record changes with the code (a strict xfail).
# The triangle's cluster-scope release arrive (cluster_pair.cuh) compiles to MEMBAR.ALL.GPU right
# after the tile's reductions into L2, so each tile waits for them to land. Its exchange without
# them, kGradTriangleAsync, is not listed: a GPU-scope fence in its tile loop fails the check.
KNOWN_GPU_FENCES = {"kGradTriangle": "until the triangle's exchange by st.async (kGradTriangleAsync, "
                                     "step 1 of the walks' plan) is measured and becomes the "
                                     "default (rule 5 of "
                                     "bench/decisions/2026-11-28-walks-m0-rules.md)"}

_FUNCTION = re.compile(r"Function\s*:\s*(\S+)")
_RESOURCE = re.compile(r"Function (\S+):\s*\n\s*REG:(\d+) STACK:(\d+) SHARED:(\d+) LOCAL:(\d+)")


def toolchain():
    """(nvcc, CuTe include dir) or a reason why the CUDA kernels cannot be compiled here."""
    if importlib.util.find_spec("triton") is None:
        return None, (f"triton is not installed (its cuobjdump reads the kernels: "
                      f"pip install {TRITON_PIN})")
    nvcc = shutil.which("nvcc") or os.path.join(os.environ.get("CUDA_HOME", "/usr/local/cuda"),
                                                "bin", "nvcc")
    if not os.path.exists(nvcc):
        return None, "nvcc is not found (set CUDA_HOME)"
    include, why_not = cutlass_include(os.environ)
    return ((nvcc, include), None) if include else (None, why_not)


def _fingerprint(nvcc):
    digest = hashlib.sha256(" ".join(FLAGS + [nvcc]).encode())
    for folder in ("csrc/cuda", "csrc/core"):
        for name in sorted(os.listdir(os.path.join(ROOT, folder))):
            if name.endswith((".cu", ".cuh", ".h")):
                with open(os.path.join(ROOT, folder, name), "rb") as f:
                    digest.update(name.encode() + f.read())
    return digest.hexdigest()[:16]


def compile_cubins(tools):
    """{(source, arch): cubin path}, cached by a hash of the sources and flags."""
    nvcc, include = tools
    cache = os.path.join(tempfile.gettempdir(), "scl_cuda_static", _fingerprint(nvcc))
    os.makedirs(cache, exist_ok=True)

    def build(source, arch):
        out = os.path.join(cache, f"{source}.{arch}.cubin")
        if not os.path.exists(out):
            subprocess.run([nvcc, *FLAGS, "-I", os.path.join(ROOT, "csrc"), "-I", include,
                            f"-arch={arch}", "-cubin", "-o", out + ".part",
                            os.path.join(ROOT, "csrc", "cuda", source)], check=True)
            os.replace(out + ".part", out)
        return (source, arch), out

    with ThreadPoolExecutor(2) as pool:
        return dict(pool.map(lambda job: build(*job), [(s, a) for s in SOURCES for a in ARCHS]))


def split_functions(sass_text):
    """{mangled name: SASS text of that function} of a cuobjdump -sass listing."""
    found, starts = {}, [(m.start(), m.group(1)) for m in _FUNCTION.finditer(sass_text)]
    for i, (start, name) in enumerate(starts):
        end = starts[i + 1][0] if i + 1 < len(starts) else len(sass_text)
        found[name] = sass_text[start:end]
    return found


def parse_resources(text):
    """{mangled name: (registers, stack, shared, local bytes)} of a cuobjdump -res-usage listing."""
    return {m.group(1): tuple(map(int, m.groups()[1:])) for m in _RESOURCE.finditer(text)}


def kernel_name(mangled):
    """'sm90 walk_kernel<bf16, kLseSymmetric, 128>' from the mangled name (the sm90 kernels' last
    argument is their resident row width), ending in ', groups' for a kernel compiled with the
    group mask (its bool argument true); 'row_stages prepare_rows' for a fused stage's."""
    if "row_stages" in mangled:
        stage = next((v for f, v in ROW_STAGES.items() if re.search(rf"\d{f}E", mangled)), "unknown")
        return f"row_stages {stage}"
    family = "sm90" if "sm90" in mangled else "sm80"
    kernel = "lse_symmetric_kernel" if "lse_symmetric_kernel" in mangled else "walk_kernel"
    dtype = ("bf16" if "bfloat16" in mangled else "fp16" if "half_t" in mangled else "fp32")
    walk = re.search(r"WalkE(\d)", mangled)
    width = re.search(r"ELi(\d+)E", mangled)
    args = (dtype + (f", {WALKS[int(walk.group(1))]}" if walk else "")
            + (f", {width.group(1)}" if width else "") + (", groups" if "Lb1E" in mangled else ""))
    return f"{family} {kernel}<{args}>"


def _turns_in_loop(instructions, loop):
    """Whether the loop waits on and arrives at a named barrier of 256 threads: the two consumer
    warpgroups' turns (sm90_mainloop.cuh, ConsumerTurns)."""
    def has(opcode):
        return any(i.opcode.startswith(opcode) and loop.contains(i.address)
                   and i.operands.replace(" ", "").rstrip(";").endswith(",0x100")
                   for i in instructions)
    return has("BAR.SYNC") and has("BAR.ARV")


def gpu_fence(instruction):
    """A memory barrier of GPU or system scope (MEMBAR.ALL.GPU, MEMBAR.SC.SYS, ...): it waits for
    every earlier memory operation of the thread to be visible at that scope."""
    return instruction.base == "MEMBAR" and instruction.opcode.endswith((".GPU", ".SYS"))


def synchronisation_in_tile_loops(instructions):
    """What the walks' overlap depends on, counted in the tile loops (the outermost loops holding
    tensor instructions): GPU-scope fences, cluster-scope acquire waits' cache invalidations
    (CCTL.IVALL), and the wgmma waits by form: `WARPGROUP.DEPBAR.LE gsb0, 0x0` waits for every
    wgmma in flight (the product is waited for at once), a larger count leaves that many in
    flight (the intra-warpgroup overlap of FlashAttention-3's main loop)."""
    loops = sass.tensor_loops(instructions)
    inside = [i for i in instructions if any(loop.contains(i.address) for loop in loops)]
    waits = {"at once": 0, "deferred": 0}
    for i in inside:
        if i.opcode.startswith("WARPGROUP.DEPBAR"):
            pending = int(i.operands.split(",")[-1].strip(), 16)
            waits["at once" if pending == 0 else "deferred"] += 1
    return {"loop_gpu_fences": sum(gpu_fence(i) for i in inside),
            "loop_cache_invalidations": sum(i.opcode.startswith("CCTL.IVALL") for i in inside),
            "loop_wgmma_waits": waits}


def known_gpu_fences(kernel):
    """Why a kernel's tile loop still holds GPU-scope fences (KNOWN_GPU_FENCES), or None."""
    return next((why for walk, why in KNOWN_GPU_FENCES.items() if f", {walk}," in kernel), None)


def analyse(name, arch, text, resources):
    instructions = sass.parse_sass(text)
    registers, stack, shared, local = resources
    opcodes = [i.base for i in instructions]
    loop = sass.tile_loop(instructions)
    per_trip = sass.weighted_counts(instructions, loop, 1) if loop else {}
    warps = SM90_CONSUMER_WARPS if name.startswith("sm90") else 4
    fmas = sass.tensor_fmas(per_trip, warps)
    return {
        "kernel": name, "arch": arch, "registers": registers,
        "spill_bytes": stack + local,
        "spill_instructions": sum(1 for op in opcodes if op in ("STL", "LDL")),
        "static_shared_bytes": shared,
        "instructions": len(instructions),
        "loop_hmma": any(c.startswith("HMMA") for c in per_trip),
        "loop_hgmma": any(c.startswith("HGMMA") for c in per_trip),
        "tma": "UTMALDG" in opcodes,
        "loop_turns": bool(loop) and _turns_in_loop(instructions, loop),
        "loop_classes": sass.by_class(per_trip),
        "trip_fmas": fmas,
        "tensor_input": sass.tensor_input(per_trip),
        "per_1000_fmas": 1000 * sum(per_trip.values()) * warps / fmas if fmas else None,
        **synchronisation_in_tile_loops(instructions),
    }


def analyse_all(tools):
    results = []
    for (source, arch), cubin in sorted(compile_cubins(tools).items()):
        sass_text = sass._tool("cuobjdump", "-sass", cubin)
        resources = parse_resources(sass._tool("cuobjdump", "-res-usage", cubin))
        for mangled, text in split_functions(sass_text).items():
            name = kernel_name(mangled)
            if name.startswith("sm90") and arch != "sm_90a":
                continue  # bodies only for sm_90a; elsewhere an empty stub
            results.append(analyse(name, arch, text, resources[mangled]))
    return results


def problems(result):
    """What is wrong with a compiled kernel (empty: nothing)."""
    found = []
    if result["spill_bytes"] or result["spill_instructions"]:
        found.append(f"spills {result['spill_bytes']} B ({result['spill_instructions']} STL/LDL)")
    if result["kernel"].startswith("row_stages"):
        return found  # a loop over D per thread: nothing but its spills to check
    if result["kernel"].startswith("sm90"):
        if not result["loop_hgmma"]:
            found.append("no HGMMA in its tile loop")
        if not result["tma"]:
            found.append("no UTMALDG (TMA)")
        if not result["loop_turns"]:
            found.append("no consumer turns (256-thread named barriers) in its tile loop")
        fences, known = result.get("loop_gpu_fences", 0), known_gpu_fences(result["kernel"])
        if fences and not known:
            found.append(f"{fences} GPU-scope MEMBAR in its tile loop")
        if known and not fences:
            found.append("no GPU-scope MEMBAR in its tile loop any more: take it out of "
                         "KNOWN_GPU_FENCES and the record's 'expected until step 1'")
    elif not result["loop_hmma"]:
        found.append("no HMMA in its loop")
    return found


def _sm90_steps(results, d, walks):
    """{step: (seconds, cost, result)} of bf16 sm_90a kernels at the resident width d takes;
    walks: {step: (walk name, tiles)}."""
    assert d <= 2 * SM90_BLOCK
    width = SM90_BLOCK if d <= SM90_BLOCK else 2 * SM90_BLOCK
    by_name = {r["kernel"]: r for r in results if r["arch"] == "sm_90a"}
    steps = {}
    for step, (walk, tiles) in walks.items():
        r = by_name[f"sm90 walk_kernel<bf16, {walk}, {width}>"]
        cost = issue_slots.cost(r["loop_classes"], r["trip_fmas"], "BF16", SM90_CONSUMER_WARPS)
        steps[step] = (issue_slots.seconds(tiles, cost, 0, cost), cost, r)
    return steps


def triangle_tiles(nb):
    """(tiles with a column side, tiles without) of the triangle backward's cluster pairs
    (tile_math::pair_triangle_tiles): a pair (2p, 2p + 1) walks nb - 2p tiles each, the first
    two its own rows' side only; an odd last block walks its diagonal alone, beside a block of
    padding that does the same."""
    column, rows_only = 0, 0
    for first in range(0, nb, 2):
        tiles = nb - first if first + 1 < nb else 1
        column += 2 * max(tiles - 2, 0)
        rows_only += 2 * min(tiles, 2)
    return column, rows_only


def predict(results, n=HEADLINE["n"], d=HEADLINE["d"]):
    """Predicted seconds of the sm_90a symmetric schedule (bf16, d <= 256): the forward over the
    upper triangle, nb (nb + 1) / 2 tiles; the backward over the triangle by cluster pairs at
    d <= 128 (kGradTriangle; its tiles without a column side cost a full-row tile), else over
    full rows, nb^2 tiles per 128-wide chunk of the gradient (each chunk recomputes the logits);
    plus the floors of 4 N^2 D (MATH.md's symmetric) and 5 N^2 D FLOPs (full rows, one chunk).
    The triangle also sends each pair's partial columns through L2 by reductions, 4 bytes per
    element of a 128 x d tile per pair step: `l2_seconds` is their time at the measured rate
    (None for full rows); the atomics are issued and not waited for, so they overlap the
    products, and only what the products do not hide adds to the total (_emit_steps).
    Returns (steps, symmetric floor, 5 N^2 D floor, l2_seconds)."""
    nb = -(-n // SM90_BLOCK)
    if d <= SM90_BLOCK:
        column, rows_only = triangle_tiles(nb)
        steps = _sm90_steps(results, d, {"forward": ("kLseSymmetric", nb * (nb + 1) // 2),
                                         "backward": ("kGradTriangle", column),
                                         "bwd rows": ("kGradRowsSymmetric", rows_only)})
        l2_seconds = (column // 2) * SM90_BLOCK * d * 4 / L2_REDUCTION_BYTES_PER_S
    else:
        l2_seconds = None
        steps = _sm90_steps(results, d, {
            "forward": ("kLseSymmetric", nb * (nb + 1) // 2),
            "backward": ("kGradRowsSymmetric", nb * nb * -(-d // SM90_GRAD_CHUNK))})
    flops = n * n * d  # multiply-adds of N^2 D / 2 ... as FMAs: FLOPs / 2
    symmetric_floor = issue_slots.floor_seconds(2 * flops, n * n, "BF16")  # 4 N^2 D FLOPs
    schedule_floor = issue_slots.floor_seconds(2.5 * flops, 1.5 * n * n, "BF16")  # 5 N^2 D
    return steps, symmetric_floor, schedule_floor, l2_seconds


def predict_async_backward(results, n=HEADLINE["n"], d=HEADLINE["d"]):
    """(seconds, cost, result) of the triangle's column-side tiles with the partners' exchange by
    st.async (kGradTriangleAsync, opt-in), in the model that gives kGradTriangle's: it counts issue
    slots, not waits, so it differs from the default only by the exchange's instructions; the
    fences' waits that this walk removes are not in it (rule 5 of
    bench/decisions/2026-11-28-walks-m0-rules.md predicts their share from the GPU's numbers)."""
    column, _ = triangle_tiles(-(-n // SM90_BLOCK))
    return _sm90_steps(results, d, {"bwd async": ("kGradTriangleAsync", column)})["bwd async"]


def predict_plain(results, n=HEADLINE["n"], d=HEADLINE["d"]):
    """Predicted seconds of the sm_90a plain schedule on a cross set of n anchors and n contrast
    rows (bf16, d <= 256): the forward over every tile, the backward's rows and columns walks
    over every tile per 128-wide gradient chunk (each chunk recomputes the logits); plus the floor
    of the plain schedule, 8 N^2 D FLOPs and 2 N^2 exps (S once in each pass, two products)."""
    nb = -(-n // SM90_BLOCK)
    chunks = -(-d // SM90_GRAD_CHUNK)
    steps = _sm90_steps(results, d, {"forward": ("kLsePlain", nb * nb),
                                     "bwd rows": ("kGradRowsPlain", nb * nb * chunks),
                                     "bwd cols": ("kGradColumns", nb * nb * chunks)})
    return steps, issue_slots.floor_seconds(4 * n * n * d, 2 * n * n, "BF16")


def _emit_steps(emit, steps, l2_seconds=None):
    """Prints the steps; returns the total of their seconds, plus what of `l2_seconds` (the
    triangle's reductions, overlapping its backward's products) those products do not hide."""
    total = 0.0
    for step, (seconds, cost, r) in steps.items():
        total += seconds
        emit(f"  {step:<9} {seconds * 1e3:7.3f} ms, {cost.bound}-bound per tile (tensor "
             f"{cost.tensor:.0f}, MUFU {cost.mufu:.0f}, issue {cost.issue:.0f} cycles), "
             f"{r['per_1000_fmas']:.2f} loop instructions per 1,000 FMAs")
    if l2_seconds is not None:
        exposed = max(l2_seconds - steps["backward"][0] - steps["bwd rows"][0], 0.0)
        total += exposed
        emit(f"  {'l2 reduce':<9} {exposed * 1e3:7.3f} ms beyond the products: the pairs' column partials, "
             f"{l2_seconds * 1e3:.3f} ms through L2 at the {L2_REDUCTION_BYTES_PER_S / 1e12:.1f} TB/s measured")
    return total


def report(results, out=sys.stdout):
    def emit(line=""):
        print(line, file=out, flush=True)

    emit("CUDA C++ kernels (csrc/cuda), nvcc for sm_80 and sm_90a; machine code, no GPU. "
         "Times are predictions.")
    emit(f"{'kernel':<52}{'arch':<8}{'regs':>5}{'spill B':>8}{'STL/LDL':>8}  {'MMA':<6}{'TMA':<5}"
         f"{'loop/trip':>10}{'per 1k FMA':>11}  loop classes per warp and trip")
    for r in results:
        mma = "HGMMA" if r["loop_hgmma"] else "HMMA" if r["loop_hmma"] else "none"
        per_k = f"{r['per_1000_fmas']:.2f}" if r["per_1000_fmas"] else "-"
        classes = " ".join(f"{k}:{v}" for k, v in sorted(r["loop_classes"].items(), key=lambda kv: -kv[1]))
        emit(f"{r['kernel']:<52}{r['arch']:<8}{r['registers']:>5}{r['spill_bytes']:>8}"
             f"{r['spill_instructions']:>8}  {mma:<6}{'yes' if r['tma'] else 'no':<5}"
             f"{sum(r['loop_classes'].values()):>10}{per_k:>11}  {classes}")
    emit("(sm_80 kernels: one trip is one K chunk of a tile, its tile epilogue included.)")
    emit()
    emit("sm_90a tile loops: GPU-scope fences (none allowed), cluster-scope cache invalidations, "
         "wgmma waits (at once: gsb0, 0x0; deferred: work left in flight)")
    for r in results:
        if r["arch"] != "sm_90a" or not r["kernel"].startswith("sm90"):
            continue
        known = known_gpu_fences(r["kernel"])
        verdict = ("ok" if not r["loop_gpu_fences"] and not known else
                   f"EXPECTED FAIL {known}" if r["loop_gpu_fences"] and known else "FAIL")
        waits = r["loop_wgmma_waits"]
        emit(f"  {r['kernel']:<50} MEMBAR.GPU {r['loop_gpu_fences']}  CCTL.IVALL "
             f"{r['loop_cache_invalidations']}  DEPBAR at once {waits['at once']}, deferred "
             f"{waits['deferred']}  {verdict}")
    steps, floor = predict_plain(results)
    emit()
    emit(f"Predicted sm_90a plain schedule, cross set of N={HEADLINE['n']} anchors and contrast "
         f"rows, D={HEADLINE['d']} bf16, issue-slot model of an {issue_slots.H100.name}:")
    total = _emit_steps(emit, steps)
    emit(f"predicted fwd+bwd CUDA cross set N={HEADLINE['n']} D={HEADLINE['d']} bf16: "
         f"{total * 1e3:.2f} ms ({total / floor:.2f}x the plain schedule's 8 N^2 D floor "
         f"{floor * 1e3:.2f} ms)")
    totals = {}
    for case in (WIDE, HEADLINE):  # the headline last: its line ends the report
        steps, symmetric_floor, schedule_floor, l2_seconds = predict(results, case["n"], case["d"])
        emit()
        emit(f"Predicted sm_90a symmetric schedule, N={case['n']} D={case['d']} bf16, "
             f"issue-slot model of an {issue_slots.H100.name}:")
        total = _emit_steps(emit, steps, l2_seconds)
        if l2_seconds is not None:
            seconds, cost, r = predict_async_backward(results, case["n"], case["d"])
            emit(f"  (opt-in) {seconds * 1e3:7.3f} ms in place of 'backward' with the exchange by st.async "
                 f"(kGradTriangleAsync): issue {cost.issue:.0f} cycles per tile, "
                 f"{r['per_1000_fmas']:.2f} loop instructions per 1,000 FMAs; not in the total")
        emit(f"predicted fwd+bwd CUDA N={case['n']} D={case['d']} bf16: {total * 1e3:.2f} ms "
             f"({total / symmetric_floor:.2f}x the 4 N^2 D symmetric floor {symmetric_floor * 1e3:.2f} ms, "
             f"{total / schedule_floor:.2f}x the 5 N^2 D floor {schedule_floor * 1e3:.2f} ms)")
        totals[case["d"]] = total
    return totals


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     epilog=f"{CUDA_NEEDS} {CUOBJDUMP}", allow_abbrev=False)
    parser.add_argument("--json", help="also write every result to this file")
    args = parser.parse_args(argv)
    tools, why_not = toolchain()
    if tools is None:
        print(f"CUDA kernels not checked: {why_not}")
        return 0
    results = analyse_all(tools)
    report(results)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    bad = [(r, problems(r)) for r in results if problems(r)]
    for r, why in bad:
        print(f"NOT FIT: {r['kernel']} ({r['arch']}): {'; '.join(why)}", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
