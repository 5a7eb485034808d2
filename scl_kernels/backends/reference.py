"""Dense PyTorch SupCon (``backend="reference"``): the whole N x M logit matrix, autograd for the
gradient. Exact and simple, for tests and tiny batches; memory grows as N * M."""
import inspect
from typing import Any, Optional, Tuple

import torch
import torch.nn.functional as F

from .._signatures import bind_arguments
from .fused_ops import loss_dtype


def temperature_value_error(value: float) -> ValueError:
    """The error of a temperature that is not positive and finite, worded as the op's own
    (csrc/core/supcon_problem.cpp, read_temperature: the value printed as %g), for the
    reference backend's check and the loss modules' (scl_kernels._validation)."""
    return ValueError(f"temperature must be positive and finite, got {value:g}")


def check_multi_hot_values(labels: torch.Tensor) -> None:
    """Multi-hot rows (a two-dimensional tensor that is not bool) hold only 0 and 1: the check the
    fused ops make in their kernels, for the reference backend and the memory (stored as bool, a
    2 would silently become a class). Class ids and bool rows pass; reads the values, so the
    caller skips it where they cannot be read."""
    if (labels.dim() == 2 and labels.dtype != torch.bool
            and not bool(((labels == 0) | (labels == 1)).all())):
        raise ValueError("multi-hot labels must hold 0 or 1")


def run_reference(*args: Any, **kwargs: Any) -> Tuple[torch.Tensor, torch.Tensor]:
    """supcon_reference after the value checks that the fused ops make inside their kernels:
    NaN / inf in the rows, a temperature that is not positive and finite. The arguments are the
    fused op's (Backend.run)."""
    arguments = bind_arguments(_SIGNATURE, args, kwargs)
    # Only when the values exist: not while tracing, not on the meta device.
    features: torch.Tensor = arguments["features"]
    if not torch.compiler.is_compiling() and features.device.type != "meta":
        for name in ("features", "contrast"):
            tensor = arguments[name]
            if tensor is not None and not bool(torch.isfinite(tensor).all()):
                raise ValueError(f"{name} contains NaN or inf")
        for name in ("labels", "contrast_labels"):
            if arguments[name] is not None:
                check_multi_hot_values(arguments[name])
        value = float(arguments["temperature"].detach())
        if not (value > 0 and value != float("inf")):
            raise temperature_value_error(value)
    return supcon_reference(**arguments)


def supcon_reference(features: torch.Tensor, labels: torch.Tensor,
                     contrast: Optional[torch.Tensor], contrast_labels: Optional[torch.Tensor],
                     temperature: torch.Tensor, num_anchors: int, normalize: bool,
                     anchor_offset: int = 0, focal_gamma: float = 0.0,
                     mean: bool = False, groups: Optional[torch.Tensor] = None,
                     contrast_groups: Optional[torch.Tensor] = None, multi_label: str = "any"
                     ) -> Tuple[torch.Tensor, torch.Tensor]:
    """Same arguments and semantics as torch.ops.scl.supcon (python_tests/api/
    test_call_arguments.py holds the arguments to its schema); returns (loss, |P(i)|)."""
    dtype = loss_dtype(features.dtype)
    rows = features.to(dtype)
    rows = F.normalize(rows, dim=1) if normalize else rows
    if contrast is None:
        anchor_rows = slice(anchor_offset, anchor_offset + num_anchors)
        anchors, others = rows[anchor_rows], rows
        anchor_labels, other_labels = labels[anchor_rows], labels
        anchor_groups, other_groups = (None, None) if groups is None else (groups[anchor_rows],
                                                                           groups)
    else:
        others = contrast.to(dtype)
        anchors, others = rows, (F.normalize(others, dim=1) if normalize else others)
        assert contrast_labels is not None, "contrast comes with its contrast_labels"
        anchor_labels, other_labels = labels, contrast_labels
        anchor_groups, other_groups = groups, contrast_groups
    m, n = anchors.shape[0], others.shape[0]
    self_column = torch.zeros(m, n, dtype=torch.bool, device=rows.device)
    if contrast is None:
        self_column[torch.arange(m), torch.arange(anchor_offset, anchor_offset + m)] = True
    weights = pair_weights(anchor_labels, other_labels, multi_label).to(dtype)
    positive = (weights > 0) & ~self_column
    weights = weights.masked_fill(~positive, 0.0)
    left_out = self_column
    if anchor_groups is not None:  # a pair of one group that is not a positive pair
        assert other_groups is not None, "a cross set takes contrast_groups with groups"
        same_group = ((anchor_groups[:, None] == other_groups[None, :])
                      & (anchor_groups[:, None] >= 0))
        left_out = left_out | (same_group & ~positive)
    logits = (anchors @ others.T / temperature).masked_fill(left_out, float("-inf"))
    # A row without any column (a single-row batch, or every other row in its group) would give
    # logsumexp(-inf) and NaN gradients.
    no_columns = left_out.all(dim=1, keepdim=True)
    lse = torch.logsumexp(logits.masked_fill(no_columns, 0.0), dim=1)
    num_positives = positive.sum(dim=1)
    # W_i: |P(i)| for class ids (docs/MATH.md section 11); 1 where no pair is positive.
    weight_sums = weights.sum(dim=1).masked_fill(num_positives == 0, 1.0)
    if focal_gamma == 0:
        positive_sum = (logits.masked_fill(~positive, 0.0) * weights).sum(dim=1)
        per_anchor = lse - positive_sum / weight_sums
    else:
        focal_terms = _focal_terms(lse[:, None] - logits, positive, focal_gamma)
        per_anchor = (focal_terms * weights).sum(dim=1) / weight_sums
    loss = torch.where(num_positives > 0, per_anchor,
                       torch.zeros((), dtype=dtype, device=rows.device))
    return (mean_over_anchors_with_positives(loss, num_positives) if mean else loss), num_positives


def pair_weights(anchor_labels: torch.Tensor, other_labels: torch.Tensor,
                 multi_label: str) -> torch.Tensor:
    """w_ij, float64 [m, n], before the self column: 1 for equal class ids >= 0; for multi-hot
    rows 1 where they share a class ("any") or |Y_i & Y_j| / |Y_i | Y_j| ("jaccard"); 0
    elsewhere (docs/MATH.md section 11). Multi-hot values are 0 / 1 (the op checks them)."""
    if multi_label not in ("any", "jaccard"):
        raise ValueError(f"multi_label must be 'any' or 'jaccard', got '{multi_label}'")
    if anchor_labels.dim() == 1:
        same = (anchor_labels[:, None] == other_labels[None, :]) & (anchor_labels[:, None] >= 0)
        return same.to(torch.float64)
    ours, theirs = (anchor_labels != 0).to(torch.float64), (other_labels != 0).to(torch.float64)
    shared = ours @ theirs.T  # sums of ones: exact
    if multi_label == "any":
        return (shared > 0).to(torch.float64)
    union = ours.sum(1)[:, None] + theirs.sum(1)[None, :] - shared
    return shared / union.clamp_min(1)


def mean_over_anchors_with_positives(per_anchor: torch.Tensor,
                                     num_positives: torch.Tensor) -> torch.Tensor:
    """The "mean" reduction: over the anchors that have a positive (0 where none has), as the
    fused ops take it with ``mean=True`` (csrc/core/supcon_problem.h)."""
    return per_anchor.sum() / torch.count_nonzero(num_positives).clamp_min_(1)


def _focal_terms(x: torch.Tensor, positive: torch.Tensor, gamma: float) -> torch.Tensor:
    """(1 - pi)^gamma * x with x = -log pi, on the positive pairs (0 elsewhere). Where x is 0 (pi
    = 1: the anchor's only column) the term is x^(1 + gamma) to first order and its gradient 0,
    which autograd through u^gamma would make 0 * inf = NaN: such pairs take the constant 0."""
    terms = positive & (x > 0)
    safe = torch.where(terms, x, torch.ones((), dtype=x.dtype, device=x.device))
    focal = (-torch.expm1(-safe)).pow(gamma) * safe
    return torch.where(terms, focal, torch.zeros((), dtype=x.dtype, device=x.device))


_SIGNATURE = inspect.signature(supcon_reference)
