"""SupContrast's ``SupConLoss`` (HobbitLong/SupContrast, ``losses.py``) on the fused loss.

Same constructor, call, values and gradients::

    from scl_kernels.compat.supcontrast import SupConLoss   # was: from losses import SupConLoss
    criterion = SupConLoss(temperature=0.07)
    loss = criterion(features, labels)   # features [bsz, n_views, ...], labels [bsz]

SupContrast's conventions are kept where they differ from :func:`scl_kernels.supcon_loss`: the
features are used as given (not L2-normalised), the loss is scaled by
``temperature / base_temperature``, labels are compared by value (a negative label is a class
like any other), and the mean runs over every anchor, those without a positive counting as 0.
docs/COMPAT.md lists every difference.
"""
import math
from numbers import Real
from typing import List, Optional, cast

import torch
from torch import nn

from .._types import BackendName, ContrastMode, Temperature
from ..functional import supcon_loss

from ._dense_fallback import compute_dtype, masked_supcon_per_anchor, warn_once

__all__ = ["SupConLoss"]


class SupConLoss(nn.Module):
    """Supervised contrastive loss with SupContrast's interface; fused unless ``mask`` forbids.

    Without ``labels`` and ``mask`` the positives of a view are the other views of its sample
    (SimCLR). A ``mask`` that is a same-label mask (0/1, symmetric, ones on the diagonal,
    transitive) runs fused like the labels it encodes; any other mask (weights, asymmetric,
    intransitive) runs a dense PyTorch reference, O((bsz * n_views)^2) in time and memory, with a
    warning the first time.
    """

    temperature: Temperature

    def __init__(self, temperature: Temperature = 0.07, contrast_mode: ContrastMode = "all",
                 base_temperature: float = 0.07, *, backend: BackendName = "auto") -> None:
        """Stores the options of every call.

        Args:
            temperature: the softmax temperature t (logits ``f_i . f_j / t``): a positive float
                or a 0-dim floating tensor (an ``nn.Parameter`` makes it learnable).
            contrast_mode: ``"all"`` (every view is an anchor) or ``"one"`` (view 0 only).
            base_temperature: the loss is multiplied by ``temperature / base_temperature``.
            backend: the :func:`scl_kernels.supcon_loss` backend of the fused calls (``"auto"``,
                ``"cpu"``, ``"triton"``, ``"cuda"`` or ``"reference"``); the dense path of a
                non-same-label mask ignores it.

        Raises:
            ValueError: contrast_mode is not ``"all"`` or ``"one"``, or base_temperature is not
                a positive finite number.
        """
        super().__init__()
        if contrast_mode not in ("all", "one"):
            raise ValueError(f"contrast_mode must be 'all' or 'one', got {contrast_mode!r}")
        # typeshed's numbers.Real declares no comparisons: a real number compares as a float does.
        if not (isinstance(base_temperature, Real) and math.isfinite(base_temperature)
                and cast(float, base_temperature) > 0):
            raise ValueError("base_temperature must be a positive finite number, "
                             f"got {base_temperature!r}")
        self.temperature = temperature
        # The attributes' types, declared (as the constructor's signature gives them).
        self.contrast_mode: ContrastMode = contrast_mode
        self.base_temperature: float = base_temperature
        self.backend: BackendName = backend

    def forward(self, features: torch.Tensor, labels: Optional[torch.Tensor] = None,
                mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        """The loss of one batch, as SupContrast's ``SupConLoss.forward``.

        Args:
            features: ``[bsz, n_views, ...]`` floating tensor; trailing dimensions are flattened.
                Used as given: SupContrast expects L2-normalised features and does not
                normalise them itself.
            labels: ``[bsz]`` class of each sample (any values comparable with ``==``).
            mask: ``[bsz, bsz]``, ``mask[i, j] = 1`` if sample j is a positive of sample i; any
                weights are accepted (a non-same-label mask runs the dense path).

        Returns:
            A 0-dim tensor, float32 (float64 for float64 features).

        Raises:
            ValueError: features has fewer than 3 dimensions or no elements, both labels and
                mask are given, or labels / mask do not match the batch size.
            TypeError: features, labels or mask is not a tensor.
        """
        if not isinstance(features, torch.Tensor):
            raise TypeError(f"features must be a tensor, got {type(features).__name__}")
        if features.dim() < 3:
            raise ValueError("features must have shape [bsz, n_views, ...] (at least 3 "
                             f"dimensions), got {tuple(features.shape)}")
        if features.numel() == 0:
            raise ValueError("features must have at least one sample, view and feature, "
                             f"got {tuple(features.shape)}")
        if labels is not None and mask is not None:
            raise ValueError("give labels or mask, not both")
        features = features.reshape(features.shape[0], features.shape[1], -1)
        batch, views = features.shape[:2]
        num_anchors = batch * (views if self.contrast_mode == "all" else 1)
        scale = self.temperature / self.base_temperature
        classes: Optional[torch.Tensor]
        if mask is None:
            classes = _class_ids(labels, batch, features.device)
        else:
            checked_mask = _checked_mask(mask, batch, features.device)
            classes = _classes_of_same_label_mask(checked_mask)
            if classes is None:
                warn_once("supcontrast-mask", lambda: _dense_mask_message(checked_mask))
                return self._dense_per_anchor(features, checked_mask).mean() * scale
        total = supcon_loss(features, classes, self.temperature, contrast_mode=self.contrast_mode,
                            normalize=False, reduction="sum", backend=self.backend)
        return total / num_anchors * scale

    def _dense_per_anchor(self, features: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """SupContrast's per-anchor loss, before the temperature ratio, with any mask."""
        batch, views = features.shape[:2]
        dtype = compute_dtype(features.dtype)
        rows = features.transpose(0, 1).reshape(batch * views, -1).to(dtype)
        anchor_views = views if self.contrast_mode == "all" else 1
        # float32 weights, as SupContrast's mask.float(): their sums are float32 there too.
        weights = mask.float().repeat(anchor_views, views)
        return masked_supcon_per_anchor(rows[: batch * anchor_views], rows, weights,
                                        self.temperature, exclude_self=True)


def _class_ids(labels: Optional[torch.Tensor], batch: int, device: torch.device) -> torch.Tensor:
    """Non-negative class ids: SupContrast compares labels by value, negative ones included,
    while supcon_loss reads a negative label as "no class"."""
    if labels is None:
        return torch.arange(batch, device=device)
    if not isinstance(labels, torch.Tensor):
        raise TypeError(f"labels must be a tensor, got {type(labels).__name__}")
    # SupContrast reads labels as a column (view(-1, 1)), so any shape of bsz entries passes.
    if labels.numel() != batch:
        raise ValueError(f"labels has {labels.numel()} entries but features has {batch} samples")
    ids: torch.Tensor = torch.unique(labels.reshape(-1).to(device), return_inverse=True)[1]
    return ids


def _checked_mask(mask: torch.Tensor, batch: int, device: torch.device) -> torch.Tensor:
    if not isinstance(mask, torch.Tensor):
        raise TypeError(f"mask must be a tensor, got {type(mask).__name__}")
    if tuple(mask.shape) != (batch, batch):
        raise ValueError(f"mask must have shape [bsz, bsz] = [{batch}, {batch}], "
                         f"got {tuple(mask.shape)}")
    return mask.to(device)


def _classes_of_same_label_mask(mask: torch.Tensor) -> Optional[torch.Tensor]:
    """Class ids whose same-label mask is ``mask``, or None when no labels give it.

    In a same-label mask the rows of one class are identical and those of two classes share no
    column, so the first column related to a row names its class; conversely a mask equal to the
    same-label mask of those ids is one. One comparison decides, with one host read.
    """
    related = mask != 0
    first_related = related.to(torch.uint8).argmax(dim=1)
    is_binary = ((mask == 0) | (mask == 1)).all()
    matches = (related == (first_related[:, None] == first_related[None, :])).all()
    return first_related if bool(is_binary & matches) else None


def _dense_mask_message(mask: torch.Tensor) -> str:
    related = mask != 0
    reasons: List[str] = []
    if not bool(((mask == 0) | (mask == 1)).all()):
        reasons.append("has values other than 0 and 1")
    if not bool((related == related.T).all()):
        reasons.append("is not symmetric")
    if not bool(related.diagonal().all()):
        reasons.append("has a 0 on its diagonal (a sample whose other views are not positives)")
    if not reasons:
        reasons.append("is not transitive (i~j and j~k without i~k)")
    return ("scl_kernels.compat.supcontrast.SupConLoss got a mask that is not a same-label mask: "
            f"it {', '.join(reasons)}. The fused kernels take the positives as 'same label', so "
            "such masks run a dense PyTorch reference, with time and memory quadratic in "
            "bsz * n_views. Labels, or a mask of the form labels[:, None] == labels[None, :], "
            "run fused.")
