"""Backend names, which device each serves, and the choice behind backend="auto"."""
import importlib
import importlib.util
import os

import torch

from ._extension import library_loaded, require_library
from .reference import supcon_reference

BACKENDS = ("auto", "cpu", "triton", "reference")


def triton_installed() -> bool:
    return importlib.util.find_spec("triton") is not None


_triton_loaded = False


def load_triton_backend():
    """Imports the Triton backend, which registers its ops (and torch.ops.scl.supcon on CUDA).
    Once done, a plain flag check: torch.compile traces it without tracing an import."""
    global _triton_loaded
    if _triton_loaded:
        return
    if not triton_installed():
        raise ValueError("backend='triton' needs the triton package (pip install triton)")
    importlib.import_module("scl_kernels.triton_backend")
    _triton_loaded = True


def _run_op(op, features, labels, contrast, contrast_labels, temperature, num_anchors, normalize):
    loss, _lse, num_positives = op(features, labels, contrast, contrast_labels, temperature,
                                   num_anchors, normalize)
    return loss, num_positives


def _fused(*args):
    require_library()
    return _run_op(torch.ops.scl.supcon, *args)


def _triton(*args):
    load_triton_backend()
    return _run_op(torch.ops.scl.supcon_triton, *args)


def _check_reference_values(features, contrast, temperature):
    # The fused ops check values inside their kernels; the dense path checks here, when eager
    # (data-dependent checks cannot be traced).
    if torch.compiler.is_compiling():
        return
    for name, tensor in (("features", features), ("contrast", contrast)):
        if tensor is not None and not bool(torch.isfinite(tensor).all()):
            raise ValueError(f"{name} contains NaN or inf")
    value = float(temperature.detach())
    if not (value > 0 and value != float("inf")):
        raise ValueError(f"temperature must be positive and finite, got {value}")


def _reference(features, labels, contrast, contrast_labels, temperature, num_anchors, normalize):
    _check_reference_values(features, contrast, temperature)
    return supcon_reference(features, labels, contrast, contrast_labels, temperature, num_anchors,
                            normalize)


def available_backends(device="cpu"):
    """The backends that can run on ``device`` in this installation, best first."""
    device = torch.device(device)
    names = []
    if device.type == "cpu" and library_loaded():
        names.append("cpu")
    interpreted = device.type == "cpu" and os.environ.get("TRITON_INTERPRET") == "1"
    if triton_installed() and (device.type == "cuda" or interpreted):
        names.append("triton")
    names.append("reference")
    return names


def resolve_backend(name, device):
    """The per-anchor loss function for backend ``name`` on ``device``, or a ValueError."""
    if name not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {name!r}")
    if name == "auto":
        name = available_backends(device)[0]
    if name == "reference":
        return _reference
    if name == "cpu":
        if device.type != "cpu":
            raise ValueError(f"backend='cpu' needs CPU tensors, but features is on {device}")
        return _fused
    if device.type not in ("cuda", "cpu"):
        raise ValueError(f"backend='triton' needs CUDA tensors, but features is on {device}")
    load_triton_backend()
    if device.type == "cuda":
        # torch.ops.scl.supcon's CUDA kernel is the Triton one: one op for every fused backend.
        return _fused if library_loaded() else _triton
    return _triton
