"""supcon_loss and SupConLoss: argument checks, the three layouts, reduction."""
import math
import warnings
from numbers import Real
from typing import NamedTuple, Optional

import torch
from torch import nn

from .backends import BACKENDS, resolve_backend

CONTRAST_MODES = ("all", "one")
REDUCTIONS = ("mean", "sum", "none")


# ------------------------------------------------------------------------------------------
# Checks of the options, shared by supcon_loss and SupConLoss.__init__ (same errors in both)
# ------------------------------------------------------------------------------------------

def _check_contrast_mode(contrast_mode):
    if contrast_mode not in CONTRAST_MODES:
        raise ValueError(f"contrast_mode must be one of {CONTRAST_MODES}, got {contrast_mode!r}")


def _check_normalize(normalize):
    if not isinstance(normalize, bool):
        raise TypeError(f"normalize must be a bool, got {type(normalize).__name__}")


def _check_reduction(reduction):
    if reduction not in REDUCTIONS:
        raise ValueError(f"reduction must be one of {REDUCTIONS}, got {reduction!r}")


def _check_backend_name(backend):
    if not isinstance(backend, str) or backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")


def _has_values(tensor):
    """False for tensors whose data cannot be read on the host: meta tensors (shapes only) and
    anything seen while torch.compile traces (fake tensors)."""
    return tensor.device.type != "meta" and not torch.compiler.is_compiling()


def _check_temperature(temperature, *, check_tensor_value):
    """Type and shape of a float or 0-dim tensor temperature, and its value for a float.

    A tensor's value is read only with ``check_tensor_value`` (and never for meta tensors or
    under torch.compile): supcon_loss leaves that to the backends, which read it anyway, so
    that a learnable CUDA temperature is not read twice per call.
    """
    if isinstance(temperature, torch.Tensor):
        if not temperature.is_floating_point():
            raise TypeError(f"temperature must be a floating-point tensor, got {temperature.dtype}")
        if temperature.numel() != 1 or temperature.dim() != 0:
            raise ValueError(f"temperature must be a 0-dim tensor, got shape {tuple(temperature.shape)}")
        if check_tensor_value and _has_values(temperature):
            value = float(temperature.detach())
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"temperature must be positive and finite, got {value}")
        return
    if isinstance(temperature, bool) or not isinstance(temperature, Real):
        raise TypeError(f"temperature must be a float or a 0-dim tensor, got {type(temperature).__name__}")
    if not (math.isfinite(temperature) and temperature > 0):
        raise ValueError(f"temperature must be positive and finite, got {temperature}")


def _check_options(temperature, contrast_mode, normalize, reduction, backend, *,
                   check_tensor_value):
    _check_contrast_mode(contrast_mode)
    _check_normalize(normalize)
    _check_reduction(reduction)
    _check_backend_name(backend)
    _check_temperature(temperature, check_tensor_value=check_tensor_value)


# ------------------------------------------------------------------------------------------
# Per-call checks and layouts
# ------------------------------------------------------------------------------------------

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
    """The (already checked) temperature as a tensor the backends take."""
    if isinstance(temperature, torch.Tensor):
        if temperature.device != device and temperature.device.type != "cpu":
            raise ValueError(f"temperature is on {temperature.device} but features is on {device}")
        return temperature
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


_SINGLE_VIEW_MESSAGE = (
    "supcon_loss got no labels and a single view per sample (features of shape [N, D] or "
    "[B, 1, D], and no contrast=): every row is then its own class, no anchor has a positive, "
    "and the loss is 0 with a zero gradient. For SimCLR-style training with two augmented views "
    "z1, z2 of shape [B, D], pass them as views of the same samples: "
    "supcon_loss(torch.stack([z1, z2], dim=1)), features of shape [B, V, D] "
    "(torch.cat([z1, z2]) makes 2B unrelated samples instead). For supervised training pass "
    "labels. This warning is shown once per process.")

_warned_single_view = False


def _warn_single_view():
    """Warns once per process that the call cannot have any positive pair."""
    global _warned_single_view
    # True only while Dynamo inlines this function (if torch stops honouring the mark below):
    # warnings.warn cannot be traced, so the warning is left out rather than breaking the graph.
    if torch.compiler.is_dynamo_compiling():
        return
    if _warned_single_view:
        return
    _warned_single_view = True
    # stacklevel: past build_layout and supcon_loss, to the caller's line.
    warnings.warn(_SINGLE_VIEW_MESSAGE, UserWarning, stacklevel=4)


# torch.compile: Dynamo cannot trace warnings.warn, so under fullgraph=True the call above would
# fail. Marked as having a constant result, the function is not traced but called once, for real,
# while Dynamo traces supcon_loss, which is when the warning is due. The attribute is exactly
# what torch.compiler.assume_constant_result sets; setting it here spares importing Dynamo (about
# a second) with the package. python_tests/test_front_end.py checks that this keeps working.
_warn_single_view._dynamo_marked_constant = True


class Layout(NamedTuple):
    """A call's tensors in the operator's conventions (docs/MATH.md section 8)."""
    rows: torch.Tensor  # [R, D] the feature rows, views flattened view-major
    labels: torch.Tensor  # [R]
    contrast: Optional[torch.Tensor]  # [M, D] in the cross-set layout, else None
    contrast_labels: Optional[torch.Tensor]  # [M] in the cross-set layout, else None
    num_anchors: int  # the anchors are rows [0, num_anchors) of rows


def _check_inputs(features, labels):
    """Types, devices and shapes of features and labels."""
    _check_tensor(features, "features", floating=True)
    if labels is not None:
        _check_tensor(labels, "labels", floating=False)
        _check_same_device(labels, "labels", features.device)
        if labels.dim() != 1:
            raise ValueError(f"labels must be one-dimensional, got shape {tuple(labels.shape)}")
        expected = features.shape[0] if features.dim() in (2, 3) else None
        if expected is not None and labels.shape[0] != expected:
            raise ValueError(f"labels has {labels.shape[0]} entries but features has {expected} samples")


def build_layout(features, labels, contrast, contrast_labels, contrast_mode, *,
                 allow_no_rows=False) -> Layout:
    """Flattens views, checks the contrast set and makes the implicit labels explicit.

    Without labels every sample gets its own id, its index b; ``allow_no_rows`` lets a rank of
    a distributed call hold no rows.
    """
    rows, row_labels, batch = _flatten_views(features, labels)
    if rows.shape[1] == 0 or (rows.shape[0] == 0 and not allow_no_rows):
        raise ValueError(f"features must have at least one row and one column, got {tuple(features.shape)}")
    if contrast is None:
        if contrast_labels is not None:
            raise ValueError("contrast_labels given without contrast")
        if row_labels is None:
            if features.dim() == 2 or features.shape[1] == 1:  # one view: no positive anywhere
                _warn_single_view()
            ids = torch.arange(batch, device=rows.device)
            row_labels = ids.repeat(rows.shape[0] // batch) if batch else ids
        num_anchors = batch if contrast_mode == "one" else rows.shape[0]
        return Layout(rows, row_labels, None, None, num_anchors)
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
    return Layout(rows, row_labels, contrast, contrast_labels, rows.shape[0])


def supcon_loss(features, labels=None, temperature=0.1, *, contrast=None, contrast_labels=None,
                contrast_mode="all", normalize=True, reduction="mean", backend="auto"):
    """Supervised contrastive loss (Khosla et al. 2020), fused: no N x N matrix is stored.

    Args:
        features: ``[N, D]``, or ``[B, V, D]`` for V views of B samples (flattened view-major).
        labels: integer ``[N]`` / ``[B]``; ``None`` makes every sample its own class (SimCLR /
            NT-Xent with V >= 2). A negative label means "no class": a negative for every anchor,
            never a positive, and no loss of its own. Without labels, contrast and a second
            view no anchor can have a positive: the loss is 0, and a UserWarning (once per
            process) says how to pass views.
        temperature: positive float, or a 0-dim floating tensor (which may require grad). A
            tensor's value is checked by the backend that runs the call; a GPU tensor costs the
            fused GPU backends one host read per call (a float costs none).
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
            ``"cuda"`` (fused CUDA C++, CUDA tensors, opt-in: only partly verified on hardware,
            see the README), or ``"reference"`` (dense PyTorch).

    Returns:
        float32 loss (float64 for float64 features); gradients come back in the input dtype.

    Raises:
        TypeError / ValueError naming the argument, for bad shapes, dtypes, devices, values or
        options.
    """
    _check_inputs(features, labels)
    _check_options(temperature, contrast_mode, normalize, reduction, backend,
                   check_tensor_value=False)
    run = resolve_backend(backend, features.device).run
    temperature = _temperature_tensor(temperature, features.device)
    layout = build_layout(features, labels, contrast, contrast_labels, contrast_mode)
    per_anchor, num_positives = run(layout.rows, layout.labels, layout.contrast,
                                    layout.contrast_labels, temperature, layout.num_anchors,
                                    normalize)
    if reduction == "none":
        return per_anchor
    if reduction == "sum":
        return per_anchor.sum()
    return per_anchor.sum() / torch.count_nonzero(num_positives).clamp_min_(1)


class SupConLoss(nn.Module):
    """Supervised contrastive loss as a module: :func:`supcon_loss` with its options fixed.

    The constructor takes (and checks) the options; each call takes the tensors::

        criterion = SupConLoss(temperature=0.07)
        loss = criterion(torch.stack([z1, z2], dim=1), labels)   # [B, 2, D] views, [B] labels

    A learnable temperature is an ``nn.Parameter`` passed as ``temperature``: it is then
    registered as a parameter of the module (and so seen by ``parameters()`` and optimisers).
    """

    def __init__(self, temperature=0.1, *, contrast_mode="all", normalize=True, reduction="mean",
                 backend="auto"):
        """Checks and stores the options of every call.

        Args:
            temperature: the softmax temperature t, logits being ``z_i . z_j / t``. A positive
                finite float, or a 0-dim floating-point tensor (positive and finite when given;
                an ``nn.Parameter`` makes it learnable, with an exact gradient). Default 0.1.
            contrast_mode: ``"all"`` (every row is an anchor, default) or ``"one"`` (only the
                view-0 rows of ``[B, V, D]`` features are anchors, as in SupContrast).
            normalize: L2-normalise the rows of ``features`` and ``contrast`` first (eps 1e-12,
                as ``F.normalize``); ``False`` for features that are normalised already or that
                should keep their norms. Default True.
            reduction: ``"mean"`` (default) over the anchors that have a positive, 0 when none
                has; ``"sum"`` over all anchors; ``"none"`` for one value per anchor.
            backend: ``"auto"`` (default: ``"cpu"`` for CPU tensors, ``"triton"`` for CUDA
                tensors), ``"cpu"``, ``"triton"``, ``"cuda"`` (opt-in, see
                :func:`supcon_loss`) or ``"reference"`` (dense PyTorch, for tests and small
                batches).

        Raises:
            TypeError: temperature is neither a real number nor a floating-point tensor, or
                normalize is not a bool.
            ValueError: temperature is not positive and finite or is a tensor with more than a
                value; contrast_mode, reduction or backend is not one of the names above.
        """
        super().__init__()
        _check_options(temperature, contrast_mode, normalize, reduction, backend,
                       check_tensor_value=True)
        self.temperature = temperature
        self.contrast_mode = contrast_mode
        self.normalize = normalize
        self.reduction = reduction
        self.backend = backend

    def forward(self, features, labels=None, contrast=None, contrast_labels=None):
        """The loss of one batch, with the options given to the constructor.

        Args:
            features: ``[N, D]`` rows, or ``[B, V, D]``: V views (augmentations) of B samples,
                flattened view-major (row ``v * B + b``). Any floating dtype and strides.
            labels: integer ``[N]`` (or ``[B]`` for ``[B, V, D]`` features), or ``None``: every
                sample is its own class and its other views are its positives (SimCLR /
                NT-Xent). A negative label means "no class": the row is a negative for every
                anchor, never a positive, and carries no loss. With ``None``, one view and no
                ``contrast``, there are no positives at all: the loss is 0 (a UserWarning says
                so once per process).
            contrast: optional ``[M, D]`` rows to contrast the features against (cross-set
                mode: the anchors are the feature rows, and no column is excluded as "self").
                Without labels, anchor i's positive is contrast row i (CLIP, SimCSE) and
                ``M >= N``.
            contrast_labels: integer ``[M]`` labels of ``contrast``; required with ``labels``.

        Returns:
            A 0-dim tensor for ``reduction="mean"`` / ``"sum"``, or ``[num_anchors]`` for
            ``"none"`` (0 for anchors without a positive). float32 for float16, bfloat16 and
            float32 features, float64 for float64 ones; gradients come back in the input dtype.

        Raises:
            TypeError / ValueError naming the argument (shapes, dtypes, devices, NaN or inf), as
            :func:`supcon_loss`.
        """
        return supcon_loss(features, labels, self.temperature, contrast=contrast,
                           contrast_labels=contrast_labels, contrast_mode=self.contrast_mode,
                           normalize=self.normalize, reduction=self.reduction, backend=self.backend)

    def extra_repr(self):
        temperature = self.temperature
        if isinstance(temperature, torch.Tensor):  # one line, not the tensor's own repr
            value = f"{float(temperature.detach()):g}" if _has_values(temperature) else "..."
            kind = "Parameter" if isinstance(temperature, nn.Parameter) else "tensor"
            temperature = f"{kind}({value})"
        return (f"temperature={temperature}, contrast_mode={self.contrast_mode!r}, "
                f"normalize={self.normalize}, reduction={self.reduction!r}, backend={self.backend!r}")
