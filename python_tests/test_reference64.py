"""Tests of the test oracle: reference64 against a pure-Python loop implementation of the spec,
and check_against_reference catching deliberately wrong backends."""
import math

import pytest
import torch

import scl_kernels
import scl_kernels.loss
from layouts import LAYOUTS, make_layout
from reference64 import check_against_reference, supcon_reference64


def _loop_supcon(features, labels, t, contrast=None, contrast_labels=None, mode="all",
                 normalize=True, reduction="mean"):
    """The maths of KERNEL_MATH.md written as plain Python loops over floats."""
    f = features.double().tolist()
    if features.dim() == 3:
        b, v = features.shape[0], features.shape[1]
        rows = [f[s][k] for k in range(v) for s in range(b)]
        lab = None if labels is None else [int(labels[s]) for k in range(v) for s in range(b)]
    else:
        b, v = len(f), 1
        rows, lab = f, (None if labels is None else [int(a) for a in labels])

    def unit(r):
        n = math.sqrt(sum(a * a for a in r))
        return [a / max(n, 1e-12) for a in r] if normalize else list(r)

    rows = [unit(r) for r in rows]
    if contrast is None:
        if lab is None:
            lab = [s for k in range(v) for s in range(b)]
        cols, clab = rows, lab
        anchors = range(b if mode == "one" else len(rows))
        self_col = True
    else:
        cols = [unit(r) for r in contrast.double().tolist()]
        if contrast_labels is None:
            lab = list(range(len(rows)))
            clab = [j if j < len(rows) else -1 for j in range(len(cols))]
        else:
            clab = [int(a) for a in contrast_labels]
        anchors = range(len(rows))
        self_col = False
    losses = []
    valid = 0
    for i in anchors:
        logits = {j: sum(a * c for a, c in zip(rows[i], cols[j])) / t for j in range(len(cols))
                  if not (self_col and j == i)}
        pos = [j for j in logits if lab[i] >= 0 and clab[j] == lab[i]]
        if not pos:
            losses.append(0.0)
            continue
        valid += 1
        m = max(logits.values())
        lse = m + math.log(sum(math.exp(s - m) for s in logits.values()))
        losses.append(lse - sum(logits[j] for j in pos) / len(pos))
    if reduction == "none":
        return losses
    if reduction == "sum":
        return sum(losses)
    return sum(losses) / max(valid, 1)


def test_hand_computed():
    # three unit vectors in 2-D at 0, 90 and 180 degrees, labels [0, 0, 1], t = 0.5
    x = torch.tensor([[2.0, 0.0], [0.0, 3.0], [-1.0, 0.0]])
    y = torch.tensor([0, 0, 1])
    # anchor 0: columns 1 (s=0, positive) and 2 (s=-2): LSE = log(1 + e^-2), l = LSE - 0
    l0 = math.log(1 + math.exp(-2))
    # anchor 1: columns 0 (s=0, positive), 2 (s=0): l = log 2
    l1 = math.log(2)
    # anchor 2: no positive
    got = supcon_reference64(x, y, 0.5, reduction="none")
    assert got.tolist() == pytest.approx([l0, l1, 0.0], abs=1e-15)
    assert float(supcon_reference64(x, y, 0.5)) == pytest.approx((l0 + l1) / 2, abs=1e-15)


@pytest.mark.parametrize("normalize", [True, False])
@pytest.mark.parametrize("reduction", ["mean", "none"])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_reference64_matches_loops(layout, reduction, normalize, randn, randint):
    kw = make_layout(layout, randn, randint, dtype=torch.float64, n=9, d=3, classes=3)
    if kw.get("labels") is not None:
        kw["labels"] = torch.where(randint(0, 4, kw["labels"].shape) == 0, -1, kw["labels"])
    got = supcon_reference64(**kw, temperature=0.3, normalize=normalize, reduction=reduction)
    want = _loop_supcon(kw["features"], kw["labels"], 0.3, kw["contrast"], kw["contrast_labels"],
                        kw["contrast_mode"], normalize, reduction)
    torch.testing.assert_close(got, torch.tensor(want, dtype=torch.float64), rtol=1e-12, atol=1e-12)


def test_reference64_zero_row_gradient_is_finite():
    x = torch.tensor([[0.0, 0.0], [1.0, 2.0], [3.0, -1.0]], dtype=torch.float64, requires_grad=True)
    supcon_reference64(x, torch.tensor([0, 0, 0])).backward()
    assert torch.isfinite(x.grad).all()
    # as F.normalize: the zero row's gradient is dz / 1e-12
    assert x.grad[0].abs().max() > 1e6


# ------------------------------------------------------------------------------------------
# The checker must catch wrong backends
# ------------------------------------------------------------------------------------------

class _ScaleGrad(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        return g * 1.001


def _mutant(kind):
    real = scl_kernels.loss.resolve_backend("cpu", torch.device("cpu"))

    def run(rows, labels, contrast, contrast_labels, temperature, num_anchors, normalize):
        if kind == "loss":
            loss, npos = real(rows, labels, contrast, contrast_labels, temperature, num_anchors,
                              normalize)
            return loss * 1.001, npos
        if kind == "grad":
            return real(_ScaleGrad.apply(rows), labels, contrast, contrast_labels, temperature,
                        num_anchors, normalize)
        if kind == "temperature":
            return real(rows, labels, contrast, contrast_labels, temperature * 1.001, num_anchors,
                        normalize)
        if kind == "mean_over_all_anchors":  # SupContrast's convention, not ours
            loss, npos = real(rows, labels, contrast, contrast_labels, temperature, num_anchors,
                              normalize)
            return loss, torch.ones_like(npos)
        if kind == "self_included":  # forgets to exclude the self column: a cross-set call
            loss, npos = real(rows[:num_anchors], labels[:num_anchors], rows, labels, temperature,
                              num_anchors, normalize)
            return loss, npos
        raise ValueError(kind)
    return run


@pytest.mark.parametrize("kind", ["loss", "grad", "temperature", "mean_over_all_anchors",
                                  "self_included"])
def test_checker_catches_mutants(kind, monkeypatch, randn, randint, gen):
    x = randn(3, 2, 5)
    labels = torch.tensor([0, 0, 1])
    if kind == "mean_over_all_anchors":
        x, labels = randn(6, 5), torch.tensor([0, 0, 1, 2, 3, 4])  # four anchors without positive
    # the unmutated backend passes
    check_against_reference("cpu", x, labels, torch.tensor(0.2, requires_grad=True), generator=gen)
    mutant = _mutant(kind)
    monkeypatch.setattr(scl_kernels.loss, "resolve_backend", lambda name, device: mutant)
    with pytest.raises(AssertionError):
        check_against_reference("cpu", x, labels, torch.tensor(0.2, requires_grad=True),
                                generator=gen)
