"""strategy="ring": the contrast set travels around the ranks in blocks, so that no rank ever
holds more than its own rows and two blocks (docs/DISTRIBUTED.md has the arithmetic).

Forward: while block k passes through rank r, the fused op gives the log-sum-exp of r's anchors
over k's columns; the blocks' log-sum-exps merge into the global one (float64), and the positive
terms, which are linear in the unit rows, come from class sums accumulated on the way.

Backward: the blocks go around once more, each with an accumulator for its rows' gradient. The
fused op's backward, given the global log-sum-exp, gives the softmax part of every block's
gradient (anchor side and column side, through the normalisation, and the temperature's). It
only gives anything to anchors that have a positive in its call, so the op is called with all
labels equal: every column is then a "positive" of every anchor, and that uniform term's
gradient, linear like the true positives', is replaced by the true one in closed form.
"""
import functools
from dataclasses import dataclass
from typing import Any, Callable, List, Optional, Sequence, Tuple, Union

import torch
import torch.distributed as dist
import torch.nn.functional as F

from ..backends.fused_ops import loss_dtype
from ..backends import Backend
from ..functional import Layout
from .agreement import CallPlan
from .collectives import RingShift

_Shape = Tuple[int, ...]


def _unit_rows(rows: torch.Tensor, normalize: bool, dtype: torch.dtype) -> torch.Tensor:
    rows = rows.to(dtype)
    return F.normalize(rows, dim=1, eps=1e-12) if normalize else rows


class AnchorClasses:
    """The classes of this rank's anchors (sorted), and which of them a block row belongs to."""

    def __init__(self, anchor_labels: torch.Tensor) -> None:
        self.classes = torch.unique(anchor_labels[anchor_labels >= 0])
        self.anchor_index, self.anchor_member = self.locate(anchor_labels)

    def locate(self, labels: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        """(index of each label among the classes, whether it is one of them)."""
        if self.classes.numel() == 0:
            return torch.zeros_like(labels), torch.zeros_like(labels, dtype=torch.bool)
        index = torch.searchsorted(self.classes, labels).clamp_max_(self.classes.numel() - 1)
        return index, (self.classes[index] == labels) & (labels >= 0)

    def sums(self, unit_rows: torch.Tensor,
             labels: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        """Per anchor class: the sum of the unit rows of that class, and their number."""
        index, member = self.locate(labels)
        sums = unit_rows.new_zeros((self.classes.numel(), unit_rows.shape[1]))
        sums = sums.index_add(0, index[member], unit_rows[member])
        return sums, torch.bincount(index[member], minlength=self.classes.numel())

    def anchor_counts(self, class_counts: torch.Tensor) -> torch.Tensor:
        """Each anchor's entry of a per-class count, 0 for an anchor without a class."""
        if self.classes.numel() == 0:
            return torch.zeros_like(self.anchor_index)
        return torch.where(self.anchor_member, class_counts[self.anchor_index],
                           torch.zeros_like(self.anchor_index))

    def positive_dot(self, unit_anchors: torch.Tensor, class_sums: torch.Tensor) -> torch.Tensor:
        """z_i . (sum of the block's rows of anchor i's class), 0 for an anchor without one."""
        if self.classes.numel() == 0:
            return unit_anchors.new_zeros(unit_anchors.shape[0])
        dot = (unit_anchors * class_sums[self.anchor_index]).sum(dim=1)
        return torch.where(self.anchor_member, dot, torch.zeros_like(dot))


@dataclass
class RingCall:
    """One call's fixed inputs: labels, sizes, the backend and the process group."""
    labels: torch.Tensor  # [rows] int64
    contrast_labels: Optional[torch.Tensor]  # [contrast rows] int64, cross set only
    num_anchors: int
    normalize: bool
    backend: Backend
    plan: CallPlan
    group: Optional[dist.ProcessGroup]

    @functools.cached_property
    def classes(self) -> AnchorClasses:
        return AnchorClasses(self.labels[: self.num_anchors])

    @property
    def single_set(self) -> bool:
        return self.contrast_labels is None

    @property
    def block_sizes(self) -> List[int]:
        return self.plan.rows if self.single_set else self.plan.contrast_rows

    def compute_dtype(self, dtype: torch.dtype) -> torch.dtype:
        return torch.float64 if self.backend.computes_in(dtype) == torch.float64 else torch.float32

    def _op(self, op: Optional[Callable[..., Any]]) -> Callable[..., Any]:
        assert op is not None, "the ring runs a fused backend (supcon_loss checks it)"
        return op

    def _local_block(self, rows: torch.Tensor,
                     contrast: Optional[torch.Tensor]) -> Tuple[torch.Tensor, torch.Tensor]:
        if self.contrast_labels is None:  # single set
            return rows, self.labels
        assert contrast is not None, "a cross-set call has contrast rows"
        return contrast, self.contrast_labels

    def _incoming_shapes(self, step: int, dim: int) -> Tuple[_Shape, _Shape]:
        """Shapes of the block (rows, labels) that arrives after ``step``."""
        size = self.block_sizes[(self.plan.rank - step - 1) % self.plan.world]
        return (size, dim), (size,)

    def _shift(self, tensors: Sequence[torch.Tensor], shapes: Sequence[_Shape]) -> RingShift:
        return RingShift(tensors, shapes, self.group, self.plan.rank, self.plan.world)

    def _same_labels(self, count: int, like: torch.Tensor) -> torch.Tensor:
        # All equal: see the module's docstring.
        return torch.zeros(count, dtype=torch.long, device=like.device)

    def _block_lse(self, rows: torch.Tensor, block: torch.Tensor, own: bool,
                   temperature: torch.Tensor) -> torch.Tensor:
        """Log-sum-exp of the anchors over one block's columns (own block: self excluded)."""
        anchors = self.num_anchors
        forward_op = self._op(self.backend.forward_op)
        lse: torch.Tensor
        if own and self.single_set:
            _, lse, _ = forward_op(rows, self._same_labels(rows.shape[0], rows),
                                   None, None, temperature, anchors, self.normalize)
        else:
            _, lse, _ = forward_op(
                rows[:anchors], self._same_labels(anchors, rows), block,
                self._same_labels(block.shape[0], rows), temperature, anchors, self.normalize)
        return lse

    def forward(self, rows: torch.Tensor, contrast: Optional[torch.Tensor],
                temperature: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(per-anchor loss, |P(i)|, global log-sum-exp) of this rank's anchors."""
        anchors, dtype = self.num_anchors, self.compute_dtype(rows.dtype)
        classes = self.classes
        class_sums = rows.new_zeros((classes.classes.numel(), rows.shape[1]), dtype=dtype)
        class_counts = torch.zeros(classes.classes.numel(), dtype=torch.long, device=rows.device)
        lse_parts: List[torch.Tensor] = []
        block, block_labels = self._local_block(rows, contrast)
        for step in range(self.plan.world):
            shift = (self._shift([block, block_labels], self._incoming_shapes(step, rows.shape[1]))
                     if step < self.plan.world - 1 else None)
            if anchors and block.shape[0]:
                lse_parts.append(self._block_lse(rows, block, step == 0, temperature))
                sums, counts = classes.sums(_unit_rows(block, self.normalize, dtype), block_labels)
                class_sums += sums
                class_counts += counts
            if shift is not None:
                block, block_labels = shift.wait()
        lse = (torch.logsumexp(torch.stack(lse_parts), dim=0) if lse_parts
               else rows.new_full((anchors,), float("-inf"), dtype=torch.float64))
        unit_anchors = _unit_rows(rows[:anchors], self.normalize, dtype)
        positive_dot = classes.positive_dot(unit_anchors, class_sums)
        positives = classes.anchor_counts(class_counts)
        if self.single_set:  # the anchor's own row was counted among its class
            positive_dot = positive_dot - (unit_anchors * unit_anchors).sum(dim=1) * classes.anchor_member
            positives = (positives - classes.anchor_member.long()).clamp_min_(0)
        t = temperature.detach().to(device=rows.device, dtype=dtype)
        loss = lse.to(dtype) - positive_dot / (t * positives.clamp_min(1))
        loss = torch.where(positives > 0, loss, torch.zeros_like(loss))
        return loss.to(loss_dtype(rows.dtype)), positives, lse

    def _linear_terms_grad(self, weights: Tuple[torch.Tensor, torch.Tensor], rows: torch.Tensor,
                           block: torch.Tensor, block_labels: torch.Tensor, own: bool,
                           temperature: torch.Tensor, dtype: torch.dtype
                           ) -> Tuple[torch.Tensor, Optional[torch.Tensor], torch.Tensor]:
        """Gradients (rows or anchors, block, temperature) of
        sum_i [g_i U_i - w_i S_i] / t: U_i is the op's uniform positive term (the mean of
        z_i . z_j over the block's columns), S_i the sum of z_i . z_p over the true positives."""
        uniform_weight, positive_weight = weights
        anchors, classes = self.num_anchors, self.classes
        with torch.enable_grad():
            t = temperature.detach().to(device=rows.device, dtype=dtype).requires_grad_()
            if own and self.single_set:
                leaves = [rows.detach().to(dtype).requires_grad_()]
                unit_block = _unit_rows(leaves[0], self.normalize, dtype)
                unit_anchors = unit_block[:anchors]
            else:
                leaves = [rows[:anchors].detach().to(dtype).requires_grad_(),
                          block.detach().to(dtype).requires_grad_()]
                unit_anchors = _unit_rows(leaves[0], self.normalize, dtype)
                unit_block = _unit_rows(leaves[1], self.normalize, dtype)
            excluded_self = own and self.single_set
            columns = unit_block.shape[0] - int(excluded_self)
            self_dot: Union[torch.Tensor, int] = (
                (unit_anchors * unit_anchors).sum(dim=1) if excluded_self else 0)
            class_sums, _ = classes.sums(unit_block, block_labels)
            positive_dot = classes.positive_dot(unit_anchors, class_sums)
            if excluded_self:
                positive_dot = positive_dot - self_dot * classes.anchor_member
            objective = -(positive_weight * positive_dot).sum()
            if columns > 0:
                uniform_dot = unit_anchors @ unit_block.sum(dim=0) - self_dot
                objective = objective + (uniform_weight * uniform_dot).sum() / columns
            objective = objective / t
            grads = torch.autograd.grad(objective, [*leaves, t], allow_unused=True)
        if own and self.single_set:
            return grads[0], None, grads[1]
        return grads[0], grads[1], grads[2]

    def backward(self, grad_loss: torch.Tensor, rows: torch.Tensor,
                 contrast: Optional[torch.Tensor], temperature: torch.Tensor, lse: torch.Tensor,
                 positives: torch.Tensor
                 ) -> Tuple[torch.Tensor, Optional[torch.Tensor], torch.Tensor]:
        """Gradients of (rows, contrast, temperature) for the per-anchor loss's gradient."""
        anchors, dtype = self.num_anchors, self.compute_dtype(rows.dtype)
        backward_op = self._op(self.backend.backward_op)
        has_positive = positives > 0
        grad_loss = torch.where(has_positive, grad_loss, torch.zeros_like(grad_loss))
        uniform_weight = grad_loss.to(dtype)
        weights = (uniform_weight, uniform_weight / positives.clamp_min(1))
        grad_rows = torch.zeros(rows.shape, dtype=dtype, device=rows.device)
        grad_temperature = torch.zeros((), dtype=dtype, device=rows.device)
        block, block_labels = self._local_block(rows, contrast)
        accumulated = torch.zeros(block.shape, dtype=dtype, device=rows.device)
        for step in range(self.plan.world):
            last = step == self.plan.world - 1
            shift = (None if last else
                     self._shift([block, block_labels], self._incoming_shapes(step, rows.shape[1])))
            own = step == 0
            if anchors and block.shape[0]:
                op_rows: torch.Tensor
                op_block: Optional[torch.Tensor]
                op_temperature: torch.Tensor
                if own and self.single_set:
                    op_rows, _, op_temperature = backward_op(
                        grad_loss, rows, self._same_labels(rows.shape[0], rows), None, None,
                        temperature, anchors, self.normalize, lse)
                    op_block = None
                else:
                    op_rows, op_block, op_temperature = backward_op(
                        grad_loss, rows[:anchors], self._same_labels(anchors, rows), block,
                        self._same_labels(block.shape[0], rows), temperature, anchors,
                        self.normalize, lse)
                fix_rows, fix_block, fix_temperature = self._linear_terms_grad(
                    weights, rows, block, block_labels, own, temperature, dtype)
                grad_rows[: op_rows.shape[0]] += op_rows.to(dtype) + fix_rows
                if op_block is not None:
                    assert fix_block is not None, "both have a block part, or neither"
                    accumulated += op_block.to(dtype) + fix_block
                grad_temperature += op_temperature.to(device=rows.device, dtype=dtype).reshape(()) \
                    + fix_temperature
            # The accumulator goes on with its block; after the last step, home to its owner.
            accumulator_shape = ((self.block_sizes[self.plan.rank], rows.shape[1]) if last
                                 else self._incoming_shapes(step, rows.shape[1])[0])
            if self.plan.world > 1:
                accumulated, = self._shift([accumulated], [accumulator_shape]).wait()
            if shift is not None:
                block, block_labels = shift.wait()
        grad_contrast: Optional[torch.Tensor]
        if self.single_set:
            grad_rows += accumulated
            grad_contrast = None
        else:
            assert contrast is not None, "a cross-set call has contrast rows"
            grad_contrast = accumulated.to(contrast.dtype)
        grad_temperature = grad_temperature.to(temperature.dtype).reshape(temperature.shape)
        return grad_rows.to(rows.dtype), grad_contrast, grad_temperature.to(temperature.device)


class _RingSupCon(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, rows: torch.Tensor, contrast: Optional[torch.Tensor],
                temperature: torch.Tensor, _graph_anchor: Optional[torch.Tensor],
                call: RingCall) -> Tuple[torch.Tensor, torch.Tensor]:
        loss, positives, lse = call.forward(rows, contrast, temperature)
        ctx.call = call
        ctx.save_for_backward(rows, contrast, temperature, lse, positives)
        ctx.mark_non_differentiable(positives)
        return loss, positives

    @staticmethod
    def backward(ctx: Any, grad_loss: torch.Tensor, _grad_positives: Optional[torch.Tensor]
                 ) -> Tuple[Optional[torch.Tensor], ...]:
        rows, contrast, temperature, lse, positives = ctx.saved_tensors
        grads = ctx.call.backward(grad_loss.contiguous(), rows, contrast, temperature, lse,
                                  positives)
        return (*grads, None, None)


def ring_supcon(layout: Layout, temperature: torch.Tensor, normalize: bool, backend: Backend,
                plan: CallPlan, group: Optional[dist.ProcessGroup],
                graph_anchor: Optional[torch.Tensor]) -> Tuple[torch.Tensor, torch.Tensor]:
    """(per-anchor loss of this rank's anchors, their |P(i)|) against the global contrast set,
    which passes by in blocks."""
    call = RingCall(layout.labels, layout.contrast_labels, layout.num_anchors, normalize, backend,
                    plan, group)
    # torch leaves autograd.Function.apply unannotated.
    result: Tuple[torch.Tensor, torch.Tensor] = _RingSupCon.apply(  # type: ignore[no-untyped-call]
        layout.rows, layout.contrast, temperature, graph_anchor, call)
    return result
