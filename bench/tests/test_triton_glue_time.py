"""bench/triton_glue_time.py against today's launchers and against a git revision's: a change of
the launchers' signatures (the temperature tensor of 2026-11-27 was one) must not leave the
benchmark broken, each column must time the package it names (the script refuses a child that
imported another), the revision's temporary worktree must be gone afterwards, and the GPU
dispatch's two paths must both run on the CPU's stand-in."""
import re
import subprocess
import sys

import pytest

from bench.harness.report import REPO_ROOT

pytest.importorskip("triton")

ROWS = ["lse launcher (symmetric)", "grad launcher (symmetric)",
        "forward + backward of supcon_loss", "forward + backward, stage ops replayed"]


def _worktrees():
    listed = subprocess.run(["git", "-C", REPO_ROOT, "worktree", "list", "--porcelain"],
                            capture_output=True, text=True, check=True).stdout
    return {line.split(" ", 1)[1] for line in listed.splitlines() if line.startswith("worktree ")}


def _in_a_git_checkout():
    return subprocess.run(["git", "-C", REPO_ROOT, "rev-parse", "--verify", "HEAD"],
                          capture_output=True, check=False).returncode == 0


def _run(*extra):
    done = subprocess.run([sys.executable, "-m", "bench.triton_glue_time", "--n", "40", "--d",
                           "12", "--calls", "2", "--repeats", "1", "--rounds", "1", *extra],
                          cwd=REPO_ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = [line for line in done.stdout.splitlines() if line.startswith(tuple(ROWS))]
    assert [next(row for row in ROWS if line.startswith(row)) for line in lines] == ROWS
    return done.stdout, lines


def test_times_each_launcher_and_the_step():
    stdout, lines = _run()
    for line in lines:
        assert float(line.split("us")[0].split()[-1]) > 0
    _check_dispatch(stdout)


def test_counts_the_crossings_into_python():
    """A single set's step crosses from the shared core into Python three times: the
    preparation, the forward's tiles and losses, the backward's weights, tiles and assembly."""
    stdout, _ = _run()
    assert re.search(r"^crossings into Python a step\s+3$", stdout, re.MULTILINE), stdout


@pytest.mark.skipif(not _in_a_git_checkout(),
                    reason="--against needs a git checkout (CI tests a copy of the files)")
def test_times_a_revision_in_the_same_run():
    before = _worktrees()
    stdout, lines = _run("--against", "HEAD")
    assert _worktrees() == before
    for line in lines:
        here, there, ratio = line.split("us")
        assert float(here.split()[-1]) > 0 and float(there.split()[-1]) > 0
        assert ratio.strip().endswith("x") and float(ratio.strip()[:-1]) > 0
    _check_dispatch(stdout)


def _check_dispatch(stdout):
    dispatch = re.findall(r"^  (tile kernel|column terms kernel), .*: ([\d.]+) us; .*: ([\d.]+) us",
                          stdout, re.MULTILINE)
    assert [kernel for kernel, _, _ in dispatch] == ["tile kernel", "column terms kernel"]
    assert all(float(jit) > 0 and float(handle) > 0 for _, jit, handle in dispatch)
