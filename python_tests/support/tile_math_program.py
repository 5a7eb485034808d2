"""The program csrc/tests/tile_math_check.cpp, which calls each function of csrc/core/tile_math.h
on the inputs of one stdin line and prints the results with full precision: built here, fed lines
written by :func:`line`. Shared by the tests of the header (static_checks/test_tile_math.py) and of
the cost model that counts its schedules (bench/tests)."""
import math
import os
import shutil
import subprocess

import numpy as np
import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
SOURCE = os.path.join(ROOT, "csrc", "tests", "tile_math_check.cpp")
COMPILER = shutil.which("g++") or shutil.which("c++")


def build(directory):
    """call(lines) -> one list of floats per line (the program's results for that line); the test
    skips, saying why, without a C++ compiler."""
    if COMPILER is None:
        pytest.skip("no C++ compiler (g++ or c++ on PATH) to build csrc/tests/tile_math_check.cpp")
    exe = os.path.join(directory, "tile_math_check")
    compiled = subprocess.run([COMPILER, "-std=c++17", "-O2", "-ffp-contract=off", "-Wall",
                               "-I", os.path.join(ROOT, "csrc"), SOURCE, "-o", exe],
                              capture_output=True, text=True)
    assert compiled.returncode == 0, f"building {SOURCE} failed:\n{compiled.stderr}"

    def call(lines):
        lines = list(lines)
        run = subprocess.run([exe], input="\n".join(lines) + "\n", capture_output=True, text=True)
        assert run.returncode == 0, run.stderr
        rows = run.stdout.split("\n")[:-1]
        assert len(rows) == len(lines)
        return [[float(v) for v in row.split()] for row in rows]
    return call


def number(v):
    """A float for the program: repr (round-trips float64 exactly), inf / -inf / nan by name."""
    v = float(v)
    if math.isfinite(v):
        return repr(v)
    return "nan" if math.isnan(v) else ("inf" if v > 0 else "-inf")


def line(command, *args):
    return " ".join([command] + [number(a) if isinstance(a, (float, np.floating)) else str(a)
                                 for a in args])
