"""The device a run trains on (``--device``) and the machine and versions its metrics record;
shared by the classifier comparison and SimCSE."""
import os
import platform

from ..machine import cpu_model
from .data import InputError


def resolve_device(name):
    """``--device``: ``auto`` -> cuda when available, else cpu; other names are checked.

    Raises:
        InputError: not a torch device, or CUDA asked of a torch without a device.
    """
    import torch

    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    try:
        device = torch.device(name)
    except RuntimeError:
        raise InputError(f"--device {name!r} is not a torch device") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise InputError(f"--device {name}: this torch has no CUDA device available")
    return name


def environment_record(device, processes):
    """The machine and versions a run's metrics.json records."""
    import torch
    import transformers

    environment = {"python": platform.python_version(), "torch": torch.__version__,
                   "transformers": transformers.__version__, "device": device,
                   "processes": processes, "cpu": cpu_model(), "cpu_count": os.cpu_count(),
                   "torch_threads": torch.get_num_threads()}
    if device.startswith("cuda"):
        environment["gpu"] = torch.cuda.get_device_name(torch.device(device))
    return environment
