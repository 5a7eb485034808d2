"""bench/gpu/size_fit.py without a GPU: the fit recovers known coefficients, and a CPU run writes
its report (the GPU session runs it for real: bench/gpu/gpu_session.sh, phase "size_fit")."""
import pytest

from bench.gpu import size_fit


def test_fit_recovers_a_quadratic():
    sizes = [4096, 8192, 16384, 32768, 65536]
    millis = [0.9 + 2e-5 * n + 1.5e-9 * n * n for n in sizes]
    (a, b, c), residuals = size_fit.fit(sizes, millis)
    assert (a, b, c) == (pytest.approx(0.9), pytest.approx(2e-5), pytest.approx(1.5e-9))
    assert max(abs(r) for r in residuals) < 1e-9


def test_fewer_than_three_sizes_are_refused(tmp_path):
    with pytest.raises(SystemExit, match="three sizes"):
        size_fit.main(["--device", "cpu", "--backends", "cpu", "--sizes", "64,128",
                       "--out", str(tmp_path)])


def test_cpu_run_writes_its_report(tmp_path):
    size_fit.main(["--device", "cpu", "--backends", "cpu", "--sizes", "48,96,192", "--dims", "8",
                   "--dtype", "fp32", "--repeats", "2", "--out", str(tmp_path)])
    [report] = tmp_path.iterdir()
    text = report.read_text()
    assert report.name.startswith("size_fit_cpu_")
    assert "## cpu, D = 8: t(N) = " in text
    assert all(f"| {n} |" in text for n in (48, 96, 192))
