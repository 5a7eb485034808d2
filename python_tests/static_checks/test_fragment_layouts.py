"""The CuTe layouts the CUDA kernels rely on, checked on the host: no GPU runs them here.

csrc/tests/fragment_layout_check.cpp includes the kernel headers (csrc/cuda/*.cuh) behind a small
host shim and evaluates the kernels' own types with the host C++ compiler; it prints one line per
check, "PASS <family> | <name> | <details>" or "FAIL ...". It is built once per session (g++,
about 30-60 s; it needs the CuTe headers of the nvidia-cutlass wheel and the CUDA toolkit's headers,
which CUTLASS includes: <cuda_runtime.h>, <cuda_fp16.h>, libcu++'s <cuda/std/...>). Each test
below asserts one family of lines, so a failure names the fact that broke:

- quads: every accumulator row is held by exactly the 4 lanes of one quad, which hold all its
  columns (quad_sum / quad_max in fragments.cuh), for every MMA the kernels use;
- views: sm80_rows_columns / sm90_rows_columns give (rows, columns) views with one tile row per
  view row and one tile column per view column, covering each thread's registers once, the same
  for the accumulator and its coordinates, and the same tile row for the 4 lanes of a quad;
- sm90-operands: for both resident widths (128, 256), the sm_90a streamed tile read as (d, row)
  (BlockTransposed, whole and in every 128-wide chunk) is the same bytes as the tile TMA
  wrote (Block), and Ring's stages are Blocks;
- sm80-out-transposed: the sm_80 out chunk's transposed view (OutTransposed) is OutLayout;
- smem-addressing: the offsets the kernels compute by calling a layout (cp.async destinations,
  store_tile_shared) are those the shared-memory tensors (ldmatrix) read; 16-byte runs;
  store_tile_shared's column pairs;
- sm90-register-operand: the sm_90a backward copies its weights element by element from the
  logits accumulator into the A fragment of a register-sourced wgmma; both place the same
  (row, column) at every index.
"""
import glob
import os
import shutil
import subprocess
import sys

import pytest

from support.build_description import build_description

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
SOURCE = os.path.join(ROOT, "csrc", "tests", "fragment_layout_check.cpp")
COMPILER = shutil.which("g++")

# Checks per family: the program's main() runs sm80 for bf16 / fp16 / fp32 and sm90 for bf16 / fp16.
EXPECTED = {
    "quads": 10,                # (3 sm80 types x 2 C tiles) + (2 sm90 types x 2 MMAs)
    "views": 10,
    "sm90-operands": 14,        # 2 types x (width 128: whole, 1 x 128, ring;
                                #            width 256: whole, 2 x 128, ring)
    "sm80-out-transposed": 3,
    "smem-addressing": 14,      # sm80: 3 x (direct vs tensor, 3 runs) + 2 x pairs
    "sm90-register-operand": 2,  # 2 types x the 128-wide grads wgmma
    "sm90-triangle": 18,        # 2 types x (3 accumulators x 2, weights tile offsets and pairs,
                                #            logits view)
}


def _cuda_includes():
    """-I directories for the CUDA toolkit's headers (cuda_runtime.h, and libcu++'s cuda/std,
    which CUDA 13 keeps under include/cccl), or None."""
    roots = []
    override = os.environ.get("SCL_CUDA_INCLUDE")
    if override:
        roots.append(override)
    for var in ("CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(var):
            roots.append(os.path.join(os.environ[var], "include"))
    nvcc = shutil.which("nvcc")
    if nvcc:
        roots.append(os.path.join(os.path.dirname(os.path.dirname(os.path.realpath(nvcc))), "include"))
    roots.append("/usr/local/cuda/include")
    for site in sys.path:  # pip's CUDA headers (nvidia-cuda-runtime, nvidia-cuda-cccl, ...)
        roots.extend(sorted(glob.glob(os.path.join(site, "nvidia", "*", "include"))))
    runtime = next((r for r in roots if os.path.exists(os.path.join(r, "cuda_runtime.h"))), None)
    if runtime is None:
        return None
    includes = [runtime]
    for r in [runtime] + roots:
        for candidate in (r, os.path.join(r, "cccl")):
            if os.path.exists(os.path.join(candidate, "cuda", "std", "utility")):
                if candidate not in includes:
                    includes.append(candidate)
                return includes
    return None


@pytest.fixture(scope="session")
def layout_checks(tmp_path_factory):
    """{family: [(status, name, details)]}, from one build and run of the check program."""
    if COMPILER is None:
        pytest.skip("no g++ on PATH to build csrc/tests/fragment_layout_check.cpp")
    cutlass, why_not = build_description().cutlass_include(os.environ)
    if cutlass is None:
        pytest.skip(f"{why_not} (or set SCL_CUTLASS_INCLUDE)")
    cuda = _cuda_includes()
    if cuda is None:
        pytest.skip("the CUDA toolkit's headers (cuda_runtime.h and libcu++'s cuda/std, which CUTLASS includes) "
                    "were not found: set CUDA_HOME or SCL_CUDA_INCLUDE")
    exe = str(tmp_path_factory.mktemp("fragment_layouts") / "fragment_layout_check")
    command = [COMPILER, "-std=c++20", "-O1", "-Wno-deprecated-declarations",
               "-I", os.path.join(ROOT, "csrc"), "-I", cutlass]
    for include in cuda:
        command += ["-I", include]
    build = subprocess.run(command + [SOURCE, "-o", exe], capture_output=True, text=True)
    assert build.returncode == 0, f"building {SOURCE} failed:\n{' '.join(command)}\n{build.stderr[-20000:]}"
    run = subprocess.run([exe], capture_output=True, text=True, timeout=300)
    lines = run.stdout.splitlines()
    assert lines and lines[-1].startswith("SUMMARY"), (
        f"the check program did not finish (exit status {run.returncode}):\n{run.stdout[-5000:]}\n{run.stderr[-5000:]}")
    results = {}
    for line in lines:
        status, _, rest = line.partition(" ")
        if status not in ("PASS", "FAIL"):
            continue
        family, name, details = (part.strip() for part in rest.split(" | ", 2))
        results.setdefault(family, []).append((status, name, details))
    assert (run.returncode == 0) == all(s == "PASS" for checks in results.values() for s, _, _ in checks), run.stdout
    return results


def _assert_family(results, family):
    checks = results.get(family, [])
    failed = [f"{name}: {details}" for status, name, details in checks if status != "PASS"]
    assert not failed, f"{len(failed)} of {len(checks)} '{family}' checks FAIL:\n" + "\n".join(failed)
    assert len(checks) == EXPECTED[family], (
        f"expected {EXPECTED[family]} '{family}' checks, the program ran {len(checks)}: {[n for _, n, _ in checks]}")


@pytest.mark.quick
def test_quads_hold_whole_accumulator_rows(layout_checks):
    _assert_family(layout_checks, "quads")


def test_rows_columns_views(layout_checks):
    _assert_family(layout_checks, "views")


def test_sm90_streamed_tile_is_its_own_transposed_operand(layout_checks):
    _assert_family(layout_checks, "sm90-operands")


def test_sm80_out_chunk_transposed(layout_checks):
    _assert_family(layout_checks, "sm80-out-transposed")


def test_shared_memory_addressing(layout_checks):
    _assert_family(layout_checks, "smem-addressing")


def test_sm90_weights_feed_the_register_sourced_wgmma_in_place(layout_checks):
    _assert_family(layout_checks, "sm90-register-operand")


def test_sm90_triangle_backward_fragment_assumptions(layout_checks):
    _assert_family(layout_checks, "sm90-triangle")


def test_no_unknown_families(layout_checks):
    assert set(layout_checks) == set(EXPECTED), sorted(layout_checks)
