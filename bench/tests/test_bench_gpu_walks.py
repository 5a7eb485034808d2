"""The walks' timings and rules without a GPU (bench/gpu/walks.py, bench/gpu/ncu_pages.py; the one
device call that runs them is rehearsed in test_bench_gpu_session.py): the timings on the CPU,
the rules' readings of synthetic rows, the clock sampler with a stand-in for nvidia-smi, and the
reading of Nsight Compute's pages in the layout assumed for them (ncu_page_text.py)."""
import argparse
import json
import os

import pytest

from bench.gpu import ncu_pages, walks
from bench.gpu.step import split_backend, walk_of, walk_that_ran
from scl_kernels import _testing

from ncu_page_text import ASYNC, FORWARD, LOOP, PREAMBLE, RAW, ROWS, TRIANGLE, source_page

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def test_a_backend_names_its_walk():
    assert split_backend("cuda:rows") == ("cuda", "rows") and split_backend("triton") == ("triton", None)
    for bad in ("triton:rows", "cuda:diagonal"):
        with pytest.raises(ValueError):
            split_backend(bad)
    assert walk_that_ran([FORWARD, TRIANGLE]) == "triangle" and walk_that_ran([ROWS]) == "rows"
    assert walk_that_ran([FORWARD, ASYNC]) == "triangle-async"
    assert split_backend("cuda:triangle-async") == ("cuda", "triangle-async")
    assert walk_that_ran(["grad_rows_kernel"]) is None


@pytest.mark.skipif(not _testing.test_build(), reason=_testing.NOT_A_TEST_BUILD)
def test_a_backend_s_walk_is_chosen_through_the_test_hook():
    before = _testing.hook_values()["symmetric_backward_walk"]
    with walk_of("cuda:rows"):
        assert _testing.hook_values()["symmetric_backward_walk"] == "rows"
    with walk_of("cuda"):
        assert _testing.hook_values()["symmetric_backward_walk"] == before
    assert _testing.hook_values()["symmetric_backward_walk"] == before


KERNEL_OF = {"triangle": TRIANGLE, "rows": ROWS, "triangle-async": ASYNC}
BACKWARD_MS = {"triangle": 5.78, "rows": 5.0, "triangle-async": 4.4}


def timed(backend, n, d, back_to_back, walk="asked"):
    """A row as bench.gpu.profile.profile_backend gives it, as far as the rules read it."""
    walk = split_backend(backend)[1] if walk == "asked" else walk
    return {"backend": backend, "n": n, "d": d, "walk_ran": walk, "back_to_back_ms": back_to_back,
            "graph_back_to_back_ms": back_to_back - 0.1,
            "top": [(KERNEL_OF.get(walk, "grad_rows_kernel"), 1, BACKWARD_MS.get(walk, 4.7))]}


def grid(ms, skip=()):
    """The default run's rows at every point of the rules (each walk twice, in the default
    order): ms(walk, n, d, k) is the k-th measurement's back-to-back time; (walk, n, d) in
    ``skip`` is not measured."""
    rows = []
    for d in walks.RULE_DIMS:
        for n in walks.RULE_SIZES:
            for spec in walks.REPEATED_BACKENDS.split(","):
                walk = split_backend(spec)[1]
                if (walk, n, d) not in skip:
                    k = len(walks.measurements(rows, spec, n, d)) + 1
                    rows.append({**timed(spec, n, d, ms(walk, n, d, k)), "measurement": k})
    return rows


def steady(triangle=7.4, rows=6.5, asynchronous=7.0):
    return lambda walk, n, d, k: {"triangle": triangle, "rows": rows,
                                  "triangle-async": asynchronous}[walk]


def rule(rows, name):
    return walks.verdicts(rows, [])[name]


@pytest.mark.parametrize("rows_ms, verdict, says", [
    (6.5, "fires", "rows becomes CUDA C++'s default symmetric backward on sm_90 and the size "
                   "sweep is scheduled"),
    (7.0, "stays", "the triangle stays the default until step 1's walk is measured"),
    (7.6, "stays", "the triangle is as fast or faster in every pair: it stays the default")])
def test_rule_one_decides_on_every_pair(rows_ms, verdict, says):
    found = rule(grid(steady(rows=rows_ms)), "rule 1")
    assert found["verdict"] == verdict
    assert found["reads"][-1].startswith(f"rule 1: {verdict}: ") and says in found["reads"][-1]
    assert "auto_rule.py" not in found["reads"][-1]
    reads = found["reads"][:-1]
    assert [line.split(":")[0] for line in reads] == [
        f"rule 1 reads, N={n} D={d}" for n in walks.RULE_SIZES for d in walks.RULE_DIMS]
    assert f"rows / triangle back to back {rows_ms / 7.4:.3f}, {rows_ms / 7.4:.3f}" in reads[0]
    assert "backward kernel 5.000 / 5.780, 5.000 / 5.780 ms" in reads[0]


def test_a_pair_on_the_other_side_leaves_the_rule_not_decided():
    """Within the noise band, but one of the two pairs at one point over 0.9: not decided,
    naming the point."""
    late = grid(lambda walk, n, d, k: 6.8 if (walk, n, d, k) == ("rows", 65536, 128, 2)
                else steady()(walk, n, d, k))
    found = rule(late, "rule 1")
    assert found["verdict"] == "not decided"
    assert "pairs on both sides of 0.9" in found["reads"][-1]
    assert "N=65536 D=128 split" in found["reads"][-1] and "N=16384 D=64 fires" in found["reads"][-1]


def test_points_on_both_sides_leave_the_rule_not_decided():
    found = rule(grid(lambda walk, n, d, k: 7.0 if (walk, d) == ("rows", 64)
                      else steady()(walk, n, d, k)), "rule 1")
    assert found["verdict"] == "not decided"
    assert "N=16384 D=64 stays" in found["reads"][-1] and "N=16384 D=128 fires" in found["reads"][-1]


def test_a_walk_that_moves_between_its_measurements_is_not_steady():
    moved = grid(lambda walk, n, d, k: 6.0 if (walk, n, d, k) == ("rows", 16384, 64, 2)
                 else steady()(walk, n, d, k))
    found = rule(moved, "rule 1")
    assert found["verdict"] == "not decided"
    assert "not steady" in found["reads"][-1] and "N=16384 D=64 rows 6.500 / 6.000 ms" in found["reads"][-1]
    # every pair still under 0.9: only the noise band keeps it from firing
    assert "pairs on both sides" not in found["reads"][-1]


@pytest.mark.parametrize("skip, why", [
    ({("rows", 65536, 64)}, "missing N=65536 D=64 (rows not measured)"),
    ({("triangle", 16384, 128)}, "missing N=16384 D=128 (triangle not measured)")])
def test_a_missing_point_leaves_the_rule_not_decided(skip, why):
    found = rule(grid(steady(), skip=skip), "rule 1")
    assert found["verdict"] == "not decided" and why in found["reads"][-1]


def test_a_walk_that_ran_other_than_asked_is_a_missing_point():
    rows = [dict(r, walk_ran="rows", top=[(ROWS, 1, 5.0)])
            if (r["backend"], r["n"], r["d"]) == ("cuda:triangle", 65536, 128) else r
            for r in grid(steady())]
    found = rule(rows, "rule 1")
    assert found["verdict"] == "not decided"
    assert "N=65536 D=128 (cuda:triangle ran rows)" in found["reads"][-1]


@pytest.mark.parametrize("async_ms, verdict, says", [
    (6.0, "fires", "fires on time; becomes the default only if the correctness stage passes"),
    (6.5, "stays", "it stays opt-in")])
def test_rule_five_reads_the_async_exchange_against_the_triangle(async_ms, verdict, says):
    found = rule(grid(steady(asynchronous=async_ms)), "rule 5")
    assert found["verdict"] == verdict and says in found["reads"][-1]
    assert found["reads"][0].startswith("rule 5 reads, N=16384 D=64: triangle-async / triangle "
                                        f"back to back {async_ms / 7.4:.3f}")
    assert "backward kernel 4.400 / 5.780" in found["reads"][0]


def test_no_cuda_rows_decide_nothing():
    found = walks.verdicts([timed("cpu", 96, 8, 1.0)], [])
    for name, walk in (("rule 1", "rows"), ("rule 5", "triangle-async")):
        assert found[name]["verdict"] == "not decided"
        assert found[name]["reads"] == [f"{name}: not decided: missing " + "; ".join(
            f"N={n} D={d} ({walk} not measured, triangle not measured)"
            for n in walks.RULE_SIZES for d in walks.RULE_DIMS)]


def test_auto_reads_the_fastest_walk_against_triton():
    rows = grid(steady()) + [timed("triton", 65536, 128, 6.22)]
    found = walks.verdicts(rows, [])
    assert found["auto"] == ["auto reads, N=65536 D=128: CUDA C++ rows 6.500 ms (median of 2) "
                             "against Triton 6.220 ms back to back"]


def test_the_verdicts_have_the_shape_the_session_reads():
    entry = {"d": 128, "n": 65536, "walk": "cuda:triangle-async", "against": "cuda:rows",
             "errors": [1.1e-3, 1.1e-3, 1.2e-3], "state": "steady"}
    found = walks.verdicts(grid(steady()), [entry])
    assert set(found) == {"rule 1", "rule 5", "agreement", "auto"}
    assert all(set(found[name]) == {"verdict", "reads"} for name in ("rule 1", "rule 5"))
    assert found["agreement"] == [entry] and found["auto"] == []
    assert walks.agreement_line(entry) == ("agreement D=128 N=65536: cuda:triangle-async vs "
                                           "cuda:rows 1.1e-03 1.1e-03 1.2e-03 (steady)")
    assert walks.agreement_line({**entry, "state": "moves"}).endswith("(MOVES: a race?)")
    assert walks.agreement_line({**entry, "state": "wrong"}).endswith("(WRONG)")


def test_also_points_are_parsed_and_checked():
    assert walks.also_points("triton@65536x128,cuda:rows@16384x64") == [
        ("triton", 65536, 128), ("cuda:rows", 16384, 64)]
    assert walks.also_points("") == []
    for bad in ("triton", "triton@65536", "triton:rows@1x1", "triton@0x128"):
        with pytest.raises(argparse.ArgumentTypeError):
            walks.also_points(bad)


def test_the_clock_is_sampled_while_a_block_runs(gpu_stand_ins, monkeypatch):
    monkeypatch.setenv("PATH", gpu_stand_ins.env["PATH"])
    import time
    with walks.SmClock(0) as clock:
        time.sleep(0.3)
    summary = clock.summary()
    assert summary["median"] == 1755 and summary["count"] >= 2


def result_files(folder):
    [md] = folder.glob("walks_cpu_*.md")
    stem = str(md)[:-len(".md")]
    with open(stem + ".json") as rows, open(stem + ".verdicts.json") as verdicts:
        return md.read_text(), json.load(rows), json.load(verdicts)


def test_cpu_run_writes_its_report(tmp_path, capsys):
    """The lead's rehearsal of the GPU call's command on the CPU: a spec named twice is measured
    twice, an --also spec once at its point after the others there, and the agreement holds the
    CPU backend to the reference."""
    rows = walks.main(["--device", "cpu", "--backends", "cpu,reference,cpu", "--also",
                       "reference@96x8", "--sizes", "96", "--dims", "8", "--repeats", "2",
                       "--agreement-steps", "2", "--out", str(tmp_path)])
    assert [(r["backend"], r["measurement"]) for r in rows] == [
        ("cpu", 1), ("reference", 1), ("cpu", 2), ("reference", 2)]
    assert all(r["wall_ms"] > 0 and r["back_to_back_ms"] > 0 and r["graph_ms"] is None
               and r["clock"] is None or r["clock"]["count"] > 0 for r in rows)
    text, written, verdicts = result_files(tmp_path)
    header = next(line for line in text.splitlines() if line.startswith("| backend |"))
    for method in ("measurement", "synchronised ms", "back to back ms", "graph replay ms",
                   "graph replay back to back ms", "SM clock MHz"):
        assert f"| {method} |" in header
    assert len(written) == 4
    assert verdicts["rule 1"]["verdict"] == verdicts["rule 5"]["verdict"] == "not decided"
    [entry] = verdicts["agreement"]
    assert (entry["d"], entry["n"], entry["walk"], entry["against"]) == (8, 96, "cpu", "reference")
    assert len(entry["errors"]) == 2 and entry["state"] == "steady"
    assert max(entry["errors"]) < 5e-2
    out = capsys.readouterr().out.splitlines()
    for start in ("rule 1: not decided: missing", "rule 5: not decided: missing",
                  "agreement D=8 N=96: cpu vs reference "):
        assert any(line.startswith(start) for line in out), start
    assert "rule 1: not decided" in text and "agreement D=8 N=96" in text


def test_an_also_point_off_the_grid_is_said_and_skipped(tmp_path, capsys):
    rows = walks.main(["--device", "cpu", "--backends", "cpu", "--sizes", "64", "--dims", "8",
                       "--repeats", "2", "--agreement-steps", "0", "--out", str(tmp_path)])
    assert [r["backend"] for r in rows] == ["cpu"]
    note = "--also triton@65536x128: not a point of --sizes x --dims, not measured"
    assert note in capsys.readouterr().out and note in result_files(tmp_path)[0]


def test_each_row_is_on_disk_as_soon_as_it_is_measured(tmp_path, monkeypatch):
    """A run killed after its second row leaves both rows, the report and the verdicts they give."""
    made = []

    def measured(spec, layout, n, d, dtype, device, steps):
        if len(made) == 2:
            raise KeyboardInterrupt  # as the session's timeout kills the run
        made.append(spec)
        return {**timed(spec, n, d, 7.0 - len(made)), "wall_ms": 7.5, "graph_ms": None,
                "busy_ms": 7.0, "runtime": {}}
    monkeypatch.setattr(walks, "profile_backend", measured)
    with pytest.raises(KeyboardInterrupt):
        walks.main(["--device", "cpu", "--backends", "cpu,reference,cpu", "--sizes", "64",
                    "--dims", "8", "--out", str(tmp_path)])
    text, written, verdicts = result_files(tmp_path)
    assert [(r["backend"], r["back_to_back_ms"]) for r in written] == [("cpu", 6.0),
                                                                       ("reference", 5.0)]
    assert sum(line.startswith("| cpu |") or line.startswith("| reference |")
               for line in text.splitlines()) == 2
    assert verdicts["rule 1"]["verdict"] == "not decided"
    assert not list(tmp_path.glob("*.tmp"))


def test_the_pages_give_each_rule_its_numbers():
    lines = ncu_pages.analyse(RAW, source_page(4))
    triangle = next(line for line in lines if line.startswith("kGradTriangle:"))
    assert "5.777 ms" in triangle and "tensor pipe 30.0%" in triangle and "membar 30.0%" in triangle
    assert "not on the page" not in triangle
    fences = [line for line in lines if line.startswith("    ")]
    kinds = {line.split()[1] for line in fences}
    assert {"fence", "after", "cluster", "stage", "turn", "wgmma"} <= kinds
    # the exit's fence lies outside the tile loop: 9 of the 100 samples are not a fence line here
    total = sum(samples for _, samples in LOOP)
    share = (2 + 15 + 7 + 9 + 3) / total
    assert (f"rule 2 reads (explanatory): triangle backward, samples at its fences and cluster "
            f"waits {share:.1%} of its warp cycles; warp state: membar 30.0%, barrier 20.0%, "
            "long scoreboard 10.0%") in lines
    assert any(line.startswith("rule 2 (explanatory, changes no default): over 25%: would suggest "
                               "step 1") for line in lines)
    assert "rules 3-4 read: forward MUFU 55.0% of peak, tensor pipe 45.0%" in lines
    assert "rule 3: MUFU at most 70%: does not fire" in lines
    assert "rule 4: tensor under 50% and MUFU under 60%: step 3a" in " ".join(lines)
    assert not any("by hand" in line for line in lines)


def test_a_page_after_ncus_own_lines_reads_the_same():
    assert ncu_pages.analyse(PREAMBLE + RAW, PREAMBLE + source_page(4)) == ncu_pages.analyse(
        RAW, source_page(4))


def test_the_metrics_are_read_by_their_exact_names():
    header = RAW.splitlines()[0]
    assert ncu_pages.TENSOR_PIPE == "sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active"
    assert ncu_pages.XU_PIPE == "sm__inst_executed_pipe_xu.avg.pct_of_peak_sustained_active"
    assert "gpu__time_duration.sum" in ncu_pages.METRICS
    for metric in ncu_pages.METRICS:
        assert f'"{metric}"' in header
    # a column that only looks like the tensor pipe's is not read as it
    lookalike = RAW.replace("sm__pipe_tensor_op_gmma_cycles_active", "sm__pipe_tensor_op_hmma_cycles_active")
    lines = ncu_pages.analyse(lookalike, None)
    assert f"rule 4: not decided: {ncu_pages.TENSOR_PIPE} not on the raw page" in lines
    assert "rule 3: MUFU at most 70%: does not fire" in lines


def test_a_missing_metric_leaves_its_rules_not_decided():
    without_xu = RAW.replace(ncu_pages.XU_PIPE, "sm__inst_executed_pipe_fma.avg.pct_of_peak_sustained_active")
    lines = ncu_pages.analyse(without_xu, source_page(4))
    assert f"rule 3: not decided: {ncu_pages.XU_PIPE} not on the raw page" in lines
    assert f"rule 4: not decided: {ncu_pages.XU_PIPE} not on the raw page" in lines
    assert not any(line.startswith("rules 3-4: neither") for line in lines)
    without_cycles = RAW.replace(ncu_pages.WARP_CYCLES, "smsp__cycles_active.avg")
    lines = ncu_pages.analyse(without_cycles, source_page(4))
    read = next(line for line in lines if line.startswith("rule 2 reads"))
    assert "membar —" in read and f"not on the page: {ncu_pages.WARP_CYCLES}" in read
    assert any(line.startswith("rule 2 (explanatory, changes no default): over 25%") for line in lines)


def test_the_pages_set_the_async_triangle_beside_the_triangle():
    raw = RAW + f'\n"4","42","{ASYNC}","4,400.00","40.0","25.0","10","0","2","1","5"'
    lines = ncu_pages.analyse(raw, None)
    assert "kGradTriangleAsync: 4.400 ms" in " ".join(lines)
    assert ("rule 5 reads (beside the timings): triangle-async backward 4.400 ms against the "
            "triangle's 5.777 ms") in " ".join(lines)


def test_pages_it_cannot_read_say_so():
    lines = ncu_pages.analyse("", None)
    assert lines[0].startswith("the raw page holds no kernel rows")
    assert lines[1:] == [
        "rule 2 (explanatory): not decided: no triangle backward (kGradTriangle) on the raw page",
        "rule 3: not decided: no symmetric forward (kLseSymmetric) on the raw page",
        "rule 4: not decided: no symmetric forward (kLseSymmetric) on the raw page"]
    lines = ncu_pages.analyse(RAW, source_page(3))
    assert lines[0].startswith("the source page has 3 kernels, the raw page 4")
    assert any(line.startswith("rule 2 (explanatory): not decided: no per-line samples")
               for line in lines)
    assert not any("by hand" in line for line in lines)
