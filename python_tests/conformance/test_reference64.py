"""Tests of the test oracle: reference64 against a pure-Python loop implementation of the spec,
and check_against_reference catching deliberately wrong backends."""
import math

from types import SimpleNamespace

import pytest
import torch

import scl_kernels
import scl_kernels.functional
from scl_kernels.backends import mean_over_anchors_with_positives
from support.layouts import LAYOUTS, make_layout
from support.reference64 import (check_against_reference, check_op_against_reference,
                                 op_reference64, supcon_reference64)


def _loop_supcon(features, labels, t, contrast=None, contrast_labels=None, mode="all",
                 normalize=True, reduction="mean"):
    """The maths of docs/MATH.md written as plain Python loops over floats."""
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
    """A backend's run (Backend.run's arguments) with one defect; its per-anchor losses are
    reduced as the op's mean=True reduces them, so that the mean sees the defect too."""
    real = scl_kernels.functional.resolve_backend("cpu", torch.device("cpu")).run

    def run(rows, labels, contrast, contrast_labels, temperature, num_anchors, normalize,
            anchor_offset=0, focal_gamma=0.0, mean=False, groups=None, contrast_groups=None,
            multi_label="any"):
        assert anchor_offset == 0, "supcon_loss's layouts start their anchors at row 0"
        assert groups is None and contrast_groups is None, "the mutants take no groups"
        assert labels.dim() == 1, "the mutants take class ids"
        loss, npos = per_anchor(rows, labels, contrast, contrast_labels, temperature,
                                num_anchors, normalize, focal_gamma)
        return (mean_over_anchors_with_positives(loss, npos) if mean else loss), npos

    def per_anchor(rows, labels, contrast, contrast_labels, temperature, num_anchors, normalize,
                   focal_gamma):
        if kind == "focal_ignored":  # computes SupCon whatever focal_gamma asks
            return real(rows, labels, contrast, contrast_labels, temperature, num_anchors,
                        normalize)
        if kind == "focal_gamma_off":  # the focal loss with another gamma
            return real(rows, labels, contrast, contrast_labels, temperature, num_anchors,
                        normalize, focal_gamma=focal_gamma * 1.01)
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
                                  "self_included", "focal_ignored", "focal_gamma_off"])
def test_checker_catches_mutants(kind, monkeypatch, randn, randint, gen, cpu_library):
    x = randn(3, 2, 5)
    labels = torch.tensor([0, 0, 1])
    if kind == "mean_over_all_anchors":
        x, labels = randn(6, 5), torch.tensor([0, 0, 1, 2, 3, 4])  # four anchors without positive
    focal = {"focal_gamma": 2.0} if kind.startswith("focal") else {}
    # the unmutated backend passes
    check_against_reference("cpu", x, labels, torch.tensor(0.2, requires_grad=True), generator=gen,
                            **focal)
    mutant = _mutant(kind)
    monkeypatch.setattr(scl_kernels.functional, "resolve_backend",
                        lambda name, device, focal_gamma=0.0, shape=None, groups=False,
                        multi_label=False: SimpleNamespace(run=mutant))
    with pytest.raises(AssertionError):
        check_against_reference("cpu", x, labels, torch.tensor(0.2, requires_grad=True),
                                generator=gen, **focal)


# ------------------------------------------------------------------------------------------
# The raw-op reference and checker
# ------------------------------------------------------------------------------------------

def test_op_reference_anchor_blocks(randn, randint):
    """op_reference64's anchor block against supcon_reference64 of contrast_mode='one' (the
    block at offset 0) and of a rotated copy of the rows (the block moved to the front)."""
    # 15 rows = 3 views of 5 samples, view-major: the first block of 5 is contrast_mode="one"
    x, sample_labels = randn(15, 4, dtype=torch.float64), randint(0, 3, (5,))
    y = sample_labels.repeat(3)
    t = torch.tensor(0.3, dtype=torch.float64)
    first = op_reference64(x, y, None, None, t, 5, True, 0)
    views = x.reshape(3, 5, 4).transpose(0, 1)  # views[b, v] = row v * 5 + b
    one = supcon_reference64(views, sample_labels, 0.3, contrast_mode="one", reduction="none")
    torch.testing.assert_close(first.loss, one.detach(), rtol=1e-14, atol=1e-14)
    x, y = x[:12], y[:12]
    shifted = op_reference64(x, y, None, None, t, 4, True, 7, grad_loss=torch.ones(4))
    order = torch.cat([torch.arange(7, 12), torch.arange(7)])
    moved = op_reference64(x[order], y[order], None, None, t, 4, True, 0, grad_loss=torch.ones(4))
    torch.testing.assert_close(shifted.loss, moved.loss, rtol=1e-14, atol=1e-14)
    torch.testing.assert_close(shifted.lse, moved.lse, rtol=1e-14, atol=1e-14)
    torch.testing.assert_close(shifted.grads[0][order], moved.grads[0], rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(shifted.grads[2], moved.grads[2], rtol=1e-12, atol=1e-14)
    # rows outside the block still get their contrast-side gradient
    assert (shifted.grads[0][:7].abs().sum(dim=1) > 0).all()


def _op_mutant(kind):
    forward, backward = torch.ops.scl.supcon, torch.ops.scl.supcon_backward

    def run_forward(*args, **kwargs):
        loss, lse, num_positives = forward(*args, **kwargs)
        if kind == "loss":
            loss = loss * 1.001
        elif kind == "lse":
            lse = lse + 1e-3
        elif kind == "num_positives":
            num_positives = num_positives.flip(0)
        elif kind == "unwritten_loss":
            loss = loss.clone()
            loss[-1] = float("nan")
        return loss, lse, num_positives

    def run_backward(*args, **kwargs):
        grad_features, grad_contrast, grad_temperature = backward(*args, **kwargs)
        if kind == "grad_features":
            grad_features = grad_features * 1.001
        elif kind == "grad_temperature":
            grad_temperature = grad_temperature * 1.001
        elif kind == "contrast_side_rows_missing":  # rows past the anchors left at zero
            grad_features = grad_features.clone()
            grad_features[10:] = 0
        return grad_features, grad_contrast, grad_temperature
    return run_forward, run_backward


@pytest.mark.parametrize("kind", ["loss", "lse", "num_positives", "unwritten_loss", "grad_features",
                                  "grad_temperature", "contrast_side_rows_missing"])
def test_op_checker_catches_mutants(kind, randn, randint, gen, cpu_library):
    args = (randn(24, 5), randint(0, 4, (24,)), None, None, torch.tensor(0.2, dtype=torch.float64),
            10, True)
    ops = (torch.ops.scl.supcon, torch.ops.scl.supcon_backward)
    # lse_float64=False: the oracle, not today's lse dtype, is under test here
    check_op_against_reference(*ops, args, generator=gen, lse_float64=False)
    with pytest.raises(AssertionError):
        check_op_against_reference(*_op_mutant(kind), args, generator=gen, lse_float64=False)
