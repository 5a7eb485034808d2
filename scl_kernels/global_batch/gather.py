"""strategy="gather": every rank gathers the contrast set, then runs the fused op on its own
anchors against it (docs/DISTRIBUTED.md).

Single set: the gathered feature rows are the contrast set and this rank's anchors are its own
rows inside it, reached with the op's ``anchor_offset``: no copy brings them to the front.
Cross set: only the contrast rows are gathered; the anchors are the local feature rows.
The gather's backward returns each contrast row's gradient, summed over ranks, to its owner.
"""
from typing import Optional, Tuple

import torch
import torch.distributed as dist

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
    return per_anchor, layout.labels.new_zeros((0,))


def gathered_supcon(layout: Layout, temperature: torch.Tensor, normalize: bool, backend: Backend,
                    plan: CallPlan, group: Optional[dist.ProcessGroup],
                    graph_anchor: Optional[torch.Tensor], focal_gamma: float = 0.0,
                    memory: Optional[SupConMemory] = None,
                    supervised: bool = True) -> Tuple[torch.Tensor, torch.Tensor]:
    """(per-anchor loss of this rank's anchors, their |P(i)|) against the global contrast set.

    With a ``memory`` (single set only) its rows follow the gathered rows as contrast only,
    then the gathered batch is enqueued (with label -1 when ``supervised`` is False)."""
    if layout.contrast is None:
        features = gather_rows_with_grad(layout.rows, plan.rows, plan.rank, group, graph_anchor)
        labels = gather_rows(layout.labels, plan.rows, group)
        if memory is not None:
            held_rows, held_labels = memory.contrast()
            gathered, gathered_labels = features.detach(), labels
            features = torch.cat([features, held_rows.to(features.dtype)])
            labels = torch.cat([labels, memory_labels(held_labels, supervised)])
            memory.enqueue(gathered, gathered_labels if supervised
                           else torch.full_like(gathered_labels, -1))
        if layout.num_anchors == 0:
            return _no_anchors(features, layout, temperature)
        return backend.run(features, labels, None, None, temperature, layout.num_anchors,
                           normalize, anchor_offset=plan.offset(plan.rows),
                           focal_gamma=focal_gamma)
    contrast = gather_rows_with_grad(layout.contrast, plan.contrast_rows, plan.rank, group,
                                     graph_anchor)
    assert layout.contrast_labels is not None, "build_layout gives contrast its labels"
    contrast_labels = gather_rows(layout.contrast_labels, plan.contrast_rows, group)
    if layout.num_anchors == 0:
        return _no_anchors(contrast, layout, temperature)
    return backend.run(layout.rows, layout.labels, contrast, contrast_labels, temperature,
                       layout.num_anchors, normalize, focal_gamma=focal_gamma)
