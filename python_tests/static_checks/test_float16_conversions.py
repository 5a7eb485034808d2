"""The fused backward's 16-bit stores (csrc/cuda/row_stages.h: float_to_bfloat16, float_to_half,
the same integer arithmetic on the host and in the CUDA kernels) and its 16-bit loads, bit for bit
against torch's conversions. The program csrc/tests/float16_conversion_check.cpp (built once per
session) converts float32 bit patterns read on stdin: every half value, the midpoints between
neighbours and one unit either side (ties to even, carries into the exponent, overflow, the
subnormal range), and random bit patterns of every exponent."""
import os
import shutil
import subprocess

import numpy as np
import pytest
import torch

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
SOURCE = os.path.join(ROOT, "csrc", "tests", "float16_conversion_check.cpp")
COMPILER = shutil.which("g++") or shutil.which("c++")


@pytest.fixture(scope="module")
def convert(tmp_path_factory):
    """bits (uint32 array) -> (bfloat16 bits, half bits, bfloat16 widened, half widened)."""
    if COMPILER is None:
        pytest.skip("no C++ compiler (g++ or c++ on PATH) to build " + SOURCE)
    exe = str(tmp_path_factory.mktemp("float16") / "float16_conversion_check")
    # SCL_CUDA_DRY_RUN: the header's CUDA-free form (no cuda_runtime.h).
    build = subprocess.run([COMPILER, "-std=c++17", "-O2", "-Wall", "-DSCL_CUDA_DRY_RUN", "-I",
                            os.path.join(ROOT, "csrc"), SOURCE, "-o", exe],
                           capture_output=True, text=True)
    assert build.returncode == 0, f"building {SOURCE} failed:\n{build.stderr}"

    def run(bits):
        text = "\n".join(f"{int(b):08x}" for b in bits) + "\n"
        done = subprocess.run([exe], input=text, capture_output=True, text=True, check=True)
        rows = np.array([[int(v, 16) for v in line.split()] for line in done.stdout.splitlines()],
                        dtype=np.uint64)
        return (rows[:, 0].astype(np.uint16), rows[:, 1].astype(np.uint16),
                rows[:, 2].astype(np.uint32), rows[:, 3].astype(np.uint32))
    return run


def _patterns():
    halves = torch.arange(0, 1 << 16, dtype=torch.int32).to(torch.int16).view(torch.float16)
    widened = halves.float()
    finite = widened[torch.isfinite(widened)].numpy().view(np.uint32)
    around = np.concatenate([finite + delta for delta in (np.uint32(0), np.uint32(1))]
                            + [finite - np.uint32(1)])
    # midpoints of neighbouring halves (ties), in float32, and bfloat16's ties: low 16 bits 0x8000
    ordered = np.sort(widened[torch.isfinite(widened)].double().numpy())
    mids = ((ordered[1:] + ordered[:-1]) / 2).astype(np.float32).view(np.uint32)
    rng = np.random.default_rng(2026)
    random = rng.integers(0, 1 << 32, 200_000, dtype=np.uint64).astype(np.uint32)
    ties = (random & np.uint32(0xffff0000)) | np.uint32(0x8000)
    special = np.array([0, 0x80000000, 0x7f800000, 0xff800000, 0x7fc00000, 0x7f800001, 0xffc12345,
                        0x477fefff, 0x477ff000, 0x47800000, 0x7f7fffff, 0x33000000, 0x33000001,
                        0x387fe000, 0x38800000, 0x00000001], dtype=np.uint32)
    return np.unique(np.concatenate([around, mids, mids + np.uint32(1), mids - np.uint32(1),
                                     random, ties, special]))


def test_conversions_match_torch_bit_for_bit(convert):
    bits = _patterns()
    bf16, half, bf16_back, half_back = convert(bits)
    x = torch.from_numpy(bits.view(np.float32))
    nan = torch.isnan(x).numpy()
    want_bf16 = x.to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
    want_half = x.to(torch.float16).view(torch.int16).numpy().view(np.uint16)
    for name, got, want, back in (("bfloat16", bf16, want_bf16, bf16_back),
                                  ("half", half, want_half, half_back)):
        got_nan = torch.from_numpy(got.view(np.int16)).view(
            torch.bfloat16 if name == "bfloat16" else torch.float16).float().isnan().numpy()
        assert (got_nan == nan).all(), f"{name}: NaN not kept as NaN"
        wrong = np.flatnonzero((got != want) & ~nan)
        assert wrong.size == 0, (f"{name}: {wrong.size} of {bits.size} differ, e.g. "
                                 + ", ".join(f"{bits[i]:08x} -> {got[i]:04x} (torch {want[i]:04x})"
                                             for i in wrong[:5]))
        # and back to float32 exactly, as torch widens
        dtype = torch.bfloat16 if name == "bfloat16" else torch.float16
        want_back = torch.from_numpy(want.view(np.int16)).view(dtype).float().numpy().view(np.uint32)
        wrong = np.flatnonzero((back != want_back) & ~nan)
        assert wrong.size == 0, f"{name} widening: {wrong.size} differ, e.g. {back[wrong[:3]]}"
