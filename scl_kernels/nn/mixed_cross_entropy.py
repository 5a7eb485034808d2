"""MixedCrossEntropyLoss: mixed cross-entropy (Li & Lu, ICML 2021), cross-entropy against the gold
label mixed with cross-entropy against the model's own prediction, the gold weight annealed."""
import math
from numbers import Real
from typing import Literal, Optional, Tuple, cast, get_args

import torch
from torch import nn

from .._types import Reduction
from ._classification_targets import (IGNORE_INDEX, check_logits_and_labels, check_reduction,
                                      gold_log_probabilities, reduce_examples)

Schedule = Literal["linear", "cosine"]
SCHEDULES: Tuple[str, ...] = get_args(Schedule)


class MixedCrossEntropyLoss(nn.Module):
    """Mixed cross-entropy (Li and Lu, "Mixed Cross Entropy Loss for Neural Machine
    Translation", ICML 2021), per example::

        -w(t) * log p_y  -  (1 - w(t)) * log p_yhat,      yhat = argmax_c logits_c (no gradient)

    Cross-entropy against the gold label ``y`` mixed with cross-entropy against the model's own
    most likely class ``yhat``. Where the model already predicts ``y`` the two coincide; where
    it does not, the second term relaxes the one-to-one target (the paper's motivation: several
    outputs can be right), which also softens over-confident fitting of noisy labels.

    **The schedule** of the gold weight ``w`` is an argument: ``w(0) = 1`` (plain cross-entropy
    while the model's own predictions are still poor) falling to ``final_weight`` at
    ``total_steps`` and staying there:

    * ``"linear"`` (default): ``w(t) = final + (1 - final) * (1 - s)``, ``s = min(t / total_steps, 1)``;
    * ``"cosine"``: ``w(t) = final + (1 - final) * (1 + cos(pi * s)) / 2``.

    The paper anneals the gold weight with training time for translation; its exact shape and
    end point there are NMT settings, so both are left to the caller here.

    **The step** ``t`` is the buffer ``step_count`` (saved in the state dict, so a resumed run
    carries on where it stopped). With ``auto_step=True`` (default) every call in training mode
    (``module.train()``) with gradients enabled advances it by one after computing the loss;
    calls in ``eval()`` mode or under ``torch.no_grad()`` (logging, evaluation) do not: call
    the loss once per optimiser step. With ``auto_step=False`` it advances
    only on :meth:`step` (e.g. once per optimiser step under gradient accumulation).

    Labels equal to -100 are ignored and other labels outside ``[0, C)`` raise, as
    in :class:`FocalLoss`.
    """

    step_count: torch.Tensor  # a buffer

    def __init__(self, total_steps: int, final_weight: float = 0.5,
                 schedule: Schedule = "linear", *, auto_step: bool = True,
                 reduction: Reduction = "mean") -> None:
        """
        Args:
            total_steps: the step at which the gold weight reaches ``final_weight``, a positive
                int (e.g. the run's number of optimiser steps).
            final_weight: the gold weight from ``total_steps`` on, in [0, 1] (default 0.5; 1 is
                plain cross-entropy throughout).
            schedule: ``"linear"`` (default) or ``"cosine"``, see above.
            auto_step: advance the step on every call in training mode (default) or only on
                :meth:`step`.
            reduction: ``"mean"`` (default), ``"sum"`` or ``"none"``.

        Raises:
            TypeError / ValueError naming the argument.
        """
        super().__init__()
        if isinstance(total_steps, bool) or not isinstance(total_steps, int):
            raise TypeError(f"total_steps must be an int, got {type(total_steps).__name__}")
        if total_steps < 1:
            raise ValueError(f"total_steps must be positive, got {total_steps}")
        if isinstance(final_weight, bool) or not isinstance(final_weight, Real):
            raise TypeError(f"final_weight must be a float in [0, 1], got {type(final_weight).__name__}")
        # typeshed's numbers.Real declares no comparisons: a real number compares as a float does.
        if not (math.isfinite(final_weight) and 0.0 <= cast(float, final_weight) <= 1.0):
            raise ValueError(f"final_weight must be in [0, 1], got {final_weight}")
        if schedule not in SCHEDULES:
            raise ValueError(f"schedule must be one of {SCHEDULES}, got {schedule!r}")
        if not isinstance(auto_step, bool):
            raise TypeError(f"auto_step must be a bool, got {type(auto_step).__name__}")
        check_reduction(reduction)
        # The attributes' types, declared (as the constructor's signature gives them).
        self.total_steps: int = total_steps
        self.final_weight: float = float(final_weight)
        self.schedule: Schedule = schedule
        self.auto_step: bool = auto_step
        self.reduction: Reduction = reduction
        self.register_buffer("step_count", torch.zeros((), dtype=torch.long))

    def gold_weight(self, step: Optional[int] = None) -> float:
        """``w(t)`` at ``step`` (default: the current step)."""
        step = int(self.step_count) if step is None else step
        progress = min(step / self.total_steps, 1.0)
        remaining = (1.0 - progress if self.schedule == "linear"
                     else 0.5 * (1.0 + math.cos(math.pi * progress)))
        return self.final_weight + (1.0 - self.final_weight) * remaining

    def step(self) -> None:
        """Advances the schedule by one step."""
        self.step_count += 1

    def forward(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """The loss of ``[N, C]`` logits against ``[N]`` integer labels at the current step
        (then, in training mode with ``auto_step``, the step advances)."""
        check_logits_and_labels(logits, labels)
        weight = self.gold_weight()
        log_p_gold, kept = gold_log_probabilities(logits, labels)
        # The model's own class: the same rows are ignored, so that both terms cover one set.
        predicted = torch.where(kept, logits.detach().argmax(dim=1), IGNORE_INDEX)
        log_p_predicted, _ = gold_log_probabilities(logits, predicted)
        per_example = -(weight * log_p_gold + (1.0 - weight) * log_p_predicted)
        if self.auto_step and self.training and torch.is_grad_enabled():
            self.step()
        return reduce_examples(per_example, kept, self.reduction)

    def extra_repr(self) -> str:
        return (f"total_steps={self.total_steps}, final_weight={self.final_weight:g}, "
                f"schedule={self.schedule!r}, auto_step={self.auto_step}, "
                f"reduction={self.reduction!r}, step={int(self.step_count)}")
