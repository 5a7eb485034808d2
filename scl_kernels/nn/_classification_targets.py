"""The checks and the gold-class gather shared by the cross-entropy alternatives (FocalLoss,
SelfAdjustingDiceLoss, MixedCrossEntropyLoss): one place for their argument errors, their
``ignore_index`` and their reductions, which follow ``F.cross_entropy``'s. The class-index check
also serves every other classification term (SupConCrossEntropyLoss, CoreTuningLoss, the
Trainer's evaluation loss), and the multi-hot check the multi-label ones (SupConCrossEntropyLoss,
the pytorch-metric-learning MultiSupConLoss drop-in)."""
from typing import Final, Literal, Optional, Tuple, get_args

import torch

from .._types import Reduction
from .._validation import check_tensor, has_values

CLASSIFICATION_REDUCTIONS: Tuple[str, ...] = get_args(Reduction)  # as F.cross_entropy's
IGNORE_INDEX = -100  # F.cross_entropy's default, which SupConCrossEntropyLoss's CE term uses

# Hugging Face's names of the two classification problems (``PretrainedConfig.problem_type``):
# class indices with cross-entropy, or multi-hot rows with binary cross-entropy.
ProblemType = Literal["single_label_classification", "multi_label_classification"]
PROBLEM_TYPES: Tuple[str, ...] = get_args(ProblemType)
SINGLE_LABEL: Final = "single_label_classification"
MULTI_LABEL: Final = "multi_label_classification"


def check_reduction(reduction: object) -> None:
    if reduction not in CLASSIFICATION_REDUCTIONS:
        raise ValueError(f"reduction must be one of {CLASSIFICATION_REDUCTIONS}, got {reduction!r}")


def check_logits_and_labels(logits: torch.Tensor, labels: torch.Tensor) -> None:
    """``logits`` floating ``[N, C]``, ``labels`` integer ``[N]`` on the same device, in
    ``[0, C)`` or the ignore index (see check_class_indices)."""
    check_tensor(logits, "logits", floating=True)
    check_tensor(labels, "labels", floating=False)
    if logits.dim() != 2:
        raise ValueError(f"logits must have shape [N, num_classes], got {tuple(logits.shape)}")
    if labels.dim() != 1 or labels.shape[0] != logits.shape[0]:
        raise ValueError(f"labels must have shape [{logits.shape[0]}] (the logits' rows), "
                         f"got {tuple(labels.shape)}")
    if labels.device != logits.device:
        raise ValueError(f"labels is on {labels.device} but logits is on {logits.device}")
    check_class_indices(labels, logits.shape[1])


def check_class_indices(labels: torch.Tensor, num_classes: int, *,
                        ignore_index: Optional[int] = IGNORE_INDEX) -> None:
    """Raises a ValueError naming the first label (value and row) that is no class of
    ``num_classes`` logits: outside ``[0, num_classes)`` and not ``ignore_index``. With
    ``ignore_index=None`` every negative label passes (for a term that reads the labels >= 0
    only).

    On an accelerator the check makes the host wait for the labels once a call, as these losses'
    checks always have: the alternative, torch's device-side assert, ends the process's use of
    the device. It is left out where values cannot be read: meta and fake tensors, and while a
    CUDA graph is captured (a replay runs no Python)."""
    if not _values_readable(labels):
        return
    bad = labels >= num_classes
    if ignore_index is None:
        allowed = f"be < {num_classes}"
    else:
        bad |= (labels < 0) & (labels != ignore_index)
        allowed = f"lie in [0, {num_classes}) or equal the ignore index {ignore_index}"
    if bool(bad.any()):
        row = int(bad.nonzero()[0, 0])
        raise ValueError(f"labels must {allowed} (logits has {num_classes} classes), "
                         f"got label {int(labels[row])} at row {row}")


def multi_hot_classes(targets: torch.Tensor, name: str = "labels") -> torch.Tensor:
    """The class sets of multi-hot ``targets``, ``[N, C]`` rows of 0 and 1 (bool, integer or
    floating: Hugging Face's multi-label targets are float), as the bool ``[N, C]`` tensor
    :func:`~scl_kernels.supcon_loss` reads. A row of zeros is "no class".

    Raises a ValueError naming the first value that is neither 0 nor 1 (a soft target has no
    class set), with its row and class; the values are read as check_class_indices reads
    labels (once a call, not where they cannot be read)."""
    if not isinstance(targets, torch.Tensor) or targets.is_complex():
        what = targets.dtype if isinstance(targets, torch.Tensor) else type(targets).__name__
        raise TypeError(f"{name} must be a tensor of multi-hot rows (bool, integer or floating), "
                        f"got {what}")
    if targets.dim() != 2 or targets.shape[1] == 0:
        raise ValueError(f"{name} as multi-hot rows must have shape [N, num_classes] with "
                         f"num_classes >= 1, got {tuple(targets.shape)}")
    if targets.dtype == torch.bool:
        return targets
    if _values_readable(targets):
        not_binary = (targets != 0) & (targets != 1)
        if bool(not_binary.any()):
            row, column = (int(index) for index in not_binary.nonzero()[0])
            raise ValueError(f"{name} as multi-hot rows must hold 0 or 1, got "
                             f"{targets[row, column].item()} at row {row}, class {column}")
    return targets != 0


def _values_readable(tensor: torch.Tensor) -> bool:
    """Whether a check may read ``tensor``'s values on the host: not for meta and fake tensors,
    nor while a CUDA graph is captured (a replay runs no Python)."""
    return has_values(tensor) and not (tensor.device.type == "cuda"
                                       and torch.cuda.is_current_stream_capturing())


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
