"""Runs a ``python -m scl_kernels.finetune`` command line in one process and under
``torchrun --nproc_per_node 2``, for tests that the processes train as one."""
import json
import os
import pathlib
import subprocess
import sys

REPOSITORY = str(pathlib.Path(__file__).resolve().parents[2])
TORCHRUN_TWO = ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]


def run_in_one_and_two_processes(options, tmp_path):
    """Runs the command line with ``options`` plus ``--output-dir tmp_path/one`` (one process)
    and ``tmp_path/two`` (two gloo processes); checks both succeed, that rank 0 alone reports
    and that metrics.json records the process count. Returns ``{"one": metrics, "two":
    metrics}``."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1",
           "PYTHONPATH": os.pathsep.join(filter(None, [REPOSITORY, os.environ.get("PYTHONPATH")]))}
    metrics = {}
    for name, launcher in (("one", []), ("two", TORCHRUN_TWO)):
        command = [sys.executable, *launcher, "-m", "scl_kernels.finetune", *options,
                   "--output-dir", str(tmp_path / name)]
        done = subprocess.run(command, capture_output=True, text=True, timeout=180, env=env,
                              cwd=tmp_path)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        assert done.stdout.count("wrote ") == 1  # rank 0 reports, once
        metrics[name] = json.loads((tmp_path / name / "metrics.json").read_text(encoding="utf-8"))
        assert metrics[name]["environment"]["processes"] == (2 if launcher else 1)
    return metrics
