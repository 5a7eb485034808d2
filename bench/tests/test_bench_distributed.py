"""Smoke test of bench/distributed.py: ``--quick`` (2 gloo ranks, N = 256, D = 16) in a
subprocess, every method's row present and the losses in agreement. Nothing about speed.

    python -m pytest bench/tests/test_bench_distributed.py
"""
import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("psutil")  # the memory still free (bench.harness.memory)
pytest.importorskip("tqdm")  # bench.finetune_step, whose memory cap the ranks use

from bench import distributed  # noqa: E402
from bench.harness.report import REPO_ROOT  # noqa: E402

OURS_AND_DENSE = ("gather", "ring", "dense", "single")


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("distributed")
    done = subprocess.run([sys.executable, "-m", "bench.distributed", "--quick", "--out", str(out)],
                          cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    files = sorted(os.listdir(out))
    assert len(files) == 2 and files[0].endswith("_quick.json") and files[1].endswith("_quick.txt")
    with open(out / files[0]) as report:
        payload = json.load(report)
    with open(out / files[1]) as text:
        return payload, text.read()


def test_every_method_has_a_row(quick_run):
    payload, text = quick_run
    rows = {(r["world"], r["method"]): r for r in payload["rows"]}
    assert set(rows) == {(2, m) for m in distributed.METHODS if m != "single"} | {(1, "single")}
    for (_, method), row in rows.items():
        assert f"| {method} |" in text
        if method.startswith("pml") and row["status"].startswith("not installed"):
            continue
        assert row["status"] == "ok", row
        assert row["step_ms"] > 0 and row["peak_mb"] >= 0 and row["steps"] == 2


def test_ours_and_the_dense_peer_agree_on_the_global_loss(quick_run):
    payload, _ = quick_run
    rows = [r for r in payload["rows"] if r["method"] in OURS_AND_DENSE + ("pml",)
            and r["status"] == "ok"]
    assert {r["method"] for r in rows} >= set(OURS_AND_DENSE)
    for row in rows:
        assert row["loss_same_on_every_rank"], row
        assert row["loss_rel_diff"] < 1e-5, row
        assert row["grad_rel_err"] < 1e-4, row
    assert "time_vs_dense" in next(r for r in rows if r["method"] == "gather")


def test_uneven_sizes_are_refused():
    with pytest.raises(SystemExit, match="multiple of the world size"):
        distributed.main(["--worlds", "3", "--sizes", "256", "--quick"])
