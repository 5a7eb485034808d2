"""Failures found and not yet fixed, each with the machines it shows on: marked as non-strict
expected failures there, so that the suite stays usable while the failure is open, and listed
here rather than skipped, so that `-rx` shows them and a fix shows as XPASS."""
import os

import pytest
import torch


def _mkl_takes_avx512() -> bool:
    """Whether MKL's float64 GEMM runs its AVX-512 kernels: an Intel CPU with AVX-512, unless
    MKL_ENABLE_INSTRUCTIONS holds it to an older set (on AMD CPUs MKL takes its AVX2 kernels)."""
    if not torch.backends.mkl.is_available():
        return False
    if os.environ.get("MKL_ENABLE_INSTRUCTIONS", "").upper().startswith(("AVX2", "AVX", "SSE")):
        return False
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
            text = cpuinfo.read()
    except OSError:
        return False
    return "GenuineIntel" in text and " avx512f" in text


# node id -> (whether it fails on this machine, why)
KNOWN_FAILURES = {
    "python_tests/conformance/test_conformance_ops.py::test_anchor_offset"
    "[cpu-cpu-first-block-f64-False-0.02-0.5]": (
        _mkl_takes_avx512,
        "open since 2026-11-29: the CPU backend's focal backward, float64, rows not normalised, "
        "t = 0.02, under MKL's AVX-512 GEMM: one column-only row whose gradient is 4e-173 differs "
        "from the float64 reference by 1.6e-8 of itself (37 of 1,665 elements, all in that row); "
        "with MKL_ENABLE_INSTRUCTIONS=AVX2 it matches to 3e-16 and the reference is the same under "
        "both; the cause is in the backward (the forward's lse agrees to 1e-13), not found yet"),
}


def mark_known_failures(items) -> None:
    """Marks the collected tests that KNOWN_FAILURES lists for this machine."""
    for item in items:
        known = KNOWN_FAILURES.get(item.nodeid)
        if known is not None and known[0]():
            item.add_marker(pytest.mark.xfail(reason=known[1], strict=False))
