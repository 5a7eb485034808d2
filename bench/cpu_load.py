"""Loads that reproduce what other people's work does to a small CPU call on a shared 2-core
machine: started beside a benchmark (bench.small_batch --load NAME) or alone.

    python -m bench.cpu_load compile            # until Ctrl-C
    python -m bench.cpu_load spin --seconds 60

A torch call with two threads opens OpenMP parallel regions whose second thread must get a core
before the region ends; a load that keeps more runnable threads than cores makes every such
region wait for the scheduler (bench/PERFORMANCE.md, "CPU: small calls under load"). RECIPES
names and describes each.
"""
import argparse
import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time

from scl_kernels.command_threads import WAIT_VARIABLES

from .harness.report import REPO_ROOT

SPIN = "while True: pass"
TRAIN = ("import torch\n"
         "torch.set_num_threads(2)\n"
         "w = torch.randn(384, 384, requires_grad=True)\n"
         "x = torch.randn(384, 384)\n"
         "while True:\n"
         "    (x @ w).relu().sum().backward()\n"
         "    w.grad = None\n")
# The library's own sources, compiled against the installed torch (-fsyntax-only would skip
# code generation, which is most of a build's time).
COMPILE_SOURCES = ("csrc/core/call_plan.cpp", "csrc/core/supcon_problem.cpp",
                   "csrc/core/supcon_orchestration.cpp")
RECIPES = {
    "compile": "a `make -j3` of C++ files that include torch's headers: three compiler processes "
               "at a time, each started again as it ends (short-lived, memory-heavy, like a build "
               "beside you)",
    "spin": "three busy Python processes, runnable all the time",
    "train": "a 2-thread PyTorch job (384 x 384 matmuls and a backward in a loop) and two busy "
             "Python processes, like a training job beside a build's compiler",
    "torch-job": "the 2-thread PyTorch job of `train` alone, with torch's default OpenMP waits, "
                 "like another user's training job on the same cores",
}


def _compile_loop_script():
    """A shell loop that keeps three compiles of torch-including sources running."""
    from torch.utils.cpp_extension import include_paths
    flags = " ".join(f"-I{path}" for path in [os.path.join(REPO_ROOT, "csrc"), *include_paths()])
    out = os.path.join(tempfile.gettempdir(), "scl_cpu_load.o")
    jobs = [f"while true; do c++ -std=c++20 -O2 -fopenmp {flags} -c {os.path.join(REPO_ROOT, s)} "
            f"-o {out}.{i} 2>/dev/null; done" for i, s in enumerate(COMPILE_SOURCES)]
    return " & ".join(jobs) + " & wait"


def commands(recipe):
    """The argument lists of the processes that make up ``recipe``."""
    python = [sys.executable, "-c"]
    if recipe == "compile":
        return [["sh", "-c", _compile_loop_script()]]
    if recipe == "spin":
        return [python + [SPIN]] * 3
    if recipe == "train":
        return [python + [TRAIN]] + [python + [SPIN]] * 2
    if recipe == "torch-job":
        return [python + [TRAIN]]
    raise ValueError(f"unknown load {recipe!r}; choose from {', '.join(RECIPES)}")


def default_wait_environment(**extra):
    """This process's environment without an OpenMP wait setting (torch's default waits), plus
    ``extra``."""
    environment = {name: value for name, value in os.environ.items() if name not in WAIT_VARIABLES}
    environment.update(extra)
    return environment


def describe(recipe):
    return f"{recipe}: {RECIPES[recipe]}"


@contextlib.contextmanager
def running(recipe, settle=5.0):
    """Runs the load ``recipe`` (None: nothing) while the block runs, in process groups of
    their own that are ended afterwards; waits ``settle`` seconds first so it is under way."""
    if recipe is None:
        yield
        return
    # Torch's default waits, whatever this process was started with: the loads are other
    # people's jobs.
    procs = [subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              env=default_wait_environment(), start_new_session=True)
             for args in commands(recipe)]
    try:
        time.sleep(settle)
        yield
    finally:
        for proc in procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in procs:
            proc.wait()


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    parser.add_argument("recipe", choices=RECIPES)
    parser.add_argument("--seconds", type=float, default=None,
                        help="stop after this long (default: until interrupted)")
    args = parser.parse_args(argv)
    with running(args.recipe, settle=0.0):
        try:
            time.sleep(args.seconds if args.seconds is not None else 10**9)
        except KeyboardInterrupt:
            pass


if __name__ == "__main__":
    main()
