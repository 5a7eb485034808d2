"""The run-time variables are read once per process and checked on any device: a misspelt value
is an error naming the variable from the first call, also on the CPU, where the value checks it
governs never wait."""
import os
import subprocess
import sys

from support import needs

pytestmark = needs.library

CALL = ("import torch, scl_kernels; "
        "print(scl_kernels.supcon_loss(torch.randn(8, 3), torch.randint(0, 2, (8,))).item())")


def _run(**environment):
    env = {k: v for k, v in os.environ.items()
           if k not in ("SCL_VALUE_CHECKS", "SCL_CUDA_SYMMETRIC_BACKWARD")}
    env.update(environment)
    done = subprocess.run([sys.executable, "-c", CALL], env=env, capture_output=True, text=True,
                          timeout=300)
    return done.returncode, done.stdout + done.stderr


def test_a_misspelt_value_check_setting_is_named_on_the_cpu():
    status, output = _run(SCL_VALUE_CHECKS="later")
    assert status != 0
    assert "SCL_VALUE_CHECKS must be when_ready, end_of_call or next_call, got 'later'" in output


def test_each_documented_value_check_setting_runs():
    for mode in ("when_ready", "end_of_call", "next_call"):
        status, output = _run(SCL_VALUE_CHECKS=mode)
        assert status == 0, (mode, output)


def test_a_misspelt_symmetric_backward_walk_is_named_on_the_cpu():
    status, output = _run(SCL_CUDA_SYMMETRIC_BACKWARD="diagonal")
    assert status != 0
    assert ('SCL_CUDA_SYMMETRIC_BACKWARD must be "triangle", "triangle-async" or "rows", '
            'got "diagonal"') in output


def test_each_documented_symmetric_backward_walk_runs():
    for walk in ("triangle", "triangle-async", "rows"):
        status, output = _run(SCL_CUDA_SYMMETRIC_BACKWARD=walk)
        assert status == 0, (walk, output)
