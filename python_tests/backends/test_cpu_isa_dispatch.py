"""The cpu backend's tile kernels are compiled once per instruction set and pick one at run time
(csrc/cpu/cpu_capability.h): every path this CPU can run agrees with the float64 reference,
SCL_CPU_CAPABILITY (read once per process) or the test hook forces a path and
torch.ops.scl.cpu_capability() names the one that runs, and a value that names no path, or a path
this CPU cannot run, raises instead of crashing.
"""

import contextlib
import os
import platform
import subprocess
import sys

import pytest
import torch

import scl_kernels
from scl_kernels._testing import NOT_A_TEST_BUILD, test_build, test_hooks
from support import needs
from support.reference64 import check_against_reference

pytestmark = pytest.mark.usefixtures("cpu_library")

ISAS = ["default", "avx2", "avx512"]


def _cpu_flags():
    """The CPU's feature flags as Linux reports them; None where it does not."""
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return None


def _runnable_isas():
    """The paths this CPU runs, from the operating system's view of it rather than the library's."""
    if platform.machine() not in ("x86_64", "AMD64"):
        return ["default"]
    flags = _cpu_flags()
    if flags is None:
        pytest.skip("no /proc/cpuinfo to tell which instruction sets this CPU runs")
    runnable = ["default"]
    if {"avx2", "fma"} <= flags:
        runnable.append("avx2")
        if {"avx512f", "avx512bw", "avx512vl", "avx512dq"} <= flags:
            runnable.append("avx512")
    return runnable


@pytest.fixture
def force_isa():
    """Forces a path for this test by the test hook cpu_capability."""
    if not test_build():
        pytest.skip(NOT_A_TEST_BUILD)
    with contextlib.ExitStack() as stack:
        def force(isa):
            if isa not in _runnable_isas():
                pytest.skip(f"this CPU cannot run the {isa} path")
            stack.enter_context(test_hooks(cpu_capability=isa))
            assert torch.ops.scl.cpu_capability() == isa
        yield force


def _in_a_process(environment, code):
    """(exit code, output) of `python -c code` with SCL_CPU_CAPABILITY set as given, the variable
    being read once per process."""
    env = {k: v for k, v in os.environ.items() if k != "SCL_CPU_CAPABILITY"}
    env.update(environment)
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          timeout=300)
    return done.returncode, done.stdout + done.stderr


def test_automatic_choice_is_the_best_path_that_aten_allows():
    """Without SCL_CPU_CAPABILITY: the best path this CPU runs, lowered to ATen's own choice
    (ATEN_CPU_CAPABILITY), so a portable build still runs the vector code of a modern CPU."""
    best = _runnable_isas()[-1]
    aten = torch.backends.cpu.get_cpu_capability().lower()
    expected = min(best, aten, key=ISAS.index) if aten in ISAS else best
    status, output = _in_a_process({}, "import scl_kernels, torch; "
                                       "print(torch.ops.scl.cpu_capability())")
    assert status == 0, output
    assert output.split()[-1] == expected


def test_environment_variable_forces_a_path_and_is_checked():
    """SCL_CPU_CAPABILITY chooses the process's path; a value that names none raises, naming it."""
    code = "import scl_kernels, torch; print(torch.ops.scl.cpu_capability())"
    status, output = _in_a_process({"SCL_CPU_CAPABILITY": "default"}, code)
    assert status == 0 and output.split()[-1] == "default", output
    status, output = _in_a_process({"SCL_CPU_CAPABILITY": "avx3"}, code)
    assert status != 0 and "SCL_CPU_CAPABILITY=avx3 is not an instruction set" in output, output


CASES = {
    # single set, symmetric schedule (fixed shift), 3 x 3 blocks of 80 rows + a partial block
    "single_sym": dict(n=300, d=33, t=0.1),
    # single set, running maximum (t below the fixed-shift range): large logits
    "single_plain": dict(n=300, d=33, t=0.005),
    # cross set: few anchor blocks, many contrast blocks (the forward splits the columns)
    "cross": dict(n=129, d=17, t=0.1, m=700),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("isa", ISAS)
def test_every_path_matches_the_float64_reference(isa, case, dtype, force_isa, randn, randint, gen):
    force_isa(isa)
    c = CASES[case]
    contrast = None if "m" not in c else randn(c["m"], c["d"], dtype=dtype)
    contrast_labels = None if "m" not in c else randint(0, 7, (c["m"],))
    check_against_reference("cpu", randn(c["n"], c["d"], dtype=dtype), randint(0, 7, (c["n"],)),
                            torch.tensor(c["t"], dtype=dtype, requires_grad=True),
                            contrast=contrast, contrast_labels=contrast_labels,
                            reduction="none", generator=gen)


@needs.hooks
def test_unknown_value_raises(randn, randint):
    with test_hooks(cpu_capability="avx3"):
        with pytest.raises(RuntimeError, match=r"cpu_capability=avx3 is not an instruction set"):
            torch.ops.scl.cpu_capability()
        with pytest.raises(RuntimeError, match=r"cpu_capability=avx3"):
            scl_kernels.supcon_loss(randn(20, 5), randint(0, 3, (20,)), 0.1, backend="cpu")


@needs.hooks
def test_path_beyond_this_cpu_raises(randn, randint):
    beyond = [isa for isa in ISAS if isa not in _runnable_isas()]
    if not beyond:
        pytest.skip("this CPU runs every path")
    with test_hooks(cpu_capability=beyond[0]):
        with pytest.raises(RuntimeError, match=rf"cpu_capability={beyond[0]}, but this CPU runs at most"):
            scl_kernels.supcon_loss(randn(20, 5), randint(0, 3, (20,)), 0.1, backend="cpu")
