"""The training objectives the command line compares (``--objectives``): their names, their
settings and the loss module each one trains with, called as ``criterion(logits, embeddings,
labels)``."""
from dataclasses import dataclass
from typing import Optional

from .data import InputError

# name on the command line -> the name of its results (the arm)
OBJECTIVES = {"ce": "CE", "scl": "CE+SCL", "core": "Core", "focal": "Focal", "dice": "Dice",
              "mixed-ce": "MixedCE"}
CONTRASTIVE_OBJECTIVES = ("scl", "core")  # need two examples of a class in a batch
MEMORY_OBJECTIVES = ("scl",)  # the objectives that can contrast against a cross-batch memory


@dataclass(frozen=True)
class ObjectiveOptions:
    """The losses' settings, shared by every run of a comparison.

    Attributes:
        lam: SCL's weight in ``scl``, ``(1 - lam) * CE + lam * SCL``.
        temperature: the contrastive temperature of ``scl`` and ``core``.
        scl_reduction: ``"mean"`` or ``"sum"`` over anchors in ``scl``.
        label_smoothing: torch's label smoothing of the cross-entropy of ``ce``, ``scl`` and
            ``core`` (its CE and mixed CE).
        focal_contrastive_gamma: the focal exponent of the contrastive term; None: 0 (plain
            SupCon) for ``scl``, 1 (the paper's) for ``core``.
        focal_gamma: :class:`~scl_kernels.nn.FocalLoss`'s gamma (``focal``).
        core_lam: the contrastive weight of ``core`` (:class:`~scl_kernels.nn.CoreTuningLoss`).
        mixup_alpha: ``core``'s Beta(alpha, alpha) mixing parameter.
        dice_alpha, dice_smoothing: :class:`~scl_kernels.nn.SelfAdjustingDiceLoss`'s (``dice``).
        mixed_ce_final_weight, mixed_ce_schedule: :class:`~scl_kernels.nn.MixedCrossEntropyLoss`'s
            gold weight at the end of training and the schedule to it (``mixed-ce``).
        memory_size: rows of a cross-batch memory (:class:`~scl_kernels.nn.SupConMemory`) that
            ``scl``'s contrastive term also contrasts against; 0 (default): none. Only for the
            objectives of :data:`MEMORY_OBJECTIVES`.
    """
    lam: float = 0.9
    temperature: float = 0.3
    scl_reduction: str = "mean"
    label_smoothing: float = 0.0
    focal_contrastive_gamma: Optional[float] = None
    focal_gamma: float = 2.0
    core_lam: float = 0.3
    mixup_alpha: float = 1.0
    dice_alpha: float = 1.0
    dice_smoothing: float = 1.0
    mixed_ce_final_weight: float = 0.5
    mixed_ce_schedule: str = "linear"
    memory_size: int = 0

    def contrastive_gamma(self, objective):
        if self.focal_contrastive_gamma is not None:
            return self.focal_contrastive_gamma
        return 1.0 if objective == "core" else 0.0


def parse_objectives(text):
    """``"ce,scl,core"`` -> ``("ce", "scl", "core")``; raises InputError for an unknown,
    repeated or missing name."""
    names = tuple(part.strip() for part in text.split(",") if part.strip())
    if not names:
        raise InputError(f"--objectives needs at least one of {', '.join(OBJECTIVES)}")
    for name in names:
        if name not in OBJECTIVES:
            raise InputError(f"--objectives: unknown objective {name!r}; choose from "
                             f"{', '.join(OBJECTIVES)}")
    if len(set(names)) != len(names):
        raise InputError(f"--objectives names an objective twice: {text!r}")
    return names


def describe(objective, options):
    """The objective and its settings, for the results table: e.g. ``CE+SCL (λ=0.9, τ=0.3)``."""
    smoothing = f", smoothing {options.label_smoothing:g}" if options.label_smoothing else ""
    gamma = options.contrastive_gamma(objective)
    focal = f", γ={gamma:g}" if gamma else ""
    memory = f", memory {options.memory_size}" if options.memory_size else ""
    settings = {
        "ce": f"λ=0{smoothing}",
        "scl": f"λ={options.lam:g}, τ={options.temperature:g}{focal}{memory}{smoothing}",
        "core": f"λ={options.core_lam:g}, τ={options.temperature:g}{focal}, "
                f"mixup α={options.mixup_alpha:g}{smoothing}",
        "focal": f"γ={options.focal_gamma:g}",
        "dice": f"α={options.dice_alpha:g}, smoothing {options.dice_smoothing:g}",
        "mixed-ce": f"gold weight 1→{options.mixed_ce_final_weight:g}, {options.mixed_ce_schedule}",
    }[objective]
    return f"{OBJECTIVES[objective]} ({settings})"


def _memory(size, model):
    """A memory of ``size`` rows of the model's hidden size, on its device; None for size 0.
    Every kind of embedding (first token, token mean, the head's dense layer) has that size."""
    if not size:
        return None
    from ..nn import SupConMemory

    dim = getattr(getattr(model, "config", None), "hidden_size", None)
    if not isinstance(dim, int):
        raise InputError("a cross-batch memory needs the embeddings' size, read from "
                         "model.config.hidden_size, which this model does not have")
    return SupConMemory(size, dim, device=next(model.parameters()).device)


def build_criterion(objective, options, *, model, embedding, total_steps, seed,
                    distributed=False, strategy="gather"):
    """The loss module of ``objective`` for one run.

    Args:
        objective: a name of :data:`OBJECTIVES`.
        options: :class:`ObjectiveOptions`.
        model: the ``*ForSequenceClassification`` model (``core``'s classifier of mixed rows is
            its head).
        embedding: the kind of embedding the loss sees (``core`` needs the head's input).
        total_steps: the run's optimiser steps (``mixed-ce``'s schedule length).
        seed: the run's seed (``core``'s mixing draws).
        distributed, strategy: SCL over the ranks' global batch (not for ``core``).

    Raises:
        InputError: ``options.memory_size`` is set for an objective without SCL's term.
    """
    # Imported here: the command line's --help and checks stay free of the loss modules' imports.
    from ..nn import (CoreTuningLoss, FocalLoss, MixedCrossEntropyLoss, SelfAdjustingDiceLoss,
                      SupConCrossEntropyLoss)

    if options.memory_size and objective not in MEMORY_OBJECTIVES:
        raise InputError(f"a cross-batch memory (memory_size={options.memory_size}) applies to "
                         f"the objectives {', '.join(MEMORY_OBJECTIVES)} only, not {objective!r}")
    if objective == "core":
        from ..integrations.embeddings import classification_head

        return CoreTuningLoss(classification_head(model, embedding), lam=options.core_lam,
                              temperature=options.temperature,
                              focal_gamma=options.contrastive_gamma("core"),
                              mixup_alpha=options.mixup_alpha,
                              label_smoothing=options.label_smoothing, seed=seed)
    common = dict(distributed=distributed, strategy=strategy)
    if objective in ("ce", "scl"):
        lam = options.lam if objective == "scl" else 0.0
        return SupConCrossEntropyLoss(lam, options.temperature, scl_reduction=options.scl_reduction,
                                      label_smoothing=options.label_smoothing,
                                      focal_gamma=options.contrastive_gamma(objective),
                                      memory=_memory(options.memory_size, model), **common)
    ce = {"focal": lambda: FocalLoss(options.focal_gamma),
          "dice": lambda: SelfAdjustingDiceLoss(options.dice_alpha, options.dice_smoothing),
          "mixed-ce": lambda: MixedCrossEntropyLoss(max(total_steps, 1),
                                                    options.mixed_ce_final_weight,
                                                    options.mixed_ce_schedule)}[objective]()
    return SupConCrossEntropyLoss(0.0, options.temperature, ce=ce, **common)
