"""bench/gpu/profile.py without a GPU: its summary of profiler events (on synthetic CUDA events)
and a whole CPU run that writes its report. The GPU session runs it for real
(bench/gpu/gpu_session.sh, phase "profile")."""
import pytest

from bench.gpu import profile as gpu_profile
from bench.gpu.profile import Event


def test_summary_of_a_step():
    events = [
        Event("aten::mul", False, 0, 5, top_level_aten=True),
        Event("aten::empty", False, 1, 2),  # nested: not a top-level call
        Event("cudaLaunchKernel", False, 2, 3),
        Event("cudaLaunchKernel", False, 6, 7),
        Event("cuLaunchKernel", False, 8, 9),
        Event("cudaStreamSynchronize", False, 10, 30),
        Event("cudaMemcpyAsync", False, 9, 10),
        Event("elementwise_kernel", True, 10, 20),
        Event("elementwise_kernel", True, 15, 25),  # overlaps the first: busy counts it once
        Event("walk_kernel", True, 40, 140),
        Event("Memcpy DtoH (Device -> Pinned)", True, 140, 142),
    ]
    s = gpu_profile.summarise(events, top=2)
    assert s["kernels"] == 3 and s["copies"] == 1 and s["aten_calls"] == 1
    assert s["kernel_ms"] == pytest.approx(0.120) and s["busy_ms"] == pytest.approx(0.115)
    assert s["tile_ms"] == pytest.approx(0.100)  # walk_kernel alone is a tile kernel
    assert s["runtime"] == {"cudaLaunchKernel": 2, "cuLaunchKernel": 1, "cudaMemcpyAsync": 1,
                            "cudaStreamSynchronize": 1}
    assert s["host_waits"] == 1
    assert s["top"] == [("walk_kernel", 1, pytest.approx(0.1)),
                        ("elementwise_kernel", 2, pytest.approx(0.02))]


def test_busy_union():
    assert gpu_profile.busy_union([]) == 0
    assert gpu_profile.busy_union([(5, 9), (0, 2), (1, 3), (8, 10)]) == 3 + 5


def test_cpu_run_writes_its_report(tmp_path):
    rows = gpu_profile.main(["--device", "cpu", "--backends", "cpu,reference", "--sizes", "200",
                             "--dims", "24", "--dtype", "fp32", "--repeats", "2",
                             "--out", str(tmp_path)])
    assert [(r["backend"], r["layout"], r["n"], r["d"]) for r in rows] == [
        ("cpu", "single", 200, 24), ("cpu", "cross", 200, 24),
        ("reference", "single", 200, 24), ("reference", "cross", 200, 24)]
    assert all(r["wall_ms"] > 0 and r["back_to_back_ms"] > 0 and r["aten_calls"] > 0
               and r["kernels"] == 0 and r["graph_ms"] is None for r in rows)
    [report] = tmp_path.iterdir()
    text = report.read_text()
    assert report.name.startswith("gpu_profile_cpu_")
    assert "| cpu | single | 200 | 24 |" in text and "| cpu | cross | 200 | 24 |" in text
    lines = text.splitlines()
    header = next(line for line in lines if line.startswith("| backend |"))
    assert "| eager / graph back to back |" in header
    table = [line for line in lines if line.startswith(("|---", "| cpu |", "| reference |"))]
    assert len(table) == 5 and {line.count("|") for line in table} == {header.count("|")}
