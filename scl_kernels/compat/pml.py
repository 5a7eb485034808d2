"""pytorch-metric-learning's ``losses.SupConLoss`` on the fused loss, and a multi-label
``MultiSupConLoss`` in its style (see that class: a formula of its own, not a copy).

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
from ..nn._classification_targets import multi_hot_classes

from ._dense_fallback import compute_dtype, masked_supcon_per_anchor, warn_once

__all__ = ["MultiSupConLoss", "SupConLoss"]

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


class MultiSupConLoss(nn.Module):
    """Multi-label supervised contrastive loss with pytorch-metric-learning's call, positives
    weighed by the Jaccard similarity of the label sets::

        # was: MultiSupConLoss of pytorch-metric-learning PR #667 (not in a release)
        from scl_kernels.compat.pml import MultiSupConLoss
        criterion = MultiSupConLoss(num_classes=20, temperature=0.07)
        loss = criterion(embeddings, labels)   # labels: multi-hot [N, 20]

    What it computes, exactly (:func:`scl_kernels.supcon_loss` with ``multi_label="jaccard"``,
    docs/MATH.md section 11): with ``Y_i`` the class set of row i, the rows L2-normalised and
    ``s_ij = z_i . z_j / temperature``,

        w_ij = |Y_i & Y_j| / |Y_i | Y_j|                      (Jaccard; 0 for two empty sets)
        A(i) = every column but the anchor's own (every ``ref_emb`` row with ``ref_emb``)
        P(i) = { j in A(i) : w_ij > 0 },     W_i = sum_{j in P(i)} w_ij
        l_i  = -(1 / W_i) sum_{j in P(i)} w_ij log( exp(s_ij) / sum_{a in A(i)} exp(s_ia) )

    (0 for an anchor without positives), and the batch loss is the mean of ``l_i`` over the
    anchors whose loss is greater than 0, pytorch-metric-learning's ``AvgNonZeroReducer`` (0
    when none is). A row of zeros has no class: a negative for every anchor, no loss of its own.

    It is **not** claimed to equal the pull request's code value for value, and is tested against
    the formula above (a float64 reference), not against that code, which pytorch-metric-learning
    has not released. Where the two differ by design (its code as published when this class was
    written): the pull request keeps as positives only
    the pairs whose Jaccard similarity exceeds ``threshold`` (default 0.3) and divides the
    weighted sum by their number, not by the weights' sum ``W_i``; it gives 0 for a batch without
    a negative pair, where this class gives the loss of its positives. Its author reports that
    it does not match its own reference implementation in float16. With one class per row
    ``w_ij`` is 1 for a same-class pair, and the loss is pytorch-metric-learning's ``SupConLoss``
    on batches that have a negative pair (tested against that class).
    """

    temperature: Temperature

    def __init__(self, num_classes: int, temperature: Temperature = 0.07, *,
                 backend: BackendName = "auto") -> None:
        """Stores the options of every call.

        Args:
            num_classes: C, the width of the multi-hot labels (the pull request's first
                argument); every call's labels must have it.
            temperature: the softmax temperature: a positive float or a 0-dim floating tensor
                (default 0.07, the pull request's).
            backend: the :func:`scl_kernels.supcon_loss` backend; one that computes
                multi-label positives (``"auto"`` picks one; docs/BACKENDS.md).

        Raises:
            ValueError: num_classes is not a positive int.
        """
        super().__init__()
        if isinstance(num_classes, bool) or not isinstance(num_classes, int) or num_classes < 1:
            raise ValueError(f"num_classes must be a positive int, got {num_classes!r}")
        self.num_classes = num_classes
        self.temperature = temperature
        self.backend = backend

    def forward(self, embeddings: torch.Tensor, labels: torch.Tensor,
                indices_tuple: None = None, ref_emb: Optional[torch.Tensor] = None,
                ref_labels: Optional[torch.Tensor] = None) -> torch.Tensor:
        """The loss of one batch.

        Args:
            embeddings: ``[N, D]`` floating tensor.
            labels: multi-hot ``[N, num_classes]`` rows of 0 and 1 (bool, integer or floating).
            indices_tuple: not supported (mined pairs); must be None.
            ref_emb: optional ``[M, D]`` reference rows the anchors are contrasted against (no
                column is then excluded).
            ref_labels: multi-hot ``[M, num_classes]`` rows of ``ref_emb``; required with it.

        Returns:
            A 0-dim tensor, float32 (float64 for float64 embeddings).

        Raises:
            NotImplementedError: indices_tuple is given.
            ValueError: shapes do not match, a label is neither 0 nor 1, ref_emb and ref_labels
                are not given together, or ``ref_labels is labels`` with another ``ref_emb``
                (pytorch-metric-learning then leaves out the pairs (i, i), which this class does
                not compute: pass ``labels.clone()``).
        """
        if indices_tuple is not None:
            raise NotImplementedError(
                "scl_kernels.compat.pml.MultiSupConLoss does not take indices_tuple (mined "
                "pairs): it uses every pair, as indices_tuple=None does")
        classes = self._classes(embeddings, labels, "embeddings", "labels")
        if (ref_emb is None) != (ref_labels is None):
            raise ValueError("ref_emb and ref_labels must be given together")
        contrast = contrast_classes = None
        if ref_emb is not None and ref_labels is not None and not (
                ref_labels is labels and ref_emb is embeddings):  # that pair is the single set
            if ref_labels is labels:
                raise ValueError("ref_labels is the labels tensor itself with another ref_emb: "
                                 "pytorch-metric-learning then leaves out the pairs (i, i), "
                                 "which this class does not compute; pass labels.clone() for "
                                 "a plain cross set")
            contrast = ref_emb
            contrast_classes = self._classes(ref_emb, ref_labels, "ref_emb",
                                             "ref_labels").to(embeddings.device)
        per_anchor = supcon_loss(embeddings, classes.to(embeddings.device), self.temperature,
                                 contrast=contrast, contrast_labels=contrast_classes,
                                 reduction="none", backend=self.backend, multi_label="jaccard")
        return _average_over_nonzero(per_anchor)

    def _classes(self, rows: torch.Tensor, labels: torch.Tensor, rows_name: str,
                 labels_name: str) -> torch.Tensor:
        """The bool class sets of ``labels``, checked against ``rows`` and ``num_classes``."""
        if not isinstance(rows, torch.Tensor):
            raise TypeError(f"{rows_name} must be a tensor, got {type(rows).__name__}")
        classes = multi_hot_classes(labels, labels_name)
        if classes.shape != (rows.shape[0], self.num_classes):
            raise ValueError(f"{labels_name} must be multi-hot rows of shape "
                             f"[{rows.shape[0]}, {self.num_classes}] ({rows_name}' rows, "
                             f"num_classes), got {tuple(classes.shape)}")
        return classes

    def extra_repr(self) -> str:
        return f"num_classes={self.num_classes}, temperature={self.temperature}"


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


def _average_over_nonzero(per_anchor: torch.Tensor) -> torch.Tensor:
    """pytorch-metric-learning's AvgNonZeroReducer: the mean over the anchors whose loss is
    greater than 0, 0 when none is, with no host read."""
    counted = per_anchor > 0
    return torch.where(counted, per_anchor, 0).sum() / counted.sum().clamp_min(1)


def _mean_over_nonzero(per_anchor: torch.Tensor,
                       has_positive_and_negative_pairs: torch.Tensor) -> torch.Tensor:
    """pytorch-metric-learning's AvgNonZeroReducer, and its 0 for a batch without a positive or
    without a negative pair, with no host read."""
    mean = _average_over_nonzero(per_anchor)
    return torch.where(has_positive_and_negative_pairs, mean, torch.zeros_like(mean))
