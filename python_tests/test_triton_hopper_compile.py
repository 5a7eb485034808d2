"""Every Triton kernel, with every tile of its autotuning list, compiles for Hopper (sm_90)
within the shared-memory budget: checked here on the CPU with Triton's own compiler, since CI
has no GPU."""
import os
import subprocess
import sys

import pytest

from scl_kernels.backends import triton_installed

pytestmark = pytest.mark.skipif(not triton_installed(), reason="triton is not installed")


def test_kernels_compile_for_hopper():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env["PYTHONPATH"] = os.pathsep.join([root, env.get("PYTHONPATH", "")])
    run = subprocess.run([sys.executable, os.path.join(root, "python_tests", "hopper_compile_check.py")],
                         env=env, capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    compiled = [line for line in run.stdout.splitlines() if "B shared" in line]
    # 4 kernels x (5 bf16 + 1 fp16 + 2 fp32 tiles), grad_rows in both of its variants
    assert len(compiled) == (4 + 1) * (5 + 1 + 2), run.stdout
