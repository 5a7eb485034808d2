"""The CuTe layouts the CUDA kernels rely on, checked on the host (no GPU runs them here):
csrc/tests/fragment_layout_check.cu evaluates the kernels' own layout types and prints one
PASS / FAIL line per check; each test below asserts one family of those lines.

- accumulators: the lanes of a quad hold whole rows (quad_sum / quad_max), the (rows, columns)
  views of fragments.cuh, and the column pairs of store_tile_shared;
- the sm_90a streamed tile read as (D, rows) is the same bytes as the tile TMA wrote (the
  backward's second wgmma operand), also in 64-column chunks;
- the sm_80 out chunk's transposed view, and the 16-byte runs cp.async and the weight stores
  assume."""
import importlib.util
import os
import shutil
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _nvcc():
    for candidate in (shutil.which("nvcc"),
                      os.path.join(os.environ.get("CUDA_HOME", "/usr/local/cuda"), "bin", "nvcc")):
        if candidate and os.path.exists(candidate):
            return candidate
    return None


def _cutlass_include():
    override = os.environ.get("SCL_CUTLASS_INCLUDE")
    if override:
        return override
    spec = importlib.util.find_spec("cutlass_library")
    return os.path.join(os.path.dirname(spec.origin), "source", "include") if spec else None


@pytest.fixture(scope="session")
def layout_checks(tmp_path_factory):
    """{check name: "PASS" or the failure}, from one compile and run (about 20 s)."""
    nvcc, cutlass = _nvcc(), _cutlass_include()
    if nvcc is None or cutlass is None:
        pytest.skip("needs nvcc and the CuTe headers (pip install nvidia-cutlass==4.2.0.0)")
    exe = str(tmp_path_factory.mktemp("layouts") / "fragment_layout_check")
    subprocess.run([nvcc, "-std=c++20", "-O1", "--expt-relaxed-constexpr", "-arch=sm_90a",
                    "-I", os.path.join(ROOT, "csrc"), "-I", cutlass,
                    os.path.join(ROOT, "csrc", "tests", "fragment_layout_check.cu"), "-o", exe],
                   check=True)
    out = subprocess.run([exe], capture_output=True, text=True).stdout
    results = {}
    for line in out.splitlines():
        status, _, rest = line.partition(" ")
        if status == "PASS":
            results[rest] = "PASS"
        elif status == "FAIL":
            name, _, why = rest.partition(": ")
            results[name] = why
    assert results, out
    return results


def _assert_family(results, words, expected):
    picked = {k: v for k, v in results.items() if all(w in k for w in words)}
    assert len(picked) == expected, sorted(picked)
    failed = {k: v for k, v in picked.items() if v != "PASS"}
    assert not failed, failed


@pytest.mark.quick
def test_accumulators_quads_views_and_pairs(layout_checks):
    _assert_family(layout_checks, ["accumulator"], 12)


def test_sm90_tile_is_its_own_transposed_operand(layout_checks):
    _assert_family(layout_checks, ["sm90", "transposed tile"], 2)
    _assert_family(layout_checks, ["sm90", "read as (D, rows)"], 2)


def test_sm80_out_chunk_transposed(layout_checks):
    _assert_family(layout_checks, ["sm80", "out chunk transposed"], 3)


def test_shared_memory_runs(layout_checks):
    _assert_family(layout_checks, ["16-byte runs"], 9)
    _assert_family(layout_checks, ["weight pairs"], 5)
