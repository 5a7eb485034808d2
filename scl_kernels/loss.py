"""supcon_loss and SupConLoss: argument checks, the three layouts, reduction."""
import math
from numbers import Real

import torch
from torch import nn

from .backends import resolve_backend

CONTRAST_MODES = ("all", "one")
REDUCTIONS = ("mean", "sum", "none")


def _check_tensor(value, name, *, floating):
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(value).__name__}")
    if floating and not value.is_floating_point():
        raise TypeError(f"{name} must be a floating-point tensor, got {value.dtype}")
    if not floating and (value.is_floating_point() or value.is_complex() or value.dtype == torch.bool):
        raise TypeError(f"{name} must be an integer tensor, got {value.dtype}")


def _check_same_device(value, name, device):
    if value.device != device:
        raise ValueError(f"{name} is on {value.device} but features is on {device}")


def _temperature_tensor(temperature, device):
    if isinstance(temperature, torch.Tensor):
        if not temperature.is_floating_point():
            raise TypeError(f"temperature must be a floating-point tensor, got {temperature.dtype}")
        if temperature.numel() != 1 or temperature.dim() != 0:
            raise ValueError(f"temperature must be a 0-dim tensor, got shape {tuple(temperature.shape)}")
        if temperature.device != device and temperature.device.type != "cpu":
            raise ValueError(f"temperature is on {temperature.device} but features is on {device}")
        return temperature
    if isinstance(temperature, bool) or not isinstance(temperature, Real):
        raise TypeError(f"temperature must be a float or a 0-dim tensor, got {type(temperature).__name__}")
    if not (math.isfinite(temperature) and temperature > 0):
        raise ValueError(f"temperature must be positive and finite, got {temperature}")
    return torch.tensor(float(temperature), dtype=torch.float64)


def _flatten_views(features, labels):
    """[B, V, D] -> [V*B, D] view-major (row v*B + b, as SupContrast); labels [B] -> [V*B]."""
    if features.dim() == 2:
        return features, labels, features.shape[0]
    if features.dim() != 3:
        raise ValueError(f"features must have shape [N, D] or [B, V, D], got {tuple(features.shape)}")
    batch, views, dim = features.shape
    rows = features.transpose(0, 1).reshape(views * batch, dim)
    return rows, (None if labels is None else labels.repeat(views)), batch


def supcon_loss(features, labels=None, temperature=0.1, *, contrast=None, contrast_labels=None,
                contrast_mode="all", normalize=True, reduction="mean", backend="auto"):
    """Supervised contrastive loss (Khosla et al. 2020), fused: no N x N matrix is stored.

    Args:
        features: ``[N, D]``, or ``[B, V, D]`` for V views of B samples (flattened view-major).
        labels: integer ``[N]`` / ``[B]``; ``None`` makes every sample its own class (SimCLR /
            NT-Xent with V >= 2). A negative label means "no class": a negative for every anchor,
            never a positive, and no loss of its own.
        temperature: positive float, or a 0-dim tensor (which may require grad).
        contrast: ``[M, D]`` rows to contrast against (cross-set mode: anchors are the feature
            rows, no self-exclusion). With ``labels=None`` and no ``contrast_labels``, anchor i's
            only positive is contrast row i and rows past N are negatives (CLIP, SimCSE).
        contrast_labels: integer ``[M]`` labels of ``contrast``; required when ``labels`` is given.
        contrast_mode: ``"all"`` (every row is an anchor) or ``"one"`` (view-0 rows only).
        normalize: L2-normalise rows first (eps 1e-12, as ``F.normalize``).
        reduction: ``"mean"`` over anchors that have a positive (0 when none has), ``"sum"``, or
            ``"none"`` for one value per anchor (0 for anchors without positives).
        backend: ``"auto"`` (``"cpu"`` for CPU tensors, ``"triton"`` for CUDA ones), ``"cpu"``
            (fused C++), ``"triton"`` (fused Triton; CPU tensors only under TRITON_INTERPRET=1),
            or ``"reference"`` (dense PyTorch).

    Returns:
        float32 loss (float64 for float64 features); gradients come back in the input dtype.
    """
    _check_tensor(features, "features", floating=True)
    if labels is not None:
        _check_tensor(labels, "labels", floating=False)
        _check_same_device(labels, "labels", features.device)
        if labels.dim() != 1:
            raise ValueError(f"labels must be one-dimensional, got shape {tuple(labels.shape)}")
        expected = features.shape[0] if features.dim() in (2, 3) else None
        if expected is not None and labels.shape[0] != expected:
            raise ValueError(f"labels has {labels.shape[0]} entries but features has {expected} samples")
    if contrast_mode not in CONTRAST_MODES:
        raise ValueError(f"contrast_mode must be one of {CONTRAST_MODES}, got {contrast_mode!r}")
    if not isinstance(normalize, bool):
        raise TypeError(f"normalize must be a bool, got {type(normalize).__name__}")
    if reduction not in REDUCTIONS:
        raise ValueError(f"reduction must be one of {REDUCTIONS}, got {reduction!r}")
    run = resolve_backend(backend, features.device).run
    temperature = _temperature_tensor(temperature, features.device)

    rows, row_labels, batch = _flatten_views(features, labels)
    if rows.shape[0] == 0 or rows.shape[1] == 0:
        raise ValueError(f"features must have at least one row and one column, got {tuple(features.shape)}")
    if contrast is None:
        if contrast_labels is not None:
            raise ValueError("contrast_labels given without contrast")
        if row_labels is None:
            row_labels = torch.arange(batch, device=rows.device).repeat(rows.shape[0] // batch)
        num_anchors = batch if contrast_mode == "one" else rows.shape[0]
        contrast_rows = None
    else:
        if contrast_mode == "one":
            raise ValueError("contrast_mode='one' cannot be combined with contrast=")
        _check_tensor(contrast, "contrast", floating=True)
        _check_same_device(contrast, "contrast", features.device)
        if contrast.dim() != 2:
            raise ValueError(f"contrast must have shape [M, D], got {tuple(contrast.shape)}")
        if contrast.shape[1] != rows.shape[1]:
            raise ValueError(f"contrast has dimension {contrast.shape[1]} but features has {rows.shape[1]}")
        if contrast.dtype != rows.dtype:
            raise TypeError(f"contrast has dtype {contrast.dtype} but features has {rows.dtype}")
        if contrast_labels is None:
            if row_labels is not None:
                raise ValueError("contrast_labels is required when labels is given with contrast=")
            if contrast.shape[0] < rows.shape[0]:
                raise ValueError(
                    f"without labels, anchor i's positive is contrast row i: contrast needs at least "
                    f"{rows.shape[0]} rows, got {contrast.shape[0]}")
            row_labels = torch.arange(rows.shape[0], device=rows.device)
            contrast_labels = torch.full((contrast.shape[0],), -1, dtype=torch.long, device=rows.device)
            contrast_labels[: rows.shape[0]] = row_labels
        else:
            if row_labels is None:
                raise ValueError("labels is required when contrast_labels is given")
            _check_tensor(contrast_labels, "contrast_labels", floating=False)
            _check_same_device(contrast_labels, "contrast_labels", features.device)
            if contrast_labels.dim() != 1 or contrast_labels.shape[0] != contrast.shape[0]:
                raise ValueError(f"contrast_labels must have shape [{contrast.shape[0]}], "
                                 f"got {tuple(contrast_labels.shape)}")
        num_anchors = rows.shape[0]
        contrast_rows = contrast

    per_anchor, num_positives = run(rows, row_labels, contrast_rows, contrast_labels, temperature,
                                    num_anchors, normalize)
    if reduction == "none":
        return per_anchor
    if reduction == "sum":
        return per_anchor.sum()
    anchors_with_positives = (num_positives > 0).sum().clamp_min(1)
    return per_anchor.sum() / anchors_with_positives.to(per_anchor.dtype)


class SupConLoss(nn.Module):
    """Module form of :func:`supcon_loss`; the constructor takes its options.

    ``temperature`` may be a float or a tensor / ``nn.Parameter`` (a learnable temperature).
    """

    def __init__(self, temperature=0.1, *, contrast_mode="all", normalize=True, reduction="mean",
                 backend="auto"):
        super().__init__()
        self.temperature = temperature
        self.contrast_mode = contrast_mode
        self.normalize = normalize
        self.reduction = reduction
        self.backend = backend

    def forward(self, features, labels=None, contrast=None, contrast_labels=None):
        return supcon_loss(features, labels, self.temperature, contrast=contrast,
                           contrast_labels=contrast_labels, contrast_mode=self.contrast_mode,
                           normalize=self.normalize, reduction=self.reduction, backend=self.backend)

    def extra_repr(self):
        return (f"temperature={self.temperature}, contrast_mode={self.contrast_mode!r}, "
                f"normalize={self.normalize}, reduction={self.reduction!r}, backend={self.backend!r}")
