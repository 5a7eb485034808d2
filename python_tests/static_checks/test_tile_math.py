"""csrc/core/tile_math.h, the per-element arithmetic of the CUDA kernels, run on the host.

The program csrc/tests/tile_math_check.cpp (support/tile_math_program.py builds it once per
session with the C++ compiler found here) calls each function of the header on the inputs of one
stdin line and prints the results with full precision; these tests feed it seeded random inputs
and edge cases (masked tiles, rows without columns, infinities, empty splits) and check the
results against float64 references (docs/MATH.md sections 2-6). No GPU and no torch build needed:
the CUDA kernels include the same header, so this is the CPU suite's check of their arithmetic."""
import itertools
import math
from fractions import Fraction

import numpy as np
import pytest

from support import tile_math_program
from support.tile_math_program import line, number

LOG2E = 1.4426950408889634074  # tile_math::kLog2e, as the same float64
LN2 = math.log(2)
INF = math.inf
F32 = np.float32
U32 = 2.0 ** -24  # float32 unit roundoff
FLT_MIN_LOG = math.log(2.0 ** -126)
DBL_MIN_LOG = math.log(2.0 ** -1022)


@pytest.fixture(scope="session")
def tile_math(tmp_path_factory):
    return tile_math_program.build(tmp_path_factory.mktemp("tile_math"))


def _lse_command(tiles):
    return "lse " + " ".join(f"{len(t)}" + "".join(" " + number(v) for v in t) for t in tiles)


def _lse2_natural(values):
    """float64 natural-log LSE of base-2 logits: ln(sum_j 2^v_j), -inf for no (finite) column."""
    v = np.asarray([x for x in values if x != -INF], dtype=np.float64)
    if v.size == 0:
        return -INF
    m = v.max()
    return float((m + np.log2(np.exp2(v - m).sum())) * LN2)


def _random_row(rng, max_tiles=6, max_width=40):
    """A row as tiles of float32 base-2 logits: random widths (0 included), scales from 1 to 3000,
    10 % of the columns masked (-inf) and 20 % of the tiles masked whole."""
    tiles = []
    for _ in range(rng.integers(1, max_tiles + 1)):
        width = int(rng.integers(0, max_width + 1))
        if rng.random() < 0.2:
            tiles.append([-INF] * width)
            continue
        values = rng.normal(rng.normal(0, 50), rng.choice([1.0, 30.0, 3000.0]), width).astype(F32)
        values[rng.random(width) < 0.1] = -INF
        tiles.append([float(v) for v in values])
    return tiles


def _edge_rows():
    up = [[float(k)] * 3 for k in range(0, 400, 40)]         # the maximum rises every tile
    down = [[float(k)] * 3 for k in range(400, 0, -40)]       # and falls: 2^-400 underflows
    rows = [
        [],                                                   # no tile at all
        [[]],                                                 # one empty tile
        [[-INF] * 7],                                         # one masked tile
        [[-INF] * 5, [], [-INF] * 33, [-INF]],                # a row without any column
        [[-INF] * 4, [3.5]],                                  # masked tiles before the first column
        [[3.5], [-INF] * 4],                                  # and after it
        [[0.0]], [[1e30]], [[-1e30]], [[-1e30, 1e30]],
        [[1e4, -INF], [-1e4], [1e4 + 1]],                     # far apart: small terms underflow
        up, down,
        [[-149.0] * 4, [-300.0] * 4],                         # subnormal and lost terms
    ]
    return [[[float(F32(v)) for v in t] for t in tiles] for tiles in rows]  # float32 logits


@pytest.mark.quick
def test_running_lse_tile_by_tile(tile_math):
    """Feeding a row tile by tile gives the float64 logsumexp of the row (float32 terms); the
    running max is the row's max; a row without columns gives -inf, never NaN."""
    rng = np.random.default_rng(1)
    rows = [_random_row(rng) for _ in range(400)] + _edge_rows()
    rows += [[[-INF] * int(rng.integers(0, 9)) for _ in range(rng.integers(1, 5))] for _ in range(20)]
    for tiles, (run_max, run_sum, lse) in zip(rows, tile_math(_lse_command(t) for t in rows)):
        values = [v for t in tiles for v in t]
        want = _lse2_natural(values)
        assert not math.isnan(lse) and not math.isnan(run_max) and not math.isnan(run_sum)
        if want == -INF:
            assert (run_max, run_sum, lse) == (-INF, 0.0, -INF), tiles
            continue
        assert run_max == max(values)
        finite = sum(v != -INF for v in values)
        assert 1.0 <= run_sum <= finite * (1 + 1e-6)
        assert abs(lse - want) <= 1e-6 * max(1.0, abs(want)), (lse, want, tiles)


@pytest.mark.quick
def test_shift_for_and_add_never_make_nan(tile_math):
    """shift_for is the new maximum, or 0 while every column seen is masked; add() with masked
    tiles (max -inf, sum 0) changes nothing and never turns the sum into NaN."""
    maxima = [-INF, float(F32(-1e30)), -200.0, -3.5, 0.0, 7.25, float(F32(1e30))]
    pairs = list(itertools.product(maxima, maxima + [INF]))
    shifts = tile_math(line("shift_for", float(m), float(t)) for m, t in pairs)
    for (m, t), (shift,) in zip(pairs, shifts):
        assert not math.isnan(shift)
        assert shift == (0.0 if max(m, t) == -INF else max(m, t))
    # add(tile_max, tile_sum) from a (max, sum) state: one term at the running max is 2^0
    states = [(-INF, 0.0), (5.0, 1.0), (5.0, 2.5), (-2.0 ** 100, 1.0)]
    tiles = [(-INF, 0.0), (5.0, 1.0), (3.0, 1.75), (9.0, 1.0), (-2.0 ** 100, 4.0), (200.0, 1.0)]
    cases = list(itertools.product(states, tiles))
    results = tile_math(line("add", float(m), float(s), float(tm), float(ts))
                        for (m, s), (tm, ts) in cases)
    for ((m, s), (tm, ts)), (new_max, new_sum) in zip(cases, results):
        want_max = max(m, tm)
        want_sum = 0.0 if want_max == -INF else (
            (s * 2.0 ** (m - want_max) if m != -INF else 0.0) + ts)
        assert new_max == want_max and not math.isnan(new_sum)
        assert abs(new_sum - want_sum) <= 2 * U32 * want_sum, ((m, s), (tm, ts), new_sum)


def test_merge_of_column_splits_equals_one_pass(tile_math):
    """Column splits run separately (some empty, some masked) and merge() to the single pass."""
    rng = np.random.default_rng(2)
    rows = [_random_row(rng) for _ in range(200)] + _edge_rows()
    parts_of_row = []
    for tiles in rows:
        cuts = sorted(rng.integers(0, len(tiles) + 1, int(rng.integers(0, 4))))
        bounds = [0, *cuts, len(tiles)]
        parts_of_row.append([tiles[a:b] for a, b in zip(bounds, bounds[1:])])
    one_pass = tile_math(_lse_command(t) for t in rows)
    flat = [part for parts in parts_of_row for part in parts]
    part_results = iter(tile_math(_lse_command(p) for p in flat))
    merges = [("merge " + " ".join(f"{number(m)} {number(s)}" for m, s, _ in
                                   (next(part_results) for _ in parts)))
              for parts in parts_of_row]
    for tiles, (_, _, single), (m, s, merged) in zip(rows, one_pass, tile_math(merges)):
        want = _lse2_natural([v for t in tiles for v in t])
        if want == -INF:
            assert (m, s, merged) == (-INF, 0.0, -INF)
            continue
        assert not math.isnan(merged)
        assert abs(merged - single) <= 1e-6 * max(1.0, abs(single))
        assert abs(merged - want) <= 1e-6 * max(1.0, abs(want)), (merged, want, tiles)
    assert tile_math(["merge", "merge -inf 0 -inf 0", "merge -inf 0 2 1 -inf 0"]) == [
        [-INF, 0.0, -INF], [-INF, 0.0, -INF], [2.0, 1.0, 2 * LN2]]


def test_symmetric_lse(tile_math):
    """1/t + log(row_sum) in float64 from the float32 fixed-shift sum; an empty row is -inf."""
    rng = np.random.default_rng(3)
    inv_t = rng.uniform(0.1, 40.0, 200)
    row_sum = np.exp(rng.uniform(-100, 40, 200)).astype(F32)  # subnormal to large
    lines = [line("symmetric_lse", float(a), float(s)) for a, s in zip(inv_t, row_sum)]
    for a, s, (got,) in zip(inv_t, row_sum, tile_math(lines)):
        want = a + math.log(float(s))
        assert abs(got - want) <= 4e-16 * max(1.0, abs(want))
    assert tile_math(["symmetric_lse 10 0", "symmetric_lse 10 -0"]) == [[-INF], [-INF]]


@pytest.mark.quick
def test_split_lse2_is_exact(tile_math):
    """hi is lse log2(e) rounded to float32, lo the float32 rest: hi + lo = lse log2(e) to about
    1e-15 (two float32 halves: 2^-48); +-inf give (+-inf, 0), NaN gives lo = 0."""
    assert LOG2E == 1 / math.log(2)
    rng = np.random.default_rng(4)
    magnitudes = np.exp(rng.uniform(math.log(1e-30), math.log(1e37), 300))
    lses = list(rng.normal(0, 50, 300)) + list(magnitudes * rng.choice([-1, 1], 300))
    lses += [0.0, -0.0, 1.0, 9000.123456789, -3e7, 1e10, 2.0 ** -130, 1e-300]
    results = tile_math(line("split_lse2", float(v)) for v in lses)
    for lse, (hi, lo) in zip(lses, results):
        lse2 = lse * LOG2E
        assert hi == float(F32(lse2)) and lo == float(F32(lo))
        assert abs(lo) <= abs(hi) * U32 or abs(lse2) < 2.0 ** -100
        assert abs((hi + lo) - lse2) <= 2.0 ** -48 * abs(lse2) + 2.0 ** -149, (lse, hi, lo)
    (hi_n, lo_n), *infinities = tile_math(["split_lse2 nan", "split_lse2 -inf", "split_lse2 inf"])
    assert math.isnan(hi_n) and lo_n == 0.0
    assert infinities == [[-INF, 0.0], [INF, 0.0]]


@pytest.mark.quick
def test_plain_grad_weight(tile_math):
    """exp2((s2 - hi) - lo) * scale; with the (hi, lo) of split_lse2 the weight of a logit near
    the row's maximum is as exact as the logit, however large (section 6); a row without
    gradient (no_gradient_lse2) weighs exactly 0 for every finite or masked logit."""
    rng = np.random.default_rng(5)
    lse = np.concatenate([rng.uniform(-5, 20, 150), rng.uniform(1e3, 1e5, 150)])
    (splits) = tile_math(line("split_lse2", float(v)) for v in lse)
    offsets = np.where(rng.random(300) < 0.5, rng.uniform(-30, 0.5, 300), rng.uniform(-2, 0.2, 300))
    s2 = (lse * LOG2E + offsets).astype(F32)
    scale = rng.uniform(0, 2, 300).astype(F32)
    lines = [line("plain_weight", float(a), hi, lo, float(c))
             for a, (hi, lo), c in zip(s2, splits, scale)]
    for a, (hi, lo), c, l64, (got,) in zip(s2, splits, scale, lse, tile_math(lines)):
        a, c = float(a), float(c)
        # the formula on these float32 numbers: the two float32 subtractions cost u |s2 - hi|
        # each in the exponent (none near the maximum, where s2 - hi is exact), exp2 and the
        # product an ulp or so
        bound = (4 + 2 * LN2 * abs(a - hi)) * U32
        want = 2.0 ** ((a - hi) - lo) * c
        assert abs(got - want) <= bound * want + 1e-45, (a, hi, lo, c)
        # against the float64 lse itself: no error proportional to |lse|
        exact = 2.0 ** (a - l64 * LOG2E) * c
        assert abs(got - exact) <= bound * exact + 1e-45, (a, l64, got, exact)
    finite = [0.0, -0.0, 1.0, -1.0, 88.0, -150.0, 1e-45, 3.4028234663852886e38,
              -3.4028234663852886e38] + [float(v) for v in rng.normal(0, 1e4, 50).astype(F32)]
    lines = [line("plain_weight_none", v, c) for v in finite + [-INF] for c in (0.0, 1.0, 7.5)]
    assert all(row == [0.0] for row in tile_math(lines))


def test_symmetric_grad_weight(tile_math):
    """2^s2 * (coef_row * column_scaled + column_coef) with one rounding of the fused sum; with
    coef_row = c_i t / log2(e), column_scaled = r_j log2(e) / t, column_coef = c_j r_j it is
    E_ij (c_i + c_j) r_j (section 4); a masked element is 0."""
    rng = np.random.default_rng(6)
    n = 300
    s2 = rng.uniform(-60, 0, n).astype(F32)
    row, scaled, col = (rng.normal(0, 3, n).astype(F32) for _ in range(3))  # signed: "none" g
    lines = [line("symmetric_weight", float(a), float(b), float(c), float(d))
             for a, b, c, d in zip(s2, row, scaled, col)]
    for a, b, c, d, (got,) in zip(s2, row, scaled, col, tile_math(lines)):
        want = 2.0 ** float(a) * (float(b) * float(c) + float(d))
        assert abs(got - want) <= 4 * U32 * abs(want) + 1e-45
    # the section 4 identity, for unit rows (inv norms r ~ 1) and g >= 0
    inv_t = rng.uniform(1, 40, n)
    c_i, c_j = rng.uniform(0, 5, n), rng.uniform(0, 5, n)
    r_j = rng.uniform(0.5, 2, n)
    e2 = rng.uniform(-2 * LOG2E * inv_t, 0)  # shifted base-2 logits, in [-2 log2(e)/t, 0]
    lines = [line("symmetric_weight", float(F32(e)), float(F32(ci / (LOG2E * it))),
                   float(F32(rj * LOG2E * it)), float(F32(cj * rj)))
             for e, ci, cj, rj, it in zip(e2, c_i, c_j, r_j, inv_t)]
    for e, ci, cj, rj, (got,) in zip(e2, c_i, c_j, r_j, tile_math(lines)):
        want = 2.0 ** float(F32(e)) * (ci + cj) * rj
        assert abs(got - want) <= 1e-6 * want + 1e-45
    masked = tile_math(line("symmetric_weight", -INF, b, c, d)
                       for b, c, d in [(0.0, 0.0, 0.0), (1.5, 3.0, -2.0), (1e30, 1e8, 1e38)])
    assert all(v == [0.0] for v in masked)


@pytest.mark.quick
def test_symmetric_coef(tile_math):
    """g e^(1/t - lse) / t in float64; exactly 0 where g = 0, whatever the lse (-inf for a row
    without columns), and never NaN for finite g and inv_t."""
    rng = np.random.default_rng(7)
    g = np.concatenate([rng.normal(0, 1, 200), np.zeros(20)])
    inv_t = rng.uniform(0.1, 50, 220)
    lse = inv_t + rng.uniform(-5, 15, 220)
    lines = [line("symmetric_coef", float(a), float(b), float(c)) for a, b, c in zip(g, lse, inv_t)]
    for a, b, c, (got,) in zip(g, lse, inv_t, tile_math(lines)):
        want = a * math.exp(c - b) * c
        assert abs(got - want) <= 1e-15 * abs(want)
    edge = list(itertools.product([0.0, -0.0, 0.5, -2.0], [-INF, INF, 3.0, 1e300, -1e300], [0.5, 10.0]))
    for (a, b, c), (got,) in zip(edge, tile_math(line("symmetric_coef", *e) for e in edge)):
        assert not math.isnan(got), (a, b, c)
        if a == 0:
            assert got == 0.0
        elif b == INF:
            assert got == 0.0


@pytest.mark.quick
def test_fixed_shift_rule_matches_the_core(tile_math):
    """The fixed shift is safe where 2/t < -log(smallest normal) * 0.95: float32 compute t >
    ~0.0241 safe and t < 0.0229 not, float64 compute t > ~0.003. tile_math's rule decides as the
    core's own rule (supcon_orchestration.cpp fixed_shift_is_safe, as it read before it called
    tile_math) on a grid of t and at the ulps around each threshold."""
    t = list(np.geomspace(1e-4, 100.0, 3000)) + [0.0229, 0.0235, 0.0241, 0.0242, 0.003, 0.0029]
    inv_t = [1 / v for v in t]
    for min_log in (FLT_MIN_LOG, DBL_MIN_LOG):
        edge = -min_log * 0.95 / 2
        for k in range(-3, 4):
            inv_t.append(float(np.float64(edge) + k * np.spacing(np.float64(edge))))
    core = tile_math(line("fixed_shift_core", v) for v in inv_t)
    fp32 = tile_math(line("fixed_shift_fp32", v) for v in inv_t)
    given = tile_math(line("fixed_shift", v, m) for v in inv_t for m in (FLT_MIN_LOG, DBL_MIN_LOG))
    for k, a in enumerate(inv_t):
        before32, before64, now32, now64 = core[k]
        assert before32 == now32 == fp32[k][0] == given[2 * k][0], a
        assert before64 == now64 == given[2 * k + 1][0], a
        assert now32 == (2 * a < -FLT_MIN_LOG * 0.95) and now64 == (2 * a < -DBL_MIN_LOG * 0.95)
        t_k = 1 / a
        if t_k > 0.02415:
            assert now32 == 1
        if t_k < 0.0229:
            assert now32 == 0
        if t_k > 0.003:
            assert now64 == 1
        if t_k < 0.0029:
            assert now64 == 0


def test_logit2_and_exp2(tile_math):
    """logit2 = fmaf(fl(dot * column_scaled), row_scale, bias): one rounding after the bias (the
    symmetric fixed shift cancels most of the product and loses nothing); exp2_approx is exp2."""
    rng = np.random.default_rng(8)
    n = 300
    dot = rng.normal(0, 1, n).astype(F32)
    row = rng.uniform(0.5, 2, n).astype(F32)
    col = (rng.uniform(0.5, 2, n) * LOG2E * rng.uniform(1, 50, n)).astype(F32)
    product = [float(F32(float(d) * float(c))) * float(r) for d, c, r in zip(dot, col, row)]
    bias = [0.0 if k % 3 == 0 else float(F32(-p * (1 + rng.normal(0, 1e-5)))) if k % 3 == 1
            else float(F32(rng.normal(0, 50))) for k, p in enumerate(product)]
    lines = [line("logit2", float(d), float(r), float(c), b) for d, r, c, b in zip(dot, row, col, bias)]
    for p, b, (got,) in zip(product, bias, tile_math(lines)):
        exact = Fraction(p) + Fraction(b)   # p is exact: a float32 product of two float32
        assert got == float(F32(got))
        assert abs(Fraction(got) - exact) <= Fraction(float(np.spacing(F32(abs(got))))) / 2, (p, b)
        if b == 0.0:
            assert got == float(F32(p))
    xs = [float(v) for v in rng.uniform(-160, 127, 200).astype(F32)] + [-INF, 0.0, -149.0, 127.0]
    for x, (got,) in zip(xs, tile_math(line("exp2", x) for x in xs)):
        want = 2.0 ** x
        assert abs(got - want) <= 2 * U32 * want + 2.0 ** -150


def test_self_column_tiles_vs_brute_force(tile_math):
    """A tile masks iff one of its rows' self column i + self_offset falls in its columns;
    self_offset < 0 means no self column at all."""
    cases = [(r0, bm, c0, bn, off) for r0 in range(0, 13) for bm in range(1, 6)
             for c0 in range(0, 17) for bn in range(1, 6) for off in (-5, -1, 0, 1, 2, 3, 6, 9)]
    cases += [(1024, 64, 1088, 64, 64), (1024, 64, 1087, 1, 64), (1024, 64, 1152, 64, 64),
              (0, 128, 4096, 128, 4000), (0, 128, 4096, 128, 3968), (0, 128, 4096, 128, 3969)]
    for case, (got,) in zip(cases, tile_math(line("self_tile", *c) for c in cases)):
        r0, bm, c0, bn, off = case
        want = off >= 0 and any(c0 <= i + off < c0 + bn for i in range(r0, r0 + bm))
        assert bool(got) == want, case


def test_split_ranges_cover_each_tile_once(tile_math):
    """The splits' [begin, end) cover 0 .. tiles exactly once, in order, in whole tiles, each at
    most ceil(tiles / splits) long (more splits than tiles leave empty ranges at the end)."""
    cases = [(tiles, splits) for tiles in range(0, 71) for splits in range(1, 21)]
    cases += [(tiles, splits) for tiles in (127, 128, 129, 1000, 4097) for splits in (1, 7, 64, 132, 5000)]
    lines = [line("split_range", t, s, k) for t, s in cases for k in range(s)]
    results = iter(tile_math(lines))
    for tiles, splits in cases:
        position = 0
        for _ in range(splits):
            begin, end = map(int, next(results))
            assert 0 <= begin <= end <= tiles and end - begin <= -(-tiles // splits)
            assert begin == position or begin == end, (tiles, splits)
            position = max(position, end)
        assert position == tiles, (tiles, splits)
    # the same, counting every tile: nothing twice, nothing missing
    results = iter(tile_math(lines))
    for tiles, splits in cases:
        covered = [i for _ in range(splits) for i in range(*map(int, next(results)))]
        assert covered == list(range(tiles))


@pytest.mark.parametrize("nbs", [pytest.param(range(1, 9), marks=pytest.mark.quick), range(9, 41)],
                         ids=["nb1-8", "nb9-40"])
def test_paired_triangle_covers_the_upper_triangle_once(tile_math, nbs):
    """Across programs p < triangle_pairs(nb) and t < nb + 1, the valid tiles are each (I, J)
    with I <= J < nb exactly once: program p does row block p then its partner nb - 1 - p, nb + 1
    tiles (the middle program of an odd nb only its own row block), valid tiles first."""
    lines, keys = [], []
    for nb in nbs:
        pairs = int(tile_math([f"pairs {nb}"])[0][0])
        assert pairs == (nb + 1) // 2
        for p in range(pairs):
            for t in range(nb + 1):
                lines.append(line("triangle", nb, p, t))
                keys.append((nb, p, t))
    got = dict(zip(keys, tile_math(lines)))
    for nb in nbs:
        seen = []
        for p in range((nb + 1) // 2):
            partner = nb - 1 - p
            valid_count = nb - p if partner == p else nb + 1
            for t in range(nb + 1):
                i, j, valid = got[(nb, p, t)]
                assert bool(valid) == (t < valid_count), (nb, p, t)
                if valid:
                    assert 0 <= i <= j < nb and i == (p if t < nb - p else partner), (nb, p, t)
                    seen.append((int(i), int(j)))
        want = [(i, j) for i in range(nb) for j in range(i, nb)]
        assert sorted(seen) == want, nb


@pytest.mark.parametrize("nbs", [pytest.param(range(1, 9), marks=pytest.mark.quick), range(9, 41)],
                         ids=["nb1-8", "nb9-40"])
def test_pair_triangle_adds_every_block_pair_once(tile_math, nbs):
    """The symmetric backward's cluster pairs (sm_90a): over row blocks I < nb rounded up to
    pairs (an odd nb's last block pairs with a block of padding), a tile (I, J) adds J's rows into
    I's gradient and, with a column side, I's rows into J's. Every ordered pair of real blocks
    must be added exactly once; both programs of a pair walk as many tiles and take the column
    side on the same tiles (their exchange pairs up), column sides only off the diagonal and
    only for column blocks after the pair."""
    lines, keys = [], []
    for nb in nbs:
        for i in range(nb + nb % 2):
            for t in range(nb + 2):
                lines.append(line("pair_triangle", nb, i, t))
                keys.append((nb, i, t))
    got = {key: [int(v) for v in row] for key, row in zip(keys, tile_math(lines))}
    for nb in nbs:
        added = {}
        for i in range(nb + nb % 2):
            tiles = got[(nb, i, 0)][0]
            assert tiles == got[(nb, i ^ 1, 0)][0], (nb, i)
            for t in range(tiles):
                _, j, column_side = got[(nb, i, t)]
                if column_side:
                    assert j >= (i | 1) + 1 and j != i, (nb, i, t)
                for to, frm in [(i, j)] + ([(j, i)] if column_side else []):
                    if to < nb and frm < nb:
                        added[(to, frm)] = added.get((to, frm), 0) + 1
        assert added == {(a, b): 1 for a in range(nb) for b in range(nb)}, nb

