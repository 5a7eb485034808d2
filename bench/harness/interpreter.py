"""Running a bench module in Triton's interpreter, which must be chosen before triton is imported:
the module runs itself again in a child process with TRITON_INTERPRET=1. The programs put the
shared core on the device's path themselves (the test hook device_preparation, a test build's:
scl_kernels._testing), as a GPU takes it."""
import os
import subprocess
import sys

_CHILD = "SCL_BENCH_INTERPRETER_CHILD"


def in_interpreter_child():
    """True inside the child that rerun_in_interpreter started."""
    return os.environ.get("TRITON_INTERPRET") == "1" and os.environ.get(_CHILD) == "1"


def interpreter_command(module, argv, **env):
    """(command, environment) that run ``python -m module argv`` as an interpreter child, with
    `env` added to the environment."""
    args = list(argv) if argv is not None else sys.argv[1:]
    return ([sys.executable, "-m", module, *args],
            {**os.environ, "TRITON_INTERPRET": "1", _CHILD: "1", **env})


def rerun_in_interpreter(module, argv):
    """Runs ``python -m module argv`` in the interpreter; returns its exit status."""
    command, env = interpreter_command(module, argv)
    return subprocess.run(command, env=env, check=False).returncode
