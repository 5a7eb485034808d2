"""csrc/core/tile_math.h, the CUDA kernels' per-element arithmetic, run on the host: the program
csrc/tests/tile_math_check.cpp calls each function on inputs from here, and the results are
checked against float64 references on random inputs and edge cases (masked tiles, rows without
columns, infinities)."""
import math
import os
import random
import shutil
import subprocess

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COMPILER = shutil.which("g++") or shutil.which("c++")
LOG2E = 1 / math.log(2)


@pytest.fixture(scope="session")
def tile_math(tmp_path_factory):
    """call(lines) -> one list of floats per line."""
    if COMPILER is None:
        pytest.skip("no C++ compiler (g++ / c++) to build csrc/tests/tile_math_check.cpp")
    exe = str(tmp_path_factory.mktemp("tile_math") / "tile_math_check")
    subprocess.run([COMPILER, "-std=c++17", "-O2", "-ffp-contract=off", "-I",
                    os.path.join(ROOT, "csrc"), os.path.join(ROOT, "csrc", "tests", "tile_math_check.cpp"),
                    "-o", exe], check=True)

    def call(lines):
        out = subprocess.run([exe], input="\n".join(lines) + "\n", capture_output=True, text=True,
                             check=True).stdout
        return [[float(v) for v in row.split()] for row in out.strip("\n").split("\n")]
    return call


def _fmt(v):
    return repr(float(v)) if math.isfinite(v) else ("inf" if v > 0 else "-inf")


def _lse_command(tiles):
    return "lse " + " ".join(f"{len(t)} " + " ".join(_fmt(v) for v in t) for t in tiles)


def _logsumexp2(values):
    """Natural-log LSE of base-2 logits, in float64 (-inf for none)."""
    finite = [v for v in values if v != -math.inf]
    if not finite:
        return -math.inf
    m = max(finite)
    return (m + math.log2(sum(2.0 ** (v - m) for v in finite))) * math.log(2)


@pytest.mark.quick
def test_running_lse_tile_by_tile(tile_math):
    rng = random.Random(1)
    rows = []
    for _ in range(200):
        tiles = []
        for _ in range(rng.randint(1, 6)):
            width = rng.randint(1, 40)
            if rng.random() < 0.2:  # a fully masked tile
                tiles.append([-math.inf] * width)
            else:
                scale = rng.choice([1.0, 30.0, 3000.0])
                tiles.append([rng.gauss(0, scale) if rng.random() > 0.1 else -math.inf
                              for _ in range(width)])
        rows.append(tiles)
    results = tile_math([_lse_command(t) for t in rows])
    for tiles, (_, _, lse) in zip(rows, results):
        want = _logsumexp2([v for t in tiles for v in t])
        assert not math.isnan(lse)
        if want == -math.inf:
            assert lse == -math.inf
        else:
            assert abs(lse - want) <= 1e-6 * max(1.0, abs(want)), (lse, want)


def test_merge_of_splits_equals_one_pass(tile_math):
    rng = random.Random(2)
    lines, wants = [], []
    for _ in range(100):
        values = [rng.gauss(0, 20) for _ in range(rng.randint(1, 60))]
        cut = sorted(rng.sample(range(len(values) + 1), 2))
        parts = [values[:cut[0]], values[cut[0]:cut[1]], values[cut[1]:]]
        one = tile_math([_lse_command([p]) for p in parts if p] or ["lse"])
        pairs = [r[:2] for r in one] + [[-math.inf, 0.0]]  # an empty split merges as a no-op
        lines.append("merge " + " ".join(_fmt(v) for pair in pairs for v in pair))
        wants.append(_logsumexp2(values))
    for (_, _, lse), want in zip(tile_math(lines), wants):
        assert abs(lse - want) <= 1e-6 * max(1.0, abs(want))
    assert tile_math(["merge -inf 0 -inf 0"])[0][2] == -math.inf


def test_symmetric_lse(tile_math):
    (got,), (none,) = tile_math(["symmetric_lse 10 3.5", "symmetric_lse 10 0"])
    assert abs(got - (10 + math.log(3.5))) < 1e-12 and none == -math.inf


def test_split_lse2_is_exact(tile_math):
    rng = np.random.default_rng(3)
    lses = list(rng.normal(0, 50, 200)) + [1e10, -3e7, 0.0]
    results = tile_math([f"split_lse2 {_fmt(v)}" for v in lses])
    for lse, (hi, lo) in zip(lses, results):
        assert hi == float(np.float32(hi)) and lo == float(np.float32(lo))
        # two fp32 halves: 48 bits, float64's 53 less the rounding of lo
        assert abs((hi + lo) - lse * LOG2E) <= 2.0 ** -47 * max(1.0, abs(lse * LOG2E))
    assert tile_math(["split_lse2 -inf", "split_lse2 inf"]) == [[-math.inf, 0.0], [math.inf, 0.0]]


def test_gradient_weights(tile_math):
    rng = random.Random(4)
    lines, wants = [], []
    for _ in range(100):
        s2, hi, lo, scale = rng.uniform(-30, 5), rng.uniform(-5, 20), rng.uniform(-1e-6, 1e-6), rng.uniform(0, 2)
        lines.append(f"plain_weight {s2!r} {hi!r} {lo!r} {scale!r}")
        wants.append(2.0 ** ((s2 - hi) - lo) * scale)
        s2, row, scaled, col = rng.uniform(-30, 0), rng.uniform(0, 3), rng.uniform(0, 20), rng.uniform(0, 3)
        lines.append(f"symmetric_weight {s2!r} {row!r} {scaled!r} {col!r}")
        wants.append(2.0 ** s2 * (row * scaled + col))
    for (got,), want in zip(tile_math(lines), wants):
        assert abs(got - want) <= 1e-5 * abs(want) + 1e-30
    # a row without gradient weighs exactly 0, whatever its logit
    assert all(v == [0.0] for v in tile_math([f"plain_weight_none {s}" for s in (0, -1e30, 1e30, 88)]))


def test_symmetric_coef(tile_math):
    (zero,), (got,) = tile_math(["symmetric_coef 0 -inf 10", "symmetric_coef 0.5 9 10"])
    assert zero == 0.0
    assert abs(got - 0.5 * math.exp(1) * 10) < 1e-12


def test_fixed_shift_rule_matches_the_core(tile_math):
    """Safe above t ~ 0.0241 (5% margin on 2/t < 87.3), never below 0.0229: the rule the core's
    schedule choice uses (supcon_orchestration.cpp calls the same function)."""
    temperatures = [0.02, 0.0229, 0.0235, 0.0240, 0.0242, 0.025, 0.05, 0.1, 1.0]
    got = [bool(v[0]) for v in tile_math([f"fixed_shift {1 / t!r}" for t in temperatures])]
    want = [2 / t < 87.336544750553102 * 0.95 for t in temperatures]
    assert got == want
    assert got[0] is False and got[-1] is True


def test_self_column_tiles(tile_math):
    cases = [(r0, bm, c0, bn, off) for r0 in (0, 5, 64) for bm in (1, 16, 64) for c0 in (0, 3, 64, 100)
             for bn in (1, 16, 64) for off in (-1, 0, 7, 60)]
    results = tile_math([f"self_tile {' '.join(map(str, c))}" for c in cases])
    for (r0, bm, c0, bn, off), (got,) in zip(cases, results):
        want = off >= 0 and any(c0 <= r + off < c0 + bn for r in range(r0, r0 + bm))
        assert bool(got) == want, (r0, bm, c0, bn, off)


def test_split_ranges_cover_each_tile_once(tile_math):
    cases = [(tiles, splits) for tiles in (0, 1, 2, 7, 64, 513) for splits in (1, 2, 3, 8, 100)]
    lines = [f"split_range {t} {s} {k}" for t, s in cases for k in range(s)]
    results = iter(tile_math(lines))
    for tiles, splits in cases:
        covered = []
        for _ in range(splits):
            begin, end = next(results)
            covered += range(int(begin), int(end))
        assert covered == list(range(tiles)), (tiles, splits)


def test_paired_triangle_covers_the_upper_triangle_once(tile_math):
    lines, shape = [], []
    for nb in range(1, 41):
        pairs = int(tile_math([f"pairs {nb}"])[0][0])
        assert pairs == (nb + 1) // 2
        for p in range(pairs):
            for t in range(nb + 1):
                lines.append(f"triangle {nb} {p} {t}")
                shape.append(nb)
    seen = {}
    for nb, (i, j, valid) in zip(shape, tile_math(lines)):
        if valid:
            assert 0 <= i <= j < nb
            seen.setdefault(nb, []).append((int(i), int(j)))
    for nb in range(1, 41):
        tiles = seen[nb]
        assert len(tiles) == len(set(tiles)) == nb * (nb + 1) // 2, nb
