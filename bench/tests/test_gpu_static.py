"""The static GPU check (bench.static.gpu_static): its reading of machine code on hand-written
SASS, its issue-slot arithmetic, and the check itself: every Triton kernel with every tile that
autotuning may keep compiles for Hopper (sm_90) without spilling and within shared memory, with
tensor-core (HGMMA) and TMA instructions in its tile loop; and every CUDA C++ kernel
(bench.static.cuda_static) compiles for sm_80 and sm_90a without spilling, with HMMA (sm_80) or
HGMMA and UTMALDG (sm_90a). CI has no GPU; this is what it can say."""
import json
import os
import subprocess
import sys

import pytest

from scl_kernels.backends import triton_installed

pytestmark = pytest.mark.skipif(not triton_installed(), reason="triton is not installed")

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))

# A column loop (0x0100 .. 0x0190) holding a K loop (0x0120 .. 0x0150) and a wait on a barrier
# placed out of line (0x0200 .. 0x0220), as ptxas lays out a pipelined Triton kernel.
SASS = """
        /*0000*/                   S2R R0, SR_TID.X ;
        /*0010*/                   LDC R1, c[0x0][0x28] ;
        /*0100*/                   FMUL R2, R2, R3 ;
        /*0110*/                   SYNCS.PHASECHK.TRANS64.TRYWAIT P1, [UR9+0x10300], R88 ;
        /*0120*/              @!P1 BRA 0x200 ;
        /*0130*/                   HGMMA.64x128x16.F32.BF16 R24, gdesc[UR8], R24 ;
        /*0140*/                   IADD3 R4, R4, 0x1, RZ ;
        /*0150*/               @P2 BRA 0x130 ;
        /*0160*/                   MUFU.EX2 R5, R5 ;
        /*0170*/                   STL [R1], R5 ;
        /*0180*/                   ISETP.GE.AND P0, PT, R4, R6, PT ;
        /*0190*/              @!P0 BRA 0x100 ;
        /*01a0*/                   EXIT ;
        /*0200*/                   SYNCS.PHASECHK.TRANS64.TRYWAIT P1, [UR9+0x10300], R88 ;
        /*0210*/              @!P1 BRA 0x200 ;
        /*0220*/                   BRA 0x130 ;
"""


@pytest.fixture(scope="module")
def sass():
    sys.path.insert(0, ROOT)
    from bench.static import sass
    return sass


def test_loops_nest_and_take_in_their_out_of_line_blocks(sass):
    instructions = sass.parse_sass(SASS)
    assert len(instructions) == 16
    column = sass.tile_loop(instructions)
    assert column.header == 0x100
    assert {0x200, 0x210, 0x220} <= column.body  # the wait belongs to the loop it serves
    assert 0x1a0 not in column.body and 0x000 not in column.body
    k_steps = [c for c in column.children if c.header == 0x130]
    assert len(k_steps) == 1 and k_steps[0].body == {0x130, 0x140, 0x150}


# A tile loop with a warp-level operation whose convergence check (BRA.DIV) branches to an out
# of line slow path that rejoins the loop after the fast path, as ptxas emits after spin waits.
SASS_DIVERGENCE_CHECK = """
        /*0000*/                   S2R R0, SR_TID.X ;
        /*0100*/                   HGMMA.64x128x16.F32.BF16 R24, gdesc[UR8], R24 ;
        /*0110*/                   BRA.DIV UR7, 0x300 ;
        /*0120*/                   NOP ;
        /*0130*/                   REDG.E.ADD.F32x4.FTZ.RN.STRONG.GPU desc[UR10][R82.64], R44 ;
        /*0140*/                   ISETP.GE.AND P0, PT, R4, R6, PT ;
        /*0150*/              @!P0 BRA 0x100 ;
        /*0160*/                   EXIT ;
        /*0300*/                   WARPSYNC.COLLECTIVE R47, 0x320 ;
        /*0310*/                   ENDCOLLECTIVE ;
        /*0320*/                   BRA 0x130 ;
"""


def test_a_divergence_check_falls_through_and_its_slow_path_joins_the_loop(sass):
    instructions = sass.parse_sass(SASS_DIVERGENCE_CHECK)
    loop = sass.tile_loop(instructions)
    assert loop is not None and loop.header == 0x100
    assert {0x120, 0x130, 0x300, 0x320} <= loop.body and 0x160 not in loop.body


def test_one_tile_counts_its_k_steps_and_its_waits_once(sass):
    instructions = sass.parse_sass(SASS)
    column = sass.tile_loop(instructions)
    counts = sass.weighted_counts(instructions, column, inner_trips=4)
    assert counts["HGMMA.64x128x16.F32.BF16"] == 4 and counts["IADD3"] == 4
    assert counts["MUFU.EX2"] == 1 and counts["SYNCS.PHASECHK.TRANS64.TRYWAIT"] == 2
    classes = sass.by_class(counts)
    assert classes["tensor"] == 4 and classes["mufu"] == 1 and classes["local"] == 1
    # an HGMMA 64x128x16 per warp, once per warpgroup of 4 warps, two warpgroups
    assert sass.tensor_fmas(counts, warps=8) == 4 * 64 * 128 * 16 * 2
    assert sass.tensor_input(counts) == "BF16"
    assert sass.outside_counts(instructions) == {"S2R": 1, "LDC": 1, "EXIT": 1}


def test_warp_level_mma_shapes(sass):
    assert sass.tensor_fmas({"HMMA.16816.F32.BF16": 2}, warps=4) == 2 * 16 * 8 * 16 * 4
    assert sass.tensor_fmas({"HMMA.1688.F32.TF32": 1}, warps=1) == 16 * 8 * 8


def test_resource_usage_is_read_or_refused(sass):
    usage = sass.parse_resources("Function k:\n  REG:180 STACK:8 SHARED:1024 LOCAL:16 CONSTANT")
    assert usage == {"registers": 180, "stack_bytes": 8, "shared_bytes": 1024,
                     "local_bytes": 16}
    with pytest.raises(ValueError):
        sass.parse_resources("nothing here")


def test_issue_slot_arithmetic():
    sys.path.insert(0, ROOT)
    from bench.static import issue_slots
    h100 = issue_slots.H100
    # A 128 x 128 x 128 tile on 8 warps: 1,024 tensor cycles; 64 MUFU per warp: 1,024 cycles;
    # 400 instructions per warp: 800 issue cycles. The tensor cores bound it.
    cost = issue_slots.cost({"mufu": 64, "fp32": 336}, 128 ** 3, "BF16", warps=8)
    assert (cost.tensor, cost.mufu, cost.issue) == (1024, 1024, 800)
    assert cost.cycles == 1024 and cost.bound == "tensor"
    assert issue_slots.cost({"mufu": 64, "fp32": 600}, 128 ** 3, "BF16", 8).bound == "issue"
    assert issue_slots.cost({}, 128 ** 3, "TF32", 4).tensor == 2048
    tiles = h100.sms * 1000
    assert issue_slots.seconds(tiles, cost, 0, cost) == pytest.approx(1000 * 1024 / h100.clock_hz)
    # the floor: multiply-adds at the full tensor rate, exps at the full MUFU rate
    fmas = 2048 * h100.sms * h100.clock_hz
    assert issue_slots.floor_seconds(fmas, 0) == pytest.approx(1.0)
    assert issue_slots.floor_seconds(fmas, 4 * fmas / 2048 * 16) == pytest.approx(4.0)


def test_a_tile_that_a_triton_release_spills_is_not_tried_under_it():
    from scl_kernels.backends.triton import launch
    symmetric, big = launch.KERNEL_USES["grad_symmetric"], launch.Tile(128, 128, 8, 2)
    assert big in launch.candidate_tiles(symmetric, 128, 2, release=(3, 6))
    assert big not in launch.candidate_tiles(symmetric, 128, 2, release=(3, 9))
    # a release newer than any checked is taken to allocate as the newest checked one
    assert big not in launch.candidate_tiles(symmetric, 128, 2, release=(3, 12))
    for use in launch.KERNEL_USES.values():
        for (size, tile), releases in use.spills_under.items():
            assert tile in use.tiles[size], (use, tile)
        for release in ((3, 6), (3, 7), (3, 8), (3, 9)):
            for size in (2, 4):
                kept = launch.candidate_tiles(use, 128, size, release=release)
                assert kept and not any(release in use.spills_under.get((size, t), ())
                                        for t in kept), (use, release, size)


def test_every_kept_tile_compiles_for_hopper_without_spilling(tmp_path):
    """The CI check: `python -m bench.static.gpu_static` exits non-zero on a spill or on too much
    shared memory, and prints the headline prediction last."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([ROOT, env.get("PYTHONPATH", "")])
    out = tmp_path / "static.json"
    run = subprocess.run([sys.executable, "-m", "bench.static.gpu_static", "--json", str(out)],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=1800)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    report = json.loads(out.read_text())
    from scl_kernels.backends.triton import launch
    covered = {(r["use"], r["dtype"], r["d"]) for r in report["results"]}
    assert covered == {(use, dtype, d) for use in launch.KERNEL_USES for dtype in ("bf16", "fp32")
                       for d in (128, 256, 768, 100)}
    for r in report["results"]:
        assert r["spill_bytes"] == 0 and r["spill_instructions"] == 0, r
        assert r["loop_hgmma"] and r["tma"], r
    # One configuration each: hard-pair mining per dtype, the launchers' column terms (two forms),
    # the forward's per-anchor losses (with and without their mean), the backward's assembly,
    # the preparation, the backward's per-anchor weights (one per schedule with the weighted
    # class sums, one without them), the log-sum-exp's merge (one per form), the multi-hot
    # positive walk (per dtype and D of WALK_DIMS, per rule: the anchors' forward and backward,
    # the contrast rows' backward, on tensor cores) and its positives' count (one per rule).
    from bench.static.triton_kernels import WALK_DIMS
    single = report["single_config"]
    forms = 2 * len(WALK_DIMS) * 2
    assert sorted(r["use"] for r in single) == sorted(
        ["anchor_losses", "anchor_losses", "anchor_weights", "anchor_weights", "anchor_weights",
         "backward_assembly", "column_terms", "column_terms", "hard_pairs", "hard_pairs",
         "lse_merge", "lse_merge", "row_preparation", "multi_label_positives",
         "multi_label_positives"] + ["walk_anchors"] * 2 * forms + ["walk_contrast"] * forms)
    for r in single:
        assert r["spill_bytes"] == 0 and r["spill_instructions"] == 0, r
        assert r.get("hgmma", True), r
    lines = run.stdout.strip().splitlines()
    assert any(line.startswith("predicted fwd+bwd N=65536 D=128 bf16: ") and "floor" in line
               for line in lines)
    from bench.static import cuda_static
    if cuda_static.toolchain()[0] is None:
        assert not report["cuda"] and "CUDA C++ kernels not checked" in run.stdout
        return
    # The CUDA C++ kernels, each with and without the group mask: 15 mma.sync kernels for each of
    # sm_80 and sm_90a, 24 wgmma ones (5 walks x 2 types x 2 resident widths, and the triangle
    # backward's two exchanges x 2 types at width 128).
    kernels = report["cuda"]
    assert sum(r["kernel"].startswith("sm80") for r in kernels) == 2 * 30
    assert sum(r["kernel"].startswith("sm90") for r in kernels) == 2 * 24
    assert sum(r["kernel"].endswith(", groups>") for r in kernels) == 30 + 24
    # The fused O(N*D) stages (row_stages.cu): seven kernels for each architecture.
    stages = sorted(r["kernel"] for r in kernels if r["kernel"].startswith("row_stages"))
    assert stages == sorted([f"row_stages {s}" for s in cuda_static.ROW_STAGES.values()] * 2)
    assert {r["kernel"] for r in kernels if "kGradTriangle" in r["kernel"]} == {
        f"sm90 walk_kernel<{t}, {w}, 128{groups}>" for t in ("bf16", "fp16")
        for w in ("kGradTriangle", "kGradTriangleAsync") for groups in ("", ", groups")}
    for r in kernels:
        assert r["spill_bytes"] == 0 and r["spill_instructions"] == 0, r
        if r["kernel"].startswith("sm90"):
            assert r["arch"] == "sm_90a" and r["loop_hgmma"] and r["tma"] and r["loop_turns"], r
            # GPU-scope fences in the default triangle's tile loop only (none in its exchange by
            # st.async), and there until that exchange becomes the default
            assert bool(r["loop_gpu_fences"]) == (", kGradTriangle," in r["kernel"]), r
        elif r["kernel"].startswith("sm80"):
            assert r["loop_hmma"], r
    assert lines[-1].startswith("predicted fwd+bwd CUDA N=65536 D=128 bf16: ")
    assert any(line.startswith("predicted fwd+bwd CUDA cross set N=65536 D=128 bf16: ")
               for line in lines)
    assert any(line.startswith("predicted fwd+bwd CUDA N=65536 D=256 bf16: ") for line in lines)


CUOBJDUMP = """
Resource usage:
 Function _ZN3scl4cuda4sm9011walk_kernelIN7cutlass10bfloat16_tELNS0_4WalkE1ELi256EEEvNS1_6ParamsIT_XT1_EEE:
  REG:168 STACK:0 SHARED:1024 LOCAL:0 CONSTANT[0]:1408 TEXTURE:0 SURFACE:0 SAMPLER:0
 Function _ZN3scl4cuda4sm8011walk_kernelIfLNS0_4WalkE4EEEvNS0_11TileProblemENS1_11WalkOutputsE:
  REG:195 STACK:8 SHARED:0 LOCAL:4 CONSTANT[0]:488 TEXTURE:0 SURFACE:0 SAMPLER:0
"""


def test_cuda_listings_are_read_per_kernel():
    sys.path.insert(0, ROOT)
    from bench.static import cuda_static
    resources = cuda_static.parse_resources(CUOBJDUMP)
    names = sorted(resources)
    assert [cuda_static.kernel_name(n) for n in names] == [
        "sm80 walk_kernel<fp32, kGradColumns>", "sm90 walk_kernel<bf16, kLseSymmetric, 256>"]
    assert resources[names[0]] == (195, 8, 0, 4)
    assert cuda_static.kernel_name("_ZN3scl4cuda4sm9011walk_kernelIN7cutlass10bfloat16_tELNS0_4WalkE6ELi128EE"
                                   "EvNS1_6ParamsIT_XT1_EEE") == "sm90 walk_kernel<bf16, kGradTriangleAsync, 128>"
    # A kernel compiled with the group mask (its bool argument true), of either family.
    assert cuda_static.kernel_name("_ZN3scl4cuda4sm9011walk_kernelIN7cutlass6half_tELNS0_4WalkE4ELi256ELb1EEEvN"
                                   "S1_6ParamsIT_XT1_EEE") == "sm90 walk_kernel<fp16, kGradColumns, 256, groups>"
    assert cuda_static.kernel_name("_ZN3scl4cuda4sm8011walk_kernelIfLNS0_4WalkE4ELb0EEEvNS0_11TileProblemENS0_11"
                                   "WalkOutputsE") == "sm80 walk_kernel<fp32, kGradColumns>"
    assert cuda_static.kernel_name("_ZN3scl4cuda4sm8020lse_symmetric_kernelIfLb1EEEvNS0_11TileProblemEPfi") == \
        "sm80 lse_symmetric_kernel<fp32, groups>"
    listing = ("\t\tFunction : first\n /*0000*/ HMMA.16816.F32.BF16 R0, R2, R4, R0 ;\n"
               "\t\tFunction : second\n /*0000*/ EXIT ;\n")
    functions = cuda_static.split_functions(listing)
    assert list(functions) == ["first", "second"] and "HMMA" in functions["first"]
    assert cuda_static.problems({"kernel": "sm90 walk_kernel<bf16, kLsePlain>", "spill_bytes": 4,
                                 "spill_instructions": 0, "loop_hgmma": True, "tma": False,
                                 "loop_turns": False}) == [
        "spills 4 B (0 STL/LDL)", "no UTMALDG (TMA)",
        "no consumer turns (256-thread named barriers) in its tile loop"]


# A tile loop (0x0100 .. 0x01a0) with a wgmma waited for at once and one left in flight, the
# cluster pair's fences and acquire wait; the exit's fence and cluster barrier outside it.
SASS_FENCES = """
        /*0000*/                   S2R R0, SR_TID.X ;
        /*0100*/                   HGMMA.64x128x16.F32.BF16 R24, gdesc[UR8], R24 ;
        /*0110*/                   WARPGROUP.DEPBAR.LE gsb0, 0x1 ;
        /*0120*/                   WARPGROUP.DEPBAR.LE gsb0, 0x0 ;
        /*0130*/                   REDG.E.ADD.F32x4.FTZ.RN.STRONG.GPU desc[UR10][R82.64], R44 ;
        /*0140*/                   MEMBAR.ALL.CTA ;
        /*0150*/                   MEMBAR.ALL.GPU ;
        /*0160*/                   SYNCS.PHASECHK.TRANS64.TRYWAIT P0, [R19+URZ+0x17ff8], R20 ;
        /*0170*/               @P0 CCTL.IVALL ;
        /*0180*/                   ISETP.GE.AND P0, PT, R4, R6, PT ;
        /*0190*/              @!P0 BRA 0x100 ;
        /*01a0*/                   MEMBAR.ALL.GPU ;
        /*01b0*/                   UCGABAR_WAIT ;
        /*01c0*/                   CCTL.IVALL ;
        /*01d0*/                   EXIT ;
"""


def test_fences_and_wgmma_waits_are_counted_in_the_tile_loop():
    """The check "no GPU-scope MEMBAR inside a tile loop": the fences after the loop (the exit's
    cluster barrier) do not count; the wgmma waits are told apart by what they leave in flight;
    a walk known to hold fences is an expected failure until they go, and then a problem until
    the record is updated."""
    sys.path.insert(0, ROOT)
    from bench.static import cuda_static, sass
    counted = cuda_static.synchronisation_in_tile_loops(sass.parse_sass(SASS_FENCES))
    assert counted == {"loop_gpu_fences": 1, "loop_cache_invalidations": 1,
                       "loop_wgmma_waits": {"at once": 1, "deferred": 1}}
    base = {"spill_bytes": 0, "spill_instructions": 0, "loop_hgmma": True, "tma": True,
            "loop_turns": True}
    rows = {**base, "kernel": "sm90 walk_kernel<bf16, kGradRowsSymmetric, 128>"}
    triangle = {**base, "kernel": "sm90 walk_kernel<bf16, kGradTriangle, 128>"}
    asynchronous = {**base, "kernel": "sm90 walk_kernel<bf16, kGradTriangleAsync, 128>"}
    assert cuda_static.problems({**rows, **counted}) == ["1 GPU-scope MEMBAR in its tile loop"]
    assert cuda_static.problems({**triangle, **counted}) == []
    # the triangle's exchange by st.async is not excused: a fence creeping back fails
    assert cuda_static.problems({**asynchronous, **counted}) == ["1 GPU-scope MEMBAR in its tile loop"]
    assert cuda_static.problems({**asynchronous, "loop_gpu_fences": 0}) == []
    assert cuda_static.problems({**triangle, "loop_gpu_fences": 0})[0].startswith(
        "no GPU-scope MEMBAR in its tile loop any more")


def test_l2_reduce_probe_compiles_to_vector_and_bulk_reductions(tmp_path):
    """bench/static/l2_reduce_probe.cu, the GPU session's measurement that decides on a triangle
    backward, measures what it says: 16-byte reductions (REDG F32x4) and the TMA unit's bulk
    reduction (UBLKRED) against plain 16-byte stores, and the cluster pair (cluster barriers,
    16-byte loads from the partner's shared memory)."""
    from bench.static import cuda_static, sass
    tools, why = cuda_static.toolchain()
    if tools is None:
        pytest.skip(why)
    cubin = tmp_path / "probe.cubin"
    subprocess.run([tools[0], "-O3", "-std=c++17", "-arch=sm_90a", "-cubin", "-o", str(cubin),
                    os.path.join(ROOT, "bench", "static", "l2_reduce_probe.cu")], check=True)
    instructions, _ = sass.disassemble(cubin.read_bytes())
    opcodes = {i.opcode for i in instructions}
    assert any(o.startswith("REDG.E.ADD.F32x4") for o in opcodes), sorted(opcodes)
    assert any(o.startswith("UBLKRED.G.S.ADD.F32") for o in opcodes), sorted(opcodes)
    assert any(o.startswith("STG.E.128") for o in opcodes), sorted(opcodes)
    assert {"UCGABAR_ARV", "UCGABAR_WAIT", "LD.E.128"} <= opcodes, sorted(opcodes)
