"""The collectives the distributed loss is made of, for batches whose size differs across ranks.

torch.distributed's gathers and reduce-scatters want the same shape on every rank, so blocks are
padded to the largest one; the sizes come from the call's agreement step (``agreement.py``), so
no extra collective is spent on them.
"""
from typing import Any, List, Optional, Sequence, Tuple

import torch
import torch.distributed as dist

# torch 2.13 renamed the single-tensor collectives; older releases have only the old names.
all_gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
reduce_scatter_single = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


def _padded(local: torch.Tensor, rows: int) -> torch.Tensor:
    if local.shape[0] == rows:
        return local.contiguous()
    padding = local.new_zeros((rows - local.shape[0], *local.shape[1:]))
    return torch.cat([local, padding])


def gather_rows(local: torch.Tensor, sizes: Sequence[int],
                group: Optional[dist.ProcessGroup]) -> torch.Tensor:
    """Every rank's ``[sizes[r], ...]`` tensor, concatenated in rank order (no autograd)."""
    largest = max(sizes)
    out = local.new_empty((len(sizes) * largest, *local.shape[1:]))
    all_gather_single(out, _padded(local, largest), group=group)
    if all(size == largest for size in sizes):
        return out
    return torch.cat([out[r * largest: r * largest + size] for r, size in enumerate(sizes)])


def sum_rows_to_owners(gathered: torch.Tensor, sizes: Sequence[int], rank: int,
                       group: Optional[dist.ProcessGroup]) -> torch.Tensor:
    """The reverse of :func:`gather_rows` for gradients: each rank receives the sum over ranks
    of the rows it owns. Summed in at least float32, so that bf16 gradients of many ranks do not
    lose their low bits to the additions."""
    largest = max(sizes)
    dtype = torch.promote_types(gathered.dtype, torch.float32)
    blocks = gathered.to(dtype).split(list(sizes))
    padded = torch.cat([_padded(block, largest) for block in blocks])
    out = padded.new_empty((largest, *gathered.shape[1:]))
    reduce_scatter_single(out, padded, group=group)
    return out[: sizes[rank]].to(gathered.dtype)


class _GatherRows(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, local: torch.Tensor, _graph_anchor: Optional[torch.Tensor],
                sizes: List[int], rank: int, group: Optional[dist.ProcessGroup]) -> torch.Tensor:
        ctx.sizes, ctx.rank, ctx.group = sizes, rank, group
        return gather_rows(local, sizes, group)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Tuple[Optional[torch.Tensor], ...]:
        return sum_rows_to_owners(grad.contiguous(), ctx.sizes, ctx.rank, ctx.group), None, None, \
            None, None


def gather_rows_with_grad(local: torch.Tensor, sizes: Sequence[int], rank: int,
                          group: Optional[dist.ProcessGroup],
                          graph_anchor: Optional[torch.Tensor]) -> torch.Tensor:
    """:func:`gather_rows` whose backward returns to each rank the gradient of its own rows,
    summed over the ranks that used them.

    ``graph_anchor`` (a tensor that requires grad, or None) puts the gather in the graph of a
    rank whose rows do not require grad while another rank's do: its backward is a collective
    that every rank must join.
    """
    # torch leaves autograd.Function.apply unannotated.
    gathered: torch.Tensor = _GatherRows.apply(  # type: ignore[no-untyped-call]
        local, graph_anchor, list(sizes), rank, group)
    return gathered


class RingShift:
    """Sends tensors to the next rank and receives the previous rank's, without blocking.

    ``recv_shapes`` are the shapes that will arrive (known from the call's agreement); empty
    tensors are neither sent nor received, as some process-group backends refuse them.
    """

    def __init__(self, tensors: Sequence[torch.Tensor], recv_shapes: Sequence[Sequence[int]],
                 group: Optional[dist.ProcessGroup], rank: int, world: int) -> None:
        self.received: List[torch.Tensor] = [
            tensor.new_empty(shape) for tensor, shape in zip(tensors, recv_shapes)]
        peer_next = dist.get_global_rank(group, (rank + 1) % world) if group is not None \
            else (rank + 1) % world
        peer_prev = dist.get_global_rank(group, (rank - 1) % world) if group is not None \
            else (rank - 1) % world
        operations = [dist.P2POp(dist.isend, tensor.contiguous(), peer_next, group)
                      for tensor in tensors if tensor.numel()]
        operations += [dist.P2POp(dist.irecv, buffer, peer_prev, group)
                       for buffer in self.received if buffer.numel()]
        self._operations = operations  # the sent tensors must live until the requests end
        self._requests = dist.batch_isend_irecv(operations) if operations else []

    def wait(self) -> List[torch.Tensor]:
        for request in self._requests:
            request.wait()
        return self.received
