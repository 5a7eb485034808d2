"""The cross-entropy alternatives (FocalLoss, SelfAdjustingDiceLoss, MixedCrossEntropyLoss):
values and gradients against formulas written here from the papers, on random logits with
imbalanced classes and class weights; ignore_index, reductions, the mixed-CE schedule and its
state, and their use as the ce= term of SupConCrossEntropyLoss."""
import math

import pytest
import torch
import torch.nn.functional as F

from scl_kernels.nn import (FocalLoss, MixedCrossEntropyLoss, SelfAdjustingDiceLoss,
                            SupConCrossEntropyLoss)


def imbalanced_batch(n=40, classes=4, seed=0, scale=3.0, dtype=torch.float64):
    """Logits with a spread of confidences; labels drawn 70 / 20 / 7 / 3 %."""
    generator = torch.Generator().manual_seed(seed)
    logits = (torch.randn(n, classes, generator=generator, dtype=torch.float64) * scale).to(dtype)
    frequencies = torch.tensor([0.70, 0.20, 0.07, 0.03][:classes], dtype=torch.float64)
    labels = torch.multinomial(frequencies, n, replacement=True, generator=generator)
    return logits.requires_grad_(), labels


def gold_probability(logits, labels):
    """p_y from the softmax definition, exp / sum exp, in float64."""
    exps = torch.exp(logits.double() - logits.double().max(dim=1, keepdim=True).values)
    return exps[torch.arange(len(labels)), labels] / exps.sum(dim=1)


def focal_formula(logits, labels, gamma, alpha=None):
    p = gold_probability(logits, labels)
    weight = torch.ones_like(p) if alpha is None else alpha.double()[labels]
    return (-weight * (1 - p) ** gamma * torch.log(p)).mean()


def dice_formula(logits, labels, alpha, smoothing):
    p = gold_probability(logits, labels)
    y = 1.0
    adjusted = (1 - p) ** alpha * p
    return (1 - (2 * adjusted * y + smoothing) / (adjusted + y + smoothing)).mean()


def mixed_formula(logits, labels, weight):
    predicted = logits.detach().argmax(dim=1)
    return (-(weight * torch.log(gold_probability(logits, labels))
              + (1 - weight) * torch.log(gold_probability(logits, predicted)))).mean()


def assert_value_and_gradient(loss_fn, formula, logits, labels):
    got = loss_fn(logits, labels)
    (got_grad,) = torch.autograd.grad(got, logits)
    want = formula(logits, labels)
    (want_grad,) = torch.autograd.grad(want, logits)
    torch.testing.assert_close(got, want.to(got.dtype), rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(got_grad, want_grad.to(got_grad.dtype), rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("gamma", [0.0, 0.5, 1.0, 2.0, 5.0])
@pytest.mark.parametrize("weighted", [False, True])
def test_focal_is_the_formula(gamma, weighted):
    logits, labels = imbalanced_batch(seed=int(gamma * 10) + weighted)
    alpha = torch.tensor([0.1, 0.5, 1.5, 3.0], dtype=torch.float64) if weighted else None
    assert_value_and_gradient(FocalLoss(gamma, alpha), lambda x, y: focal_formula(x, y, gamma, alpha),
                              logits, labels)


def test_focal_gamma_zero_is_cross_entropy_and_gamma_down_weights_easy_examples():
    logits, labels = imbalanced_batch(seed=3)
    torch.testing.assert_close(FocalLoss(0.0)(logits, labels), F.cross_entropy(logits, labels))
    per_example = FocalLoss(2.0, reduction="none")(logits, labels)
    cross_entropy = F.cross_entropy(logits, labels, reduction="none")
    easy = gold_probability(logits, labels) > 0.9
    assert easy.any() and bool((per_example[easy] < 0.011 * cross_entropy[easy]).all())


@pytest.mark.parametrize("alpha, smoothing", [(1.0, 1.0), (0.0, 1.0), (0.5, 0.1), (2.0, 0.0)])
def test_dice_is_the_formula(alpha, smoothing):
    logits, labels = imbalanced_batch(seed=int(alpha * 7 + smoothing * 3))
    assert_value_and_gradient(SelfAdjustingDiceLoss(alpha, smoothing),
                              lambda x, y: dice_formula(x, y, alpha, smoothing), logits, labels)


@pytest.mark.parametrize("schedule", ["linear", "cosine"])
def test_mixed_cross_entropy_is_the_formula_along_its_schedule(schedule):
    logits, labels = imbalanced_batch(seed=11)
    criterion = MixedCrossEntropyLoss(total_steps=4, final_weight=0.2, schedule=schedule)
    weights = []
    for step in range(6):
        weight = criterion.gold_weight()
        weights.append(weight)
        progress = min(step / 4, 1.0)
        shape = 1 - progress if schedule == "linear" else (1 + math.cos(math.pi * progress)) / 2
        assert weight == pytest.approx(0.2 + 0.8 * shape)
        assert_value_and_gradient(criterion, lambda x, y: mixed_formula(x, y, weight), logits, labels)
        assert int(criterion.step_count) == step + 1
    assert weights[0] == 1.0 and weights[4] == weights[5] == pytest.approx(0.2)


def test_mixed_cross_entropy_steps_in_training_only_and_keeps_its_step_in_the_state_dict():
    logits, labels = imbalanced_batch(seed=2)
    criterion = MixedCrossEntropyLoss(total_steps=10)
    criterion(logits, labels)
    with torch.no_grad():
        criterion(logits, labels)
    criterion.eval()
    criterion(logits, labels)
    assert int(criterion.step_count) == 1
    restored = MixedCrossEntropyLoss(total_steps=10)
    restored.load_state_dict(criterion.state_dict())
    assert int(restored.step_count) == 1 and restored.gold_weight() == pytest.approx(0.95)
    manual = MixedCrossEntropyLoss(total_steps=10, auto_step=False)
    manual(logits, labels)
    manual.step()
    assert int(manual.step_count) == 1


def test_mixed_cross_entropy_equals_cross_entropy_where_the_model_is_right():
    logits, _ = imbalanced_batch(seed=5)
    predicted = logits.detach().argmax(dim=1)
    criterion = MixedCrossEntropyLoss(total_steps=1, final_weight=0.0)
    criterion.step()
    torch.testing.assert_close(criterion(logits, predicted), F.cross_entropy(logits, predicted))


@pytest.mark.parametrize("make", [lambda: FocalLoss(2.0), lambda: SelfAdjustingDiceLoss(),
                                  lambda: MixedCrossEntropyLoss(5, auto_step=False)])
def test_ignore_index_and_reductions(make):
    logits, labels = imbalanced_batch(n=12, seed=8)
    criterion = make()
    ignored = labels.clone()
    ignored[::3] = -100
    kept = ignored != -100
    criterion.reduction = "none"
    per_example = criterion(logits, ignored)
    assert bool((per_example[~kept] == 0).all())
    torch.testing.assert_close(per_example[kept], criterion(logits[kept], labels[kept]))
    criterion.reduction = "sum"
    torch.testing.assert_close(criterion(logits, ignored), per_example.sum())
    criterion.reduction = "mean"
    torch.testing.assert_close(criterion(logits, ignored), per_example.sum() / kept.sum())
    (grad,) = torch.autograd.grad(criterion(logits, ignored), logits)
    assert bool((grad[~kept] == 0).all()) and bool(torch.isfinite(grad).all())
    everything_ignored = criterion(logits, torch.full_like(labels, -100))
    assert float(everything_ignored.detach()) == 0.0


@pytest.mark.parametrize("make", [lambda: FocalLoss(0.5), lambda: SelfAdjustingDiceLoss(0.5)])
def test_a_certain_example_has_a_finite_gradient(make):
    logits = torch.tensor([[200.0, 0.0, 0.0], [0.0, 1.0, 0.0]], requires_grad=True)
    labels = torch.tensor([0, 1])
    (grad,) = torch.autograd.grad(make()(logits, labels), logits)
    assert bool(torch.isfinite(grad).all())


def test_float32_logits_give_float32_losses():
    logits, labels = imbalanced_batch(dtype=torch.float32)
    for criterion in (FocalLoss(), SelfAdjustingDiceLoss(), MixedCrossEntropyLoss(3)):
        assert criterion(logits, labels).dtype == torch.float32


@pytest.mark.parametrize("make, error, match", [
    (lambda: FocalLoss(-1.0), ValueError, "gamma"),
    (lambda: FocalLoss("2"), TypeError, "gamma"),
    (lambda: FocalLoss(alpha=torch.tensor([1, 2])), TypeError, "alpha"),
    (lambda: FocalLoss(alpha=torch.tensor([1.0, -2.0])), ValueError, "alpha"),
    (lambda: FocalLoss(reduction="avg"), ValueError, "reduction"),
    (lambda: SelfAdjustingDiceLoss(alpha=-1.0), ValueError, "alpha"),
    (lambda: SelfAdjustingDiceLoss(smoothing=None), TypeError, "smoothing"),
    (lambda: MixedCrossEntropyLoss(0), ValueError, "total_steps"),
    (lambda: MixedCrossEntropyLoss(10, final_weight=1.5), ValueError, "final_weight"),
    (lambda: MixedCrossEntropyLoss(10, schedule="step"), ValueError, "schedule"),
])
def test_bad_options_name_the_argument(make, error, match):
    with pytest.raises(error, match=match):
        make()


def test_bad_inputs_name_the_argument():
    logits, labels = imbalanced_batch(n=6)
    criterion = FocalLoss()
    with pytest.raises(ValueError, match="labels must have shape"):
        criterion(logits, labels[:5])
    with pytest.raises(TypeError, match="labels must be an integer tensor"):
        criterion(logits, labels.double())
    with pytest.raises(ValueError, match="alpha has 2 class weights"):
        FocalLoss(alpha=torch.ones(2))(logits, labels)


@pytest.mark.parametrize("make", [FocalLoss, SelfAdjustingDiceLoss, lambda: MixedCrossEntropyLoss(3)])
@pytest.mark.parametrize("row, label", [(3, 4), (5, -1)])
def test_a_label_that_is_no_class_names_its_value_row_and_the_class_count(make, row, label):
    logits, labels = imbalanced_batch(n=6)  # 4 classes
    labels[row] = label
    with pytest.raises(ValueError) as raised:
        make()(logits, labels)
    assert str(raised.value) == ("labels must lie in [0, 4) or equal the ignore index -100 "
                                 f"(logits has 4 classes), got label {label} at row {row}")


def test_label_values_are_read_where_they_have_values():
    """Meta labels have no values to read: they pass (as fake tensors under torch.compile do)."""
    from scl_kernels.nn._classification_targets import check_class_indices
    check_class_indices(torch.empty(5, dtype=torch.long, device="meta"), 3)
    with pytest.raises(ValueError, match="got label 3 at row 1"):
        check_class_indices(torch.tensor([0, 3]), 3)
    check_class_indices(torch.tensor([-5, 2]), 3, ignore_index=None)


@pytest.mark.parametrize("make", [lambda: FocalLoss(2.0, torch.tensor([1.0, 2.0, 3.0])),
                                  lambda: SelfAdjustingDiceLoss(), lambda: MixedCrossEntropyLoss(3)])
def test_as_the_ce_term_of_supcon_cross_entropy(make):
    generator = torch.Generator().manual_seed(4)
    logits = torch.randn(10, 3, generator=generator, dtype=torch.float64, requires_grad=True)
    embeddings = torch.randn(10, 5, generator=generator, dtype=torch.float64)
    labels = torch.randint(0, 3, (10,), generator=generator)
    term, reference_term = make(), make()
    loss = SupConCrossEntropyLoss(0.0, ce=term)(logits, embeddings, labels)
    torch.testing.assert_close(loss, reference_term(logits, labels))
    assert term in SupConCrossEntropyLoss(0.5, ce=term).modules()


def test_label_smoothing_is_torchs():
    logits, labels = imbalanced_batch(n=10, classes=3, seed=6)
    embeddings = torch.randn(10, 4, dtype=torch.float64)
    loss = SupConCrossEntropyLoss(0.0, label_smoothing=0.1)(logits, embeddings, labels)
    torch.testing.assert_close(loss, F.cross_entropy(logits, labels, label_smoothing=0.1))
    with pytest.raises(ValueError, match="label_smoothing"):
        SupConCrossEntropyLoss(ce=FocalLoss(), label_smoothing=0.1)
    with pytest.raises(ValueError, match="label_smoothing"):
        SupConCrossEntropyLoss(label_smoothing=1.0)
