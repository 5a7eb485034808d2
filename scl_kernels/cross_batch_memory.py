"""A cross-batch memory (XBM, Wang et al. 2020; the MoCo queue): past batches' embeddings as
extra contrast rows, and the loss of a batch against (batch ∪ memory).

Below both :mod:`scl_kernels.nn` (SupConLoss, SupConCrossEntropyLoss, ``memory=``) and
:mod:`scl_kernels.global_batch` (the gathered global batch against the memory), which both use it;
users import :class:`SupConMemory` from :mod:`scl_kernels.nn`."""
from typing import Any, Dict, Optional, Tuple, Union

import torch
from torch import nn

from ._types import BackendName, ContrastMode, MultiLabel, Reduction, Temperature
from ._validation import (check_focal_gamma, check_inputs, check_label_rows, check_multi_label,
                          check_options, check_tensor, temperature_tensor)
from .backends import resolve_backend
from .backends.reference import check_multi_hot_values
from .functional import build_layout, reduce_per_anchor


def _check_positive_int(value: object, name: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be a positive int, got {type(value).__name__}")
    if value < 1:
        raise ValueError(f"{name} must be at least 1, got {value}")


class SupConMemory(nn.Module):
    """A FIFO ring of the last ``size`` embeddings, their labels and their group ids, detached.

    A training step contrasts its anchors against its own rows *and* the memory's (the memory's
    rows are never anchors and receive no gradient), then enqueues its own rows, so a batch of 64
    can contrast against 65,536 rows at O(size * D) memory and no encoder pass over them::

        memory = SupConMemory(65536, 384)
        criterion = SupConLoss(temperature=0.1, memory=memory)   # or SupConCrossEntropyLoss
        loss = criterion(embeddings, labels)   # training mode: contrast, then enqueue

    The rows are stored as given (cast to the memory's dtype), not normalised: the loss treats
    them as it treats the batch's rows (``normalize=True`` normalises both), so a stored row is
    the one its batch contrasted with. The rows come from older encoder weights; XBM's advice is
    to start the memory once the embeddings have settled a little (``reset()`` and a later
    start, or a small memory early).

    **Group ids** (known false negatives, ``groups=`` of :func:`~scl_kernels.supcon_loss`): each
    row is stored with its group id beside its label, -1 ("no group") for a row enqueued without
    groups. A batch's anchors and the memory's rows are then masked as two rows of one batch are:
    a pair in one group (id >= 0) that is not a positive leaves the anchor's denominator. Calls
    with and without groups may alternate: the rows of a call without groups are in no group,
    so they are never masked against a later batch's anchors, and a call without groups masks
    nothing (its anchors are in no group). Group ids are the user's, compared as they are
    across calls: the same id in two batches is the same group.

    **Multi-hot labels** (``[N, C]`` labels, multi-label positives of
    :func:`~scl_kernels.supcon_loss`): a memory built with ``num_classes=C`` stores each row's
    classes as a ``[C]`` bool row, an empty row being "no class" (as every slot not yet written
    is), and the loss weighs the pairs of the batch's anchors and its rows by ``multi_label``
    as it weighs two rows of one batch. The label form is fixed at construction, so that the
    buffers' shapes are too: a memory of class ids (the default) refuses multi-hot labels, one
    of multi-hot rows refuses class ids and another C, with a ValueError naming both forms.
    A call without labels (SimCLR) works with either form: its rows are stored with no class.

    The ring and its position are buffers: ``state_dict()`` / ``load_state_dict()`` checkpoint
    them and ``.to()`` moves them; a state dict saved before the memory kept group ids loads with
    every row in no group. Being buffers, the fill count and write position are read on
    the host at each call (one synchronisation per step on a GPU, next to the step's own).
    """

    # The buffers.
    rows: torch.Tensor
    row_labels: torch.Tensor
    row_groups: torch.Tensor
    next_slot: torch.Tensor
    filled: torch.Tensor

    def __init__(self, size: int, dim: int, *, num_classes: Optional[int] = None,
                 dtype: torch.dtype = torch.float32,
                 device: Optional[Union[torch.device, str, int]] = None) -> None:
        """
        Args:
            size: the number of rows kept (positive int); older rows are overwritten first.
            dim: the embeddings' dimension D (positive int).
            num_classes: None (default): the labels are class ids, ``[N]``; a positive int C:
                they are multi-hot rows, ``[N, C]`` (bool, or integers 0 / 1).
            dtype: the floating dtype the rows are stored in (default float32; bfloat16 halves
                the memory, and the loss casts the rows to the batch's dtype anyway).
            device: where the rows live (default: the current default device); the batch must
                be there too (``.to()`` moves the memory, as a submodule of the loss it follows
                the loss).

        Raises:
            TypeError / ValueError naming the argument.
        """
        super().__init__()
        _check_positive_int(size, "size")
        _check_positive_int(dim, "dim")
        if num_classes is not None:
            _check_positive_int(num_classes, "num_classes")
        if not (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
            raise TypeError(f"dtype must be a floating-point torch.dtype, got {dtype!r}")
        self.size, self.dim = size, dim
        self.register_buffer("rows", torch.zeros(size, dim, dtype=dtype, device=device))
        # "No class" (-1, or a row of no class) and "no group" (-1) in slots never written; they
        # are never read (only the filled part is).
        self.register_buffer("row_labels", torch.empty(
            (size,) if num_classes is None else (size, num_classes),
            dtype=torch.long if num_classes is None else torch.bool, device=device))
        self.row_labels.fill_(self._no_class)
        self.register_buffer("row_groups", torch.full((size,), -1, dtype=torch.long, device=device))
        self.register_buffer("next_slot", torch.zeros((), dtype=torch.long, device=device))
        self.register_buffer("filled", torch.zeros((), dtype=torch.long, device=device))

    @property
    def num_classes(self) -> Optional[int]:
        """C of the multi-hot rows stored, or None for class ids (read from the buffer, so
        that it follows a loaded state dict)."""
        return self.row_labels.shape[1] if self.row_labels.dim() == 2 else None

    @property
    def _no_class(self) -> Union[int, bool]:
        """What a label of no class is in the stored form: -1, or every class False."""
        return -1 if self.num_classes is None else False

    def __len__(self) -> int:
        """The number of rows held (at most ``size``)."""
        return int(self.filled)

    def reset(self) -> None:
        """Empties the memory (the storage is kept)."""
        self.row_labels.fill_(self._no_class)
        self.row_groups.fill_(-1)
        self.next_slot.zero_()
        self.filled.zero_()

    def contrast(self) -> Tuple[torch.Tensor, torch.Tensor]:
        """``(rows [len, D], labels [len] or [len, C] bool)``: the rows held, in slot order
        (slot ``k`` holds the row enqueued ``k`` mod ``size``-th), as views that the next
        enqueue overwrites."""
        count = len(self)
        return self.rows[:count], self.row_labels[:count]

    def contrast_groups(self) -> torch.Tensor:
        """``[len]``: the group ids of the rows :meth:`contrast` gives, in the same order (-1:
        no group, as for every row enqueued without groups)."""
        return self.row_groups[:len(self)]

    def check_embeddings(self, embeddings: torch.Tensor, name: str = "embeddings") -> None:
        """Raises unless ``embeddings`` is a ``[N, dim]`` floating tensor on the memory's device."""
        check_tensor(embeddings, name, floating=True)
        if embeddings.dim() != 2:
            raise ValueError(f"{name} must have shape [N, {self.dim}], got {tuple(embeddings.shape)}")
        if embeddings.shape[1] != self.dim:
            raise ValueError(f"memory dim {self.dim} but {name} have {embeddings.shape[1]}")
        if embeddings.device != self.rows.device:
            raise ValueError(f"{name} is on {embeddings.device} but the memory is on "
                             f"{self.rows.device}; move the memory with .to()")

    def _label_form(self) -> str:
        return ("class ids" if self.num_classes is None
                else f"multi-hot rows of {self.num_classes} classes")

    def check_labels(self, labels: torch.Tensor, name: str = "labels") -> None:
        """Raises ValueError unless ``labels`` (already checked to be class ids or multi-hot
        rows: ``_validation.check_label_rows``) are in the form this memory stores: class ids,
        or multi-hot rows of its C."""
        if labels.dim() == 1 and self.num_classes is None:
            return
        if labels.dim() == 2 and labels.shape[1] == self.num_classes:
            return
        given = ("class ids" if labels.dim() == 1
                 else f"multi-hot rows of {labels.shape[1]} classes")
        remedy = ("SupConMemory(size, dim) for class ids" if labels.dim() == 1
                  else f"SupConMemory(size, dim, num_classes={labels.shape[1]}) for these")
        raise ValueError(f"{name} are {given} but the memory holds {self._label_form()}: one "
                         f"memory keeps one form of labels (build it with {remedy})")

    @torch.no_grad()
    def enqueue(self, embeddings: torch.Tensor, labels: Optional[torch.Tensor],
                groups: Optional[torch.Tensor] = None) -> None:
        """Appends the rows of ``embeddings`` (detached, cast to the memory's dtype), their
        ``labels`` and their ``groups``, overwriting the oldest rows once full; of a batch larger
        than ``size`` only its last ``size`` rows are kept.

        Args:
            embeddings: ``[N, dim]`` floating tensor on the memory's device, finite.
            labels: in the memory's form: integer ``[N]`` class ids, negative meaning "no
                class" (a negative for every anchor); or, for a memory built with
                ``num_classes=C``, multi-hot ``[N, C]`` rows (bool, or integers 0 / 1), a row
                without a class being "no class". None: every row has no class.
            groups: integer ``[N]`` group ids (negative: no group), or None (default): the rows
                are then in no group (stored as -1).

        Raises:
            TypeError / ValueError naming the argument (labels in the other form, or of another
            C, included).
        """
        self.check_embeddings(embeddings)
        if labels is not None:
            check_label_rows(labels, "labels")
            self.check_labels(labels)
        if groups is not None:
            check_tensor(groups, "groups", floating=False)
        shapes = {"labels": [embeddings.shape[0], *self.row_labels.shape[1:]],
                  "groups": [embeddings.shape[0]]}
        for name, per_row in (("labels", labels), ("groups", groups)):
            if per_row is None:
                continue
            if list(per_row.shape) != shapes[name]:
                raise ValueError(f"{name} must have shape {shapes[name]} (one per row of "
                                 f"embeddings), got {tuple(per_row.shape)}")
            if per_row.device != self.rows.device:
                raise ValueError(f"{name} is on {per_row.device} but the memory is on "
                                 f"{self.rows.device}")
        if not bool(torch.isfinite(embeddings).all()):
            raise ValueError("embeddings contains NaN or inf: the memory would keep it for "
                             f"{self.size} rows' worth of steps")
        # Stored as bool, a multi-hot 2 would silently become a class: refused as the loss does.
        if labels is not None:
            check_multi_hot_values(labels)
        count = min(embeddings.shape[0], self.size)
        if labels is None:
            labels = self.row_labels.new_full((count, *self.row_labels.shape[1:]),
                                              self._no_class)
        if groups is None:
            groups = self.row_groups.new_full((count,), -1)
        rows = embeddings.detach()[-self.size:]
        if count == 0:
            return
        start = int(self.next_slot)
        head = min(count, self.size - start)  # up to the end of the ring, the rest wraps
        for buffer, values in ((self.rows, rows), (self.row_labels, labels[-self.size:]),
                               (self.row_groups, groups[-self.size:])):
            buffer[start:start + head] = values[:head]
            buffer[:count - head] = values[head:]
        self.next_slot.fill_((start + count) % self.size)
        self.filled.fill_(min(int(self.filled) + count, self.size))

    def _load_from_state_dict(self, state_dict: Dict[str, Any], prefix: str, *args: Any,
                              **kwargs: Any) -> None:
        # A state dict saved before the memory kept group ids has no row_groups: its rows were
        # all enqueued without groups, so they are in no group.
        state_dict.setdefault(prefix + "row_groups", torch.full_like(self.row_groups, -1))
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def extra_repr(self) -> str:
        classes = "" if self.num_classes is None else f", num_classes={self.num_classes}"
        return (f"size={self.size}, dim={self.dim}{classes}, dtype={self.rows.dtype}, "
                f"held={len(self)}")


def check_memory(memory: object) -> None:
    """Raises TypeError unless ``memory`` is None or a :class:`SupConMemory`."""
    if memory is not None and not isinstance(memory, SupConMemory):
        raise TypeError(f"memory must be a SupConMemory or None, got {type(memory).__name__}")


def memory_labels(memory_labels_held: torch.Tensor, supervised: bool) -> torch.Tensor:
    """The memory rows' labels for a call: without batch labels (SimCLR / MoCo) the batch's ids
    are its sample indices, which say nothing about memory rows, so these are negatives: class
    id -1, whatever form the memory stores its labels in."""
    if supervised:
        return memory_labels_held
    return torch.full(memory_labels_held.shape[:1], -1, dtype=torch.long,
                      device=memory_labels_held.device)


def supcon_loss_with_memory(features: torch.Tensor, labels: Optional[torch.Tensor],
                            memory: SupConMemory, temperature: Temperature = 0.1, *,
                            contrast_mode: ContrastMode = "all", normalize: bool = True,
                            focal_gamma: float = 0.0, reduction: Reduction = "mean",
                            backend: BackendName = "auto",
                            groups: Optional[torch.Tensor] = None,
                            multi_label: MultiLabel = "any") -> torch.Tensor:
    """:func:`~scl_kernels.supcon_loss` of a batch whose anchors contrast against the batch and
    the rows of ``memory``, followed by enqueueing the batch's rows (all views) into ``memory``.

    The fused op runs in its single-set layout on ``[batch rows; memory rows]`` with the anchors
    the first rows (``num_anchors`` of them, ``anchor_offset`` 0): every anchor's own column is
    excluded and the memory's rows are contrast only. Their gradient is dropped (the memory is
    detached), so the loss's gradient is with respect to the batch only. Without labels the
    memory rows are negatives only and are enqueued with label -1.

    With ``groups`` the memory's rows take part with the group ids they were enqueued with (-1
    for rows enqueued without), so that they are masked as the batch's own rows are, and the
    batch's rows are enqueued with theirs; without ``groups`` the batch is in no group, nothing
    is masked, and its rows are enqueued with -1 (:class:`SupConMemory`).

    Multi-hot ``labels`` (``[B, C]``) need a memory built with ``num_classes=C``: its rows'
    classes follow the batch's in the op's labels, so the pairs of an anchor with the batch's
    rows and with the memory's are weighed alike, by ``multi_label``; the batch's rows are
    enqueued with their classes.

    Takes :func:`~scl_kernels.supcon_loss`'s arguments, less ``contrast`` / ``contrast_labels``
    / ``contrast_groups``.
    """
    check_inputs(features, labels, groups)
    check_options(temperature, contrast_mode, normalize, reduction, backend,
                  check_value=False)
    check_memory(memory)
    check_multi_label(multi_label)
    if labels is not None:
        memory.check_labels(labels)
    focal_gamma = check_focal_gamma(focal_gamma)
    run = resolve_backend(backend, features.device, focal_gamma, groups=groups is not None,
                          multi_label=labels is not None and labels.dim() == 2).run
    temperature_value = temperature_tensor(temperature, features.device)
    layout = build_layout(features, labels, None, None, contrast_mode, groups=groups)
    memory.check_embeddings(layout.rows, "features")
    held_rows, held_labels = memory.contrast()
    held_labels = memory_labels(held_labels, labels is not None)
    # One dtype for the concatenation: int64 class ids, or the batch's multi-hot dtype (the op
    # checks that integer multi-hot rows hold 0 or 1 before the memory stores them as bool).
    batch_labels = layout.labels.long() if layout.labels.dim() == 1 else layout.labels
    rows = torch.cat([layout.rows, held_rows.to(layout.rows.dtype)])
    row_labels = torch.cat([batch_labels, held_labels.to(batch_labels.dtype)])
    row_groups = (None if layout.groups is None
                  else torch.cat([layout.groups.long(), memory.contrast_groups()]))
    per_anchor, num_positives = run(rows, row_labels, None, None, temperature_value,
                                    layout.num_anchors, normalize, focal_gamma=focal_gamma,
                                    groups=row_groups, multi_label=multi_label)
    memory.enqueue(layout.rows, batch_labels if labels is not None else None, layout.groups)
    return reduce_per_anchor(per_anchor, num_positives, reduction)
