"""FocalLoss: multi-class focal loss (Lin et al., ICCV 2017), a cross-entropy alternative."""

from typing import Optional

import torch
from torch import nn

from .._types import Reduction
from .._validation import check_non_negative, check_tensor
from ._classification_targets import (check_logits_and_labels, check_reduction,
                                      gold_log_probabilities, reduce_examples)


class FocalLoss(nn.Module):
    """Multi-class focal loss, per example ``-alpha_y * (1 - p_y)^gamma * log p_y``::

        criterion = FocalLoss(gamma=2.0)
        loss = criterion(logits, labels)        # [N, C] logits, [N] class indices

    with ``p_y`` the softmax probability of the gold class (Lin et al., "Focal Loss for Dense
    Object Detection", ICCV 2017, in its softmax form). ``(1 - p_y)^gamma`` scales down the
    examples the model already gets right, so training dwells on the hard ones; Mukhoti et al.
    (NeurIPS 2020) and, for NLP classifiers, Wang et al. (2022) use it because it also leaves
    the model better calibrated than cross-entropy. ``gamma = 0`` without ``alpha`` is
    cross-entropy.

    Labels equal to -100 (``F.cross_entropy``'s ignore index) are ignored: 0 in ``"none"`` and
    ``"sum"``, left out of ``"mean"``. The mean is over the kept examples, not normalised by the
    class weights (as in Lin et al.; ``F.cross_entropy(weight=)`` divides by the sum of the
    gold weights instead), and 0 when every label is ignored. Any other label outside ``[0, C)``
    raises a ValueError naming its value and row (on a GPU the check waits for the labels once
    a call; it is left out while a CUDA graph is captured).

    Usable alone, or as the cross-entropy term of :class:`SupConCrossEntropyLoss` and
    :class:`CoreTuningLoss` (their ``ce=`` argument).
    """

    alpha: Optional[torch.Tensor]  # a buffer

    def __init__(self, gamma: float = 2.0, alpha: Optional[torch.Tensor] = None,
                 reduction: Reduction = "mean") -> None:
        """
        Args:
            gamma: the focusing exponent, a float >= 0 (default 2.0, Lin et al.'s).
            alpha: optional class weights, a ``[C]`` floating tensor of values >= 0 (e.g.
                inverse class frequencies for an imbalanced task): example i is weighted by
                ``alpha[y_i]``. Registered as a buffer (moves with ``.to()``, saved in the
                state dict). None: every class weighs 1.
            reduction: ``"mean"`` (default), ``"sum"`` or ``"none"`` (one value per example).

        Raises:
            TypeError / ValueError naming the argument.
        """
        super().__init__()
        check_non_negative(gamma, "gamma")
        check_reduction(reduction)
        if alpha is not None:
            check_tensor(alpha, "alpha", floating=True)
            if alpha.dim() != 1 or alpha.numel() == 0:
                raise ValueError(f"alpha must be a [num_classes] tensor, got shape {tuple(alpha.shape)}")
            if not bool(torch.isfinite(alpha).all()) or bool((alpha < 0).any()):
                raise ValueError("alpha must hold finite values >= 0")
        self.gamma = float(gamma)
        self.reduction = reduction
        self.register_buffer("alpha", None if alpha is None else alpha.detach().clone())

    def forward(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """The loss of ``[N, C]`` logits against ``[N]`` integer labels (float32, or float64 for
        float64 logits)."""
        check_logits_and_labels(logits, labels)
        if self.alpha is not None and self.alpha.shape[0] != logits.shape[1]:
            raise ValueError(f"alpha has {self.alpha.shape[0]} class weights but logits has "
                             f"{logits.shape[1]} classes")
        log_p, kept = gold_log_probabilities(logits, labels)
        # 1 - p as -expm1(log p): exact for p near 1, where 1 - exp would cancel. The clamp keeps
        # the gradient of u^gamma finite (0) where p rounds to 1 and gamma < 1.
        u = (-torch.expm1(log_p)).clamp_min(torch.finfo(log_p.dtype).tiny)
        per_example = -u.pow(self.gamma) * log_p
        if self.alpha is not None:
            weights = self.alpha.to(per_example.dtype)[torch.where(kept, labels, 0)]
            per_example = per_example * weights
        return reduce_examples(per_example * kept, kept, self.reduction)

    def extra_repr(self) -> str:
        alpha = None if self.alpha is None else f"tensor of {self.alpha.shape[0]} weights"
        return f"gamma={self.gamma:g}, alpha={alpha}, reduction={self.reduction!r}"
