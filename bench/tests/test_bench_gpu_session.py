"""The one GPU call (bench/gpu/session.py) rehearsed on the CPU with stand-ins for the driver,
Nsight Compute and compute-sanitizer (conftest.py's gpu_stand_ins): the stages run in their order
inside the budget, a failed build ends the call, a failing smoke gate drops the triangle by
st.async from every later stage, a Nsight Compute report too large for the archive stays out, the
verdict block comes last, and the call refuses at once without the CuTe headers."""
import json
import os
import subprocess
import sys
import tarfile

from bench.gpu import session

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
DEVICE_FILES = 8          # the device tool returns at most this many files
DEVICE_FILE_BYTES = 16 * 2**20


def test_the_plan_fits_the_budget():
    assert [s.name for s in session.STAGES] == ["preflight", "build", "smoke", "timings", "ncu",
                                                "correctness", "probe", "pack"]
    assert sum(s.predicted_s for s in session.STAGES) <= session.BUDGET_S
    assert all(s.predicted_s <= s.limit_s for s in session.STAGES)
    assert next(s for s in session.STAGES if s.name == "smoke").limit_s == 60
    done = subprocess.run([sys.executable, "-m", "bench.gpu.session", "--print-plan"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and f"of the budget's {session.BUDGET_S}" in done.stdout


def rehearse(stand_ins, tmp_path, **env):
    out = tmp_path / "out"
    done = subprocess.run([sys.executable, "-m", "bench.gpu.session", "--rehearsal", "--out",
                           str(out)], cwd=ROOT, env={**os.environ, **stand_ins.env, **env},
                          capture_output=True, text=True, timeout=900)
    stages = json.loads((out / "stages.json").read_text()) if (out / "stages.json").exists() else {}
    return done, out, stages


def verdict_block(stdout):
    lines = stdout.rstrip().splitlines()
    start = max(i for i, line in enumerate(lines) if line.startswith("== verdicts"))
    return lines[start:]


def returned_files(out):
    files = [p for p in out.rglob("*") if p.is_file()]
    assert len(files) <= DEVICE_FILES and all(p.stat().st_size <= DEVICE_FILE_BYTES for p in files)
    return {p.name for p in files}


def test_the_rehearsal_runs_every_stage(gpu_stand_ins, tmp_path):
    done, out, stages = rehearse(gpu_stand_ins, tmp_path)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert {name: stages[name]["status"] for name in stages if name != "async walk dropped"} == \
        {s.name: "ok" for s in session.STAGES}
    block = verdict_block(done.stdout)
    assert len(block) <= session.VERDICT_LINES and block[-1].startswith("returned: ")
    assert any(line.startswith("rule 1: ") for line in block)
    assert any(line.startswith("triton host rule") for line in block)
    assert {"environment.txt", "stages.json", "timings.md", "timings.json", "verdicts.txt",
            "ncu_summary.txt", "session_results.tar.gz"} <= returned_files(out)
    with tarfile.open(out / "session_results.tar.gz") as archive:
        names = set(archive.getnames())
    assert {"walks_kernels.ncu-rep", "walks_kernels.raw.csv", "build_check.log"} <= names
    calls = gpu_stand_ins.calls("compute-sanitizer")
    assert sorted(line.split("--cases ")[1] for line in calls if "--cases" in line) == \
        sorted(f"{case}" for case in ("14", "15", "18", "19") for _ in range(3))


def test_a_failed_build_ends_the_call(gpu_stand_ins, tmp_path):
    done, out, stages = rehearse(gpu_stand_ins, tmp_path, SCL_REHEARSAL_FAIL="build")
    assert done.returncode == 1
    assert stages["build"]["status"] == "FAILED"
    assert all(stages[s]["status"] == "not run" for s in ("smoke", "timings", "ncu", "correctness", "probe"))
    assert not gpu_stand_ins.calls("ncu") or all("--version" in c for c in gpu_stand_ins.calls("ncu"))
    assert verdict_block(done.stdout)[-1].startswith("returned: ")


def test_a_failed_smoke_gate_drops_the_async_walk_and_a_large_report_stays_out(gpu_stand_ins, tmp_path):
    done, out, stages = rehearse(gpu_stand_ins, tmp_path, SCL_REHEARSAL_FAIL="smoke",
                                 STAND_IN_NCU_REPORT_BYTES=str(17 * 2**20))
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert stages["smoke"]["status"] == "FAILED" and "smoke gate" in stages["async walk dropped"]
    dropped = session.REHEARSAL.spec("async")
    profiled = [c for c in gpu_stand_ins.calls("ncu") if "kernel_profile" in c]
    assert profiled and all(dropped not in c.split("--backends ")[1] for c in profiled)
    sanitized = {line.split("--cases ")[1] for line in gpu_stand_ins.calls("compute-sanitizer")
                 if "--cases" in line}
    assert sanitized == {"14", "15"}
    block = verdict_block(done.stdout)
    assert any(line.startswith("rule 5 in all: stays opt-in: the smoke gate") for line in block)
    assert "left out: walks_kernels.ncu-rep" in block[-1]
    assert (out / "session_results.tar.gz").stat().st_size <= session.ARCHIVE_LIMIT_BYTES
    with tarfile.open(out / "session_results.tar.gz") as archive:
        assert "walks_kernels.ncu-rep" not in archive.getnames()
    timings = json.loads((out / "timings.json").read_text())
    assert timings and all(row["backend"] != dropped for row in timings)


def test_without_headers_or_an_index_the_call_refuses_at_once(gpu_stand_ins, tmp_path):
    done, out, stages = rehearse(gpu_stand_ins, tmp_path,
                                 SCL_CUTLASS_INCLUDE=str(tmp_path / "no_headers"),
                                 PIP_NO_INDEX="1")
    assert done.returncode == 1
    assert stages["preflight"]["status"] == "refused" and stages["preflight"]["seconds"] < 60
    assert stages["build"]["status"] == "not run"
    refusals = [line for line in done.stdout.splitlines() if "refused: no CuTe headers" in line]
    assert refusals and len(refusals[0]) < 400
