"""The CPU sweeps that share bench/harness/sweep.py (groups, focal, multilabel): each runs at a
tiny size and writes one table and one CSV whose rows hold a measured ratio."""
import csv
import importlib

import pytest


@pytest.mark.parametrize("module, argv", [
    ("bench.groups", ["--sizes", "96", "--group-sizes", "4", "--dense-max", "96"]),
    ("bench.focal", ["--sizes", "96", "--classes", "3"]),
    ("bench.multilabel", ["--sizes", "96", "--dense-max", "96"]),
])
def test_sweep_writes_its_table(tmp_path, module, argv):
    importlib.import_module(module).main([*argv, "--dims", "16", "--repeats", "1",
                                          "--out", str(tmp_path)])
    [table], [values] = list(tmp_path.glob("*.md")), list(tmp_path.glob("*.csv"))
    assert "command" in table.read_text()
    with open(values) as rows_file:
        rows = list(csv.DictReader(rows_file))
    assert rows and all(float(row["ratio"]) > 0 for row in rows)
