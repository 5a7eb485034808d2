"""bench/triton_glue_time.py runs against today's launchers: a change of their signatures (the
temperature tensor of 2026-11-27 was one) must not leave the benchmark broken."""
import subprocess
import sys

import pytest

from bench.harness.report import REPO_ROOT

pytest.importorskip("triton")


def test_times_each_launcher_and_the_step():
    done = subprocess.run([sys.executable, "-m", "bench.triton_glue_time", "--n", "40", "--d",
                           "12", "--calls", "2", "--repeats", "1"], cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    lines = [line for line in done.stdout.splitlines() if " us per call " in line]
    assert [line.split(":")[0] for line in lines] == [
        "lse launcher (symmetric)", "grad launcher (symmetric)",
        "forward + backward of supcon_loss"]
    assert all(float(line.split(": ")[1].split()[0]) > 0 for line in lines)
