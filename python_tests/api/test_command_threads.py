"""The package's commands prepare their threads for a shared machine (scl_kernels.command_threads):
passive OpenMP waits unless the user chose, at most the usable CPUs; importing the library changes
neither."""
import os
import subprocess
import sys
from importlib import metadata

import pytest

from scl_kernels.command_threads import (WAIT_VARIABLES, command_thread_count,
                                         passive_wait_environment)

# Prints the wait policy the process runs with, after preparing the threads as a command does.
COMMAND_PROBE = """
import os
from scl_kernels.command_threads import prepare_command_threads
prepare_command_threads()
print(os.environ.get("OMP_WAIT_POLICY"), os.getpid())
"""


def test_a_command_restarts_itself_with_passive_waits_when_unset():
    """In a process (two torch imports: the restart is an exec); that a stated wait is kept is
    passive_wait_environment's, below."""
    env = {name: value for name, value in os.environ.items() if name not in WAIT_VARIABLES}
    probe = subprocess.Popen([sys.executable, "-c", COMMAND_PROBE], env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out, err = probe.communicate(timeout=120)
    assert probe.returncode == 0, err
    policy, pid = out.split()
    assert policy == "PASSIVE"
    assert int(pid) == probe.pid, "the restart is an exec of the same process"


@pytest.mark.parametrize("environ", [{"OMP_WAIT_POLICY": "ACTIVE"}, {"GOMP_SPINCOUNT": "10000"},
                                     {"OMP_WAIT_POLICY": "PASSIVE"}])
def test_a_stated_wait_is_kept(environ):
    assert passive_wait_environment(environ) is None


def test_an_unstated_wait_becomes_passive_and_the_rest_is_kept():
    assert passive_wait_environment({"PATH": "/bin"}) == {"PATH": "/bin", "OMP_WAIT_POLICY": "PASSIVE"}


@pytest.mark.parametrize("usable, torch_threads, environ, expected", [
    (2, 8, {}, 2),                            # a container's quota or taskset below torch's default
    (8, 2, {}, 2),                            # never more than torch's default
    (2, 8, {"OMP_NUM_THREADS": "8"}, 8),      # the user's count
    (2, 8, {"MKL_NUM_THREADS": "4"}, 8),
])
def test_command_thread_count(usable, torch_threads, environ, expected):
    assert command_thread_count(usable, torch_threads, environ) == expected


def test_the_commands_entry_points_prepare_their_threads():
    (script,) = [entry for entry in metadata.entry_points(group="console_scripts")
                 if entry.name == "scl-finetune"]
    assert script.value == "scl_kernels.finetune.__main__:main"
    from scl_kernels import demo
    from scl_kernels.finetune import __main__ as finetune_main
    for module in (demo, finetune_main):
        source = open(module.__file__, encoding="utf-8").read()
        assert "prepare_command_threads()" in source, module.__name__


def test_importing_the_library_leaves_torchs_threads_and_the_environment_alone():
    probe = ("import os, torch\n"
             "before = (torch.get_num_threads(), torch.get_num_interop_threads(), dict(os.environ))\n"
             "import scl_kernels, scl_kernels.command_threads\n"
             "after = (torch.get_num_threads(), torch.get_num_interop_threads(), dict(os.environ))\n"
             "print(before == after)\n")
    env = {name: value for name, value in os.environ.items()
           if name not in ("OMP_WAIT_POLICY", "OMP_NUM_THREADS")}
    done = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["True"]
