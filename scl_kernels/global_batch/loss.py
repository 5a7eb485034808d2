"""supcon_loss over a batch spread across the ranks of a torch.distributed group."""
from typing import Any, Callable, Dict, Optional, Tuple, Union

import torch
import torch.distributed as dist

from .._types import BackendName, ContrastMode, MultiLabel, Reduction, Strategy, Temperature
from .._validation import (check_focal_gamma, check_inputs, check_multi_label, check_options,
                          temperature_tensor)
from ..backends import REGISTRY, resolve_backend
from ..cross_batch_memory import SupConMemory, check_memory
from ..functional import Layout, build_layout
from .agreement import STRATEGIES, CallPlan, agree_on_call
from .gather import gathered_supcon
from .ring import ring_supcon

# (per-anchor loss, |P(i)|) of this rank's anchors; the gather strategy takes keywords more.
_STRATEGY_FUNCTIONS: Dict[str, Callable[..., Tuple[torch.Tensor, torch.Tensor]]] = {
    "gather": gathered_supcon, "ring": ring_supcon}

NOT_INITIALISED = ("scl_kernels.distributed needs an initialised process group: call "
                   "torch.distributed.init_process_group() first (torchrun sets the environment "
                   "it reads), or use scl_kernels.supcon_loss in a single process")


def check_distributed_options(strategy: object, gradients_averaged: object) -> None:
    if strategy not in STRATEGIES:
        raise ValueError(f"strategy must be one of {STRATEGIES}, got {strategy!r}")
    if not isinstance(gradients_averaged, bool):
        raise TypeError(f"gradients_averaged must be a bool, got {type(gradients_averaged).__name__}")


def _check_group(group: Optional[dist.ProcessGroup], features: object) -> None:
    if not (dist.is_available() and dist.is_initialized()):
        raise RuntimeError(NOT_INITIALISED)
    if dist.get_rank(group) < 0:
        raise ValueError("this process is not a member of the process group passed as group=")
    if (dist.get_backend(group) == "nccl" and isinstance(features, torch.Tensor)
            and features.device.type != "cuda"):
        raise ValueError(f"the process group uses NCCL, which moves CUDA tensors only, but features "
                         f"is on {features.device}; use a gloo group for CPU tensors")


def _as_int64(ids: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    return None if ids is None else ids.long()


def _as_sent(labels: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    """Labels in the dtype every rank sends: int64 class ids, or uint8 multi-hot rows (their
    values checked to be 0 / 1 by the agreement)."""
    if labels is None:
        return None
    return labels.long() if labels.dim() == 1 else labels.to(torch.uint8)


def _global_ids(layout: Layout, plan: CallPlan, implicit_labels: bool) -> Layout:
    """Without labels, the sample ids start at this rank's first sample (single set) or first
    anchor row (cross set), so that they are unique in the global batch. Labels and group ids
    take one dtype on every rank, which must send the same (:func:`_as_sent`; group ids int64);
    group ids are the user's global ids and stay as they are."""
    labels, contrast_labels = _as_sent(layout.labels), _as_sent(layout.contrast_labels)
    assert labels is not None, "build_layout gives every row a label"
    if implicit_labels:
        first = plan.offset(plan.samples if contrast_labels is None else plan.rows)
        labels = labels + first
        if contrast_labels is not None:
            contrast_labels = torch.where(contrast_labels >= 0, contrast_labels + first,
                                          contrast_labels)
    return layout._replace(labels=labels, contrast_labels=contrast_labels,
                           groups=_as_int64(layout.groups),
                           contrast_groups=_as_int64(layout.contrast_groups))


def _check_global_sizes(plan: CallPlan, contrast: Optional[torch.Tensor]) -> None:
    if sum(plan.rows) == 0:
        raise ValueError("features has no rows on any rank: the global batch is empty")
    if contrast is not None and sum(plan.contrast_rows) == 0:
        raise ValueError("contrast has no rows on any rank")


def _global_reduction(per_anchor: torch.Tensor, num_positives: torch.Tensor,
                      reduction: Reduction, plan: CallPlan, group: Optional[dist.ProcessGroup],
                      gradients_averaged: bool) -> torch.Tensor:
    """The global loss's value on every rank; its gradient is this rank's share (times the world
    size when DDP will average the parameter gradients)."""
    scale = plan.world if gradients_averaged else 1
    if reduction == "none":
        return per_anchor if scale == 1 else per_anchor * scale + (per_anchor * (1 - scale)).detach()
    local_sum = per_anchor.sum()
    totals = torch.stack([local_sum.detach().to(torch.float64),
                          torch.count_nonzero(num_positives).to(torch.float64)])
    dist.all_reduce(totals, group=group)
    denominator: Union[float, torch.Tensor] = 1.0 if reduction == "sum" else totals[1].clamp_min(1)
    share = local_sum * scale / denominator
    value = (totals[0] / denominator).to(per_anchor.dtype)
    return share + (value - share).detach()


def supcon_loss(features: torch.Tensor, labels: Optional[torch.Tensor] = None,
                temperature: Temperature = 0.1, *, contrast: Optional[torch.Tensor] = None,
                contrast_labels: Optional[torch.Tensor] = None, contrast_mode: ContrastMode = "all",
                normalize: bool = True, focal_gamma: float = 0.0, reduction: Reduction = "mean",
                backend: BackendName = "auto", strategy: Strategy = "gather",
                gradients_averaged: bool = False, group: Optional[dist.ProcessGroup] = None,
                memory: Optional[SupConMemory] = None, groups: Optional[torch.Tensor] = None,
                contrast_groups: Optional[torch.Tensor] = None,
                multi_label: MultiLabel = "any") -> torch.Tensor:
    """Supervised contrastive loss of the global batch: the concatenation, in rank order, of
    every rank's local batch. Each rank passes its own rows; the ranks must all call it.

    Takes the arguments of :func:`scl_kernels.supcon_loss`, with the same meaning applied to the
    global batch, and:

    Args:
        strategy: ``"gather"`` (default): each rank gathers the global contrast set,
            ``O(N_global * D)`` memory per rank, and runs the fused op on its own anchors
            against it. ``"ring"``: the contrast set passes around the ranks in blocks, so no
            rank holds more than its rows and two blocks; same results, more messages
            (docs/DISTRIBUTED.md has the memory and communication arithmetic). The focal loss
            (``focal_gamma > 0``) needs ``"gather"``: its walk over positive pairs needs every
            column of the anchor's class at once; so do ``groups``, which the ring's block calls
            cannot mask, and multi-hot labels, whose pair weights do not reduce to the ring's
            per-class sums.
        gradients_averaged: ``True`` when the parameters' gradients are averaged over the ranks
            after backward, as ``DistributedDataParallel`` does: the gradient is then multiplied
            by the world size, so that the average is the gradient of the global loss. With
            ``False`` (default) every rank receives exactly the global loss's gradient for its
            own rows.
        group: the ``torch.distributed`` process group the ranks belong to (default: the
            world); not to be confused with ``groups``.
        memory: a :class:`~scl_kernels.nn.SupConMemory` (or None): this rank's anchors also
            contrast against its rows, then the gathered global batch is enqueued into it, so
            memories that start alike stay identical on every rank. Needs ``"gather"`` and no
            ``contrast``. With ``groups`` the memory's rows are masked by the group ids they were
            enqueued with, and the global batch is enqueued with its own. Multi-hot labels need
            a memory built with their ``num_classes``.
        groups: this rank's samples' group ids (known false negatives, as in
            :func:`scl_kernels.supcon_loss`), integer ``[b_r]``, negative for no group; not the
            process group (``group``). The ids are global: the same id on two ranks is one group,
            whose non-positive pairs leave the denominator across ranks too. Every rank gives
            them, or none does.
        contrast_groups: with ``contrast``, this rank's contrast rows' group ids, given with
            ``groups`` on every rank.
        multi_label: how multi-hot labels weigh a pair, as in :func:`scl_kernels.supcon_loss`.
            Multi-hot ``labels`` (``[b_r, C]``, ``contrast_labels`` ``[m_r, C]``) are gathered
            as class ids are, and every rank must give the same form: class ids, or multi-hot
            rows of one C. They need ``strategy="gather"``.

    Labels and group ids, and their absence, refer to the global batch: ``labels=None`` numbers
    the samples globally (SimCLR across ranks: a sample's positives are its other views,
    wherever the anchor is); with ``contrast`` and no labels, anchor i's positive is the
    contrast row of the same local index on the same rank. A label present on one rank only is
    an ordinary class.

    Returns:
        ``"mean"`` / ``"sum"``: the global loss, the same value on every rank (the mean is over
        the anchors of all ranks that have a positive). ``"none"``: this rank's anchors' losses,
        in the local order. Backward through it gives each rank the global loss's gradient for
        its own rows; a tensor temperature receives this rank's share of its gradient, as the
        model's parameters do (sum them over ranks, or let DDP average them with
        ``gradients_averaged=True``).

    Raises:
        RuntimeError: no initialised process group.
        ValueError / TypeError: the single-process checks, and ranks that disagree on the feature
            dimension, dtype, number of views, options, temperature, the labels' form (class
            ids, or multi-hot rows of which C) or on whether labels, contrast or groups are
            given, and multi-hot labels other than 0 / 1 on any rank (raised on every rank
            alike, after one small all-gather).
    """
    _check_group(group, features)
    # A rank that rejects its inputs still joins the agreement, so that every rank raises
    # instead of the others waiting for it in a collective.
    layout: Optional[Layout] = None
    error: Optional[Exception] = None
    try:
        check_inputs(features, labels, groups)
        check_options(temperature, contrast_mode, normalize, reduction, backend,
                      check_value=False)
        check_distributed_options(strategy, gradients_averaged)
        focal_gamma = check_focal_gamma(focal_gamma)
        check_multi_label(multi_label)
        multi_hot = labels is not None and labels.dim() == 2
        if strategy == "ring" and focal_gamma != 0:
            raise ValueError(f"focal_gamma={focal_gamma} needs strategy='gather': the ring strategy "
                             "computes SupCon's positive terms only (focal_gamma=0)")
        if strategy == "ring" and groups is not None:
            raise ValueError("groups= needs strategy='gather': the ring strategy calls the fused "
                             "op on each block with all labels equal (an anchor without a "
                             "positive in a call gets no gradient from it), so its calls cannot "
                             "tell a group's non-positive pairs from its positives")
        if strategy == "ring" and multi_hot:
            raise ValueError("multi-hot labels need strategy='gather': the ring strategy sums "
                             "each block's rows per class to get the positive terms, which "
                             "multi-label pair weights (a pair counted once however many "
                             "classes it shares, or divided by the union) do not reduce to; "
                             "the fused op cannot give them either, as the ring calls it with "
                             "all labels equal (docs/DISTRIBUTED.md)")
        chosen = resolve_backend(backend, features.device, focal_gamma,
                                 groups=groups is not None, multi_label=multi_hot)
        temperature = temperature_tensor(temperature, features.device)
        if strategy == "ring" and chosen.op_name is None:
            fused = ", ".join(repr(name) for name, backend in REGISTRY.items() if backend.op_name)
            raise ValueError(f"strategy='ring' needs a fused backend ({fused}), "
                             f"got {chosen.name!r}")
        layout = build_layout(features, labels, contrast, contrast_labels, contrast_mode,
                              allow_no_rows=True, groups=groups, contrast_groups=contrast_groups)
        check_memory(memory)
        if memory is not None:
            if strategy != "gather" or contrast is not None:
                raise ValueError("memory needs strategy='gather' and no contrast=: it holds the "
                                 "gathered global batch, which the ring never gathers")
            memory.check_embeddings(layout.rows, "features")
            if labels is not None:
                memory.check_labels(labels)
    except (TypeError, ValueError) as caught:
        error = caught
    options = {"contrast_mode": contrast_mode, "normalize": normalize, "reduction": reduction,
               "strategy": strategy, "gradients_averaged": gradients_averaged,
               "focal_gamma": focal_gamma, "multi_label": multi_label}
    plan = agree_on_call(error, features, None if layout is None else layout.rows, labels,
                         contrast, contrast_labels, groups, contrast_groups, temperature, options,
                         group)
    _check_global_sizes(plan, contrast)
    assert layout is not None, "agree_on_call raised this rank's error"
    layout = _global_ids(layout, plan, implicit_labels=labels is None)
    graph_anchor = None
    if plan.any_requires_grad and torch.is_grad_enabled() and not (
            layout.rows.requires_grad or (contrast is not None and contrast.requires_grad)):
        graph_anchor = torch.zeros((), device=features.device, requires_grad=True)
    gather_options: Dict[str, Any] = {
        "focal_gamma": focal_gamma, "memory": memory, "supervised": labels is not None,
        "multi_label": multi_label} if strategy == "gather" else {}
    per_anchor, num_positives = _STRATEGY_FUNCTIONS[strategy](
        layout, temperature, normalize, chosen, plan, group, graph_anchor, **gather_options)
    return _global_reduction(per_anchor, num_positives, reduction, plan, group, gradients_averaged)
