"""Gradient cache (Gao et al. 2021, "Scaling Deep Contrastive Learning Batch Size under Memory
Limited Setup"): a contrastive batch of any size with the encoder memory of one chunk.

A contrastive loss couples every example of the batch, so the batch cannot simply be split into
micro-batches (gradient accumulation would shrink the set each anchor contrasts against). But
the loss's inputs, the embeddings, are small ([N, D]): embed the batch in chunks without a graph,
compute the loss and its gradient with respect to the embeddings, then re-embed each chunk with a
graph and back-propagate that chunk's slice of the cached gradient. The parameter gradient is the
same as one pass over the whole batch; the price is a second forward pass of the encoder.
"""
import contextlib
from collections.abc import Mapping
from typing import (Any, Callable, ContextManager, Iterator, List, Literal, Optional,
                    Sequence, Tuple, Union, overload)

import torch

# What split_batch takes: a tensor, a mapping (a dict, a BatchEncoding) or a tuple / list.
Batch = Union[torch.Tensor, Mapping[Any, Any], Tuple[Any, ...], List[Any]]
# What ``encode`` returns (for a chunk of the batch, of its type): a tensor or a tuple (or list)
# of tensors.
EncoderOutput = Union[torch.Tensor, Sequence[torch.Tensor]]
Outputs = Tuple[torch.Tensor, ...]


def _check_chunk_size(chunk_size: object) -> None:
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1:
        raise ValueError(f"chunk_size must be a positive int, got {chunk_size!r}")


def split_batch(batch: Batch, chunk_size: int) -> List[Batch]:
    """Splits a batch into chunks of at most ``chunk_size`` examples (dim 0).

    Args:
        batch: a tensor, a mapping (a dict, a Hugging Face ``BatchEncoding``) or a tuple / list
            whose tensor values share their first dimension; other values are passed to every
            chunk unchanged.
        chunk_size: positive int.

    Returns:
        A list of chunks of the batch's type (a mapping becomes a dict); one empty chunk for a
        batch of 0 examples.
    """
    _check_chunk_size(chunk_size)
    if isinstance(batch, torch.Tensor):
        if batch.dim() == 0:
            raise ValueError("a batch tensor needs a first (example) dimension, got a 0-dim tensor")
        return list(batch.split(chunk_size))
    keys: Optional[List[Any]] = None
    sequence_type: Callable[[List[Any]], Batch] = list
    if isinstance(batch, Mapping):
        keys, values = list(batch.keys()), list(batch.values())
    elif isinstance(batch, (tuple, list)):
        values, sequence_type = list(batch), type(batch)
    else:
        raise TypeError(f"batch must be a tensor, a mapping or a tuple/list, got {type(batch).__name__}")
    sizes = {v.shape[0] for v in values if isinstance(v, torch.Tensor) and v.dim() > 0}
    if len(sizes) != 1:
        raise ValueError("the tensors of a batch must share their first (example) dimension, got "
                         f"sizes {sorted(sizes)}" if sizes else "the batch holds no tensor to split")
    size = sizes.pop()
    chunks: List[Batch] = []
    # An empty batch is one empty chunk, as Tensor.split gives: a rank of a distributed loss may
    # hold no examples and must still take part in the step.
    for start in range(0, max(size, 1), chunk_size):
        part = [v[start:start + chunk_size] if isinstance(v, torch.Tensor) and v.dim() > 0 else v
                for v in values]
        chunks.append(dict(zip(keys, part)) if keys is not None else sequence_type(part))
    return chunks


class _RandomState:
    """The generators' state before a chunk's first pass, to replay its dropout masks."""

    def __init__(self) -> None:
        self.cpu = torch.get_rng_state()
        self.cuda = (torch.cuda.get_rng_state_all()
                     if torch.cuda.is_available() and torch.cuda.is_initialized() else [])

    @contextlib.contextmanager
    def replay(self) -> Iterator[None]:
        # fork_rng restores the state on exit: the run ends with the generators where the first
        # pass left them, as if the chunk had been encoded once.
        with torch.random.fork_rng(devices=range(len(self.cuda))):
            torch.set_rng_state(self.cpu)
            if self.cuda:
                torch.cuda.set_rng_state_all(self.cuda)
            yield


def _as_tuple(outputs: object) -> Outputs:
    if isinstance(outputs, torch.Tensor):
        return (outputs,)
    if isinstance(outputs, (tuple, list)) and outputs and all(isinstance(o, torch.Tensor) for o in outputs):
        return tuple(outputs)
    raise TypeError("encode must return a tensor or a tuple of tensors (e.g. (logits, embeddings)), "
                    f"got {type(outputs).__name__}")


class GradientCache:
    """Runs one training step of a contrastive loss over a batch, one encoder chunk at a time.

    ``step(batch)`` leaves in every parameter's ``.grad`` the gradient of
    ``loss_fn(*encode(batch))`` (added to what is there, as ``loss.backward()`` does), while the
    encoder only ever holds the activations of ``chunk_size`` examples::

        def encode(chunk):
            out = model(**chunk, output_hidden_states=True)
            return out.logits, out.hidden_states[-1][:, 0]

        criterion = SupConCrossEntropyLoss(lam=0.9, temperature=0.3)
        cache = GradientCache(encode, criterion, chunk_size=32)
        for batch in loader:                  # batches of e.g. 1024 examples
            labels = batch.pop("labels")
            loss = cache.step(batch, labels)  # loss_fn(logits, embeddings, labels)
            optimizer.step(); optimizer.zero_grad()

    Inside a training loop that is not one's own (a loss module given to a trainer, which
    scales, accumulates and back-propagates the loss itself), :meth:`loss` returns the loss
    instead, and the chunks are re-encoded when the trainer calls its backward.

    Dropout: each chunk's second (graph-building) pass replays the random state of its first,
    so it sees the same dropout masks and the gradient is that of the loss that was computed.
    Layers with running statistics (batch norm) update them in both passes.
    """

    def __init__(self, encode: Callable[[Any], EncoderOutput],
                 loss_fn: Callable[..., torch.Tensor], chunk_size: int, *,
                 loss_backward: Optional[Callable[[torch.Tensor], object]] = None,
                 sync_context: Optional[Callable[[], ContextManager[object]]] = None) -> None:
        """
        Args:
            encode: ``encode(chunk)`` -> a tensor or a tuple of tensors with the chunk's examples
                on dim 0 (e.g. ``(logits, embeddings)``). Called twice per chunk: once under
                ``torch.no_grad()``, once with a graph; it must be deterministic given the random
                state (dropout is replayed).
            loss_fn: ``loss_fn(*outputs, *loss_args, **loss_kwargs)`` -> 0-dim tensor, where each
                output is the concatenation of the chunks' outputs at that position.
            chunk_size: examples per encoder pass (positive int); a batch no larger than that is
                encoded once, with a graph, and gets no second pass.
            loss_backward: back-propagates the loss into its inputs, ``loss.backward()`` by
                default; pass e.g. ``accelerator.backward`` or
                ``lambda loss: scaler.scale(loss).backward()`` for mixed-precision loss
                scaling: the scaled output gradients then flow into the encoder unchanged.
            sync_context: a context manager factory entered around every chunk's backward pass
                but the last, e.g. ``model.no_sync`` of DistributedDataParallel, so gradients are
                all-reduced once per step.

        Distributed: ``loss_fn`` may be a loss over the ranks' global batch
        (:mod:`scl_kernels.distributed`, ``SupConCrossEntropyLoss(distributed=True)``): the
        cached output gradients are then the global loss's, and each rank's re-encoding turns
        them into its parameter gradients, equal to an uncached step's. Under DDP pass
        ``sync_context=model.no_sync``: besides one all-reduce per step instead of one per
        chunk, it lets ranks with unequal local batches encode different numbers of chunks
        (without it, each chunk's backward all-reduces, and a rank with more chunks would wait
        for the others forever).
        """
        if not callable(encode) or not callable(loss_fn):
            raise TypeError("encode and loss_fn must be callables")
        _check_chunk_size(chunk_size)
        self.encode = encode
        self.loss_fn = loss_fn
        self.chunk_size = chunk_size
        self.loss_backward: Callable[[torch.Tensor], object] = (
            loss_backward if loss_backward is not None else torch.Tensor.backward)
        self.sync_context = sync_context

    @overload
    def loss(self, batch: Batch, *loss_args: Any, return_outputs: Literal[False] = ...,
             **loss_kwargs: Any) -> torch.Tensor: ...

    @overload
    def loss(self, batch: Batch, *loss_args: Any, return_outputs: Literal[True],
             **loss_kwargs: Any) -> Tuple[torch.Tensor, Outputs]: ...

    def loss(self, batch: Batch, *loss_args: Any, return_outputs: bool = False,
             **loss_kwargs: Any) -> Union[torch.Tensor, Tuple[torch.Tensor, Outputs]]:
        """The loss of ``batch``, whose backward pass sends its gradient into the encoder.

        Encodes the batch chunk by chunk without a graph and returns ``loss_fn`` of the
        concatenated outputs. Back-propagating the returned loss (``loss.backward()``, a scaled
        loss, gradient accumulation: whatever a training loop does with a loss) re-encodes each
        chunk with a graph under its replayed random state and back-propagates that chunk's
        slice of the outputs' gradient, so the encoder's parameters receive in ``.grad`` the
        gradient of the uncached loss. (As with re-entrant checkpointing, the encoder's
        gradients arrive in ``.grad``, not through ``torch.autograd.grad``.) This is the form
        for a loss module inside someone else's training loop; :meth:`step` is the form for a
        loop of one's own.

        Args:
            batch: what :func:`split_batch` takes (tensor, mapping, tuple or list).
            *loss_args, **loss_kwargs: passed to ``loss_fn`` after the outputs (e.g. labels),
                whole, not chunked.
            return_outputs: also return the concatenated outputs (detached).

        Returns:
            The 0-dim loss, with a graph unless grad mode is off (then it is only the value);
            with ``return_outputs``, ``(loss, outputs)``.
        """
        chunks = split_batch(batch, self.chunk_size)
        if len(chunks) == 1:
            outputs = _as_tuple(self.encode(chunks[0]))
            loss = self.loss_fn(*outputs, *loss_args, **loss_kwargs)
            return (loss, tuple(o.detach() for o in outputs)) if return_outputs else loss

        states: List[_RandomState] = []
        chunk_outputs: List[Outputs] = []
        with torch.no_grad():
            for chunk in chunks:
                states.append(_RandomState())
                chunk_outputs.append(_as_tuple(self.encode(chunk)))
        if len({len(o) for o in chunk_outputs}) != 1:
            raise ValueError("encode returned a different number of tensors for different chunks")
        rows = [o[0].shape[0] for o in chunk_outputs]
        outputs = tuple(torch.cat(parts) for parts in zip(*chunk_outputs))
        del chunk_outputs
        if not torch.is_grad_enabled():  # evaluation: the value only, nothing to replay
            loss = self.loss_fn(*outputs, *loss_args, **loss_kwargs)
            return (loss, outputs) if return_outputs else loss
        differentiable = [i for i, o in enumerate(outputs) if o.is_floating_point()]

        def replay(gradients: Tuple[Optional[torch.Tensor], ...]) -> None:
            """Re-encodes every chunk with a graph and back-propagates its gradient slice."""
            by_output = dict(zip(differentiable, gradients))
            start = 0
            for index, (chunk, state, count) in enumerate(zip(chunks, states, rows)):
                last = index == len(chunks) - 1
                sync = (self.sync_context() if self.sync_context is not None and not last
                        else contextlib.nullcontext())
                with sync, state.replay(), torch.enable_grad():
                    replayed = _as_tuple(self.encode(chunk))
                    if [o.shape for o in replayed] != [o[start:start + count].shape for o in outputs]:
                        raise RuntimeError("encode returned different shapes for the same chunk in "
                                           "its two passes")
                    pairs = [(out, gradient[start:start + count]) for i, out in enumerate(replayed)
                             if (gradient := by_output.get(i)) is not None and out.requires_grad]
                    if pairs:
                        torch.autograd.backward([p[0] for p in pairs], [p[1] for p in pairs])
                start += count

        leaves = [outputs[i].requires_grad_() for i in differentiable]
        with torch.enable_grad():
            # torch leaves autograd.Function.apply unannotated.
            routed: Outputs = _ReplayChunks.apply(replay, *leaves)  # type: ignore[no-untyped-call]
            inputs = list(outputs)
            for i, tensor in zip(differentiable, routed):
                inputs[i] = tensor
            loss = self.loss_fn(*inputs, *loss_args, **loss_kwargs)
        if return_outputs:
            return loss, tuple(o.detach() for o in outputs)
        return loss

    @overload
    def step(self, batch: Batch, *loss_args: Any, return_outputs: Literal[False] = ...,
             **loss_kwargs: Any) -> torch.Tensor: ...

    @overload
    def step(self, batch: Batch, *loss_args: Any, return_outputs: Literal[True],
             **loss_kwargs: Any) -> Tuple[torch.Tensor, Outputs]: ...

    def step(self, batch: Batch, *loss_args: Any, return_outputs: bool = False,
             **loss_kwargs: Any) -> Union[torch.Tensor, Tuple[torch.Tensor, Outputs]]:
        """Computes the loss of ``batch`` and accumulates its gradient into the parameters:
        ``loss_backward`` of :meth:`loss`.

        Args:
            batch: what :func:`split_batch` takes (tensor, mapping, tuple or list).
            *loss_args, **loss_kwargs: passed to ``loss_fn`` after the outputs (e.g. labels),
                whole, not chunked.
            return_outputs: also return the concatenated outputs (detached).

        Returns:
            The loss, detached; with ``return_outputs``, ``(loss, outputs)``.
        """
        loss, outputs = self.loss(batch, *loss_args, return_outputs=True, **loss_kwargs)
        self.loss_backward(loss)
        return (loss.detach(), outputs) if return_outputs else loss.detach()


class _ReplayChunks(torch.autograd.Function):
    """The identity on the cached outputs; its backward hands their gradient to ``replay``,
    which re-encodes the chunks and back-propagates it into the encoder."""

    @staticmethod
    def forward(ctx: Any, replay: Callable[[Tuple[Optional[torch.Tensor], ...]], None],
                *outputs: torch.Tensor) -> Outputs:
        ctx.replay = replay
        ctx.set_materialize_grads(False)  # an output the loss does not use gets None, not zeros
        return tuple(o.view_as(o) for o in outputs)

    @staticmethod
    def backward(ctx: Any, *gradients: Optional[torch.Tensor]) -> Tuple[None, ...]:
        ctx.replay(gradients)
        return (None,) * (1 + len(gradients))
