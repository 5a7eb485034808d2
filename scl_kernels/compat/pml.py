"""pytorch-metric-learning's ``losses.SupConLoss`` on the fused loss.

Same call, values and gradients, for the default distance (cosine) and reducer (which may be
passed explicitly, ``distance=CosineSimilarity()``, ``reducer=AvgNonZeroReducer()``)::

    # was: from pytorch_metric_learning.losses import SupConLoss
    from scl_kernels.compat.pml import SupConLoss
    criterion = SupConLoss(temperature=0.1)
    loss = criterion(embeddings, labels)   # or (embeddings, labels, ref_emb=..., ref_labels=...)

pytorch-metric-learning's conventions are kept where they differ from
:func:`scl_kernels.supcon_loss`: the mean runs over the anchors whose loss is non-zero, the
loss is 0 when the batch has no positive pair or no negative pair, and labels are compared by
value (a negative label is a class like any other). docs/COMPAT.md lists every difference.
"""
import importlib
from typing import Dict, Optional

import torch
from torch import nn
from torch.nn import functional as F

from .._types import BackendName, Temperature
from ..functional import supcon_loss

from ._dense_fallback import compute_dtype, masked_supcon_per_anchor, warn_once

__all__ = ["SupConLoss"]

_PAIR_EXCLUSION_MESSAGE = (
    "scl_kernels.compat.pml.SupConLoss got ref_labels that is the labels tensor itself with a "
    "different ref_emb. pytorch-metric-learning compares the two by identity and then leaves "
    "out the pair (i, i), anchor i against ref_emb row i, from positives and negatives alike; "
    "the fused kernels cannot leave out such pairs, so these calls run a dense PyTorch "
    "reference with time and memory quadratic in the batch. ref_labels=labels.clone() keeps "
    "the pair (i, i) (a different loss) and runs fused.")

# pytorch-metric-learning's SupConLoss defaults, the only ones this class computes: argument
# name -> (module, class, what it chooses).
_PML_DEFAULTS = {"distance": ("pytorch_metric_learning.distances", "CosineSimilarity", "distance"),
                 "reducer": ("pytorch_metric_learning.reducers", "AvgNonZeroReducer", "reduction")}
_UNSET = object()


class SupConLoss(nn.Module):
    """Supervised contrastive loss with pytorch-metric-learning's interface and reduction.

    The embeddings (and ``ref_emb``) are L2-normalised, the logits are cosine similarities over
    the temperature, and an anchor's loss is the mean over its positives of the negative log
    softmax. Without ``ref_emb`` each anchor is left out of its own softmax; with ``ref_emb`` and
    ``ref_labels`` every reference row takes part. The batch loss is the mean over the anchors
    whose loss is greater than 0 (anchors without positives have 0), and 0 when no pair is
    positive or none is negative.
    """

    temperature: Temperature

    def __init__(self, temperature: Temperature = 0.1, *, distance: Optional[nn.Module] = None,
                 reducer: Optional[nn.Module] = None, backend: BackendName = "auto") -> None:
        """Stores the options of every call.

        Args:
            temperature: the softmax temperature: a positive float or a 0-dim floating tensor.
            distance: None or pytorch-metric-learning's ``CosineSimilarity()`` with its default
                settings (pml's default, what this class computes).
            reducer: None or pytorch-metric-learning's ``AvgNonZeroReducer()`` with its default
                settings (pml's default, what this class computes).
            backend: the :func:`scl_kernels.supcon_loss` backend (``"auto"``, ``"cpu"``,
                ``"triton"``, ``"cuda"`` or ``"reference"``); the dense path of
                ``ref_labels is labels`` ignores it.

        Raises:
            TypeError: distance or reducer is another class (use
                ``pytorch_metric_learning.losses.SupConLoss`` for it).
            ValueError: distance or reducer is pml's default class with other settings (the
                same advice).
        """
        super().__init__()
        _check_pml_default("distance", distance)
        _check_pml_default("reducer", reducer)
        self.temperature = temperature
        self.backend = backend

    def forward(self, embeddings: torch.Tensor, labels: Optional[torch.Tensor] = None,
                indices_tuple: None = None, ref_emb: Optional[torch.Tensor] = None,
                ref_labels: Optional[torch.Tensor] = None) -> torch.Tensor:
        """The loss of one batch, as pytorch-metric-learning's ``SupConLoss.forward``.

        Args:
            embeddings: ``[N, D]`` floating tensor.
            labels: ``[N]`` class of each embedding (any values comparable with ``==``).
            indices_tuple: not supported (mined pairs); must be None.
            ref_emb: optional ``[M, D]`` reference rows the anchors are contrasted against.
            ref_labels: ``[M]`` classes of ``ref_emb``; required with it.

        Returns:
            A 0-dim tensor, float32 (float64 for float64 embeddings).

        Raises:
            NotImplementedError: indices_tuple is given.
            ValueError: labels is missing, shapes do not match, or ref_emb and ref_labels are
                not given together.
        """
        if indices_tuple is not None:
            raise NotImplementedError(
                "scl_kernels.compat.pml.SupConLoss does not take indices_tuple (mined pairs): it "
                "uses every pair, as indices_tuple=None does. For mined pairs use "
                "pytorch_metric_learning.losses.SupConLoss.")
        if labels is None:
            raise ValueError("labels is required (pytorch-metric-learning: labels and "
                             "indices_tuple cannot both be None)")
        _check_rows(embeddings, labels, "embeddings", "labels")
        labels = labels.to(embeddings.device)
        if ref_emb is None:
            if ref_labels is not None:
                raise ValueError("ref_labels given without ref_emb (pytorch-metric-learning "
                                 "ignores it; pass ref_emb too, or leave ref_labels out)")
            return self._single_set(embeddings, labels)
        if ref_labels is None:
            raise ValueError("ref_labels is required with ref_emb")
        _check_rows(ref_emb, ref_labels, "ref_emb", "ref_labels")
        if ref_labels is labels:
            if ref_emb is embeddings:
                return self._single_set(embeddings, labels)
            warn_once("pml-pair-exclusion", lambda: _PAIR_EXCLUSION_MESSAGE)
            return self._cross_set_without_pairs_i_i(embeddings, labels, ref_emb)
        return self._cross_set(embeddings, labels, ref_emb, ref_labels.to(ref_emb.device))

    def _single_set(self, embeddings: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        classes: torch.Tensor
        class_sizes: torch.Tensor
        _, classes, class_sizes = torch.unique(labels, return_inverse=True, return_counts=True)
        per_anchor = supcon_loss(embeddings, classes, self.temperature, reduction="none",
                                 backend=self.backend)
        has_positive_pair = (class_sizes > 1).any()
        has_negative_pair = class_sizes.numel() > 1
        return _mean_over_nonzero(per_anchor, has_positive_pair & has_negative_pair)

    def _cross_set(self, embeddings: torch.Tensor, labels: torch.Tensor, ref_emb: torch.Tensor,
                   ref_labels: torch.Tensor) -> torch.Tensor:
        class_values: torch.Tensor
        classes: torch.Tensor
        class_values, classes = torch.unique(torch.cat([labels, ref_labels]), return_inverse=True)
        anchor_classes, ref_classes = classes[: labels.shape[0]], classes[labels.shape[0]:]
        per_anchor = supcon_loss(embeddings, anchor_classes, self.temperature, contrast=ref_emb,
                                 contrast_labels=ref_classes, reduction="none",
                                 backend=self.backend)
        has_positive_pair = torch.isin(anchor_classes, ref_classes).any()
        has_negative_pair = class_values.numel() > 1
        return _mean_over_nonzero(per_anchor, has_positive_pair & has_negative_pair)

    def _cross_set_without_pairs_i_i(self, embeddings: torch.Tensor, labels: torch.Tensor,
                                     ref_emb: torch.Tensor) -> torch.Tensor:
        dtype = compute_dtype(embeddings.dtype)
        anchors = F.normalize(embeddings.to(dtype), dim=1)
        references = F.normalize(ref_emb.to(dtype), dim=1)
        same_class = labels[:, None] == labels[None, :]
        pair_i_i = torch.eye(labels.shape[0], dtype=torch.bool, device=labels.device)
        per_anchor = masked_supcon_per_anchor(anchors, references, same_class.to(dtype),
                                              self.temperature, exclude_self=True)
        has_positive_pair = (same_class & ~pair_i_i).any()
        has_negative_pair = (~same_class).any()
        return _mean_over_nonzero(per_anchor, has_positive_pair & has_negative_pair)


def _check_pml_default(name: str, value: object) -> None:
    """Refuses anything but pytorch-metric-learning's own default for ``name``, naming pml's
    SupConLoss as the way to get it. pml is imported only here: ``import scl_kernels`` and the
    default call leave it out."""
    if value is None:
        return
    module, class_name, what = _PML_DEFAULTS[name]
    wanted = (f"{name} must be {module}.{class_name}() with its default settings, the only {what} "
              "this drop-in computes")
    advice = "use pytorch_metric_learning.losses.SupConLoss for any other"
    try:
        default_class = getattr(importlib.import_module(module), class_name)
    except ImportError:  # without pml installed, value cannot be pml's object
        default_class = None
    if default_class is None or type(value) is not default_class:
        raise TypeError(f"{wanted}, got {type(value).__name__}; {advice}")
    defaults = _pml_settings(default_class())
    changed = ", ".join(f"{setting}={current!r}" for setting, current in _pml_settings(value).items()
                        if defaults.get(setting, _UNSET) != current)
    if changed:
        raise ValueError(f"{wanted}, got {class_name}({changed}); {advice}")


def _pml_settings(module: object) -> Dict[str, object]:
    """The settings of a pml distance or reducer: its public attributes but nn.Module's training
    flag and the statistics pml records in it (they change with every call)."""
    skipped = {"training", *getattr(module, "_record_these_stats", ())}
    return {setting: current for setting, current in vars(module).items()
            if not setting.startswith("_") and setting not in skipped}


def _check_rows(rows: torch.Tensor, labels: torch.Tensor, rows_name: str,
                labels_name: str) -> None:
    if not isinstance(rows, torch.Tensor) or not isinstance(labels, torch.Tensor):
        raise TypeError(f"{rows_name} and {labels_name} must be tensors")
    if rows.dim() != 2:
        raise ValueError(f"{rows_name} must have shape [N, D], got {tuple(rows.shape)}")
    if labels.dim() != 1 or labels.shape[0] != rows.shape[0]:
        raise ValueError(f"{labels_name} must have shape [{rows.shape[0]}] to match {rows_name}, "
                         f"got {tuple(labels.shape)}")


def _mean_over_nonzero(per_anchor: torch.Tensor,
                       has_positive_and_negative_pairs: torch.Tensor) -> torch.Tensor:
    """pytorch-metric-learning's AvgNonZeroReducer, and its 0 for a batch without a positive or
    without a negative pair, with no host read."""
    counted = per_anchor > 0
    mean = torch.where(counted, per_anchor, 0).sum() / counted.sum().clamp_min(1)
    return torch.where(has_positive_and_negative_pairs, mean, torch.zeros_like(mean))
