"""Backend names, which device each serves, and the choice behind backend="auto"."""
import torch

from ._extension import library_loaded, require_library
from .reference import supcon_reference

BACKENDS = ("auto", "cpu", "reference")


def _fused_op(features, labels, contrast, contrast_labels, temperature, num_anchors, normalize):
    require_library()
    loss, _lse, num_positives = torch.ops.scl.supcon(
        features, labels, contrast, contrast_labels, temperature, num_anchors, normalize)
    return loss, num_positives


def _check_reference_values(features, contrast, temperature):
    # The fused op checks values inside the kernel; the dense path checks here, when eager
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
        return _fused_op
    raise AssertionError(name)
