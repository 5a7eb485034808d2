"""SelfAdjustingDiceLoss: the self-adjusting dice loss of Li et al. (ACL 2020), a cross-entropy
alternative aimed at F1 on imbalanced tasks."""
import torch
from torch import nn

from .._types import Reduction
from .._validation import check_non_negative
from ._classification_targets import (check_logits_and_labels, check_reduction,
                                      gold_log_probabilities, reduce_examples)


class SelfAdjustingDiceLoss(nn.Module):
    """Self-adjusting dice loss (Li et al., "Dice Loss for Data-imbalanced NLP Tasks", ACL
    2020), per example::

        1 - (2 * (1 - p)^alpha * p * y + smoothing) / ((1 - p)^alpha * p + y + smoothing)

    **Variant:** the gold-class form. The paper writes the per-example dice coefficient for the
    probability ``p_i1`` of the positive class and its 0/1 target ``y_i1``; here ``p`` is the
    softmax probability of the example's gold class and ``y = 1``, which turns the binary
    formula into a multi-class loss (one term per example, no sum over the other classes). The
    factor ``(1 - p)^alpha`` is the paper's self-adjustment: as an example becomes easy
    (``p -> 1``) its weight falls, so the many easy negatives of an imbalanced set stop
    dominating; ``smoothing`` is the paper's gamma (the Laplace term in both numerator and
    denominator). Dice optimises an F1-like overlap rather than likelihood: reach for it when
    the score is F1 on skewed classes (the paper's NER, MRC and paraphrase tasks), not when
    calibrated probabilities matter.

    **Where its minimum is.** The dice coefficient above grows with ``(1 - p)^alpha * p``, which
    is largest at ``p = 1 / (1 + alpha)``: trained on this loss alone, the gold probability is
    pulled to 0.5 at ``alpha = 1``, not to 1 (the offline demo measured chance accuracy,
    docs/FINETUNING.md). Only ``alpha = 0`` (plain smoothed dice) has its minimum at ``p = 1``;
    with ``alpha > 0`` use it beside cross-entropy, as a reweighting, rather than alone.

    Labels equal to -100 are ignored and other labels outside ``[0, C)`` raise, as
    in :class:`FocalLoss`; the default reduction is the mean over the kept examples.
    """

    def __init__(self, alpha: float = 1.0, smoothing: float = 1.0,
                 reduction: Reduction = "mean") -> None:
        """
        Args:
            alpha: the self-adjusting exponent, a float >= 0 (default 1.0, the paper's DSC
                loss; 0 is the plain smoothed dice coefficient).
            smoothing: the Laplace smoothing term, a float >= 0 (default 1.0, the paper's
                gamma).
            reduction: ``"mean"`` (default), ``"sum"`` or ``"none"``.

        Raises:
            TypeError / ValueError naming the argument.
        """
        super().__init__()
        check_non_negative(alpha, "alpha")
        check_non_negative(smoothing, "smoothing")
        check_reduction(reduction)
        self.alpha = float(alpha)
        self.smoothing = float(smoothing)
        self.reduction = reduction

    def forward(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """The loss of ``[N, C]`` logits against ``[N]`` integer labels."""
        check_logits_and_labels(logits, labels)
        log_p, kept = gold_log_probabilities(logits, labels)
        p = log_p.exp()
        # (1 - p) as -expm1(log p) (exact near p = 1), clamped as in FocalLoss so that the
        # gradient of the power stays finite where p rounds to 1 and alpha < 1.
        weighted = (-torch.expm1(log_p)).clamp_min(torch.finfo(p.dtype).tiny).pow(self.alpha) * p
        dice = (2.0 * weighted + self.smoothing) / (weighted + 1.0 + self.smoothing)
        return reduce_examples((1.0 - dice) * kept, kept, self.reduction)

    def extra_repr(self) -> str:
        return f"alpha={self.alpha:g}, smoothing={self.smoothing:g}, reduction={self.reduction!r}"
