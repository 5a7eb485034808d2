"""A cross-batch memory (XBM, Wang et al. 2020; the MoCo queue): past batches' embeddings as
extra contrast rows, and the loss of a batch against (batch ∪ memory).

Below both :mod:`scl_kernels.nn` (SupConLoss, SupConCrossEntropyLoss, ``memory=``) and
:mod:`scl_kernels.global_batch` (the gathered global batch against the memory), which both use it;
users import :class:`SupConMemory` from :mod:`scl_kernels.nn`."""
from typing import Optional, Tuple, Union

import torch
from torch import nn

from ._types import BackendName, ContrastMode, Reduction, Temperature
from ._validation import (check_focal_gamma, check_inputs, check_options, check_tensor,
                          temperature_tensor)
from .backends import resolve_backend
from .functional import build_layout, reduce_per_anchor


def _check_positive_int(value: object, name: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be a positive int, got {type(value).__name__}")
    if value < 1:
        raise ValueError(f"{name} must be at least 1, got {value}")


class SupConMemory(nn.Module):
    """A FIFO ring of the last ``size`` embeddings and their labels, detached.

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

    The ring and its position are buffers: ``state_dict()`` / ``load_state_dict()`` checkpoint
    them and ``.to()`` moves them. Being buffers, the fill count and write position are read on
    the host at each call (one synchronisation per step on a GPU, next to the step's own).
    """

    # The buffers.
    rows: torch.Tensor
    row_labels: torch.Tensor
    next_slot: torch.Tensor
    filled: torch.Tensor

    def __init__(self, size: int, dim: int, *, dtype: torch.dtype = torch.float32,
                 device: Optional[Union[torch.device, str, int]] = None) -> None:
        """
        Args:
            size: the number of rows kept (positive int); older rows are overwritten first.
            dim: the embeddings' dimension D (positive int).
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
        if not (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
            raise TypeError(f"dtype must be a floating-point torch.dtype, got {dtype!r}")
        self.size, self.dim = size, dim
        self.register_buffer("rows", torch.zeros(size, dim, dtype=dtype, device=device))
        # -1 ("no class") in slots never written; they are never read (only the filled part is).
        self.register_buffer("row_labels", torch.full((size,), -1, dtype=torch.long, device=device))
        self.register_buffer("next_slot", torch.zeros((), dtype=torch.long, device=device))
        self.register_buffer("filled", torch.zeros((), dtype=torch.long, device=device))

    def __len__(self) -> int:
        """The number of rows held (at most ``size``)."""
        return int(self.filled)

    def reset(self) -> None:
        """Empties the memory (the storage is kept)."""
        self.row_labels.fill_(-1)
        self.next_slot.zero_()
        self.filled.zero_()

    def contrast(self) -> Tuple[torch.Tensor, torch.Tensor]:
        """``(rows [len, D], labels [len])``: the rows held, in slot order (slot ``k`` holds the
        row enqueued ``k`` mod ``size``-th), as views that the next enqueue overwrites."""
        count = len(self)
        return self.rows[:count], self.row_labels[:count]

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

    @torch.no_grad()
    def enqueue(self, embeddings: torch.Tensor, labels: torch.Tensor) -> None:
        """Appends the rows of ``embeddings`` (detached, cast to the memory's dtype) and their
        ``labels``, overwriting the oldest rows once full; of a batch larger than ``size`` only
        its last ``size`` rows are kept.

        Args:
            embeddings: ``[N, dim]`` floating tensor on the memory's device, finite.
            labels: integer ``[N]``; negative means "no class" (a negative for every anchor).

        Raises:
            TypeError / ValueError naming the argument.
        """
        self.check_embeddings(embeddings)
        check_tensor(labels, "labels", floating=False)
        if labels.shape != (embeddings.shape[0],):
            raise ValueError(f"labels must have shape [{embeddings.shape[0]}] (one per row of "
                             f"embeddings), got {tuple(labels.shape)}")
        if labels.device != self.rows.device:
            raise ValueError(f"labels is on {labels.device} but the memory is on {self.rows.device}")
        if not bool(torch.isfinite(embeddings).all()):
            raise ValueError("embeddings contains NaN or inf: the memory would keep it for "
                             f"{self.size} rows' worth of steps")
        rows, labels = embeddings.detach()[-self.size:], labels[-self.size:]
        count = rows.shape[0]
        if count == 0:
            return
        start = int(self.next_slot)
        head = min(count, self.size - start)  # up to the end of the ring, the rest wraps
        self.rows[start:start + head] = rows[:head]
        self.row_labels[start:start + head] = labels[:head]
        self.rows[:count - head] = rows[head:]
        self.row_labels[:count - head] = labels[head:]
        self.next_slot.fill_((start + count) % self.size)
        self.filled.fill_(min(int(self.filled) + count, self.size))

    def extra_repr(self) -> str:
        return f"size={self.size}, dim={self.dim}, dtype={self.rows.dtype}, held={len(self)}"


def check_memory(memory: object) -> None:
    """Raises TypeError unless ``memory`` is None or a :class:`SupConMemory`."""
    if memory is not None and not isinstance(memory, SupConMemory):
        raise TypeError(f"memory must be a SupConMemory or None, got {type(memory).__name__}")


def memory_labels(memory_labels_held: torch.Tensor, supervised: bool) -> torch.Tensor:
    """The memory rows' labels for a call: without batch labels (SimCLR / MoCo) the batch's ids
    are its sample indices, which say nothing about memory rows, so these are negatives (-1)."""
    return memory_labels_held if supervised else torch.full_like(memory_labels_held, -1)


def supcon_loss_with_memory(features: torch.Tensor, labels: Optional[torch.Tensor],
                            memory: SupConMemory, temperature: Temperature = 0.1, *,
                            contrast_mode: ContrastMode = "all", normalize: bool = True,
                            focal_gamma: float = 0.0, reduction: Reduction = "mean",
                            backend: BackendName = "auto") -> torch.Tensor:
    """:func:`~scl_kernels.supcon_loss` of a batch whose anchors contrast against the batch and
    the rows of ``memory``, followed by enqueueing the batch's rows (all views) into ``memory``.

    The fused op runs in its single-set layout on ``[batch rows; memory rows]`` with the anchors
    the first rows (``num_anchors`` of them, ``anchor_offset`` 0): every anchor's own column is
    excluded and the memory's rows are contrast only. Their gradient is dropped (the memory is
    detached), so the loss's gradient is with respect to the batch only. Without labels the
    memory rows are negatives only and are enqueued with label -1.

    Takes :func:`~scl_kernels.supcon_loss`'s arguments, less ``contrast`` / ``contrast_labels``.
    """
    check_inputs(features, labels)
    check_options(temperature, contrast_mode, normalize, reduction, backend,
                  check_value=False)
    check_memory(memory)
    focal_gamma = check_focal_gamma(focal_gamma)
    run = resolve_backend(backend, features.device, focal_gamma).run
    temperature_value = temperature_tensor(temperature, features.device)
    layout = build_layout(features, labels, None, None, contrast_mode)
    memory.check_embeddings(layout.rows, "features")
    held_rows, held_labels = memory.contrast()
    batch_labels = layout.labels.long()
    rows = torch.cat([layout.rows, held_rows.to(layout.rows.dtype)])
    row_labels = torch.cat([batch_labels, memory_labels(held_labels, labels is not None)])
    per_anchor, num_positives = run(rows, row_labels, None, None, temperature_value,
                                    layout.num_anchors, normalize, focal_gamma=focal_gamma)
    memory.enqueue(layout.rows, batch_labels if labels is not None
                   else torch.full_like(batch_labels, -1))
    return reduce_per_anchor(per_anchor, num_positives, reduction)
