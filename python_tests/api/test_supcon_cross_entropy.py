"""SupConCrossEntropyLoss: the formula (1 - lam) * CE + lam * SCL, its options and errors."""
import inspect
import math

import pytest
import torch
import torch.nn.functional as F

import scl_kernels
from scl_kernels import supcon_loss
from scl_kernels.nn import SupConCrossEntropyLoss, SupConLoss


def batch(n=12, classes=3, dim=5, seed=0, dtype=torch.float64):
    generator = torch.Generator().manual_seed(seed)
    logits = torch.randn(n, classes, generator=generator, dtype=dtype, requires_grad=True)
    embeddings = torch.randn(n, dim, generator=generator, dtype=dtype, requires_grad=True)
    labels = torch.randint(0, classes, (n,), generator=generator)
    return logits, embeddings, labels


def test_nn_exports_both_losses():
    assert SupConLoss is scl_kernels.SupConLoss
    assert scl_kernels.SupConCrossEntropyLoss is SupConCrossEntropyLoss


@pytest.mark.quick
@pytest.mark.parametrize("lam", [0.0, 0.3, 0.9, 1.0])
@pytest.mark.parametrize("scl_reduction", ["mean", "sum"])
def test_value_and_gradients_are_the_formula(lam, scl_reduction):
    logits, embeddings, labels = batch(seed=int(lam * 10))
    loss = SupConCrossEntropyLoss(lam, 0.3, scl_reduction=scl_reduction)(logits, embeddings, labels)
    got = torch.autograd.grad(loss, (logits, embeddings), allow_unused=True, materialize_grads=True)

    expected = ((1 - lam) * F.cross_entropy(logits, labels)
                + lam * supcon_loss(embeddings, labels, 0.3, reduction=scl_reduction,
                                    backend="reference"))
    want = torch.autograd.grad(expected, (logits, embeddings), allow_unused=True,
                               materialize_grads=True)
    torch.testing.assert_close(loss, expected, rtol=1e-12, atol=1e-12)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-10, atol=1e-12)


def test_sum_is_the_mean_times_the_anchors_with_positives():
    logits, embeddings, labels = batch(n=10, classes=4, seed=3)
    mean = SupConCrossEntropyLoss(1.0, scl_reduction="mean")(logits, embeddings, labels)
    total = SupConCrossEntropyLoss(1.0, scl_reduction="sum")(logits, embeddings, labels)
    counts = torch.bincount(labels)
    anchors_with_positives = int((counts[labels] > 1).sum())
    torch.testing.assert_close(total, mean * anchors_with_positives, rtol=1e-12, atol=0)


def test_a_term_with_zero_weight_is_not_computed():
    logits, embeddings, labels = batch()
    SupConCrossEntropyLoss(lam=0.0)(logits, embeddings, labels).backward()
    assert embeddings.grad is None and logits.grad is not None
    logits.grad = None
    SupConCrossEntropyLoss(lam=1.0)(logits, embeddings, labels).backward()
    assert logits.grad is None and embeddings.grad is not None


def test_parts_are_the_unweighted_terms():
    logits, embeddings, labels = batch(seed=5)
    criterion = SupConCrossEntropyLoss(0.25, 0.5)
    loss, cross_entropy, supcon = criterion.parts(logits, embeddings, labels)
    torch.testing.assert_close(cross_entropy, F.cross_entropy(logits, labels))
    torch.testing.assert_close(supcon, supcon_loss(embeddings, labels, 0.5))
    torch.testing.assert_close(loss, criterion(logits, embeddings, labels))


def test_float32_inputs_give_a_float32_loss():
    logits, embeddings, labels = batch(dtype=torch.float32)
    loss = SupConCrossEntropyLoss()(logits, embeddings, labels)
    assert loss.dtype == torch.float32 and math.isfinite(loss.item())


def test_learnable_temperature_is_a_parameter_with_a_gradient():
    temperature = torch.nn.Parameter(torch.tensor(0.3, dtype=torch.float64))
    criterion = SupConCrossEntropyLoss(0.5, temperature)
    assert [p for p in criterion.parameters()] == [temperature]
    logits, embeddings, labels = batch()
    criterion(logits, embeddings, labels).backward()
    assert temperature.grad is not None and temperature.grad.abs() > 0


@pytest.mark.parametrize("kwargs, error, match", [
    ({"lam": -0.1}, ValueError, "lam"),
    ({"lam": 1.5}, ValueError, "lam"),
    ({"lam": float("nan")}, ValueError, "lam"),
    ({"lam": "0.5"}, TypeError, "lam"),
    ({"lam": True}, TypeError, "lam"),
    ({"scl_reduction": "none"}, ValueError, "scl_reduction"),
    ({"temperature": 0.0}, ValueError, "temperature"),
    ({"backend": "gpu"}, ValueError, "backend"),
    ({"normalize": 1}, TypeError, "normalize"),
])
def test_bad_options_fail_in_the_constructor(kwargs, error, match):
    with pytest.raises(error, match=match):
        SupConCrossEntropyLoss(**kwargs)


def test_bad_inputs_name_the_argument():
    logits, embeddings, labels = batch()
    criterion = SupConCrossEntropyLoss()
    with pytest.raises(ValueError, match="logits"):
        criterion(logits[:-1], embeddings, labels)
    with pytest.raises(ValueError, match="embeddings"):
        criterion(logits, embeddings[:, None], labels)
    with pytest.raises(TypeError, match="labels"):
        criterion(logits, embeddings, labels.double())
    with pytest.raises(ValueError, match="labels"):
        criterion(logits, embeddings, labels[:, None])
    with pytest.raises(ValueError, match="labels"):  # checked by supcon_loss
        criterion(logits, embeddings[:-1], labels)


@pytest.mark.parametrize("row, label", [(4, 7), (2, 3), (0, -1)])
def test_a_label_that_is_no_class_names_its_value_row_and_the_class_count(row, label):
    logits, embeddings, labels = batch()  # 3 classes
    labels[row] = label
    message = (f"labels must lie in [0, 3) or equal the ignore index -100 (logits has 3 classes), "
               f"got label {label} at row {row}")
    criterion = SupConCrossEntropyLoss(0.5)
    for call in (criterion, criterion.parts):
        with pytest.raises(ValueError) as raised:
            call(logits, embeddings, labels)
        assert str(raised.value) == message


def test_the_ignore_index_and_a_custom_ce_take_any_label():
    logits, embeddings, labels = batch()
    labels[1] = -100
    SupConCrossEntropyLoss(0.5)(logits, embeddings, labels)
    labels[1] = 9  # the custom term decides what a label means
    SupConCrossEntropyLoss(0.5, ce=lambda z, y: z.sum() * 0)(logits, embeddings, labels)


def _supcon_has_focal_gamma():
    return "focal_gamma" in inspect.signature(supcon_loss).parameters


def test_focal_gamma_is_passed_to_the_contrastive_term():
    if not _supcon_has_focal_gamma():
        pytest.skip("supcon_loss has no focal_gamma yet (the focal SupCon branch)")
    logits, embeddings, labels = batch(seed=9)
    loss = SupConCrossEntropyLoss(0.6, 0.3, focal_gamma=2.0, backend="reference")(
        logits, embeddings, labels)
    expected = (0.4 * F.cross_entropy(logits, labels)
                + 0.6 * supcon_loss(embeddings, labels, 0.3, focal_gamma=2.0, backend="reference"))
    torch.testing.assert_close(loss, expected, rtol=1e-12, atol=1e-12)
    plain = SupConCrossEntropyLoss(0.6, 0.3, backend="reference")(logits, embeddings, labels)
    assert float(loss) < float(plain)  # (1 - pi)^2 < 1 on every positive pair


def test_focal_gamma_options():
    with pytest.raises(ValueError, match="focal_gamma"):
        SupConCrossEntropyLoss(focal_gamma=-1.0)
    with pytest.raises(ValueError, match="focal_gamma applies to distributed=False"):
        SupConCrossEntropyLoss(focal_gamma=1.0, distributed=True)
    assert "focal_gamma=2" in repr(SupConCrossEntropyLoss(focal_gamma=2.0))
