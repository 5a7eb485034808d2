"""SupConCrossEntropyLoss with multi-hot targets: (1 - lam) * BCE + lam * multi-label SCL against
the float64 oracle (both pair rules, both reductions, float / bool / integer targets, the fused
and dense backends), the problem type read from the labels or fixed as Hugging Face names it,
groups passed to the contrastive term, and the errors of the multi-label options."""
import pytest
import torch
import torch.nn.functional as F

from scl_kernels.nn import SupConCrossEntropyLoss, SupConMemory
from support.reference64 import supcon_reference64

MULTI = "multi_label_classification"
SINGLE = "single_label_classification"
TOLERANCE = dict(rtol=1e-10, atol=1e-12)  # float64 inputs: the oracle's rounding


@pytest.fixture(params=["cpu", "reference"])
def multi_label_backend(request):
    """The SupCon backends that compute multi-label positives."""
    if request.param == "cpu":
        request.getfixturevalue("cpu_library")
    return request.param


def multi_hot_batch(n=12, classes=4, dim=6, seed=0, dtype=torch.float64):
    """Logits, embeddings (both requiring grad) and float multi-hot targets, as Hugging Face's
    multi-label models take them: up to three classes a row, row 0 without any."""
    generator = torch.Generator().manual_seed(seed)
    logits = torch.randn(n, classes, generator=generator, dtype=dtype, requires_grad=True)
    embeddings = torch.randn(n, dim, generator=generator, dtype=dtype, requires_grad=True)
    targets = (torch.rand(n, classes, generator=generator) < 0.4).to(dtype)
    targets[0] = 0
    return logits, embeddings, targets


def value_and_grads(loss, logits, embeddings):
    grads = torch.autograd.grad(loss, (logits, embeddings), allow_unused=True,
                                materialize_grads=True)
    return (loss.detach(),) + tuple(g.detach() for g in grads)


@pytest.mark.quick
@pytest.mark.parametrize("lam", [0.0, 0.3, 1.0])
@pytest.mark.parametrize("rule", ["any", "jaccard"])
@pytest.mark.parametrize("scl_reduction", ["mean", "sum"])
def test_value_and_gradients_are_bce_plus_multi_label_scl(multi_label_backend, lam, rule, scl_reduction):
    logits, embeddings, targets = multi_hot_batch(seed=int(lam * 10) + len(rule))
    criterion = SupConCrossEntropyLoss(lam, 0.3, scl_reduction=scl_reduction, multi_label=rule,
                                       backend=multi_label_backend)
    got = value_and_grads(criterion(logits, embeddings, targets), logits, embeddings)

    expected = ((1 - lam) * torch.nn.BCEWithLogitsLoss()(logits, targets)
                + lam * supcon_reference64(embeddings, targets.bool(), 0.3, multi_label=rule,
                                           reduction=scl_reduction))
    want = value_and_grads(expected, logits, embeddings)
    for name, ours, oracle in zip(["loss", "d logits", "d embeddings"], got, want):
        torch.testing.assert_close(ours, oracle, **TOLERANCE, msg=lambda m: f"{name}: {m}")


@pytest.mark.parametrize("form", ["float", "bool", "int64", "uint8"])
def test_every_multi_hot_form_gives_the_same_loss(form):
    logits, embeddings, targets = multi_hot_batch(seed=4)
    given = targets if form == "float" else targets.to(getattr(torch, form))
    criterion = SupConCrossEntropyLoss(0.5, multi_label="jaccard", backend="reference")
    torch.testing.assert_close(criterion(logits, embeddings, given),
                               criterion(logits, embeddings, targets), rtol=0, atol=0)


def test_the_rules_differ_where_a_pair_shares_part_of_its_classes():
    logits, embeddings, targets = multi_hot_batch(seed=2)
    any_rule, jaccard = (SupConCrossEntropyLoss(1.0, multi_label=rule)(logits, embeddings, targets)
                         for rule in ("any", "jaccard"))
    assert not torch.isclose(any_rule, jaccard)


def test_one_class_per_row_gives_the_single_label_contrastive_term():
    logits, embeddings, _ = multi_hot_batch(seed=6)
    classes = torch.tensor([0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 0])
    one_hot = F.one_hot(classes, 4).double()
    for rule in ("any", "jaccard"):
        multi = SupConCrossEntropyLoss(0.4, multi_label=rule).parts(logits, embeddings, one_hot)
        single = SupConCrossEntropyLoss(0.4).parts(logits, embeddings, classes)
        torch.testing.assert_close(multi.supcon, single.supcon, **TOLERANCE)
        torch.testing.assert_close(multi.cross_entropy, F.binary_cross_entropy_with_logits(
            logits, one_hot))


def test_parts_and_the_classification_loss_are_the_unweighted_terms():
    logits, embeddings, targets = multi_hot_batch(seed=8)
    criterion = SupConCrossEntropyLoss(0.25, 0.5, multi_label="jaccard")
    loss, bce, supcon = criterion.parts(logits, embeddings, targets)
    torch.testing.assert_close(bce, F.binary_cross_entropy_with_logits(logits, targets))
    torch.testing.assert_close(supcon, supcon_reference64(embeddings, targets.bool(), 0.5,
                                                          multi_label="jaccard"), **TOLERANCE)
    torch.testing.assert_close(loss, criterion(logits, embeddings, targets))
    torch.testing.assert_close(criterion.classification_loss(logits, targets), bce)
    classes = targets.argmax(1)
    torch.testing.assert_close(criterion.classification_loss(logits, classes),
                               F.cross_entropy(logits, classes))


def test_the_problem_type_is_read_from_the_labels_or_fixed():
    logits, embeddings, targets = multi_hot_batch(seed=1)
    classes = targets.argmax(1)
    inferred = SupConCrossEntropyLoss(0.5)
    fixed_multi = SupConCrossEntropyLoss(0.5, problem_type=MULTI)
    fixed_single = SupConCrossEntropyLoss(0.5, problem_type=SINGLE)
    torch.testing.assert_close(inferred(logits, embeddings, targets),
                               fixed_multi(logits, embeddings, targets))
    torch.testing.assert_close(inferred(logits, embeddings, classes),
                               fixed_single(logits, embeddings, classes))
    with pytest.raises(ValueError, match=r"labels as multi-hot rows must have shape \[N, num_classes\]"):
        fixed_multi(logits, embeddings, classes)
    with pytest.raises(ValueError, match=r"labels must have shape \[N\] \(class indices\)"):
        fixed_single(logits, embeddings, targets.long())
    with pytest.raises(TypeError, match="labels must be an integer tensor"):
        fixed_single(logits, embeddings, targets)


@pytest.mark.parametrize("lam", [0.0, 1.0])
def test_a_value_that_is_neither_0_nor_1_names_its_row_and_class(lam):
    """Checked whichever term runs: BCE would take a soft target, SCL reads class sets."""
    logits, embeddings, targets = multi_hot_batch()
    targets[5, 2] = 0.5
    with pytest.raises(ValueError) as raised:
        SupConCrossEntropyLoss(lam)(logits, embeddings, targets)
    assert str(raised.value) == "labels as multi-hot rows must hold 0 or 1, got 0.5 at row 5, class 2"


def test_logits_must_have_the_targets_shape():
    logits, embeddings, targets = multi_hot_batch()
    with pytest.raises(ValueError, match=r"logits must have the multi-hot labels' shape \(12, 4\)"):
        SupConCrossEntropyLoss(0.5)(logits[:, :3], embeddings, targets)


def test_a_custom_ce_receives_the_targets_as_given():
    logits, embeddings, targets = multi_hot_batch(seed=3)
    seen = []

    def soft_margin(z, y):
        seen.append(y)
        return F.multilabel_soft_margin_loss(z, y)

    loss = SupConCrossEntropyLoss(0.5, ce=soft_margin, backend="reference")(logits, embeddings, targets)
    assert seen[0] is targets
    expected = (0.5 * F.multilabel_soft_margin_loss(logits, targets)
                + 0.5 * supcon_reference64(embeddings, targets.bool(), 0.3))
    torch.testing.assert_close(loss, expected, **TOLERANCE)


@pytest.mark.parametrize("multi_label", [False, True])
def test_groups_reach_the_contrastive_term(multi_label_backend, multi_label):
    logits, embeddings, targets = multi_hot_batch(seed=7)
    labels = targets if multi_label else targets.argmax(1)
    groups = torch.tensor([0, 0, 0, 1, 1, -1, 2, 2, 3, 3, 3, -1])
    criterion = SupConCrossEntropyLoss(0.6, 0.2, multi_label="jaccard", backend=multi_label_backend)
    got = value_and_grads(criterion(logits, embeddings, labels, groups), logits, embeddings)

    classification = (F.binary_cross_entropy_with_logits(logits, targets) if multi_label
                      else F.cross_entropy(logits, labels))
    scl_labels = targets.bool() if multi_label else labels
    expected = 0.4 * classification + 0.6 * supcon_reference64(
        embeddings, scl_labels, 0.2, multi_label="jaccard", groups=groups)
    want = value_and_grads(expected, logits, embeddings)
    for ours, oracle in zip(got, want):
        torch.testing.assert_close(ours, oracle, **TOLERANCE)
    ungrouped = criterion(logits, embeddings, labels)
    assert not torch.isclose(got[0], ungrouped)
    parts = criterion.parts(logits, embeddings, labels, groups=groups)
    torch.testing.assert_close(parts.loss, got[0], **TOLERANCE)


def test_a_memory_of_multi_hot_rows_takes_the_batch():
    logits, embeddings, targets = multi_hot_batch(seed=5, dtype=torch.float32)
    memory = SupConMemory(32, embeddings.shape[1], num_classes=targets.shape[1])
    criterion = SupConCrossEntropyLoss(0.5, memory=memory, multi_label="jaccard")
    # an empty memory adds no column: the first step is the loss without one
    first = criterion(logits, embeddings, targets)
    torch.testing.assert_close(first, SupConCrossEntropyLoss(0.5, multi_label="jaccard")(
        logits, embeddings, targets))
    assert len(memory) == targets.shape[0]
    _, stored_labels = memory.contrast()
    assert torch.equal(stored_labels, targets.bool())


@pytest.mark.parametrize("kwargs, match", [
    ({"problem_type": "regression"}, "problem_type must be None or one of"),
    ({"multi_label": "all"}, "multi_label must be one of"),
    ({"problem_type": MULTI, "label_smoothing": 0.1}, "label_smoothing applies to single_label"),
    ({"problem_type": MULTI, "distributed": True, "strategy": "ring"},
     "distributed=True needs strategy='gather': the ring strategy refuses multi-hot labels"),
])
def test_bad_multi_label_options_fail_in_the_constructor(kwargs, match):
    with pytest.raises(ValueError, match=match):
        SupConCrossEntropyLoss(**kwargs)


def test_multi_hot_labels_read_as_such_refuse_label_smoothing():
    logits, embeddings, targets = multi_hot_batch()
    with pytest.raises(ValueError, match="label_smoothing applies to single_label"):
        SupConCrossEntropyLoss(0.5, label_smoothing=0.1)(logits, embeddings, targets)


def test_repr_names_the_multi_label_options():
    text = repr(SupConCrossEntropyLoss(problem_type=MULTI, multi_label="jaccard"))
    assert "problem_type='multi_label_classification'" in text and "multi_label='jaccard'" in text
    assert "problem_type" not in repr(SupConCrossEntropyLoss())
