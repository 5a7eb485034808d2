"""supcon_loss: the views and layouts of a call, the backend that runs it, the reduction."""
import warnings
from typing import NamedTuple, Optional, Tuple

import torch

from ._docstrings import fill_arguments
from ._types import BackendName, ContrastMode, MultiLabel, Reduction, Temperature
from ._validation import (check_focal_gamma, check_inputs, check_label_rows, check_multi_label,
                          check_options, check_same_device, check_tensor, temperature_tensor)
from .backends import Backend, mean_over_anchors_with_positives, resolve_backend
from .backends.auto_rule import CallShape


def _flatten_views(features: torch.Tensor) -> Tuple[torch.Tensor, int, int]:
    """[B, V, D] -> [V*B, D] view-major (row v*B + b, as SupContrast), with B and V."""
    if features.dim() == 2:
        return features, features.shape[0], 1
    if features.dim() != 3:
        raise ValueError(f"features must have shape [N, D] or [B, V, D], got {tuple(features.shape)}")
    batch, views, dim = features.shape
    return features.transpose(0, 1).reshape(views * batch, dim), batch, views


def _per_row(per_sample: Optional[torch.Tensor], views: int) -> Optional[torch.Tensor]:
    """A per-sample tensor ([B]: labels, groups; [B, C]: multi-hot labels) for the view-major
    rows ([V*B], [V*B, C])."""
    if per_sample is None or views == 1:
        return per_sample
    return per_sample.repeat(views, *([1] * (per_sample.dim() - 1)))


_SINGLE_VIEW_MESSAGE = (
    "supcon_loss got no labels and a single view per sample (features of shape [N, D] or "
    "[B, 1, D], and no contrast=): every row is then its own class, no anchor has a positive, "
    "and the loss is 0 with a zero gradient. For SimCLR-style training with two augmented views "
    "z1, z2 of shape [B, D], pass them as views of the same samples: "
    "supcon_loss(torch.stack([z1, z2], dim=1)), features of shape [B, V, D] "
    "(torch.cat([z1, z2]) makes 2B unrelated samples instead). For supervised training pass "
    "labels. This warning is shown once per process.")

_warned_single_view = False


def _warn_single_view() -> None:
    """Warns once per process that the call cannot have any positive pair."""
    global _warned_single_view
    # True only while Dynamo inlines this function (if torch stops honouring the mark below):
    # warnings.warn cannot be traced, so the warning is left out rather than breaking the graph.
    if torch.compiler.is_dynamo_compiling():
        return
    if _warned_single_view:
        return
    _warned_single_view = True
    # stacklevel: past build_layout, checked_call, supcon_loss (or explain): the caller's line.
    warnings.warn(_SINGLE_VIEW_MESSAGE, UserWarning, stacklevel=5)


# torch.compile: Dynamo cannot trace warnings.warn, so under fullgraph=True the call above would
# fail. Marked as having a constant result, the function is not traced but called once, for real,
# while Dynamo traces supcon_loss, which is when the warning is due. The attribute is exactly
# what torch.compiler.assume_constant_result sets; setting it here spares importing Dynamo (about
# a second) with the package. python_tests/api/test_front_end.py checks that this keeps working.
_warn_single_view._dynamo_marked_constant = True  # type: ignore[attr-defined]  # a function attribute


class Layout(NamedTuple):
    """A call's tensors in the operator's conventions (docs/MATH.md section 8)."""
    rows: torch.Tensor  # [R, D] the feature rows, views flattened view-major
    labels: torch.Tensor  # [R] class ids, or [R, C] multi-hot rows
    contrast: Optional[torch.Tensor]  # [M, D] in the cross-set layout, else None
    contrast_labels: Optional[torch.Tensor]  # [M] ([M, C]) in the cross-set layout, else None
    num_anchors: int  # the anchors are rows [0, num_anchors) of rows
    groups: Optional[torch.Tensor] = None  # [R] group ids, or None (docs/MATH.md section 11)
    contrast_groups: Optional[torch.Tensor] = None  # [M] with groups in the cross-set layout


def _check_per_contrast_row(value: torch.Tensor, name: str, contrast: torch.Tensor) -> None:
    """An integer [M] tensor with one entry per row of ``contrast`` (already checked to be on
    the features' device): contrast_labels, contrast_groups."""
    check_tensor(value, name, floating=False)
    check_same_device(value, name, contrast.device)
    if value.dim() != 1 or value.shape[0] != contrast.shape[0]:
        raise ValueError(f"{name} must have shape [{contrast.shape[0]}], got {tuple(value.shape)}")


def _check_contrast_labels(contrast_labels: torch.Tensor, labels: torch.Tensor,
                           contrast: torch.Tensor) -> None:
    """contrast_labels in the form of labels: class ids [M], or multi-hot rows [M, C] of the
    labels' C."""
    if labels.dim() == 1:
        return _check_per_contrast_row(contrast_labels, "contrast_labels", contrast)
    if not isinstance(contrast_labels, torch.Tensor):
        raise TypeError(f"contrast_labels must be a torch.Tensor, got "
                        f"{type(contrast_labels).__name__}")
    check_label_rows(contrast_labels, "contrast_labels")
    check_same_device(contrast_labels, "contrast_labels", contrast.device)
    expected = (contrast.shape[0], labels.shape[1])
    if tuple(contrast_labels.shape) != expected:
        raise ValueError(f"contrast_labels must be multi-hot rows of shape {list(expected)} as "
                         f"labels are, got {tuple(contrast_labels.shape)}")


def build_layout(features: torch.Tensor, labels: Optional[torch.Tensor],
                 contrast: Optional[torch.Tensor], contrast_labels: Optional[torch.Tensor],
                 contrast_mode: ContrastMode, *, allow_no_rows: bool = False,
                 groups: Optional[torch.Tensor] = None,
                 contrast_groups: Optional[torch.Tensor] = None) -> Layout:
    """Flattens views, checks the contrast set and makes the implicit labels explicit.

    Without labels every sample gets its own id, its index b; ``allow_no_rows`` lets a rank of
    a distributed call hold no rows. ``groups`` (checked with the labels: check_inputs) follow
    the rows as the labels do.
    """
    rows, batch, views = _flatten_views(features)
    row_labels, row_groups = _per_row(labels, views), _per_row(groups, views)
    if rows.shape[1] == 0 or (rows.shape[0] == 0 and not allow_no_rows):
        raise ValueError(f"features must have at least one row and one column, got {tuple(features.shape)}")
    if contrast is None:
        if contrast_labels is not None:
            raise ValueError("contrast_labels given without contrast")
        if contrast_groups is not None:
            raise ValueError("contrast_groups given without contrast")
        if row_labels is None:
            if features.dim() == 2 or features.shape[1] == 1:  # one view: no positive anywhere
                _warn_single_view()
            ids = torch.arange(batch, device=rows.device)
            row_labels = ids.repeat(rows.shape[0] // batch) if batch else ids
        num_anchors = batch if contrast_mode == "one" else rows.shape[0]
        return Layout(rows, row_labels, None, None, num_anchors, row_groups)
    if contrast_mode == "one":
        raise ValueError("contrast_mode='one' cannot be combined with contrast=")
    check_tensor(contrast, "contrast", floating=True)
    check_same_device(contrast, "contrast", features.device)
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
        _check_contrast_labels(contrast_labels, row_labels, contrast)
    if (row_groups is None) != (contrast_groups is None):
        raise ValueError("with contrast, groups and contrast_groups must be given together")
    if contrast_groups is not None:
        _check_per_contrast_row(contrast_groups, "contrast_groups", contrast)
    return Layout(rows, row_labels, contrast, contrast_labels, rows.shape[0], row_groups,
                  contrast_groups)


def reduce_per_anchor(per_anchor: torch.Tensor, num_positives: torch.Tensor,
                      reduction: Reduction) -> torch.Tensor:
    """The per-anchor losses reduced: "mean" is over the anchors that have a positive."""
    if reduction == "none":
        return per_anchor
    if reduction == "sum":
        return per_anchor.sum()
    return mean_over_anchors_with_positives(per_anchor, num_positives)


def call_shape(layout: Layout, normalize: bool) -> CallShape:
    """What backend="auto" reads of the call (backends/auto_rule.py): one set only where the
    symmetric schedule may serve it (every row an anchor, unit rows)."""
    one_set = (layout.contrast is None and layout.num_anchors == layout.rows.shape[0]
               and normalize)
    columns = layout.rows if layout.contrast is None else layout.contrast
    return CallShape(columns.shape[0], layout.rows.shape[-1], layout.rows.dtype, one_set)


@fill_arguments
def supcon_loss(features: torch.Tensor, labels: Optional[torch.Tensor] = None,
                temperature: Temperature = 0.1, *, contrast: Optional[torch.Tensor] = None,
                contrast_labels: Optional[torch.Tensor] = None, contrast_mode: ContrastMode = "all",
                normalize: bool = True, focal_gamma: float = 0.0, reduction: Reduction = "mean",
                backend: BackendName = "auto", groups: Optional[torch.Tensor] = None,
                contrast_groups: Optional[torch.Tensor] = None,
                multi_label: MultiLabel = "any") -> torch.Tensor:
    """Supervised contrastive loss (Khosla et al. 2020), fused: no N x N matrix is stored.

    Args:
        {arg:features}
        {arg:labels}
        {arg:temperature}
        {arg:contrast}
        {arg:contrast_labels}
        {arg:contrast_mode}
        {arg:normalize}
        {arg:focal_gamma}
        {arg:reduction}
        {arg:backend}
        {arg:groups}
        {arg:contrast_groups}
        {arg:multi_label}

    Returns:
        float32 loss (float64 for float64 features); gradients come back in the input dtype.

    Raises:
        TypeError / ValueError naming the argument, for bad shapes, dtypes, devices, values or
        options.
    """
    call = checked_call(features, labels, temperature, contrast, contrast_labels, contrast_mode,
                        normalize, focal_gamma, reduction, backend, groups, contrast_groups,
                        multi_label)
    layout = call.layout
    # By position (anchor_offset 0: every anchor row is in the layout), the op's cheaper call.
    loss, num_positives = call.backend.run(
        layout.rows, layout.labels, layout.contrast, layout.contrast_labels, call.temperature,
        layout.num_anchors, normalize, 0, call.focal_gamma, call.mean, layout.groups,
        layout.contrast_groups, multi_label)
    return loss if call.mean else reduce_per_anchor(loss, num_positives, reduction)


class CheckedCall(NamedTuple):
    """A supcon_loss call checked and laid out, with the backend that runs it."""
    layout: Layout
    shape: CallShape
    backend: Backend
    temperature: torch.Tensor
    focal_gamma: float
    # The mean inside the op: on a GPU its four reduction launches and its gradient's division
    # become part of the fused finish (docs/MATH.md, "The mean").
    mean: bool


def checked_call(features: torch.Tensor, labels: Optional[torch.Tensor], temperature: Temperature,
                 contrast: Optional[torch.Tensor], contrast_labels: Optional[torch.Tensor],
                 contrast_mode: ContrastMode, normalize: bool, focal_gamma: float,
                 reduction: Reduction, backend: BackendName,
                 groups: Optional[torch.Tensor] = None,
                 contrast_groups: Optional[torch.Tensor] = None,
                 multi_label: MultiLabel = "any") -> CheckedCall:
    """supcon_loss's arguments checked (errors naming the argument), laid out, and its backend
    resolved: what supcon_loss runs and scl_kernels.explain describes."""
    check_inputs(features, labels, groups)
    check_multi_label(multi_label)
    check_options(temperature, contrast_mode, normalize, reduction, backend,
                  check_value=False)
    focal_gamma = check_focal_gamma(focal_gamma)
    layout = build_layout(features, labels, contrast, contrast_labels, contrast_mode,
                          groups=groups, contrast_groups=contrast_groups)
    shape = call_shape(layout, normalize)
    return CheckedCall(layout, shape,
                       resolve_backend(backend, features.device, focal_gamma, shape,
                                       groups=groups is not None,
                                       multi_label=labels is not None and labels.dim() == 2),
                       temperature_tensor(temperature, features.device), focal_gamma,
                       reduction == "mean")
