"""Multi-hot labels through SupConLoss and the cross-batch memory: the module's ``multi_label``
rule reaches every call, and a memory built with ``num_classes=C`` stores each row's classes
(empty slots and unlabelled rows with no class), so that the loss against it is the float64
oracle on [batch; memory] under both rules, over steps that wrap the ring; awkward C (1, 64,
65), rows without a class, views, cross sets, SimCLR steps, checkpoints and the errors."""
import pytest
import torch

from scl_kernels.cross_batch_memory import supcon_loss_with_memory
from scl_kernels.nn import SupConLoss, SupConMemory
from support import needs
from support.memory_oracle import multi_hot, oracle_with_memory
from support.reference64 import supcon_reference64

BACKENDS = [pytest.param("cpu", marks=needs.library), "reference"]
RULES = ("any", "jaccard")
TOLERANCE = dict(rtol=1e-10, atol=1e-12)


def _assert_loss_and_gradient(loss, expected, leaves, generator):
    """Loss and the gradient of a random weighting of it (per anchor for "none") w.r.t.
    ``leaves``, against the oracle's."""
    torch.testing.assert_close(loss, expected, **TOLERANCE)
    weights = torch.rand(expected.shape, generator=generator, dtype=torch.float64)
    got = torch.autograd.grad((loss * weights).sum(), leaves)
    want = torch.autograd.grad((expected * weights).sum(), leaves)
    for got_one, want_one in zip(got, want):
        torch.testing.assert_close(got_one, want_one, **TOLERANCE)


@pytest.mark.quick
@pytest.mark.parametrize("loss_backend", BACKENDS)
@pytest.mark.parametrize("rule", RULES)
@pytest.mark.parametrize("classes", [1, 3, 64, 65])
@pytest.mark.parametrize("views, contrast_mode, reduction", [
    (0, "all", "mean"), (2, "all", "none"), (3, "one", "sum")])
def test_module_is_the_oracle(loss_backend, rule, classes, views, contrast_mode, reduction):
    generator = torch.Generator().manual_seed(classes + views)
    batch, dim = 9, 5
    shape = (batch, views, dim) if views else (batch, dim)
    features = torch.randn(shape, generator=generator, dtype=torch.float64, requires_grad=True)
    labels = multi_hot(batch, classes, generator)
    criterion = SupConLoss(0.3, contrast_mode=contrast_mode, reduction=reduction,
                           backend=loss_backend, multi_label=rule)
    expected = supcon_reference64(features, labels, 0.3, contrast_mode=contrast_mode,
                                  reduction=reduction, multi_label=rule)
    _assert_loss_and_gradient(criterion(features, labels), expected, [features], generator)


@pytest.mark.parametrize("loss_backend", BACKENDS)
@pytest.mark.parametrize("rule", RULES)
def test_module_cross_set_with_integer_rows(loss_backend, rule):
    generator = torch.Generator().manual_seed(7)
    features = torch.randn(6, 4, generator=generator, dtype=torch.float64, requires_grad=True)
    contrast = torch.randn(11, 4, generator=generator, dtype=torch.float64, requires_grad=True)
    labels, contrast_labels = (multi_hot(count, 65, generator).long() for count in (6, 11))
    criterion = SupConLoss(0.2, reduction="none", backend=loss_backend, multi_label=rule)
    expected = supcon_reference64(features, labels, 0.2, contrast=contrast,
                                  contrast_labels=contrast_labels, reduction="none",
                                  multi_label=rule)
    loss = criterion(features, labels, contrast, contrast_labels)
    _assert_loss_and_gradient(loss, expected, [features, contrast], generator)


def test_module_rule_differs_and_shows():
    """The rule reaches the call: jaccard weighs a pair sharing one of three classes by 1/3."""
    features = torch.randn(4, 3, dtype=torch.float64)
    labels = torch.tensor([[1, 1, 1], [1, 0, 0], [0, 1, 1], [0, 0, 0]], dtype=torch.bool)
    losses = {rule: SupConLoss(0.5, backend="reference", multi_label=rule)(features, labels)
              for rule in RULES}
    for rule in RULES:
        torch.testing.assert_close(losses[rule], supcon_reference64(features, labels, 0.5,
                                                                    multi_label=rule))
    assert not torch.allclose(losses["any"], losses["jaccard"])
    assert "multi_label='jaccard'" in repr(SupConLoss(multi_label="jaccard"))
    assert "multi_label" not in repr(SupConLoss())


def _steps_against_the_oracle(loss_backend, memory, steps, *, batch=5, views=0, rule="any",
                              contrast_mode="all", reduction="mean", seed=0):
    """Runs ``steps`` ("labels": multi-hot labels, "groups": with group ids too, "none": no
    labels) through SupConLoss with ``memory``; each step's loss and gradient against the
    oracle on a copy of the memory, which then receives what the memory should."""
    generator = torch.Generator().manual_seed(seed)
    dim, classes = memory.dim, memory.num_classes
    oracle_memory = SupConMemory(memory.size, dim, num_classes=classes, dtype=torch.float64)
    oracle_memory.load_state_dict(memory.state_dict())
    criterion = SupConLoss(0.3, contrast_mode=contrast_mode, reduction=reduction,
                           backend=loss_backend, memory=memory, multi_label=rule)
    for step in steps:
        shape = (batch, views, dim) if views else (batch, dim)
        features = torch.randn(shape, generator=generator, dtype=torch.float64,
                               requires_grad=True)
        labels = None if step == "none" else multi_hot(batch, classes, generator)
        groups = (torch.randint(-1, 3, (batch,), generator=generator) if step == "groups"
                  else None)
        expected = oracle_with_memory(features, labels, groups, oracle_memory, 0.3,
                                      contrast_mode, reduction, multi_label=rule)
        loss = criterion(features, labels, groups=groups)
        _assert_loss_and_gradient(loss, expected, [features], generator)
        rows = features.detach().transpose(0, 1).reshape(-1, dim) if views else features.detach()
        repeat = views or 1
        oracle_memory.enqueue(rows, None if labels is None else torch.cat([labels] * repeat),
                              None if groups is None else groups.repeat(repeat))
        for name, value in oracle_memory.state_dict().items():
            assert torch.equal(memory.state_dict()[name], value), name


def _filled_memory(size, dim, classes, held, seed=1):
    generator = torch.Generator().manual_seed(seed)
    memory = SupConMemory(size, dim, num_classes=classes, dtype=torch.float64)
    memory.enqueue(torch.randn(held, dim, generator=generator, dtype=torch.float64),
                   multi_hot(held, classes, generator).to(torch.int32))
    return memory


@pytest.mark.quick
@pytest.mark.filterwarnings("ignore:supcon_loss got no labels")  # the SimCLR step, on purpose
@pytest.mark.parametrize("loss_backend", BACKENDS)
@pytest.mark.parametrize("rule", RULES)
@pytest.mark.parametrize("classes, size, held", [(1, 7, 3), (3, 11, 0), (64, 13, 9), (65, 6, 6)])
def test_memory_steps_are_the_oracle(loss_backend, rule, classes, size, held):
    memory = _filled_memory(size, 4, classes, held)
    _steps_against_the_oracle(loss_backend, memory, ("labels", "groups", "none", "labels"),
                              rule=rule)


@pytest.mark.parametrize("loss_backend", BACKENDS)
@pytest.mark.parametrize("rule", RULES)
@pytest.mark.parametrize("views, contrast_mode, reduction", [
    (2, "all", "sum"), (3, "one", "none"), (2, "all", "mean")])
def test_memory_views_and_reductions(loss_backend, rule, views, contrast_mode, reduction):
    memory = _filled_memory(12, 3, 65, 5, seed=2)
    _steps_against_the_oracle(loss_backend, memory, ("labels", "none", "groups"), batch=3,
                              views=views, rule=rule, contrast_mode=contrast_mode,
                              reduction=reduction, seed=3)


def test_memory_stores_classes_and_no_class():
    memory = SupConMemory(4, 1, num_classes=2)
    assert memory.num_classes == 2 and memory.contrast()[1].shape == (0, 2)
    assert not memory.row_labels.any() and memory.row_labels.dtype == torch.bool
    rows = torch.arange(3, dtype=torch.float32).reshape(-1, 1)
    memory.enqueue(rows, torch.tensor([[1, 0], [0, 0], [1, 1]]))
    memory.enqueue(rows[:2], None)  # wraps: rows of no class
    assert memory.contrast()[1].tolist() == [[False, False], [False, False], [True, True],
                                             [False, False]]
    memory.reset()
    assert len(memory) == 0 and not memory.row_labels.any()
    assert "num_classes=2" in repr(memory) and "num_classes" not in repr(SupConMemory(4, 1))


def test_supcon_loss_with_memory_takes_the_rule():
    memory = _filled_memory(8, 3, 5, 6)
    copy = _filled_memory(8, 3, 5, 6)
    generator = torch.Generator().manual_seed(9)
    features = torch.randn(4, 3, generator=generator, dtype=torch.float64, requires_grad=True)
    labels = multi_hot(4, 5, generator)
    loss = supcon_loss_with_memory(features, labels, memory, 0.3, backend="reference",
                                   multi_label="jaccard", reduction="none")
    expected = oracle_with_memory(features, labels, None, copy, 0.3, reduction="none",
                                  multi_label="jaccard")
    _assert_loss_and_gradient(loss, expected, [features], generator)


def test_state_dict_round_trip_and_forms():
    memory = _filled_memory(6, 3, 65, 4)
    state = memory.state_dict()
    assert state["row_labels"].shape == (6, 65)
    copy = SupConMemory(6, 3, num_classes=65, dtype=torch.float64)
    copy.load_state_dict(state)
    assert len(copy) == 4 and torch.equal(copy.contrast()[1], memory.contrast()[1])
    # A memory of class ids keeps loading state dicts of class ids, those saved before the
    # memory kept group ids too; a state dict of the other form is refused by its shape.
    ids = SupConMemory(6, 3, dtype=torch.float64)
    ids.enqueue(torch.randn(2, 3, dtype=torch.float64), torch.tensor([4, -1]))
    older = {name: value for name, value in ids.state_dict().items() if name != "row_groups"}
    plain = SupConMemory(6, 3, dtype=torch.float64)
    plain.load_state_dict(older)
    assert plain.contrast()[1].tolist() == [4, -1] and plain.num_classes is None
    with pytest.raises(RuntimeError, match="row_labels"):
        plain.load_state_dict(state)
    with pytest.raises(RuntimeError, match="row_labels"):
        SupConMemory(6, 3, num_classes=64, dtype=torch.float64).load_state_dict(state)


@pytest.mark.parametrize("call, error, match", [
    (lambda: SupConMemory(4, 3, num_classes=0), ValueError, "num_classes must be at least 1"),
    (lambda: SupConMemory(4, 3, num_classes=2.0), TypeError, "num_classes must be a positive int"),
    (lambda: SupConMemory(4, 3).enqueue(torch.randn(2, 3), torch.ones(2, 5, dtype=torch.bool)),
     ValueError, r"labels are multi-hot rows of 5 classes but the memory holds class ids.*"
                 r"num_classes=5"),
    (lambda: SupConMemory(4, 3, num_classes=5).enqueue(torch.randn(2, 3), torch.tensor([0, 1])),
     ValueError, "labels are class ids but the memory holds multi-hot rows of 5 classes"),
    (lambda: SupConMemory(4, 3, num_classes=5).enqueue(torch.randn(2, 3),
                                                       torch.ones(2, 4, dtype=torch.bool)),
     ValueError, "labels are multi-hot rows of 4 classes but the memory holds multi-hot rows "
                 "of 5 classes"),
    (lambda: SupConMemory(4, 3, num_classes=2).enqueue(torch.randn(2, 3),
                                                       torch.ones(3, 2, dtype=torch.bool)),
     ValueError, r"labels must have shape \[2, 2\]"),
    (lambda: SupConMemory(4, 3, num_classes=2).enqueue(torch.randn(2, 3),
                                                       torch.tensor([[0, 2], [1, 0]])),
     ValueError, "multi-hot labels must hold 0 or 1"),
    (lambda: SupConMemory(4, 3, num_classes=2).enqueue(torch.randn(2, 3), torch.ones(2, 2)),
     TypeError, "labels must be an integer tensor"),
    (lambda: SupConLoss(memory=SupConMemory(4, 3))(torch.randn(2, 3),
                                                    torch.ones(2, 2, dtype=torch.bool)),
     ValueError, "the memory holds class ids"),
    (lambda: SupConLoss(memory=SupConMemory(4, 3, num_classes=2))(torch.randn(2, 3),
                                                                   torch.tensor([0, 1])),
     ValueError, "labels are class ids but the memory holds multi-hot rows of 2 classes"),
    (lambda: SupConLoss(multi_label="all"), ValueError, "multi_label must be one of"),
    (lambda: SupConLoss(backend="cpu", memory=SupConMemory(4, 3, num_classes=2))(
        torch.randn(2, 3), torch.tensor([[0, 2], [1, 0]])),
     ValueError, "multi-hot labels must hold 0 or 1"),
])
def test_errors_name_the_problem(call, error, match):
    with pytest.raises(error, match=match):
        call()


@pytest.mark.parametrize("labels", [torch.tensor([0, 1]), torch.tensor([[0, 2], [1, 0]])])
def test_a_refused_call_leaves_the_memory_unchanged(labels):
    memory = _filled_memory(6, 3, 2, 3)
    before = {name: value.clone() for name, value in memory.state_dict().items()}
    with pytest.raises(ValueError):
        SupConLoss(memory=memory, backend="reference")(torch.randn(2, 3, dtype=torch.float64),
                                                       labels)
    for name, value in memory.state_dict().items():
        assert torch.equal(value, before[name]), name
