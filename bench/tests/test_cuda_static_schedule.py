"""bench.static.cuda_static's cost model against the schedule it predicts: csrc/core/tile_math.h,
run on the host by csrc/tests/tile_math_check.cpp (support/tile_math_program.py)."""
import pytest

from bench.static.cuda_static import triangle_tiles
from support import tile_math_program
from support.tile_math_program import line


@pytest.fixture(scope="module")
def tile_math(tmp_path_factory):
    return tile_math_program.build(tmp_path_factory.mktemp("tile_math"))


def test_the_cost_models_triangle_counts_are_the_schedules(tile_math):
    """bench.static.cuda_static counts the triangle's tiles (with and without a column side) to
    predict its time: the counts must be those of tile_math's schedule, over every program of a
    pair."""
    for nb in range(1, 41):
        programs = range(nb + nb % 2)
        tiles = {i: int(tile_math([line("pair_triangle", nb, i, 0)])[0][0]) for i in programs}
        lines = [line("pair_triangle", nb, i, t) for i in programs for t in range(tiles[i])]
        sides = [int(row[2]) for row in tile_math(lines)]
        assert triangle_tiles(nb) == (sum(sides), len(sides) - sum(sides)), nb
