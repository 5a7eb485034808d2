"""One small all-gather per call, before any work: every rank learns every rank's batch sizes,
and all ranks check together that they were called alike.

Every rank sees the same table, so a disagreement raises the same error on every rank instead of
leaving some of them waiting in a collective that the others never join.
"""
from dataclasses import dataclass
from typing import Dict, List, Mapping, Optional, Tuple, get_args

import torch
import torch.distributed as dist

from .._types import Strategy, Temperature
from .._validation import CONTRAST_MODES, MULTI_LABEL_RULES, REDUCTIONS
from ..backends.reference import temperature_value_error
from .collectives import all_gather_single

DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)

# The columns of the exchanged table. "label_classes" is C of multi-hot labels, 0 for class ids
# (or none); "labels_valid" whether multi-hot labels hold only 0 / 1.
COLUMNS = ("failed", "samples", "rows", "contrast_rows", "requires_grad", "views", "dim", "dtype",
           "labels", "contrast", "contrast_labels", "groups", "contrast_groups", "label_classes",
           "contrast_mode", "normalize", "reduction", "strategy", "gradients_averaged",
           "focal_gamma", "multi_label", "finite", "labels_valid", "temperature")
# Every rank's own (sizes, and the value checks, which name the ranks that fail them); the
# others must be equal on every rank.
PER_RANK = ("failed", "samples", "rows", "contrast_rows", "requires_grad", "finite",
            "labels_valid")
AGREED = tuple(column for column in COLUMNS if column not in PER_RANK)
STRATEGIES: Tuple[str, ...] = get_args(Strategy)
# The options that are one of a few names travel as the name's index.
CHOICES: Dict[str, Tuple[str, ...]] = {"contrast_mode": CONTRAST_MODES, "reduction": REDUCTIONS,
                                       "strategy": STRATEGIES, "multi_label": MULTI_LABEL_RULES}


@dataclass(frozen=True)
class CallPlan:
    """What every rank holds, in rank order."""
    rank: int
    world: int
    samples: List[int]  # B (or N for [N, D] features) per rank
    rows: List[int]  # flattened feature rows per rank
    contrast_rows: List[int]  # contrast rows per rank (0 without contrast)
    any_requires_grad: bool  # whether some rank builds a graph, so every rank must join backward

    def offset(self, sizes: List[int]) -> int:
        """Where this rank's block of ``sizes`` starts in the concatenation over ranks."""
        return sum(sizes[: self.rank])


_GIVEN_OR_NONE = ("labels", "contrast", "contrast_labels", "groups", "contrast_groups")
_FLAGS = ("normalize", "gradients_averaged")


def _describe(column: str, value: float) -> str:
    if column == "dtype":
        return str(DTYPES[int(value)])
    if column in _GIVEN_OR_NONE:
        return "given" if value else "None"
    if column in _FLAGS:
        return str(bool(value))
    if column in CHOICES:
        return repr(CHOICES[column][int(value)])
    if column == "views":
        return "[N, D] features" if value == 0 else f"{int(value)} views"
    if column == "label_classes":
        return "class ids" if value == 0 else f"multi-hot rows of {int(value)} classes"
    if column in ("temperature", "focal_gamma"):
        return repr(value)
    return str(int(value))


def _exchange_device(features: object, group: Optional[dist.ProcessGroup]) -> torch.device:
    if isinstance(features, torch.Tensor):
        return features.device
    return torch.device("cuda", torch.cuda.current_device()) if dist.get_backend(group) == "nccl" \
        else torch.device("cpu")


def _multi_hot_valid(labels: Optional[torch.Tensor],
                     contrast_labels: Optional[torch.Tensor]) -> torch.Tensor:
    """Whether the multi-hot labels hold only 0 / 1 (a 0-dim bool on their device; True for
    class ids). Checked here rather than left to the op, which sees a cross set's anchor labels
    on their own rank only: a rank raising alone there would leave the others waiting."""
    valid = torch.ones((), dtype=torch.bool)
    for given in (labels, contrast_labels):
        if given is not None and given.dim() == 2 and given.dtype != torch.bool:
            valid = valid.to(given.device) & ((given == 0) | (given == 1)).all()
    return valid


def _describe_call(features: torch.Tensor, rows: torch.Tensor, labels: Optional[torch.Tensor],
                   contrast: Optional[torch.Tensor], contrast_labels: Optional[torch.Tensor],
                   groups: Optional[torch.Tensor], contrast_groups: Optional[torch.Tensor],
                   temperature: Temperature, options: Mapping[str, object]) -> torch.Tensor:
    """This rank's row of the table, on the features' device: no host synchronisation here."""
    requires_grad = features.requires_grad or (contrast is not None and contrast.requires_grad) \
        or (isinstance(temperature, torch.Tensor) and temperature.requires_grad)
    described = [
        0, features.shape[0], rows.shape[0], 0 if contrast is None else contrast.shape[0],
        requires_grad, 0 if features.dim() == 2 else features.shape[1], features.shape[-1],
        DTYPES.index(features.dtype), labels is not None, contrast is not None,
        contrast_labels is not None, groups is not None, contrast_groups is not None,
        labels.shape[1] if labels is not None and labels.dim() == 2 else 0,
        *(CHOICES[name].index(options[name]) if name in CHOICES else options[name]
          for name in ("contrast_mode", "normalize", "reduction", "strategy",
                       "gradients_averaged", "focal_gamma", "multi_label"))]
    device = features.device
    finite = torch.isfinite(rows).all()
    if contrast is not None:
        finite = finite & torch.isfinite(contrast).all()
    temperature_row = (temperature.detach().reshape(1) if isinstance(temperature, torch.Tensor)
                       else torch.tensor([float(temperature)]))
    return torch.cat([torch.tensor(described, dtype=torch.float64).to(device),
                      finite.reshape(1).to(torch.float64),
                      _multi_hot_valid(labels, contrast_labels).to(device).reshape(1)
                      .to(torch.float64),
                      temperature_row.to(device=device, dtype=torch.float64)])


def agree_on_call(local_error: Optional[Exception], features: torch.Tensor,
                  rows: Optional[torch.Tensor], labels: Optional[torch.Tensor],
                  contrast: Optional[torch.Tensor], contrast_labels: Optional[torch.Tensor],
                  groups: Optional[torch.Tensor], contrast_groups: Optional[torch.Tensor],
                  temperature: Temperature, options: Mapping[str, object],
                  group: Optional[dist.ProcessGroup]) -> CallPlan:
    """Exchanges the sizes and the call's options, and raises on every rank if a rank rejected
    its inputs (``local_error``, re-raised there), holds NaN or inf or multi-hot labels other
    than 0 / 1, or disagrees with the others (on whether labels, contrast, contrast_labels,
    groups and contrast_groups are given, and on the labels' form, class ids or multi-hot rows
    of one C, too).

    ``options`` maps contrast_mode, normalize, reduction, strategy, gradients_averaged,
    focal_gamma and multi_label to their values. ``groups`` / ``contrast_groups`` are the rows'
    group ids (known false negatives); ``group`` is the torch.distributed process group.
    """
    world = dist.get_world_size(group)
    if local_error is None:
        assert rows is not None, "a rank that accepted its inputs has laid its rows out"
        local = _describe_call(features, rows, labels, contrast, contrast_labels, groups,
                               contrast_groups, temperature, options)
    else:
        local = torch.zeros(len(COLUMNS), dtype=torch.float64,
                            device=_exchange_device(features, group))
        local[0] = 1
    table = local.new_empty((world * len(COLUMNS),))
    all_gather_single(table, local, group=group)
    rows_of_table: List[List[float]] = table.view(world, len(COLUMNS)).tolist()
    failed = [r for r, row in enumerate(rows_of_table) if row[0]]
    if local_error is not None:
        raise local_error
    if failed:
        raise ValueError(f"scl_kernels.distributed: rank(s) {failed} rejected their inputs (their "
                         "error says why); no rank computed the loss")
    column = {name: [row[i] for row in rows_of_table] for i, name in enumerate(COLUMNS)}
    for name in AGREED:
        values = column[name]
        if any(v != values[0] for v in values):
            listed = ", ".join(f"rank {r}: {_describe(name, v)}" for r, v in enumerate(values))
            raise ValueError(f"scl_kernels.distributed: the ranks disagree on {name} ({listed}); "
                             "every rank must call the loss with the same options, feature "
                             "dimension and dtype")
    not_finite = [r for r, finite in enumerate(column["finite"]) if not finite]
    if not_finite:
        raise ValueError(f"features or contrast contains NaN or inf on rank(s) {not_finite}")
    invalid_labels = [r for r, valid in enumerate(column["labels_valid"]) if not valid]
    if invalid_labels:
        raise ValueError(f"multi-hot labels must hold 0 or 1, and do not on rank(s) "
                         f"{invalid_labels}")
    value = column["temperature"][0]
    if not (value > 0 and value != float("inf")):
        raise temperature_value_error(value)
    sizes = {name: [int(v) for v in column[name]]
             for name in ("samples", "rows", "contrast_rows", "requires_grad")}
    return CallPlan(dist.get_rank(group), world, sizes["samples"], sizes["rows"],
                    sizes["contrast_rows"], any(sizes["requires_grad"]))
