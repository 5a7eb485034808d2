"""SupConLoss: supcon_loss as an nn.Module with its options fixed."""
from typing import Optional

import torch
from torch import nn

from .._docstrings import fill_arguments
from .._types import BackendName, ContrastMode, MultiLabel, Reduction, Temperature
from .._validation import check_focal_gamma, check_multi_label, check_options, has_values
from ..cross_batch_memory import SupConMemory, check_memory, supcon_loss_with_memory
from ..functional import supcon_loss


class SupConLoss(nn.Module):
    """Supervised contrastive loss as a module: :func:`supcon_loss` with its options fixed.

    The constructor takes (and checks) the options; each call takes the tensors::

        criterion = SupConLoss(temperature=0.07)
        loss = criterion(torch.stack([z1, z2], dim=1), labels)   # [B, 2, D] views, [B] labels

    A learnable temperature is an ``nn.Parameter`` passed as ``temperature``: it is then
    registered as a parameter of the module (and so seen by ``parameters()`` and optimisers).

    With a :class:`SupConMemory` (``memory=``), a call in training mode contrasts the batch's
    anchors against the batch and the memory's rows, then enqueues the batch's rows
    (:func:`~scl_kernels.cross_batch_memory.supcon_loss_with_memory`); ``groups`` then reach the
    memory's rows too, which keep the group ids they were enqueued with (-1, no group, for rows
    enqueued without). Multi-hot labels (``[B, C]``) need a memory built with
    ``num_classes=C``, whose rows' classes are weighed against the anchors' by ``multi_label``.
    In eval mode the memory is neither used nor changed.
    """

    temperature: Temperature
    memory: Optional[SupConMemory]

    @fill_arguments
    def __init__(self, temperature: Temperature = 0.1, *, contrast_mode: ContrastMode = "all",
                 normalize: bool = True, focal_gamma: float = 0.0, reduction: Reduction = "mean",
                 backend: BackendName = "auto", memory: Optional[SupConMemory] = None,
                 multi_label: MultiLabel = "any") -> None:
        """Checks and stores the options of every call.

        Args:
            {arg:temperature}
            {arg:contrast_mode}
            {arg:normalize}
            {arg:focal_gamma}
            {arg:reduction}
            {arg:backend}
            memory: a :class:`SupConMemory` of past rows to contrast against in training mode
                (a submodule: it follows ``.to()`` and the state dict), or None (default).
            {arg:multi_label}

        Raises:
            TypeError: temperature is neither a real number nor a floating-point tensor,
                normalize is not a bool, or focal_gamma is not a real number.
            ValueError: temperature is not positive and finite or is a tensor with more than a
                value; focal_gamma is negative or not finite; contrast_mode, reduction, backend
                or multi_label is not one of the names above.
        """
        super().__init__()
        check_options(temperature, contrast_mode, normalize, reduction, backend,
                      check_value=True)
        self.temperature = temperature
        self.contrast_mode = contrast_mode
        self.normalize = normalize
        self.focal_gamma = check_focal_gamma(focal_gamma)
        self.reduction = reduction
        self.backend = backend
        check_multi_label(multi_label)
        self.multi_label = multi_label
        check_memory(memory)
        self.memory = memory

    @fill_arguments
    def forward(self, features: torch.Tensor, labels: Optional[torch.Tensor] = None,
                contrast: Optional[torch.Tensor] = None,
                contrast_labels: Optional[torch.Tensor] = None,
                groups: Optional[torch.Tensor] = None,
                contrast_groups: Optional[torch.Tensor] = None) -> torch.Tensor:
        """The loss of one batch, with the options given to the constructor.

        Args:
            {arg:features}
            {arg:labels}
            {arg:contrast}
            {arg:contrast_labels}
            {arg:groups}
            {arg:contrast_groups}

        Returns:
            A 0-dim tensor for ``reduction="mean"`` / ``"sum"``, or ``[num_anchors]`` for
            ``"none"`` (0 for anchors without a positive). float32 for float16, bfloat16 and
            float32 features, float64 for float64 ones; gradients come back in the input dtype.

        Raises:
            TypeError / ValueError naming the argument (shapes, dtypes, devices, NaN or inf), as
            :func:`supcon_loss`.
        """
        if self.memory is not None and self.training:
            if contrast is not None or contrast_labels is not None or contrast_groups is not None:
                raise ValueError("contrast= cannot be combined with a memory: the memory's rows "
                                 "are the extra contrast rows (with their labels and group ids)")
            return supcon_loss_with_memory(features, labels, self.memory, self.temperature,
                                           contrast_mode=self.contrast_mode,
                                           normalize=self.normalize, focal_gamma=self.focal_gamma,
                                           reduction=self.reduction, backend=self.backend,
                                           groups=groups, multi_label=self.multi_label)
        return supcon_loss(features, labels, self.temperature, contrast=contrast,
                           contrast_labels=contrast_labels, contrast_mode=self.contrast_mode,
                           normalize=self.normalize, focal_gamma=self.focal_gamma,
                           reduction=self.reduction, backend=self.backend, groups=groups,
                           contrast_groups=contrast_groups, multi_label=self.multi_label)

    def extra_repr(self) -> str:
        temperature: object = self.temperature
        if isinstance(temperature, torch.Tensor):  # one line, not the tensor's own repr
            value = f"{float(temperature.detach()):g}" if has_values(temperature) else "..."
            kind = "Parameter" if isinstance(temperature, nn.Parameter) else "tensor"
            temperature = f"{kind}({value})"
        focal = f", focal_gamma={self.focal_gamma:g}" if self.focal_gamma else ""
        # Shown where it is not the default, as focal_gamma: it is read for multi-hot labels only.
        rule = f", multi_label={self.multi_label!r}" if self.multi_label != "any" else ""
        return (f"temperature={temperature}, contrast_mode={self.contrast_mode!r}, "
                f"normalize={self.normalize}{focal}, reduction={self.reduction!r}, "
                f"backend={self.backend!r}{rule}")
