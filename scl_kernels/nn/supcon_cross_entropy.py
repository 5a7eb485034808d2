"""The fine-tuning objective of Gunel et al. (ICLR 2021): (1 - lam) * CE + lam * SCL, and its
multi-label form (1 - lam) * BCE + lam * multi-label SCL."""
import math
from numbers import Real
from typing import Callable, NamedTuple, Optional, Tuple, TypedDict, cast, get_args

import torch
import torch.nn.functional as F
from torch import nn

from .._types import BackendName, MultiLabel, SclReduction, Strategy, Temperature
from .._validation import check_focal_gamma, check_multi_label, check_options, check_tensor
from ..cross_batch_memory import SupConMemory, check_memory, supcon_loss_with_memory
from ..functional import supcon_loss
from ._classification_targets import (MULTI_LABEL, PROBLEM_TYPES, SINGLE_LABEL, ProblemType,
                                      check_class_indices, multi_hot_classes)

SCL_REDUCTIONS: Tuple[str, ...] = get_args(SclReduction)


class SupConCrossEntropyParts(NamedTuple):
    """The objective and its two terms, each unweighted (for logging). ``cross_entropy`` is the
    classification term: binary cross-entropy for multi-label targets."""
    loss: torch.Tensor
    cross_entropy: torch.Tensor
    supcon: torch.Tensor


class _Targets(NamedTuple):
    """A call's labels as each term reads them."""
    problem_type: ProblemType
    supcon_labels: torch.Tensor  # class indices [N], or the bool class sets [N, C]


class FocalOptions(TypedDict, total=False):
    """What focal_options gives: supcon_loss's keyword focal_gamma, or nothing."""
    focal_gamma: float


def focal_options(gamma: float) -> FocalOptions:
    """supcon_loss's focal argument for ``gamma``: none at 0, which is plain SupCon, so that
    the call stays the plain one (the distributed loss takes no focal_gamma)."""
    return {"focal_gamma": gamma} if gamma else {}


def _check_multi_label_options(label_smoothing: float) -> None:
    """The option a multi-label call cannot take: raised by the constructor for
    ``problem_type="multi_label_classification"``, by the call for multi-hot labels read as such."""
    if label_smoothing:
        raise ValueError("label_smoothing applies to single_label_classification (class indices); "
                         "binary cross-entropy of multi-hot targets has none")


def _check_lam(lam: object) -> None:
    if isinstance(lam, bool) or not isinstance(lam, Real):
        raise TypeError(f"lam must be a float in [0, 1], got {type(lam).__name__}")
    # typeshed's numbers.Real declares no comparisons: a real number compares as a float does.
    if not (math.isfinite(lam) and 0.0 <= cast(float, lam) <= 1.0):
        raise ValueError(f"lam must be in [0, 1], got {lam}")


class SupConCrossEntropyLoss(nn.Module):
    """Cross-entropy plus the supervised contrastive term, for fine-tuning a classifier::

        loss = (1 - lam) * F.cross_entropy(logits, labels) + lam * SCL(embeddings, labels)

    as in Gunel et al., "Supervised Contrastive Learning for Pre-trained Language Model
    Fine-tuning" (ICLR 2021), where the embeddings are the L2-normalised first-token ([CLS] /
    ``<s>``) vectors of the encoder's last layer. SCL is the fused :func:`~scl_kernels.supcon_loss`
    (no N x N matrix is stored), with ``normalize=True`` doing the L2 normalisation.

    The cross-entropy term can be replaced (``ce=``) by any ``ce(logits, labels)`` loss, e.g.
    ``SupConCrossEntropyLoss(0.9, ce=FocalLoss(gamma=2.0))``; by default it is
    ``F.cross_entropy`` with torch's own ``label_smoothing``. ``focal_gamma`` makes the
    contrastive term the focal SupCon.

    Cross-entropy is a mean over the batch. The paper writes SCL as a *sum* over the N anchors,
    which makes its effective weight N times larger than the same ``lam`` on a mean: at batch 16
    the two differ by 16x. ``scl_reduction`` picks one:

    * ``"mean"`` (default): SCL averaged over the anchors that have a positive, the convention of
      most re-implementations; ``lam`` is then batch-size independent.
    * ``"sum"``: the paper's formula, a sum over anchors.

    Example::

        criterion = SupConCrossEntropyLoss(lam=0.9, temperature=0.3)
        out = model(**batch, output_hidden_states=True)
        loss = criterion(out.logits, out.hidden_states[-1][:, 0], batch["labels"])

    **Several processes** (``distributed=True``, under ``DistributedDataParallel``, FSDP or a
    Hugging Face Trainer launched with ``torchrun``): SCL is the loss of the *global* batch, every
    rank's examples in rank order, computed by :func:`scl_kernels.distributed.supcon_loss` with
    ``gradients_averaged=True``; cross-entropy stays the mean over this rank's batch. Once the
    parameters' gradients are averaged over the ranks (what DDP does), the update is that of
    ``(1 - lam) * CE + lam * SCL`` on the global batch in one process: exactly when every rank
    holds the same number of examples (the CE average of per-rank means is then the global mean;
    SCL is exact for any sizes). Every rank must call the loss (its SCL term is a collective).

    **Cross-batch memory** (``memory=``, a :class:`SupConMemory`): in training mode SCL's anchors
    (the batch) contrast against the batch and the memory's rows, then the batch's embeddings
    are enqueued (with ``distributed``, the gathered global batch, so every rank's memory stays
    the same); in eval mode the memory is neither used nor changed. With the gradient cache the
    loss is called once per step on the whole batch, so the memory sees each batch once.

    **Multi-label classification** (Hugging Face's ``problem_type`` names)::

        loss = (1 - lam) * F.binary_cross_entropy_with_logits(logits, targets)
               + lam * supcon_loss(embeddings, targets, multi_label=multi_label)

    with multi-hot ``targets`` ``[N, C]`` (float as Hugging Face's, or bool, or integers 0 / 1),
    BCE the mean over the ``N x C`` elements (``nn.BCEWithLogitsLoss()``) and SCL the multi-label
    SupCon of :func:`~scl_kernels.supcon_loss` on the same class sets: ``multi_label="any"``, a
    pair sharing a class is a positive; ``"jaccard"``, weighted by ``|Y_i & Y_j| / |Y_i | Y_j|``
    (docs/MATH.md section 11). ``problem_type=None`` (default) reads the problem from each call's
    labels, as Hugging Face's models do when ``config.problem_type`` is unset: ``[N]`` class
    indices are single-label, ``[N, C]`` rows multi-label; ``"single_label_classification"`` or
    ``"multi_label_classification"`` fixes it.

    **Known false negatives** (``groups=`` of :meth:`forward`): group ids passed to SCL, whose
    pairs of one group that are not positives leave the denominator (docs/MATH.md section 11).
    """

    temperature: Temperature
    ce: Optional[Callable[[torch.Tensor, torch.Tensor], torch.Tensor]]
    memory: Optional[SupConMemory]

    def __init__(self, lam: float = 0.9, temperature: Temperature = 0.3, *,
                 scl_reduction: SclReduction = "mean", normalize: bool = True,
                 backend: BackendName = "auto", distributed: bool = False,
                 strategy: Strategy = "gather",
                 group: Optional[torch.distributed.ProcessGroup] = None,
                 ce: Optional[Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = None,
                 label_smoothing: float = 0.0, focal_gamma: float = 0.0,
                 memory: Optional[SupConMemory] = None,
                 problem_type: Optional[ProblemType] = None,
                 multi_label: MultiLabel = "any") -> None:
        """Checks and stores the options.

        Args:
            lam: weight of the contrastive term, in [0, 1]; 0 is plain cross-entropy and 1 plain
                SCL. Default 0.9 (with ``temperature=0.3``, the defaults of the paper's
                re-implementations; its grid was lam in {0.1, 0.3, 0.5, 0.7, 0.9, 1.0}).
            temperature: SCL's softmax temperature, a positive float or a 0-dim tensor (an
                ``nn.Parameter`` is learnable). The paper's grid: {0.1, 0.3, 0.5, 0.7}.
            scl_reduction: ``"mean"`` (default) or ``"sum"`` over anchors, see above.
            normalize: L2-normalise the embeddings first (default True, as in the paper).
            backend: the SupCon backend, as in :func:`~scl_kernels.supcon_loss`.
            distributed: ``True``: SCL contrasts the global batch of the ``torch.distributed``
                process group (which must be initialised before the first call), and its
                backward is scaled for gradients that are then *averaged* over the ranks (DDP,
                FSDP, the Trainer; or an all-reduce of the gradients divided by the world size).
                The returned loss is ``(1 - lam) * CE(this rank) + lam * SCL(global batch)``,
                whose mean over the ranks is the single-process objective of the global batch
                when the ranks hold equal batches. A learnable temperature must then be averaged
                over the ranks like the model's parameters (part of the DDP-wrapped module).
                ``False`` (default): this process's batch only.
            strategy: with ``distributed``: ``"gather"`` (default) or ``"ring"``, as in
                :func:`scl_kernels.distributed.supcon_loss`.
            group: with ``distributed``: the process group (default: the world).
            ce: the cross-entropy term, a callable ``ce(logits, labels)`` returning a 0-dim loss,
                e.g. :class:`FocalLoss`, :class:`SelfAdjustingDiceLoss` or
                :class:`MixedCrossEntropyLoss` (an ``nn.Module`` is registered as a submodule:
                it follows ``.to()``, ``train()`` / ``eval()`` and the state dict). None
                (default): ``F.cross_entropy`` with ``label_smoothing``. With ``distributed`` it
                stays this rank's loss, like the default.
            label_smoothing: passed to ``F.cross_entropy`` (torch's label smoothing, in
                [0, 1)); default 0. Only with ``ce=None``: give a custom term its own smoothing.
            focal_gamma: the focal exponent of the contrastive term (the focal SupCon of
                :func:`~scl_kernels.supcon_loss`, ``(1 - pi)^gamma`` weighting each positive
                pair's term); default 0, plain SupCon. Not with ``distributed``.
            memory: a :class:`SupConMemory` whose rows SCL also contrasts against in training
                mode (a submodule: it follows ``.to()`` and the state dict), or None (default).
                Needs ``lam > 0`` (CE alone has nothing to contrast) and, with ``distributed``,
                ``strategy="gather"``. For multi-hot labels, one built with ``num_classes=C``.
            problem_type: ``None`` (default): each call's labels say, integer ``[N]`` class
                indices single-label (cross-entropy), multi-hot ``[N, C]`` rows multi-label
                (binary cross-entropy); ``"single_label_classification"`` or
                ``"multi_label_classification"`` (Hugging Face's ``config.problem_type``) fixes it
                and refuses the other form. Multi-label takes no ``label_smoothing``; with
                ``distributed``, the ``"gather"`` strategy (``"ring"`` is refused here, and for
                labels read as multi-hot by the distributed loss, on every rank at the call).
            multi_label: how SCL weighs a pair of multi-hot rows, passed to
                :func:`~scl_kernels.supcon_loss`: ``"any"`` (default; weight 1 when they share a
                class) or ``"jaccard"`` (``|Y_i & Y_j| / |Y_i | Y_j|``). Unread for class indices.

        Raises:
            TypeError / ValueError naming the argument.
        """
        super().__init__()
        _check_lam(lam)
        if scl_reduction not in SCL_REDUCTIONS:
            raise ValueError(f"scl_reduction must be one of {SCL_REDUCTIONS}, got {scl_reduction!r}")
        check_options(temperature, "all", normalize, "mean", backend, check_value=True)
        if not isinstance(distributed, bool):
            raise TypeError(f"distributed must be a bool, got {type(distributed).__name__}")
        if distributed:
            # Imported here: `import scl_kernels` leaves torch.distributed out.
            from ..global_batch import STRATEGIES
            if strategy not in STRATEGIES:
                raise ValueError(f"strategy must be one of {STRATEGIES}, got {strategy!r}")
        elif strategy != "gather" or group is not None:
            raise ValueError("strategy and group apply to distributed=True only, got "
                             f"strategy={strategy!r}, group={group!r} with distributed=False")
        if ce is not None and not callable(ce):
            raise TypeError(f"ce must be a callable ce(logits, labels), got {type(ce).__name__}")
        if isinstance(label_smoothing, bool) or not isinstance(label_smoothing, Real):
            raise TypeError(f"label_smoothing must be a float in [0, 1), got "
                            f"{type(label_smoothing).__name__}")
        if not 0.0 <= cast(float, label_smoothing) < 1.0:  # a Real compares as a float
            raise ValueError(f"label_smoothing must be in [0, 1), got {label_smoothing}")
        if ce is not None and label_smoothing:
            raise ValueError("label_smoothing applies to the default cross-entropy (ce=None); "
                             "pass a custom ce its own smoothing")
        check_focal_gamma(focal_gamma)
        if distributed and focal_gamma:
            raise ValueError("focal_gamma applies to distributed=False only")
        check_memory(memory)
        if memory is not None and lam == 0:
            raise ValueError("memory needs lam > 0: with lam = 0 the loss is cross-entropy alone "
                             "and has no contrastive term to use the memory")
        if memory is not None and distributed and strategy != "gather":
            raise ValueError(f"memory needs strategy='gather' (got {strategy!r}): the memory "
                             "enqueues the gathered global batch, which the ring never holds")
        if problem_type is not None and problem_type not in PROBLEM_TYPES:
            raise ValueError(f"problem_type must be None or one of {PROBLEM_TYPES}, got "
                             f"{problem_type!r}")
        if problem_type == MULTI_LABEL:
            _check_multi_label_options(label_smoothing)
            if distributed and strategy == "ring":
                raise ValueError("problem_type='multi_label_classification' with distributed=True "
                                 "needs strategy='gather': the ring strategy refuses multi-hot "
                                 "labels (docs/DISTRIBUTED.md)")
        check_multi_label(multi_label)
        # The attributes' types, declared (as the constructor's signature gives them).
        self.lam: float = float(lam)
        self.ce = ce
        self.label_smoothing: float = float(label_smoothing)
        self.focal_gamma: float = float(focal_gamma)
        self.temperature = temperature
        self.scl_reduction: SclReduction = scl_reduction
        self.normalize: bool = normalize
        self.backend: BackendName = backend
        self.distributed: bool = distributed
        self.strategy: Strategy = strategy
        self.group: Optional[torch.distributed.ProcessGroup] = group
        self.memory = memory
        self.problem_type: Optional[ProblemType] = problem_type
        self.multi_label: MultiLabel = multi_label

    def _targets(self, labels: torch.Tensor) -> _Targets:
        """The call's problem type (``problem_type``, or the labels' form) and the labels SCL
        reads, with the labels checked for it."""
        if not isinstance(labels, torch.Tensor):
            raise TypeError(f"labels must be a torch.Tensor, got {type(labels).__name__}")
        problem_type = self.problem_type or (MULTI_LABEL if labels.dim() == 2 else SINGLE_LABEL)
        if problem_type == SINGLE_LABEL:
            check_tensor(labels, "labels", floating=False)
            if labels.dim() != 1:
                raise ValueError(f"labels must have shape [N] (class indices), got "
                                 f"{tuple(labels.shape)}")
            return _Targets(problem_type, labels)
        _check_multi_label_options(self.label_smoothing)
        return _Targets(problem_type, multi_hot_classes(labels))

    def _classification(self, logits: torch.Tensor, labels: torch.Tensor,
                        problem_type: ProblemType) -> torch.Tensor:
        check_tensor(logits, "logits", floating=True)
        if logits.dim() != 2 or logits.shape[0] != labels.shape[0]:
            raise ValueError(f"logits must have shape [N, num_classes] with N = {labels.shape[0]} "
                             f"(the labels), got {tuple(logits.shape)}")
        if self.ce is not None:
            return self.ce(logits, labels)
        if problem_type == MULTI_LABEL:
            if logits.shape != labels.shape:
                raise ValueError(f"logits must have the multi-hot labels' shape "
                                 f"{tuple(labels.shape)}, got {tuple(logits.shape)}")
            return F.binary_cross_entropy_with_logits(logits, labels.to(logits.dtype))
        # torch's own "Target 7 is out of bounds" names neither the row nor the logits' width.
        check_class_indices(labels, logits.shape[1])
        return F.cross_entropy(logits, labels, label_smoothing=self.label_smoothing)

    def classification_loss(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """The classification term alone, unweighted: cross-entropy of class indices, binary
        cross-entropy of multi-hot targets (or ``ce``), with :meth:`forward`'s checks. The
        Trainer integration's ``eval_loss``."""
        return self._classification(logits, labels, self._targets(labels).problem_type)

    def _supcon(self, embeddings: torch.Tensor, labels: torch.Tensor,
                groups: Optional[torch.Tensor]) -> torch.Tensor:
        if embeddings.dim() != 2:
            raise ValueError(f"embeddings must have shape [N, D], got {tuple(embeddings.shape)}")
        memory = self.memory if self.training else None
        if self.distributed:
            from ..global_batch import supcon_loss as global_supcon_loss
            # gradients_averaged: DDP averages the parameters' gradients over the ranks, so this
            # rank's share of SCL's gradient is scaled by the world size, while CE's per-rank
            # mean is left as is (its average over equal batches is the global mean's gradient).
            return global_supcon_loss(embeddings, labels, self.temperature, normalize=self.normalize,
                                      reduction=self.scl_reduction, backend=self.backend,
                                      strategy=self.strategy, gradients_averaged=True,
                                      group=self.group, memory=memory, groups=groups,
                                      multi_label=self.multi_label)
        if memory is not None:
            return supcon_loss_with_memory(embeddings, labels, memory, self.temperature,
                                           normalize=self.normalize, reduction=self.scl_reduction,
                                           backend=self.backend, groups=groups,
                                           multi_label=self.multi_label,
                                           **focal_options(self.focal_gamma))
        return supcon_loss(embeddings, labels, self.temperature, normalize=self.normalize,
                           reduction=self.scl_reduction, backend=self.backend, groups=groups,
                           multi_label=self.multi_label, **focal_options(self.focal_gamma))

    def parts(self, logits: torch.Tensor, embeddings: torch.Tensor, labels: torch.Tensor,
              groups: Optional[torch.Tensor] = None) -> SupConCrossEntropyParts:
        """The objective and both of its terms (unweighted), for logging.

        Takes the arguments of :meth:`forward`; returns a :class:`SupConCrossEntropyParts`
        ``(loss, cross_entropy, supcon)``. Both terms are computed whatever ``lam`` is (with
        ``distributed``, every rank must then call it: SCL is the global batch's, cross-entropy
        this rank's). With a memory in training mode it is a step like :meth:`forward`: it
        contrasts and enqueues.
        """
        targets = self._targets(labels)
        cross_entropy = self._classification(logits, labels, targets.problem_type)
        supcon = self._supcon(embeddings, targets.supcon_labels, groups)
        loss = (1.0 - self.lam) * cross_entropy + self.lam * supcon
        return SupConCrossEntropyParts(loss, cross_entropy, supcon)

    def forward(self, logits: torch.Tensor, embeddings: torch.Tensor, labels: torch.Tensor,
                groups: Optional[torch.Tensor] = None) -> torch.Tensor:
        """The objective of one batch (a 0-dim tensor).

        Args:
            logits: ``[N, num_classes]`` classifier outputs (before softmax).
            embeddings: ``[N, D]`` sentence embeddings (normalised by the loss unless
                ``normalize=False``), e.g. the last layer's first-token vectors.
            labels: integer ``[N]`` class indices. A negative label is ignored by cross-entropy
                only if it equals its ``ignore_index`` (-100); SupCon treats any negative label as
                "no class" (a negative for every anchor, no loss of its own). With the default
                cross-entropy a label outside ``[0, num_classes)`` other than -100 raises a
                ValueError naming its value and row (on a GPU the check waits for the labels
                once a call; it is left out while a CUDA graph is captured). A custom ``ce``
                checks its own labels. Or, multi-label (see ``problem_type``), multi-hot
                ``[N, num_classes]`` rows of 0 and 1 (float, bool or integer; a row of zeros is
                "no class" for SCL): another value raises a ValueError naming it, its row and
                class (read as the class indices are). A custom ``ce`` receives them as given.
            groups: optional integer ``[N]`` group ids for SCL (known false negatives, as
                ``groups=`` of :func:`~scl_kernels.supcon_loss`): two rows of one group that
                are not positives leave each other's denominator; a negative id is no group.
                Cross-entropy does not read them.

        A term whose weight is 0 (``lam`` of 0 or 1) is not computed, so its input needs no
        graph (and with ``lam`` = 0 no rank communicates).
        """
        targets = self._targets(labels)
        loss: Optional[torch.Tensor] = None
        if self.lam < 1.0:
            loss = (1.0 - self.lam) * self._classification(logits, labels, targets.problem_type)
        if self.lam > 0.0:
            scl = self.lam * self._supcon(embeddings, targets.supcon_labels, groups)
            loss = scl if loss is None else loss + scl
        assert loss is not None, "lam is in [0, 1]: one of the terms is computed"
        return loss

    def extra_repr(self) -> str:
        temperature: object = self.temperature
        if isinstance(temperature, torch.Tensor):
            temperature = f"{type(temperature).__name__}(...)"
        text = (f"lam={self.lam}, temperature={temperature}, scl_reduction={self.scl_reduction!r}, "
                f"normalize={self.normalize}, backend={self.backend!r}")
        if self.label_smoothing:
            text += f", label_smoothing={self.label_smoothing:g}"
        if self.focal_gamma:
            text += f", focal_gamma={self.focal_gamma:g}"
        if self.distributed:
            text += f", distributed=True, strategy={self.strategy!r}"
        if self.problem_type is not None:
            text += f", problem_type={self.problem_type!r}"
        if self.multi_label != "any":
            text += f", multi_label={self.multi_label!r}"
        return text
