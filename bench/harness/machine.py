"""The facts that decide a benchmark's numbers: machine, library versions, source revision,
date and load, as {label: text} for every report's header."""
import datetime
import importlib.util
import os
import platform
import subprocess

import torch

import scl_kernels
from scl_kernels.machine import cpu_model

from .report import REPO_ROOT


def git_revision():
    """The checkout's short commit, with " (dirty)" when it has uncommitted changes."""
    try:
        def git(*args):
            return subprocess.run(["git", *args], cwd=REPO_ROOT, capture_output=True, text=True,
                                  check=True).stdout.strip()
        dirty = " (dirty)" if git("status", "--porcelain") else ""
        return git("rev-parse", "--short", "HEAD") + dirty
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def machine_description(device="cpu"):
    """{label: text}. psutil (the memory line) and triton are optional: a GPU machine may lack
    the one and a CPU one the other."""
    info = {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "CPU": f"{cpu_model()}, {os.cpu_count()} cores, {torch.get_num_threads()} torch threads",
    }
    if importlib.util.find_spec("psutil") is not None:
        import psutil
        info["memory"] = f"{psutil.virtual_memory().total / 2**30:.0f} GiB"
    info.update({
        "OS": platform.platform(),
        "Python": platform.python_version(),
        "torch": torch.__version__ + (f", CUDA {torch.version.cuda}" if torch.version.cuda else ""),
        "scl_kernels": f"{scl_kernels.__version__}, git {git_revision()}",
    })
    if importlib.util.find_spec("triton") is not None:
        import triton
        info["triton"] = triton.__version__
    if torch.device(device).type == "cuda":
        props = torch.cuda.get_device_properties(device)
        info["GPU"] = (f"{props.name}, {props.multi_processor_count} SMs, "
                       f"{props.total_memory / 2**30:.0f} GiB")
    # Other processes on the machine skew every number; this shows whether there were any.
    info["load average at start"] = load_average()
    return info


def load_average():
    return ", ".join(f"{load:.2f}" for load in os.getloadavg())
