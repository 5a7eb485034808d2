"""Benchmarks never report the dense reference as the fused op: when the fused backend they time
cannot run (the compiled library failed to load, triton is absent), they exit before measuring,
with one line that says why, and write nothing. The library is made unloadable as
python_tests/api/test_library_loading.py does: SCL_KERNELS_LIBRARY names a file that is no
library."""
import importlib.util
import os
import subprocess
import sys

import pytest

import scl_kernels
from bench.harness.report import REPO_ROOT
from bench.implementations import by_name, skip_reason
from scl_kernels._extension import library_loaded
from scl_kernels.backends import why_not_fused
from scl_kernels.backends.triton import TRITON_MISSING


@pytest.fixture
def unloadable_library(tmp_path):
    fake = tmp_path / "_C.so"
    fake.write_bytes(b"not a shared library")
    return str(fake)


def _run(module, *args, env=None, without_triton=False):
    # triton absent: an entry of None in sys.modules makes `import triton` fail.
    hide = "sys.modules['triton'] = None; " if without_triton else ""
    code = (f"import runpy, sys; {hide}sys.argv = sys.argv[1:]; "
            "runpy.run_module(sys.argv[0], run_name='__main__')")
    return subprocess.run([sys.executable, "-c", code, module, *args], cwd=REPO_ROOT,
                          env=dict(os.environ, **(env or {})), capture_output=True, text=True,
                          timeout=300)


def _assert_refused(done, program, out_dir, *reasons):
    assert done.returncode != 0, done.stdout + done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith(f"{program}: no fused backend"), done.stderr
    assert "Traceback" not in done.stderr
    for reason in reasons:
        assert reason in last, last
    assert not any(out_dir.iterdir()), "wrote results before refusing"


NEEDS_FINETUNE = pytest.mark.skipif(importlib.util.find_spec("tqdm") is None,
                                    reason="bench.finetune_step needs the finetune extra (tqdm)")


@pytest.mark.parametrize("module, args", [
    ("bench.sweep", ["--device", "cpu", "--sizes", "64", "--impls", "scl_kernels,dense"]),
    ("bench.small_batch", ["--sizes", "64", "--dims", "8"]),
    ("bench.distributed", ["--quick"]),
    pytest.param("bench.finetune_step", ["--models", "minilm", "--sizes", "16"],
                 marks=NEEDS_FINETUNE),
])
def test_a_library_that_fails_to_load_ends_the_benchmark_with_its_reason(
        module, args, unloadable_library, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    done = _run(module, *args, "--out", str(out),
                env={"SCL_KERNELS_LIBRARY": unloadable_library})
    _assert_refused(done, f"python -m {module}", out, "failed to load")


@pytest.mark.skipif(not library_loaded(), reason="needs the compiled library: without it, that is "
                                                   "the reason given")
def test_the_triton_backend_without_triton_ends_the_sweep_with_its_reason(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    done = _run("bench.sweep", "--device", "cpu", "--sizes", "64", "--impls",
                "scl_kernels[triton],dense", "--out", str(out), without_triton=True)
    _assert_refused(done, "python -m bench.sweep", out, TRITON_MISSING)


def test_the_profile_skips_what_cannot_run_and_refuses_an_empty_run(unloadable_library,
                                                                     tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    done = _run("bench.gpu.profile", "--device", "cpu", "--backends", "cpu", "--sizes", "64",
                "--dims", "8", "--out", str(out), env={"SCL_KERNELS_LIBRARY": unloadable_library})
    assert done.returncode != 0 and "Traceback" not in done.stderr, done.stderr
    assert "none of the backends ['cpu'] runs on cpu" in done.stderr
    assert "failed to load" in done.stderr and not any(out.iterdir())


def test_the_demo_and_the_benchmarks_give_the_same_reason(unloadable_library, tmp_path):
    demo = _run("scl_kernels.demo", "--n", "64", "--dim", "8",
                env={"SCL_KERNELS_LIBRARY": unloadable_library})
    sweep = _run("bench.sweep", "--device", "cpu", "--sizes", "64", "--impls", "scl_kernels",
                 "--out", str(tmp_path), env={"SCL_KERNELS_LIBRARY": unloadable_library})
    reason = demo.stderr.strip().splitlines()[-1].split(": ", 1)[1]
    assert reason and sweep.stderr.strip().splitlines()[-1].endswith(reason)


def test_why_not_fused_names_the_reference_and_unknown_names():
    assert "dense PyTorch" in why_not_fused("reference", "cpu")
    assert "backend must be one of" in why_not_fused("fastest", "cpu")
    assert why_not_fused("auto", "meta") is None or not library_loaded()


@pytest.mark.skipif(not library_loaded(), reason="needs the compiled library (the cpu backend)")
def test_with_the_library_the_fused_cpu_backend_is_measured():
    pytest.importorskip("psutil", reason="the benchmarks' memory check needs psutil (the bench extra)")
    assert why_not_fused("auto", "cpu") is None and why_not_fused("cpu", "cpu") is None
    assert scl_kernels.backends.require_fused("auto", "cpu", "bench") == "cpu"
    assert skip_reason(by_name("scl_kernels"), 64, 8, "cpu") is None


@pytest.mark.skipif(library_loaded(), reason="the compiled library is loaded here")
def test_without_the_library_pytest_benchmarks_skip_the_fused_rows():
    reason = skip_reason(by_name("scl_kernels"), 64, 8, "cpu")
    assert reason.startswith("no fused kernel would run:")
    assert skip_reason(by_name("scl_kernels[reference]"), 64, 8, "cpu") is None
    assert skip_reason(by_name("dense"), 64, 8, "cpu") is None
