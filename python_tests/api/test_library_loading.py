"""A compiled library that cannot load is loud: the import warns once with the reason, the fused
backends raise it, and SCL_KERNELS_LIBRARY naming no file is an error (never a silent fall back to
the dense reference)."""
import os
import subprocess
import sys

import torch

from scl_kernels._extension import BUILD_INFO_MARKER

PROBE = """
import warnings
warnings.simplefilter("always")
with warnings.catch_warnings(record=True) as caught:
    import scl_kernels
import torch
print("WARNINGS:", [str(w.message) for w in caught if w.category is RuntimeWarning])
print("BACKENDS:", scl_kernels.available_backends())
try:
    scl_kernels.supcon_loss(torch.randn(4, 3), torch.tensor([0, 0, 1, 1]), backend="cpu")
except RuntimeError as error:
    print("CPU:", error)
"""


def _import_with_library(path):
    env = dict(os.environ, SCL_KERNELS_LIBRARY=str(path))
    return subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True,
                          timeout=300)


def test_a_library_built_for_another_torch_is_not_loaded_and_says_why(tmp_path):
    fake = tmp_path / "_C.so"
    fake.write_bytes(b"\x7fELF" + b"\0" * 64 + BUILD_INFO_MARKER + b"2.11.0, CPU only\0")
    result = _import_with_library(fake)
    assert result.returncode == 0, result.stderr
    warning = next(line for line in result.stdout.splitlines() if line.startswith("WARNINGS:"))
    assert "built for torch 2.11.0" in warning and torch.__version__ in warning
    assert "BACKENDS: ['reference']" in result.stdout
    assert "CPU:" in result.stdout and "built for torch 2.11.0" in result.stdout.split("CPU:")[1]


def test_a_corrupt_library_is_reported_with_the_loaders_error(tmp_path):
    fake = tmp_path / "_C.so"
    fake.write_bytes(b"not a shared library")
    result = _import_with_library(fake)
    assert result.returncode == 0, result.stderr
    assert "failed to load" in result.stdout and "BACKENDS: ['reference']" in result.stdout


def test_a_library_path_that_names_no_file_is_an_error(tmp_path):
    result = _import_with_library(tmp_path / "build" / "_C.*.so")
    assert result.returncode != 0
    assert "FileNotFoundError" in result.stderr and "names no file" in result.stderr
    assert "does not expand a glob" in result.stderr


def test_the_demo_refuses_to_call_the_dense_reference_fused(tmp_path):
    fake = tmp_path / "_C.so"
    fake.write_bytes(b"not a shared library")
    env = dict(os.environ, SCL_KERNELS_LIBRARY=str(fake))
    result = subprocess.run([sys.executable, "-m", "scl_kernels.demo", "--n", "64", "--dim", "8"],
                            env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode != 0
    assert "python -m scl_kernels.demo: no fused backend" in result.stderr
    assert "failed to load" in result.stderr and "fused (reference)" not in result.stdout
