"""M0's script without a GPU (bench/gpu/walks.py, bench/gpu/ncu_pages.py and the phase "walks" of
bench/gpu/gpu_session.sh): the timings on the CPU, rule 1's reading of synthetic rows, the clock
sampler and the whole phase with stand-ins for nvidia-smi and Nsight Compute, and the reading of
Nsight Compute's pages in the layout assumed for them, so that the one device call the phase is
written for cannot fail on the script."""
import json
import os
import stat
import subprocess
import sys
import tarfile

import pytest

from bench.gpu import ncu_pages, walks
from bench.gpu.step import split_backend, walk_of, walk_that_ran, WALK_VARIABLE

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
TRIANGLE = "void scl::cuda::sm90::walk_kernel<cutlass::bfloat16_t, (scl::cuda::Walk)5, 128>(scl::cuda::sm90::Params)"
ROWS = "void scl::cuda::sm90::walk_kernel<cutlass::bfloat16_t, (scl::cuda::Walk)3, 128>(scl::cuda::sm90::Params)"
ASYNC = "void scl::cuda::sm90::walk_kernel<cutlass::bfloat16_t, (scl::cuda::Walk)6, 128>(scl::cuda::sm90::Params)"
FORWARD = "void scl::cuda::sm90::walk_kernel<cutlass::bfloat16_t, (scl::cuda::Walk)1, 128>(scl::cuda::sm90::Params)"

# The raw page (ncu --page raw --csv) as assumed: metric names, a row of units, a row per kernel
# (numbers with thousands separators).
RAW = "\n".join([
    '"ID","Process ID","Kernel Name","gpu__time_duration.sum",'
    '"sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active",'
    '"sm__inst_executed_pipe_xu.avg.pct_of_peak_sustained_active",'
    '"smsp__average_warps_issue_stalled_membar_per_issue_active.ratio",'
    '"smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio",'
    '"smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio",'
    '"smsp__average_warps_issue_stalled_selected_per_issue_active.ratio"',
    '"","","","usecond","%","%","ratio","ratio","ratio","ratio"',
    f'"0","42","{FORWARD}","1,356.00","45.0","55.0","0","1","1","2"',
    f'"1","42","{TRIANGLE}","5,777.00","30.0","20.0","3","2","1","4"',
    f'"2","42","{FORWARD}","1,350.00","45.0","55.0","0","1","1","2"',
    f'"3","42","{ROWS}","4,900.00","52.0","30.0","0","2","1","7"',
])

# One kernel's SASS as the source page may list it (absolute addresses and branch targets): a
# tile loop holding the wgmma, a CTA- and a GPU-scope fence, a cluster-scope acquire wait (try-
# wait, then CCTL.IVALL), a stage wait and a turn barrier; the exit barrier's fence lies outside.
BASE = 0x7F0000001000
LOOP = [("MOV R1, c[0x0][0x28]", 1), ("SYNCS.PHASECHK.TRANS64.TRYWAIT P0, [UR4+0x19800], R5", 6),
        ("BAR.SYNC.DEFER_BLOCKING R9, 0x100", 4), ("HGMMA.64x128x16.F32.BF16 R24, gdesc[UR8], R24", 20),
        ("WARPGROUP.DEPBAR.LE gsb0, 0x0", 10), ("REDG.E.ADD.F32x4.FTZ.RN.STRONG.GPU desc[UR24][R10.64], R28", 5),
        ("MEMBAR.ALL.CTA", 2), ("MEMBAR.ALL.GPU", 15), ("SYNCS.ARRIVE.TRANS64.RED.A1T0 RZ, [R23+URZ], RZ", 7),
        ("SYNCS.PHASECHK.TRANS64.TRYWAIT P0, [R19+URZ+0x17ff8], R20", 9), ("@P0 CCTL.IVALL", 3),
        ("FFMA R2, R2, R3, R4", 8), ("@!P1 BRA {loop}", 1), ("MEMBAR.ALL.GPU", 9), ("EXIT", 0)]


def source_page(kernels):
    lines = []
    for k in range(kernels):
        lines += [f'"Kernel Name","kernel {k}"',
                  '"# Address","Source","Warp Stall Sampling (All Samples)",'
                  '"Warp Stall Sampling (Not-issued Samples)"']
        for i, (text, samples) in enumerate(LOOP):
            text = text.format(loop=hex(BASE + 0x10))
            lines.append(f'"{hex(BASE + 0x10 * i)}","{text}","{samples}","{samples}"')
    return "\n".join(lines)


def test_a_backend_names_its_walk():
    assert split_backend("cuda:rows") == ("cuda", "rows") and split_backend("triton") == ("triton", None)
    for bad in ("triton:rows", "cuda:diagonal"):
        with pytest.raises(ValueError):
            split_backend(bad)
    before = os.environ.get(WALK_VARIABLE)
    with walk_of("cuda:rows"):
        assert os.environ[WALK_VARIABLE] == "rows"
    assert os.environ.get(WALK_VARIABLE) == before
    assert walk_that_ran([FORWARD, TRIANGLE]) == "triangle" and walk_that_ran([ROWS]) == "rows"
    assert walk_that_ran([FORWARD, ASYNC]) == "triangle-async"
    assert split_backend("cuda:triangle-async") == ("cuda", "triangle-async")
    assert walk_that_ran(["grad_rows_kernel"]) is None


def row(backend, d, walk, back_to_back, backward_ms, kernel):
    return {"backend": backend, "d": d, "walk_ran": walk, "back_to_back_ms": back_to_back,
            "graph_back_to_back_ms": back_to_back - 0.1, "top": [(kernel, 1, backward_ms)]}


@pytest.mark.parametrize("rows_ms, verdict", [
    ((6.5, 6.6), "rows becomes CUDA C++'s default"),
    ((6.5, 7.2), "the triangle stays the default until step 1"),
    ((7.5, 7.6), "it stays the default")])
def test_rule_one_reads_rows_against_the_triangle(rows_ms, verdict):
    rows = [row("cuda:triangle", 64, "triangle", 7.26, 5.6, TRIANGLE),
            row("cuda:rows", 64, "rows", rows_ms[0], 4.9, ROWS),
            row("cuda:triangle", 128, "triangle", 7.49, 5.78, TRIANGLE),
            row("cuda:rows", 128, "rows", rows_ms[1], 5.0, ROWS),
            # D = 256: the triangle does not run there, so rule 1 does not read it
            row("cuda:triangle", 256, "rows", 13.5, 11.0, ROWS),
            row("cuda:rows", 256, "rows", 13.5, 11.0, ROWS),
            row("triton", 128, None, 6.22, 4.7, "grad_rows_kernel")]
    lines = walks.readings(rows)
    assert [line.split(":")[0] for line in lines[:2]] == ["rule 1 reads, D=64", "rule 1 reads, D=128"]
    assert verdict in lines[2]
    assert "backward kernel 5.000 / 5.780 ms" in lines[1]
    assert "rule 5: no D where both triangles ran as asked: not decided" in lines
    assert lines[-1].startswith("auto reads, D=128: CUDA C++ ") and "Triton 6.220 ms" in lines[-1]


@pytest.mark.parametrize("async_ms, verdict", [
    ((6.1, 6.3), "its exchange becomes the triangle's once the CUDA tests"),
    ((6.1, 6.5), "it stays opt-in"),
    ((7.4, 7.6), "it stays opt-in")])
def test_rule_five_reads_the_async_exchange_against_the_triangle(async_ms, verdict):
    """Rule 5 (written before the run): the triangle with its exchange by st.async at most 0.85x
    the triangle back to back at every D the triangle runs (D = 256 runs rows whatever is asked),
    and the fastest CUDA C++ walk is the one auto's rule reads."""
    rows = [row("cuda:triangle", 64, "triangle", 7.26, 5.6, TRIANGLE),
            row("cuda:triangle-async", 64, "triangle-async", async_ms[0], 4.2, ASYNC),
            row("cuda:triangle", 128, "triangle", 7.49, 5.78, TRIANGLE),
            row("cuda:triangle-async", 128, "triangle-async", async_ms[1], 4.4, ASYNC),
            row("cuda:triangle-async", 256, "rows", 13.5, 11.0, ROWS),
            row("triton", 128, None, 6.22, 4.7, "grad_rows_kernel")]
    lines = walks.readings(rows)
    reads = [line for line in lines if line.startswith("rule 5 reads")]
    assert [line.split(":")[0] for line in reads] == ["rule 5 reads, D=64", "rule 5 reads, D=128"]
    assert "backward kernel 4.400 / 5.780 ms" in reads[1]
    assert verdict in next(line for line in lines if line.startswith("rule 5:"))
    fastest = "triangle-async" if async_ms[1] < 7.49 else "triangle"
    assert lines[-1].startswith(f"auto reads, D=128: CUDA C++ {fastest} {min(async_ms[1], 7.49):.3f} ms")


@pytest.fixture
def stand_ins(tmp_path, monkeypatch):
    """nvidia-smi and ncu stand-ins first on the PATH. ncu records its arguments, answers
    --import with the pages above and otherwise runs the command it profiles (from the first
    argument that is an executable file) and writes the report it was asked to export."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (tmp_path / "raw.csv").write_text(RAW)
    (tmp_path / "source.csv").write_text(source_page(4))
    scripts = {
        "nvidia-smi": """#!/usr/bin/env bash
if [[ " $* " == *" -lms "* ]]; then while true; do echo 1755; sleep 0.02; done; fi
echo "NVIDIA H100 stand-in, 580.00, 1980 MHz"
""",
        "ncu": f"""#!/usr/bin/env bash
echo "$*" >> {tmp_path}/ncu_calls.txt
case " $* " in
  *" --version "*) echo "stand-in ncu"; exit 0 ;;
  *" --page raw "*) cat {tmp_path}/raw.csv; exit 0 ;;
  *" --page source "*) cat {tmp_path}/source.csv; exit 0 ;;
  *" --page details "*) echo "  walk_kernel stand-in"; echo "    Duration  msecond  5.78"; exit 0 ;;
esac
while [ $# -gt 0 ]; do
  case "$1" in
    --export) touch "$2.ncu-rep"; shift 2 ;;
    *) if [ -f "$1" ] && [ -x "$1" ]; then exec "$@"; fi; shift ;;
  esac
done
exit 3
"""}
    for name, text in scripts.items():
        path = bin_dir / name
        path.write_text(text)
        path.chmod(path.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    return tmp_path


def test_the_clock_is_sampled_while_a_block_runs(stand_ins):
    import time
    with walks.SmClock(0) as clock:
        time.sleep(0.3)
    summary = clock.summary()
    assert summary["median"] == 1755 and summary["count"] >= 2


def test_cpu_run_writes_its_report(tmp_path):
    rows = walks.main(["--device", "cpu", "--backends", "cpu,reference", "--sizes", "96",
                       "--dims", "8,16", "--repeats", "2", "--out", str(tmp_path)])
    assert [(r["backend"], r["d"]) for r in rows] == [("cpu", 8), ("reference", 8), ("cpu", 16),
                                                      ("reference", 16)]
    assert all(r["wall_ms"] > 0 and r["back_to_back_ms"] > 0 and r["graph_ms"] is None
               and r["clock"] is None or r["clock"]["count"] > 0 for r in rows)
    [md] = tmp_path.glob("walks_cpu_*.md")
    text = md.read_text()
    header = next(line for line in text.splitlines() if line.startswith("| backend |"))
    for method in ("synchronised ms", "back to back ms", "graph replay ms",
                   "graph replay back to back ms", "SM clock MHz"):
        assert f"| {method} |" in header
    assert "rule 1: no D where both CUDA C++ walks ran" in text
    assert len(json.loads(next(tmp_path.glob("walks_cpu_*.json")).read_text())) == 4


def test_the_pages_give_each_rule_its_numbers():
    lines = ncu_pages.analyse(RAW, source_page(4))
    triangle = next(line for line in lines if line.startswith("kGradTriangle:"))
    assert "5.777 ms" in triangle and "tensor pipe 30.0%" in triangle and "membar 30.0%" in triangle
    fences = [line for line in lines if line.startswith("    ")]
    kinds = {line.split()[1] for line in fences}
    assert {"fence", "after", "cluster", "stage", "turn", "wgmma"} <= kinds
    # the exit's fence lies outside the tile loop: 9 of the 100 samples are not a fence line here
    total = sum(samples for _, samples in LOOP)
    share = (2 + 15 + 7 + 9 + 3) / total
    assert f"samples at its fences and cluster waits {share:.1%}" in " ".join(lines)
    assert any(line.startswith("rule 2: over 25%") for line in lines)
    assert "rules 3-4 read: forward MUFU 55.0% of peak, tensor pipe 45.0%" in lines
    assert "rule 4: tensor under 50% and MUFU under 60%: step 3a" in " ".join(lines)


def test_the_pages_set_the_async_triangle_beside_the_triangle():
    raw = RAW + f'\n"4","42","{ASYNC}","4,400.00","40.0","25.0","0","2","1","5"'
    lines = ncu_pages.analyse(raw, None)
    assert "kGradTriangleAsync: 4.400 ms" in " ".join(lines)
    assert ("rule 5 reads (beside the timings): triangle-async backward 4.400 ms against the "
            "triangle's 5.777 ms") in " ".join(lines)


def test_pages_it_cannot_read_say_so():
    assert ncu_pages.analyse("", None) == ["the raw page holds no kernel rows: nothing to read "
                                           "(see the page itself)"]
    lines = ncu_pages.analyse(RAW, source_page(3))
    assert lines[0].startswith("the source page has 3 kernels, the raw page 4")
    assert "rule 2: not decided (no per-line samples)" in lines


def test_the_walks_phase_runs_with_stand_ins(stand_ins):
    out = stand_ins / "out"
    env = {**os.environ, "OUT": str(out), "PYTHON": sys.executable, "SCL_GPU_PHASES": "walks",
           "PYTHONPATH": ROOT,
           "SCL_WALKS_ARGS": "--device cpu --backends cpu,reference --sizes 64 --dims 8 --repeats 2",
           "SCL_WALKS_NCU_ARGS": "--device cpu --backends cpu --sizes 64 --dims 8"}
    run = subprocess.run(["bash", os.path.join(ROOT, "bench", "gpu", "gpu_session.sh")], cwd=ROOT,
                         env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "== walks: ok" in run.stdout and "== phases failed: none" in run.stdout
    assert "rule 2 reads: triangle backward" in run.stdout
    [profiled] = [line for line in (stand_ins / "ncu_calls.txt").read_text().splitlines()
                  if "--export" in line]
    for part in ("--profile-from-start off", "--clock-control none", "--section WarpStateStats",
                 "--section SourceCounters", "--section ComputeWorkloadAnalysis",
                 "bench.gpu.kernel_profile --backends cuda:triangle,cuda:triangle-async,cuda:rows "
                 "--sizes 65536 --dims 128"):
        assert part in profiled
    with tarfile.open(out / "gpu_session_results.tar.gz") as archive:
        names = {os.path.basename(n) for n in archive.getnames()}
    assert {"environment.txt", "walks_kernels.raw.csv", "walks_kernels.sass.csv",
            "walks_rules.txt", "walks_kernels.ncu-rep"} <= names
    assert any(n.startswith("walks_cpu_") and n.endswith(".md") for n in names)
