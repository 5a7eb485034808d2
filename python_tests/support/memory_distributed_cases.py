"""The multi-process checks of a cross-batch memory under scl_kernels.distributed: every rank's
loss and gradient against the single-process loss of the global batch with the same memory, and
every rank's memory afterwards equal to that single-process memory.
distributed/test_memory_distributed.py spawns the ranks."""

import torch
import torch.distributed as dist

import scl_kernels.distributed as sd
from scl_kernels.nn import SupConCrossEntropyLoss, SupConMemory
from scl_kernels.cross_batch_memory import supcon_loss_with_memory
from .spawned_ranks import join_gloo_group, run_cases

SIZES = [5, 3]  # unequal local batches
TOLERANCE = dict(rtol=1e-10, atol=1e-12)
CASES = {}


def case(function):
    CASES[function.__name__] = function
    return function


def _memory(seed=11, size=12, held=9, dim=4):
    """The same partly filled memory on every rank and in the single-process reference."""
    generator = torch.Generator().manual_seed(seed)
    memory = SupConMemory(size, dim, dtype=torch.float64)
    memory.enqueue(torch.randn(held, dim, generator=generator, dtype=torch.float64),
                   torch.randint(0, 3, (held,), generator=generator))
    return memory


def _steps(rank, count=2, dim=4, views=0, with_labels=True):
    """``count`` global batches, and this rank's slice of each."""
    generator = torch.Generator().manual_seed(3)
    start, total = sum(SIZES[:rank]), sum(SIZES)
    steps = []
    for _ in range(count):
        shape = (total, views, dim) if views else (total, dim)
        features = torch.randn(shape, generator=generator, dtype=torch.float64)
        labels = torch.randint(0, 3, (total,), generator=generator) if with_labels else None
        local = features[start:start + SIZES[rank]].clone().requires_grad_()
        local_labels = None if labels is None else labels[start:start + SIZES[rank]]
        steps.append((features, labels, local, local_labels))
    return steps


def _assert_memories_equal(a, b):
    for name, value in a.state_dict().items():
        if not torch.equal(value, b.state_dict()[name]):
            raise AssertionError(f"memory {name} differs from the single-process memory")


def _assert_same_rows(memory, reference):
    """The same rows and labels in any order (with views, the gathered batch is each rank's
    view-major block in turn, the single-process batch view-major over all samples), and the
    same memory on every rank."""
    def by_row(m):
        rows, labels = m.contrast()
        order = torch.argsort(rows[:, 0])
        return rows[order], labels[order]
    for got, want in zip(by_row(memory), by_row(reference)):
        if not torch.equal(got, want):
            raise AssertionError("the memory's rows differ from the single-process memory's")
    gathered = [torch.empty_like(memory.rows) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, memory.rows)
    if any(not torch.equal(rows, gathered[0]) for rows in gathered):
        raise AssertionError("the ranks' memories differ")


def _compare(rank, views=0, with_labels=True, focal_gamma=0.0):
    memory, reference = _memory(), _memory()
    for features, labels, local, local_labels in _steps(rank, views=views, with_labels=with_labels):
        loss = sd.supcon_loss(local, local_labels, 0.3, memory=memory, focal_gamma=focal_gamma)
        (grad,) = torch.autograd.grad(loss, local)
        whole = features.clone().requires_grad_()
        expected = supcon_loss_with_memory(whole, labels, reference, 0.3, focal_gamma=focal_gamma)
        (expected_grad,) = torch.autograd.grad(expected, whole)
        start = sum(SIZES[:rank])
        torch.testing.assert_close(loss, expected, **TOLERANCE)
        torch.testing.assert_close(grad, expected_grad[start:start + SIZES[rank]], **TOLERANCE)
        if views:
            _assert_same_rows(memory, reference)
        else:
            _assert_memories_equal(memory, reference)


@case
def supervised(rank, world):
    _compare(rank)


@case
def focal(rank, world):
    _compare(rank, focal_gamma=1.5)


@case
def views_without_labels(rank, world):
    _compare(rank, views=2, with_labels=False)


@case
def cross_entropy_objective(rank, world):
    """SupConCrossEntropyLoss(distributed=True, memory=...): its SCL term is the global one with
    gradients_averaged, and every rank enqueues the global batch."""
    memory, reference = _memory(), _memory()
    criterion = SupConCrossEntropyLoss(1.0, 0.3, distributed=True, memory=memory)
    for features, labels, local, local_labels in _steps(rank):
        loss = criterion(None, local, local_labels)
        expected = supcon_loss_with_memory(features, labels, reference, 0.3)
        torch.testing.assert_close(loss, expected, **TOLERANCE)
    _assert_memories_equal(memory, reference)


@case
def ring_is_refused(rank, world):
    memory = _memory()
    (_, _, local, local_labels), = _steps(rank, count=1)
    try:
        sd.supcon_loss(local, local_labels, 0.3, memory=memory, strategy="ring")
    except ValueError as error:
        if "memory needs strategy='gather'" not in str(error):
            raise
    else:
        raise AssertionError("strategy='ring' with a memory did not raise")
    if len(memory) != 9:
        raise AssertionError("a refused call changed the memory")


def run_rank(rank, world, store, names, results):
    """Spawned entry point: joins the gloo group and runs the named cases, recording each."""
    join_gloo_group(rank, world, store)
    run_cases(CASES, names, rank, results)
