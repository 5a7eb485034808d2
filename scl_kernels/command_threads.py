"""The threads of the package's commands (``scl-finetune``, ``python -m scl_kernels.demo``) on a
machine shared with other work (bench/PERFORMANCE.md, "Shared machines").

Two settings, each only where the user has not made the choice:

- OpenMP's idle threads sleep instead of spinning (``OMP_WAIT_POLICY=PASSIVE``). Under the default
  policy libgomp's workers spin for milliseconds after every parallel region, holding cores that
  the command's own thread and other processes need. libgomp reads the variable once, when it
  loads at ``import torch``, and importing this package imports torch: so the command restarts
  itself (``os.execve``: same process id, same arguments, the variable added), at the cost of a
  second interpreter start and torch import (2-4 s of CPU on the 2-core VM), paid once. A module
  outside the package that set the variable before any import would save that start, but not
  for ``python -m scl_kernels...``, and would be a second top-level name to install.
- torch's thread count is at most the CPUs the process may use (:mod:`.usable_cpus`): torch's
  default follows the affinity mask but not a cgroup's CPU quota.

The library itself changes neither on import: both are the whole process's, and a program that
imports it has its own reasons for its threads.
"""
import os
import sys
from typing import Dict, Mapping, Optional, Sequence

import torch

from .usable_cpus import usable_cpu_count

# Variables that already state how OpenMP's idle threads wait: GOMP_SPINCOUNT overrides the
# policy's spin count.
WAIT_VARIABLES = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")
# Variables that already state torch's thread count.
THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")


def prepare_command_threads(argv: Optional[Sequence[str]] = None) -> None:
    """Called first thing by a command's entry point: restarts the process with passive OpenMP
    waits where they are unset (it does not return then), else caps torch's thread count at the
    usable CPUs. ``argv``: the command line to restart with (default: this interpreter's own,
    ``sys.orig_argv``)."""
    environment = passive_wait_environment(os.environ)
    if environment is not None:
        sys.stdout.flush()
        sys.stderr.flush()
        os.execve(sys.executable, list(sys.orig_argv if argv is None else argv), environment)
    threads = command_thread_count(usable_cpu_count(), torch.get_num_threads(), os.environ)
    if threads != torch.get_num_threads():
        torch.set_num_threads(threads)


def passive_wait_environment(environ: Mapping[str, str]) -> Optional[Dict[str, str]]:
    """The environment to restart with, passive waits added; None where ``environ`` already says
    how OpenMP's threads wait (the user's choice, or the restarted process)."""
    if any(name in environ for name in WAIT_VARIABLES):
        return None
    return {**environ, "OMP_WAIT_POLICY": "PASSIVE"}


def command_thread_count(usable_cpus: int, torch_threads: int, environ: Mapping[str, str]) -> int:
    """torch's thread count for a command: its default capped at the usable CPUs, unless the
    environment set the count."""
    if any(name in environ for name in THREAD_VARIABLES):
        return torch_threads
    return min(torch_threads, usable_cpus)
