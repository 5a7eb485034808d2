"""SupConLoss: the global batch's supcon_loss as an nn.Module with its options fixed."""
from typing import Optional

import torch
import torch.distributed as dist

from .._types import BackendName, ContrastMode, MultiLabel, Reduction, Strategy, Temperature
from ..cross_batch_memory import SupConMemory
from ..global_batch.loss import check_distributed_options, supcon_loss
from ..nn.supcon import SupConLoss as SingleProcessSupConLoss


class SupConLoss(SingleProcessSupConLoss):
    """:func:`supcon_loss` as a module, its options fixed at construction::

        criterion = scl_kernels.distributed.SupConLoss(temperature=0.1, gradients_averaged=True)
        loss = criterion(model(x), y)   # every rank, its own x and y; then loss.backward()

    A learnable temperature passed as an ``nn.Parameter`` becomes a parameter of the module.
    """

    def __init__(self, temperature: Temperature = 0.1, *, contrast_mode: ContrastMode = "all",
                 normalize: bool = True, focal_gamma: float = 0.0, reduction: Reduction = "mean",
                 backend: BackendName = "auto", strategy: Strategy = "gather",
                 gradients_averaged: bool = False, group: Optional[dist.ProcessGroup] = None,
                 memory: Optional[SupConMemory] = None, multi_label: MultiLabel = "any") -> None:
        """Checks and stores the options (see :func:`supcon_loss`); a ``memory`` is used in
        training mode only; ``multi_label`` weighs the pairs of multi-hot labels (which need
        ``strategy="gather"``). ``group`` is the ``torch.distributed`` process group (default: the
        world), not the rows' group ids, which :meth:`forward` takes as ``groups``."""
        super().__init__(temperature, contrast_mode=contrast_mode, normalize=normalize,
                         focal_gamma=focal_gamma, reduction=reduction, backend=backend,
                         memory=memory, multi_label=multi_label)
        if memory is not None and strategy != "gather":
            raise ValueError(f"memory needs strategy='gather', got {strategy!r}: the memory "
                             "enqueues the gathered global batch, which the ring never holds")
        check_distributed_options(strategy, gradients_averaged)
        if strategy == "ring" and self.focal_gamma != 0:
            raise ValueError(f"focal_gamma={self.focal_gamma} needs strategy='gather': the ring "
                             "strategy computes SupCon's positive terms only (focal_gamma=0)")
        self.strategy = strategy
        self.gradients_averaged = gradients_averaged
        self.group = group

    def forward(self, features: torch.Tensor, labels: Optional[torch.Tensor] = None,
                contrast: Optional[torch.Tensor] = None,
                contrast_labels: Optional[torch.Tensor] = None,
                groups: Optional[torch.Tensor] = None,
                contrast_groups: Optional[torch.Tensor] = None) -> torch.Tensor:
        """The global loss of this step; every rank calls it with its local batch. ``groups``
        and ``contrast_groups`` are the local rows' group ids (known false negatives, global
        ids: see :func:`supcon_loss`), not the process group, which is the constructor's
        ``group``."""
        return supcon_loss(features, labels, self.temperature, contrast=contrast,
                           contrast_labels=contrast_labels, contrast_mode=self.contrast_mode,
                           normalize=self.normalize, focal_gamma=self.focal_gamma,
                           reduction=self.reduction, backend=self.backend, strategy=self.strategy,
                           gradients_averaged=self.gradients_averaged, group=self.group,
                           memory=self.memory if self.training else None, groups=groups,
                           contrast_groups=contrast_groups, multi_label=self.multi_label)

    def extra_repr(self) -> str:
        return (f"{super().extra_repr()}, strategy={self.strategy!r}, "
                f"gradients_averaged={self.gradients_averaged}")
