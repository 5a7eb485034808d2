"""The checks and the gold-class gather shared by the cross-entropy alternatives (FocalLoss,
SelfAdjustingDiceLoss, MixedCrossEntropyLoss): one place for their argument errors, their
``ignore_index`` and their reductions, which follow ``F.cross_entropy``'s."""
from typing import Tuple, get_args

import torch

from .._types import Reduction
from .._validation import check_tensor

CLASSIFICATION_REDUCTIONS: Tuple[str, ...] = get_args(Reduction)  # as F.cross_entropy's
IGNORE_INDEX = -100  # F.cross_entropy's default, which SupConCrossEntropyLoss's CE term uses


def check_reduction(reduction: object) -> None:
    if reduction not in CLASSIFICATION_REDUCTIONS:
        raise ValueError(f"reduction must be one of {CLASSIFICATION_REDUCTIONS}, got {reduction!r}")


def check_logits_and_labels(logits: torch.Tensor, labels: torch.Tensor) -> None:
    """``logits`` floating ``[N, C]``, ``labels`` integer ``[N]`` in ``[0, C)`` or the ignore
    index, on the same device."""
    check_tensor(logits, "logits", floating=True)
    check_tensor(labels, "labels", floating=False)
    if logits.dim() != 2:
        raise ValueError(f"logits must have shape [N, num_classes], got {tuple(logits.shape)}")
    if labels.dim() != 1 or labels.shape[0] != logits.shape[0]:
        raise ValueError(f"labels must have shape [{logits.shape[0]}] (the logits' rows), "
                         f"got {tuple(labels.shape)}")
    if labels.device != logits.device:
        raise ValueError(f"labels is on {labels.device} but logits is on {logits.device}")
    if labels.numel():
        kept = labels[labels != IGNORE_INDEX]
        if kept.numel() and (int(kept.min()) < 0 or int(kept.max()) >= logits.shape[1]):
            raise ValueError(f"labels must lie in [0, {logits.shape[1]}) or equal the ignore index "
                             f"{IGNORE_INDEX}, got values in [{int(kept.min())}, {int(kept.max())}]")


def gold_log_probabilities(logits: torch.Tensor,
                           labels: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """``(log p_y [N] in float32 or float64, kept [N] bool)``: the log-softmax of each row's gold
    class, 0 where the label is the ignore index (``kept`` False)."""
    log_probabilities = torch.log_softmax(logits.to(torch.promote_types(logits.dtype, torch.float32)),
                                          dim=1)
    kept = labels != IGNORE_INDEX
    gathered = log_probabilities.gather(1, torch.where(kept, labels, 0).unsqueeze(1)).squeeze(1)
    return torch.where(kept, gathered, torch.zeros((), dtype=gathered.dtype, device=gathered.device)), kept


def reduce_examples(per_example: torch.Tensor, kept: torch.Tensor,
                    reduction: Reduction) -> torch.Tensor:
    """Ignored rows count 0 in ``"none"`` and ``"sum"``; ``"mean"`` is over the kept rows
    (0 when none is kept, where F.cross_entropy gives NaN)."""
    if reduction == "none":
        return per_example
    total = per_example.sum()
    if reduction == "sum":
        return total
    return total / kept.sum().clamp_min(1)
