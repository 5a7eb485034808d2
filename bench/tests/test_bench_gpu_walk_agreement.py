"""bench/gpu/walk_agreement.py without a GPU: the error, the three states of a spec's errors over
its steps, and the command line the GPU session's smoke gate runs, on the CPU backend against the
reference."""
import math
import os
import subprocess
import sys

import pytest
import torch

from bench.gpu import walk_agreement

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
CPU_CALL = ["--device", "cpu", "--dtype", "fp32", "--backends", "cpu", "--against", "reference",
            "--sizes", "256", "--dims", "16"]


def test_the_error_is_the_largest_difference_over_the_largest_gradient():
    want = (torch.tensor([[2.0, -4.0]]), torch.tensor([1.0]))
    assert walk_agreement.relative_error((torch.tensor([[2.0, -3.0]]), torch.tensor([1.0])),
                                         want) == pytest.approx(0.25)
    # the worst tensor counts, each over its own largest element
    assert walk_agreement.relative_error((want[0], torch.tensor([1.5])), want) == pytest.approx(0.5)
    for bad in (float("nan"), float("inf")):
        assert not math.isfinite(walk_agreement.relative_error(
            (torch.tensor([[bad, -4.0]]), want[1]), want))


@pytest.mark.parametrize("errors, dtype, state", [
    ([1.1e-3, 1.1e-3, 1.2e-3], torch.bfloat16, "steady"),
    ([1.1e-3, 8.0e-3], torch.bfloat16, "steady"),      # one bf16 unit apart at most: rounding
    ([1.1e-3, 1.2e-2], torch.bfloat16, "moves"),
    ([1.1e-3, 3.0e-3], torch.float16, "moves"),
    ([1.0e-6, 5.0e-5], torch.float32, "steady"),
    ([1.0e-6, 2.0e-4], torch.float32, "moves"),
    ([1.1e-3, 6.0e-2], torch.bfloat16, "wrong"),
    ([1.1e-3, float("nan")], torch.bfloat16, "wrong"),
    ([float("inf")], torch.bfloat16, "wrong")])
def test_the_states_of_a_specs_errors(errors, dtype, state):
    assert walk_agreement.agreement_state(errors, dtype) == state


def test_the_cpu_backend_agrees_with_the_reference(capsys):
    assert walk_agreement.main(CPU_CALL + ["--steps", "2"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert [line.split(":")[0] + ":" + line.split(":")[1] for line in out[:2]] == [
        "agreement D=16 N=256: cpu vs reference step 1", "agreement D=16 N=256: cpu vs reference step 2"]
    assert all(float(line.rsplit(" ", 1)[1]) < 1e-4 for line in out[:2])
    assert out[-1].startswith("agreement ok")


def test_each_spec_against_each_against_once_per_step():
    found = list(walk_agreement.compare(["cpu", "reference"], ["reference", "cpu"], 64, 8,
                                        torch.float32, torch.device("cpu"), 2))
    assert [(spec, against, len(errors)) for spec, against, errors in found] == [
        ("cpu", "reference", 2), ("cpu", "cpu", 2), ("reference", "reference", 2),
        ("reference", "cpu", 2)]
    assert all(max(errors) < 1e-4 for _, _, errors in found)


def test_the_smoke_call_fails_with_a_last_line_naming_what():
    done = subprocess.run([sys.executable, "-m", "bench.gpu.walk_agreement", *CPU_CALL,
                           "--tolerance", "1e-12"], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 1, done.stderr
    last = done.stdout.strip().splitlines()[-1]
    assert last.startswith("agreement FAILED: ") and "cpu vs reference at D=16 N=256 step 1" in last


def test_a_spec_that_cannot_run_fails_the_call(capsys):
    assert walk_agreement.main(CPU_CALL[:5] + ["cuda:rows"] + CPU_CALL[6:]) == 1
    assert capsys.readouterr().out.strip().splitlines()[-1].startswith(
        "agreement FAILED: cuda:rows cannot run on cpu")
