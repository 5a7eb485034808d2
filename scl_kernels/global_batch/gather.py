"""strategy="gather": every rank gathers the contrast set, then runs the fused op on its own
anchors against it (docs/DISTRIBUTED.md).

Single set: the gathered feature rows are the contrast set and this rank's anchors are its own
rows inside it, reached with the op's ``anchor_offset``: no copy brings them to the front.
Cross set: only the contrast rows are gathered; the anchors are the local feature rows.
The gather's backward returns each contrast row's gradient, summed over ranks, to its owner.
"""
from typing import List, Optional, Tuple

import torch
import torch.distributed as dist

from .._types import MultiLabel
from ..backends import Backend
from ..backends.fused_ops import loss_dtype
from ..cross_batch_memory import SupConMemory, memory_labels
from ..functional import Layout
from .agreement import CallPlan
from .collectives import gather_rows, gather_rows_with_grad


def _no_anchors(gathered: torch.Tensor, layout: Layout,
                temperature: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """The per-anchor outputs of a rank without anchors. They stay joined to the gather, so
    that the rank takes part in its backward (a collective), and to the (empty) rows and the
    temperature, whose gradients are then empty or 0 rather than None: under DDP, a parameter
    without a gradient on one rank would stall the others."""
    dtype = loss_dtype(layout.rows.dtype)
    per_anchor = (gathered.narrow(0, 0, 0).sum(dim=1).to(dtype)
                  + layout.rows.narrow(0, 0, 0).sum(dim=1).to(dtype) + (temperature * 0).to(dtype))
    return per_anchor, torch.zeros((0,), dtype=torch.long, device=layout.rows.device)


def _gather_ids(labels: torch.Tensor, groups: Optional[torch.Tensor], sizes: List[int],
                group: Optional[dist.ProcessGroup]) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
    """Every rank's labels (and group ids), concatenated in rank order: one all-gather for both.
    Beside int64 class ids the group ids travel as a second int64 column; beside multi-hot rows
    (uint8, a byte a class rather than int64's eight) as their int64's 8 bytes."""
    if groups is None:
        return gather_rows(labels, sizes, group), None
    if labels.dim() == 2:
        classes = labels.shape[1]
        group_bytes = groups.contiguous().view(torch.uint8).reshape(-1, groups.element_size())
        gathered = gather_rows(torch.cat([labels, group_bytes], dim=1), sizes, group)
        return gathered[:, :classes], gathered[:, classes:].contiguous().view(groups.dtype)[:, 0]
    gathered = gather_rows(torch.stack([labels, groups], dim=1), sizes, group)
    return gathered[:, 0], gathered[:, 1]


def gathered_supcon(layout: Layout, temperature: torch.Tensor, normalize: bool, backend: Backend,
                    plan: CallPlan, group: Optional[dist.ProcessGroup],
                    graph_anchor: Optional[torch.Tensor], focal_gamma: float = 0.0,
                    memory: Optional[SupConMemory] = None, supervised: bool = True,
                    multi_label: MultiLabel = "any") -> Tuple[torch.Tensor, torch.Tensor]:
    """(per-anchor loss of this rank's anchors, their |P(i)|) against the global contrast set.
    ``group`` is the process group; the rows' group ids are the layout's; ``multi_label``
    weighs the pairs of multi-hot labels.

    With a ``memory`` (single set only) its rows follow the gathered rows as contrast only,
    then the gathered batch is enqueued (with no class when ``supervised`` is False, and with
    its group ids where the call has them)."""
    if layout.contrast is None:
        features = gather_rows_with_grad(layout.rows, plan.rows, plan.rank, group, graph_anchor)
        labels, groups = _gather_ids(layout.labels, layout.groups, plan.rows, group)
        if memory is not None:
            held_rows, held_labels = memory.contrast()
            gathered, gathered_labels, gathered_groups = features.detach(), labels, groups
            features = torch.cat([features, held_rows.to(features.dtype)])
            labels = torch.cat([labels, memory_labels(held_labels, supervised).to(labels.dtype)])
            if groups is not None:
                groups = torch.cat([groups, memory.contrast_groups()])
            memory.enqueue(gathered, gathered_labels if supervised else None, gathered_groups)
        if layout.num_anchors == 0:
            return _no_anchors(features, layout, temperature)
        return backend.run(features, labels, None, None, temperature, layout.num_anchors,
                           normalize, anchor_offset=plan.offset(plan.rows),
                           focal_gamma=focal_gamma, groups=groups, multi_label=multi_label)
    contrast = gather_rows_with_grad(layout.contrast, plan.contrast_rows, plan.rank, group,
                                     graph_anchor)
    assert layout.contrast_labels is not None, "build_layout gives contrast its labels"
    contrast_labels, contrast_groups = _gather_ids(layout.contrast_labels, layout.contrast_groups,
                                                   plan.contrast_rows, group)
    if layout.num_anchors == 0:
        return _no_anchors(contrast, layout, temperature)
    return backend.run(layout.rows, layout.labels, contrast, contrast_labels, temperature,
                       layout.num_anchors, normalize, focal_gamma=focal_gamma,
                       groups=layout.groups, contrast_groups=contrast_groups,
                       multi_label=multi_label)
