"""Known false negatives (``groups=``) with a cross-batch memory: the memory stores each row's
group id beside its label (-1 for rows enqueued without), and the loss against the memory masks
its rows as the batch's own; loss and gradients against the float64 oracle on [batch; memory]
over several steps (the ring wraps), with and without groups, every layout the memory takes,
one group for all; checkpoints, and the errors."""
import pytest
import torch

import scl_kernels
from scl_kernels.cross_batch_memory import supcon_loss_with_memory
from scl_kernels.nn import SupConLoss, SupConMemory
from support import needs
from support.memory_oracle import oracle_with_memory

BACKENDS = [pytest.param("cpu", marks=needs.library), "reference"]
TOLERANCE = dict(rtol=1e-10, atol=1e-12)


def grouped_memory(size, dim, with_groups, without_groups, seed=1):
    """A memory that received ``with_groups`` rows with group ids, then ``without_groups`` rows
    without (in no group): the ring may wrap."""
    generator = torch.Generator().manual_seed(seed)
    memory = SupConMemory(size, dim, dtype=torch.float64)
    memory.enqueue(torch.randn(with_groups, dim, generator=generator, dtype=torch.float64),
                   torch.randint(-1, 3, (with_groups,), generator=generator),
                   torch.randint(-1, 3, (with_groups,), generator=generator))
    memory.enqueue(torch.randn(without_groups, dim, generator=generator, dtype=torch.float64),
                   torch.randint(0, 3, (without_groups,), generator=generator))
    return memory


def _steps_against_the_oracle(backend, batch, dim, memory, steps, *, views=0, labels=True,
                              groups="some", contrast_mode="all", reduction="mean", seed=0):
    """Runs ``steps`` (True: with groups, False: without) through SupConLoss with ``memory``
    and checks each step's loss and gradient against the oracle on a copy of the memory, which
    then receives what the memory should."""
    generator = torch.Generator().manual_seed(seed)
    oracle_memory = SupConMemory(memory.size, dim, dtype=torch.float64)
    oracle_memory.load_state_dict(memory.state_dict())
    criterion = SupConLoss(0.3, contrast_mode=contrast_mode, reduction=reduction,
                           backend=backend, memory=memory)
    for step_has_groups in steps:
        shape = (batch, views, dim) if views else (batch, dim)
        features = torch.randn(shape, generator=generator, dtype=torch.float64,
                               requires_grad=True)
        step_labels = torch.randint(-1, 3, (batch,), generator=generator) if labels else None
        step_groups = None
        if step_has_groups:
            step_groups = (torch.zeros(batch, dtype=torch.long) if groups == "one"
                           else torch.randint(-1, 3, (batch,), generator=generator))
        expected = oracle_with_memory(features, step_labels, step_groups, oracle_memory, 0.3,
                                      contrast_mode, reduction)
        loss = criterion(features, step_labels, groups=step_groups)
        weights = torch.rand(expected.shape, generator=generator, dtype=torch.float64)
        got, want = (torch.autograd.grad((value * weights).sum(), features)[0]
                     for value in (loss, expected))
        torch.testing.assert_close(loss, expected, **TOLERANCE)
        torch.testing.assert_close(got, want, **TOLERANCE)
        rows = features.detach().transpose(0, 1).reshape(-1, dim) if views else features.detach()
        repeat = views or 1
        oracle_memory.enqueue(
            rows, (step_labels if labels else torch.full((batch,), -1)).repeat(repeat),
            None if step_groups is None else step_groups.repeat(repeat))
        for name, value in oracle_memory.state_dict().items():
            assert torch.equal(memory.state_dict()[name], value), name


@pytest.mark.quick
@pytest.mark.parametrize("loss_backend", BACKENDS)
@pytest.mark.parametrize("batch, size, with_groups, without_groups, dim", [
    (7, 11, 4, 2, 5), (5, 13, 20, 10, 33), (9, 3, 3, 0, 2), (6, 8, 0, 0, 5), (1, 40, 17, 5, 7)])
def test_steps_with_and_without_groups_are_the_oracle(loss_backend, batch, size, with_groups,
                                                      without_groups, dim):
    memory = grouped_memory(size, dim, with_groups, without_groups)
    _steps_against_the_oracle(loss_backend, batch, dim, memory, (True, False, True, True))


@pytest.mark.parametrize("loss_backend", BACKENDS)
@pytest.mark.parametrize("views, labels, contrast_mode, reduction", [
    (2, True, "all", "sum"), (3, True, "one", "none"), (2, False, "all", "mean"),
    (2, False, "one", "none")])
def test_views_labels_and_reductions(loss_backend, views, labels, contrast_mode, reduction):
    memory = grouped_memory(10, 6, 7, 2, seed=2)
    _steps_against_the_oracle(loss_backend, 4, 6, memory, (True, True, False), views=views,
                              labels=labels, contrast_mode=contrast_mode, reduction=reduction,
                              seed=3)


@pytest.mark.parametrize("loss_backend", BACKENDS)
def test_one_group_for_all(loss_backend):
    """Every batch row in group 0, and memory rows in group 0 too: their non-positive pairs
    leave the denominator; an anchor without positives has no loss and a zero gradient."""
    memory = SupConMemory(12, 4, dtype=torch.float64)
    generator = torch.Generator().manual_seed(4)
    memory.enqueue(torch.randn(8, 4, generator=generator, dtype=torch.float64),
                   torch.randint(-1, 3, (8,), generator=generator), torch.zeros(8).long())
    _steps_against_the_oracle(loss_backend, 6, 4, memory, (True, True), groups="one",
                              reduction="none", seed=5)


@pytest.mark.parametrize("loss_backend", BACKENDS)
def test_groups_take_memory_pairs_out(loss_backend):
    """A memory row of the anchor's group that is not its positive leaves its denominator: the
    loss is the one without that row; a row of the same group enqueued without groups stays."""
    features = torch.tensor([[1.0, 0.0], [0.8, 0.6]], dtype=torch.float64)
    labels, groups = torch.tensor([0, 0]), torch.tensor([5, -1])
    duplicate = torch.tensor([[1.0, 0.01]], dtype=torch.float64)
    for stored_groups, masked in ((torch.tensor([5]), True), (None, False)):
        memory = SupConMemory(4, 2, dtype=torch.float64)
        memory.enqueue(duplicate, torch.tensor([1]), stored_groups)
        loss = supcon_loss_with_memory(features, labels, memory, 0.1, backend=loss_backend,
                                       reduction="none", groups=groups)
        without_row = scl_kernels.supcon_loss(features, labels, 0.1, backend=loss_backend,
                                              reduction="none")
        if masked:
            torch.testing.assert_close(loss[0], without_row[0], **TOLERANCE)
        else:  # the near-duplicate of another class weighs on the denominator
            assert float(loss[0]) > float(without_row[0]) + 1
        assert memory.contrast_groups().tolist() == [-1 if stored_groups is None else 5, 5, -1]


def test_enqueue_stores_group_ids_and_wraps():
    memory = SupConMemory(5, 1)

    def rows(*values):
        return torch.tensor(values, dtype=torch.float32).reshape(-1, 1)

    memory.enqueue(rows(0, 1, 2), torch.tensor([0, 1, 2]), torch.tensor([7, -3, 8]))
    assert memory.contrast_groups().tolist() == [7, -3, 8]
    memory.enqueue(rows(3, 4, 5, 6), torch.tensor([3, 4, 5, 6]))  # wraps; no groups: -1
    assert memory.contrast_groups().tolist() == [-1, -1, 8, -1, -1]
    memory.enqueue(rows(*range(10, 17)), torch.arange(10, 17),
                   torch.arange(20, 27, dtype=torch.int32))
    assert memory.contrast()[0].flatten().tolist() == [15, 16, 12, 13, 14]
    assert memory.contrast_groups().tolist() == [25, 26, 22, 23, 24]
    assert memory.row_groups.dtype == torch.long
    memory.reset()
    assert len(memory) == 0 and memory.contrast_groups().shape == (0,)
    assert torch.equal(memory.row_groups, torch.full((5,), -1))


def test_state_dict_keeps_group_ids_and_loads_one_saved_without_them():
    memory = grouped_memory(6, 3, 4, 1)
    state = memory.state_dict()
    assert set(state) == {"rows", "row_labels", "row_groups", "next_slot", "filled"}
    copy = SupConMemory(6, 3, dtype=torch.float64)
    copy.load_state_dict(state)
    assert torch.equal(copy.contrast_groups(), memory.contrast_groups())
    # Saved before the memory kept group ids: every row loads in no group.
    older = {name: value for name, value in state.items() if name != "row_groups"}
    copy.load_state_dict(older)
    assert len(copy) == 5 and torch.equal(copy.contrast_groups(), torch.full((5,), -1))
    assert torch.equal(copy.contrast()[1], memory.contrast()[1])


@pytest.mark.parametrize("call, error, match", [
    (lambda: SupConMemory(4, 3).enqueue(torch.randn(2, 3), torch.tensor([0, 1]),
                                        torch.tensor([0, 1, 2])),
     ValueError, r"groups must have shape \[2\]"),
    (lambda: SupConMemory(4, 3).enqueue(torch.randn(2, 3), torch.tensor([0, 1]),
                                        torch.tensor([0.0, 1.0])),
     TypeError, "groups must be an integer tensor"),
    (lambda: SupConMemory(4, 3, device="meta").enqueue(torch.randn(2, 3, device="meta"),
                                                       torch.tensor([0, 1], device="meta"),
                                                       torch.tensor([0, 1])),
     ValueError, "groups is on cpu but the memory is on meta"),
    (lambda: SupConLoss(memory=SupConMemory(4, 3))(torch.randn(2, 3), torch.tensor([0, 1]),
                                                    groups=torch.tensor([0])),
     ValueError, "groups has 1 entries but features has 2 samples"),
    (lambda: SupConLoss(memory=SupConMemory(4, 3))(torch.randn(2, 3), torch.tensor([0, 1]),
                                                    groups=torch.tensor([0, 1]),
                                                    contrast_groups=torch.tensor([0, 1])),
     ValueError, "contrast= cannot be combined with a memory"),
])
def test_errors_name_the_argument(call, error, match):
    with pytest.raises(error, match=match):
        call()


def test_a_refused_call_leaves_the_memory_unchanged():
    memory = grouped_memory(6, 3, 3, 1)
    before = {name: value.clone() for name, value in memory.state_dict().items()}
    with pytest.raises(ValueError):
        SupConLoss(memory=memory)(torch.randn(2, 3, dtype=torch.float64), torch.tensor([0, 1]),
                                  groups=torch.tensor([0, 1, 2]))
    for name, value in memory.state_dict().items():
        assert torch.equal(value, before[name]), name
