"""The conformance suite, part 1: supcon_loss(backend=...) against the float64 reference, for
every backend that scl_kernels.available_backends lists on every device present (the plugin
support/backend_matrix.py generates the ``backend`` argument and each backend's budget of the
``matrix`` values).

Every layout, awkward sizes around the tiles, fp32 / fp64 / fp16 / bf16, reductions, a
temperature tensor, label patterns, degenerate values, non-contiguous inputs, anchors without
positives, the module form, the numerical contract at large logits, and gradcheck; each of them
for SupCon and the focal contrastive loss (focal_gamma, FOCAL_GAMMAS).
Backend-specific behaviour is in backends/ (test_cpu_backend.py, test_triton_*.py, ...)."""

import pytest
import torch
from torch.autograd import gradcheck

import scl_kernels
from scl_kernels._testing import test_hooks
from support import needs
from support.layouts import LAYOUTS, make_layout, num_anchor_rows
from support.reference64 import (check_against_reference, check_backend_against_reference,
                                 supcon_reference64)

FLOATS = [torch.float32, torch.float64]
HALVES = [torch.float16, torch.bfloat16]
# SupCon (0) and the focal contrastive loss, with gamma below and above 1 (u^gamma is concave,
# then convex). Every matrix below runs them all: the CPU budget's full product triples these
# tests' cases (a few seconds each on the fused CPU backend); slow backends take the pairwise
# subset, which still runs every value of every other argument with each gamma.
FOCAL_GAMMAS = [0.0, 0.5, 2.0]


def _needs_focal(backend, focal_gamma):
    if not backend.info.runs(focal_gamma):
        pytest.skip(f"{backend} does not implement focal_gamma={focal_gamma} (Backend.focal)")


def _run(backend, kw, gen, **extra):
    """check_backend_against_reference where the backend computes the focal loss asked for."""
    _needs_focal(backend, extra.get("focal_gamma", 0.0))
    return check_backend_against_reference(backend, kw, gen, **extra)


def _loss(backend, **kw):
    _needs_focal(backend, kw.get("focal_gamma", 0.0))
    return scl_kernels.supcon_loss(**backend.put(kw), backend=backend.name)


# ------------------------------------------------------------------------------------------
# The shared core's O(N*D) terms run in bounded chunks of rows (the test hook chunk_elements:
# elements each): 7-row chunks at D = 20 split anchors, contrast rows and the gradient assembly.
# ------------------------------------------------------------------------------------------

@needs.hooks
@pytest.mark.matrix(layout=["single_all", "multiview_one", "cross_labels"], focal_gamma=FOCAL_GAMMAS)
def test_row_chunks_of_the_linear_terms(backend, layout, focal_gamma, randn, randint, gen):
    kw = make_layout(layout, randn, randint, n=40, d=20)
    with test_hooks(chunk_elements=7 * 20):
        _run(backend, kw, gen, temperature=torch.tensor(0.1, requires_grad=True),
             focal_gamma=focal_gamma)


# ------------------------------------------------------------------------------------------
# Every layout, fp32 and fp64, three temperatures: 0.02 takes the running-max ("plain") path
# in fp32, 0.1 and 10 the fixed-shift symmetric path for single-set "all". 45 x 37 crosses the
# interpreter's 32-wide tiles.
# ------------------------------------------------------------------------------------------

@pytest.mark.matrix(layout=LAYOUTS, dtype=FLOATS, temperature=[0.02, 0.1, 10.0],
                    focal_gamma=FOCAL_GAMMAS, quick="each")
def test_layouts(backend, layout, dtype, temperature, focal_gamma, randn, randint, gen):
    kw = make_layout(layout, randn, randint, dtype=dtype, n=45, d=37)
    res = _run(backend, kw, gen, temperature=temperature, focal_gamma=focal_gamma)
    assert res.loss.dim() == 0
    assert float(res.ref.loss.detach()) > 0  # a real loss, not the degenerate 0


@pytest.mark.matrix(layout=LAYOUTS, reduction=["sum", "none"], focal_gamma=FOCAL_GAMMAS)
def test_reductions(backend, layout, reduction, focal_gamma, randn, randint, gen):
    # few classes among many rows would give every anchor a positive: use more classes so that
    # some anchors have none and must carry exactly 0
    kw = make_layout(layout, randn, randint, n=20, d=6, classes=12)
    res = _run(backend, kw, gen, temperature=0.1, reduction=reduction, focal_gamma=focal_gamma)
    if reduction == "none":
        assert res.loss.shape == (num_anchor_rows(kw),)
        assert res.loss.dtype == torch.float32
    else:
        assert res.loss.dim() == 0


@pytest.mark.matrix(layout=LAYOUTS, focal_gamma=FOCAL_GAMMAS)
def test_reductions_are_consistent(backend, layout, focal_gamma, randn, randint):
    kw = make_layout(layout, randn, randint, n=20, d=6, classes=12)
    per_anchor = _loss(backend, **kw, reduction="none", focal_gamma=focal_gamma)
    total = _loss(backend, **kw, reduction="sum", focal_gamma=focal_gamma)
    mean = _loss(backend, **kw, reduction="mean", focal_gamma=focal_gamma)
    ref = supcon_reference64(**kw, reduction="none", full=True)
    valid = int((ref.num_positives > 0).sum())
    assert valid > 0
    torch.testing.assert_close(total, per_anchor.sum(), rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(mean, per_anchor.sum() / valid, rtol=1e-6, atol=1e-6)


# ------------------------------------------------------------------------------------------
# Temperature as a tensor that requires grad
# ------------------------------------------------------------------------------------------

T_DTYPES = [("f32-t32", torch.float32, torch.float32), ("f64-t64", torch.float64, torch.float64),
            ("f32-t64", torch.float32, torch.float64), ("f64-t32", torch.float64, torch.float32),
            ("f32-tbf16", torch.float32, torch.bfloat16)]


@pytest.mark.matrix(layout=LAYOUTS, temperature=[0.02, 0.3], dtypes=T_DTYPES,
                    focal_gamma=FOCAL_GAMMAS)
def test_temperature_tensor_grad(backend, layout, temperature, dtypes, focal_gamma, randn, randint,
                                 gen):
    _, dtype, t_dtype = dtypes
    kw = make_layout(layout, randn, randint, dtype=dtype, n=18, d=5)
    t = torch.tensor(temperature, dtype=t_dtype, requires_grad=True)
    res = _run(backend, kw, gen, temperature=t, reduction="none", focal_gamma=focal_gamma)
    assert "temperature" in res.grads
    assert res.grads["temperature"].shape == ()
    assert res.grads["temperature"].dtype == t_dtype
    assert float(res.ref_grads["temperature"]) != 0


@pytest.mark.quick
def test_temperature_tensor_without_grad(backend, randn, randint):
    x = randn(16, 5)
    y = randint(0, 3, (16,))
    a = _loss(backend, features=x, labels=y, temperature=torch.tensor(0.2))
    b = _loss(backend, features=x, labels=y, temperature=0.2)
    torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)


# ------------------------------------------------------------------------------------------
# Awkward sizes: N and D around and between the tile sizes 32 / 64 / 128 / 256 (N < tile,
# N = 1, 2, one past a tile, several partial tiles), within each backend's budget
# ------------------------------------------------------------------------------------------

AWKWARD_ROWS = [1, 2, 7, 33, 70, 127, 129, 300]
AWKWARD_DIMS = [1, 3, 37, 130]


@pytest.mark.matrix(n=AWKWARD_ROWS, d=AWKWARD_DIMS,
                    case=["single_sym", "single_plain", "multiview_one", "cross", "cross_narrow"],
                    focal_gamma=FOCAL_GAMMAS, quick="each")
def test_awkward_shapes(backend, n, d, case, focal_gamma, randn, randint, gen):
    classes = max(2, n // 5)
    if case in ("single_sym", "single_plain"):
        kw = dict(features=randn(n, d), labels=randint(0, classes, (n,)))
        t = 0.1 if case == "single_sym" else 0.02
    elif case == "multiview_one":
        b = max(1, n // 2)
        kw = dict(features=randn(b, 2, d), labels=randint(0, classes, (b,)), contrast_mode="one")
        t = 0.1
    else:
        # contrast rows span more tiles than the anchors, or fewer rows than the anchors
        m = n + backend.budget.rows(131) if case == "cross" else 1 + n // 50
        kw = dict(features=randn(n, d), labels=randint(0, classes, (n,)),
                  contrast=randn(m, d), contrast_labels=randint(0, classes, (m,)))
        t = 0.1
    res = _run(backend, kw, gen, temperature=torch.tensor(t, requires_grad=True), reduction="none",
               focal_gamma=focal_gamma)
    assert res.loss.shape == (num_anchor_rows(kw),)


@pytest.mark.matrix(case=[
    ("t0.005-f32", 0.005, torch.float32), ("t0.0235-f32", 0.0235, torch.float32),
    ("t0.0245-f32", 0.0245, torch.float32), ("t0.03-f32", 0.03, torch.float32),
    ("t0.0025-f64", 0.0025, torch.float64), ("t0.0035-f64", 0.0035, torch.float64),
    ("t100-f32", 100.0, torch.float32), ("t1e4-f64", 1e4, torch.float64)],
    focal_gamma=FOCAL_GAMMAS)
def test_temperature_range(backend, case, focal_gamma, randn, randint, gen):
    """Either side of the fixed-shift threshold (t ~ 0.024 in fp32, ~0.003 in fp64) and far out."""
    _, temperature, dtype = case
    n = backend.budget.rows(150)
    kw = dict(features=randn(n, 12, dtype=dtype), labels=randint(0, 6, (n,)))
    _run(backend, kw, gen, temperature=torch.tensor(temperature, dtype=dtype, requires_grad=True),
         focal_gamma=focal_gamma)


# ------------------------------------------------------------------------------------------
# Label patterns
# ------------------------------------------------------------------------------------------

@pytest.mark.matrix(layout=["single_all", "multiview_all", "multiview_one", "cross_labels"],
                    focal_gamma=FOCAL_GAMMAS)
def test_one_class_for_all(backend, layout, focal_gamma, randn, randint, gen):
    kw = make_layout(layout, randn, randint, n=30, d=7, classes=1)
    res = _run(backend, kw, gen, reduction="none", focal_gamma=focal_gamma)
    assert (res.ref.num_positives > 0).all()


@pytest.mark.matrix(focal_gamma=FOCAL_GAMMAS)
def test_all_labels_distinct_multiview(backend, focal_gamma, randn, gen):
    # distinct labels with two views: each anchor's only positive is its other view
    b = 13
    kw = dict(features=randn(b, 2, 5), labels=torch.randperm(100, generator=gen)[:b])
    res = _run(backend, kw, gen, reduction="none", focal_gamma=focal_gamma)
    assert (res.ref.num_positives == 1).all()
    # the same as labels=None (SimCLR)
    same = _loss(backend, features=kw["features"], labels=None, reduction="none",
                 focal_gamma=focal_gamma)
    torch.testing.assert_close(res.loss.detach(), same, rtol=1e-5, atol=1e-6)


@pytest.mark.matrix(layout=["single_all", "multiview_all", "multiview_one", "cross_labels",
                            "cross_multiview"], focal_gamma=FOCAL_GAMMAS)
def test_negative_labels(backend, layout, focal_gamma, randn, randint, gen):
    kw = make_layout(layout, randn, randint, n=30, d=7, classes=4)
    # about a third of the labels become "no class" (-1, -5, ...), on both sides
    kw["labels"] = torch.where(randint(0, 3, kw["labels"].shape) == 0,
                               -randint(1, 6, kw["labels"].shape), kw["labels"])
    if kw.get("contrast_labels") is not None:
        cl = kw["contrast_labels"]
        kw["contrast_labels"] = torch.where(randint(0, 3, cl.shape) == 0, -randint(1, 6, cl.shape), cl)
    res = _run(backend, kw, gen, reduction="none", focal_gamma=focal_gamma)
    ref = res.ref
    # anchors without class carry no loss, and their rows never count as positives
    assert (ref.num_positives == 0).any() and (ref.num_positives > 0).any()
    loss = res.loss.detach().cpu()
    assert (loss[ref.num_positives == 0] == 0).all()


@pytest.mark.matrix(reduction=["mean", "sum", "none"], focal_gamma=FOCAL_GAMMAS)
def test_negative_labels_with_zero_rows(backend, reduction, focal_gamma, randn, randint, gen):
    x = randn(40, 33)
    x[3] = 0.0
    labels = randint(-1, 3, (40,))
    _run(backend, dict(features=x, labels=labels), gen, temperature=0.5, reduction=reduction,
         focal_gamma=focal_gamma)


def test_negative_labels_are_still_negatives(backend, randn, gen):
    """A no-class row enters every LSE: removing it changes the loss of the other anchors
    (at t = 1 its exp is at least e^-2 / 8 of the others' sum: far above fp32 rounding)."""
    x = randn(9, 4)
    y = torch.tensor([0, 0, 1, 1, 2, 2, 0, 1, -1])
    with_row = _loss(backend, features=x, labels=y, temperature=1.0, reduction="none")
    without = _loss(backend, features=x[:-1], labels=y[:-1], temperature=1.0, reduction="none")
    assert with_row[-1] == 0
    assert (with_row[:-1] > without).all()
    _run(backend, dict(features=x, labels=y), gen, reduction="none")


@pytest.mark.matrix(dtype=[torch.int64, torch.int32, torch.int16, torch.uint8])
def test_label_dtypes_and_extreme_values(backend, dtype, randn, gen):
    info = torch.iinfo(dtype)
    values = torch.tensor([info.max, 0, info.max, 5, 5, max(info.min, -1), 0, 3, 3, info.max],
                          dtype=dtype)
    x, c = randn(10, 4), randn(12, 4)
    res = _run(backend, dict(features=x, labels=values), gen, reduction="none")
    small = torch.unique(values.long(), return_inverse=True)[1]  # the same partition, small ids
    small = torch.where(values.long() < 0, -1, small)
    same = _loss(backend, features=x, labels=small, reduction="none")
    torch.testing.assert_close(res.loss.detach(), same, rtol=0, atol=0)
    contrast_labels = values[torch.arange(12) % 10]
    _run(backend, dict(features=x, labels=values, contrast=c, contrast_labels=contrast_labels), gen,
         reduction="none")


# ------------------------------------------------------------------------------------------
# Degenerate values
# ------------------------------------------------------------------------------------------

@pytest.mark.matrix(layout=["single_all", "multiview_one", "cross_labels"], temperature=[0.02, 0.1],
                    focal_gamma=FOCAL_GAMMAS)
def test_zero_rows_normalized(backend, layout, temperature, focal_gamma, randn, randint, gen):
    kw = make_layout(layout, randn, randint, n=20, d=6, classes=3)
    f = kw["features"].clone()
    f.view(-1, f.shape[-1])[[0, 3, 7]] = 0
    kw["features"] = f
    if kw.get("contrast") is not None:
        c = kw["contrast"].clone()
        c[[1, 2, 20]] = 0
        kw["contrast"] = c
    res = _run(backend, kw, gen, temperature=temperature, focal_gamma=focal_gamma)
    # F.normalize semantics: an all-zero row gets dz / eps, huge but finite
    g = res.grads["features"].reshape(-1, f.shape[-1])
    assert torch.isfinite(g).all()


@pytest.mark.matrix(layout=["single_all", "multiview_all", "multiview_one", "clip", "cross_labels"],
                    dtype=FLOATS, temperature=[1.0, 10.0], d=[1, 5], focal_gamma=FOCAL_GAMMAS)
def test_large_norms_without_normalize(backend, layout, dtype, temperature, d, focal_gamma, randn,
                                       randint, gen):
    # D = 1 only without normalisation: unit rows of width 1 are +-1 and their gradient is 0
    kw = make_layout(layout, randn, randint, dtype=dtype, n=20, d=d)
    kw["features"] = (kw["features"].double() * 12).to(dtype)
    if kw.get("contrast") is not None:
        kw["contrast"] = (kw["contrast"].double() * 12).to(dtype)
    res = _run(backend, kw, gen, temperature=torch.tensor(temperature, dtype=dtype,
                                                          requires_grad=True), normalize=False,
               focal_gamma=focal_gamma)
    if d > 1 or temperature == 1.0:
        assert float(res.ref.logits.detach().abs().max()) > 50  # far beyond the fixed-shift range


@pytest.mark.matrix(layout=LAYOUTS, focal_gamma=FOCAL_GAMMAS)
def test_small_norms_without_normalize(backend, layout, focal_gamma, randn, randint, gen):
    kw = make_layout(layout, randn, randint, n=20, d=5)
    kw["features"] = kw["features"] * 0.3
    if kw.get("contrast") is not None:
        kw["contrast"] = kw["contrast"] * 0.3
    _run(backend, kw, gen, temperature=0.1, normalize=False, reduction="none",
         focal_gamma=focal_gamma)


# ------------------------------------------------------------------------------------------
# 16-bit inputs: float32 loss, gradients in the input dtype
# ------------------------------------------------------------------------------------------

@pytest.mark.matrix(layout=LAYOUTS, dtype=HALVES, temperature=[0.02, 0.1], focal_gamma=FOCAL_GAMMAS,
                    quick="each")
def test_half_precision(backend, layout, dtype, temperature, focal_gamma, randn, randint, gen):
    kw = make_layout(layout, randn, randint, dtype=dtype, n=40, d=24)
    res = _run(backend, kw, gen, temperature=torch.tensor(temperature, requires_grad=True),
               focal_gamma=focal_gamma)
    assert res.loss.dtype == torch.float32
    assert res.grads["features"].dtype == dtype
    if "contrast" in res.grads:
        assert res.grads["contrast"].dtype == dtype


# ------------------------------------------------------------------------------------------
# The numerical contract: for finite inputs whose float64 loss is representable in float32,
# the float32 loss and gradient are finite and within fp32 accuracy of float64, at a FIXED
# tolerance (the reference's logit-scaled tolerances would hide a gradient that is 10% off).
# Plain schedule: normalize=False at scales up to 5000 (logits ~ 1e10); both schedules with
# normalize=True (t = 0.05 symmetric for single-set "all", t = 0.01 plain).
# ------------------------------------------------------------------------------------------

CONTRACT_LOSS_RTOL = 1e-5
CONTRACT_GRAD_RTOL = 1e-4   # ||grad - grad64|| / ||grad64||
# The one documented exception (docs/STATUS.md): Triton's focal walk forms the positive logits
# apart from its log-sum-exp tiles, so at logits of 1e6 and more (unnormalised rows x100 and up)
# x = lse - s of a dominant positive is float32 noise of the logits' size, and its focal weight
# with it. The loss keeps the contract; the gradient is held to this looser bound.
TRITON_FOCAL_RAW_GRAD_RTOL = 2e-2

CONTRACT_CASES = [
    ("x1-t0.02-raw", 1.0, 0.02, False), ("x100-t0.02-raw", 100.0, 0.02, False),
    ("x4000-t0.02-raw", 4000.0, 0.02, False), ("x5000-t0.02-raw", 5000.0, 0.02, False),
    ("x1-t0.05-unit", 1.0, 0.05, True), ("x1-t0.01-unit", 1.0, 0.01, True),
]


@pytest.mark.matrix(case=CONTRACT_CASES, focal_gamma=FOCAL_GAMMAS,
                    quick=lambda case, focal_gamma: focal_gamma == 0)
def test_float32_accuracy_contract(backend, case, focal_gamma):
    _needs_focal(backend, focal_gamma)
    _, scale, temperature, normalize = case
    g = torch.Generator().manual_seed(1)  # the same numbers as torch.manual_seed(1)
    x = torch.randn(64, 1, 16, generator=g) * scale
    labels = torch.randint(0, 10, (64,), generator=g)
    x64 = x.double().requires_grad_(True)
    want = supcon_reference64(x64, labels, temperature, normalize=normalize,
                              focal_gamma=focal_gamma)
    want_grad, = torch.autograd.grad(want, [x64])
    want = want.detach()
    assert abs(float(want)) < torch.finfo(torch.float32).max  # representable in float32

    features = backend.put(x).requires_grad_(True)
    loss = scl_kernels.supcon_loss(features, backend.put(labels), temperature, normalize=normalize,
                                   backend=backend.name, focal_gamma=focal_gamma)
    grad, = torch.autograd.grad(loss, [features])
    loss = loss.detach()
    assert loss.dtype == torch.float32 and grad.dtype == torch.float32
    assert torch.isfinite(loss), f"loss is {float(loss)} (float64: {float(want):.9g})"
    assert torch.isfinite(grad).all(), f"{int((~torch.isfinite(grad)).sum())} non-finite gradients"
    loss_error = abs(float(loss) - float(want)) / abs(float(want))
    assert loss_error <= CONTRACT_LOSS_RTOL, (
        f"loss {float(loss):.9g} vs float64 {float(want):.9g}: relative error {loss_error:.2e}")
    grad_error = float((grad.double().cpu() - want_grad).norm() / want_grad.norm())
    grad_rtol = CONTRACT_GRAD_RTOL
    if backend.name == "triton" and focal_gamma > 0 and not normalize and scale >= 100:
        grad_rtol = TRITON_FOCAL_RAW_GRAD_RTOL
    assert grad_error <= grad_rtol, (
        f"gradient relative error in norm {grad_error:.2e} > {grad_rtol:.0e} "
        f"(max |diff| {float((grad.double().cpu() - want_grad).abs().max()):.3e}, "
        f"max |grad64| {float(want_grad.abs().max()):.3e})")


# ------------------------------------------------------------------------------------------
# Non-contiguous inputs
# ------------------------------------------------------------------------------------------

def _strided(randn, shape, kind, device):
    """A non-contiguous tensor of this shape on the device (views taken there)."""
    if kind == "transposed":
        if len(shape) == 2:
            x = randn(shape[1], shape[0]).to(device).T
        else:
            x = randn(shape[1], shape[0], shape[2]).to(device).transpose(0, 1)
    else:  # every other column of a wider tensor
        x = randn(*shape[:-1], 2 * shape[-1]).to(device)[..., ::2]
    assert x.shape == tuple(shape) and not x.is_contiguous()
    return x


@pytest.mark.matrix(layout=LAYOUTS, kind=["transposed", "strided"], focal_gamma=FOCAL_GAMMAS)
def test_non_contiguous(backend, layout, kind, focal_gamma, randn, randint, gen):
    kw = make_layout(layout, randn, randint, n=22, d=7)
    kw["features"] = _strided(randn, kw["features"].shape, kind, backend.device)
    if kw.get("contrast") is not None:
        kw["contrast"] = _strided(randn, kw["contrast"].shape, kind, backend.device)
    for key in ("labels", "contrast_labels"):
        if kw.get(key) is not None:
            n = kw[key].shape[0]
            kw[key] = randint(0, 4, (2 * n,)).to(backend.device)[::2]
            assert not kw[key].is_contiguous()
    res = _run(backend, kw, gen, temperature=torch.tensor(0.1, requires_grad=True),
               reduction="none", focal_gamma=focal_gamma)
    # same values as with contiguous copies
    contiguous = {k: (v.contiguous() if isinstance(v, torch.Tensor) else v) for k, v in kw.items()}
    again = _loss(backend, **contiguous, reduction="none", focal_gamma=focal_gamma)
    torch.testing.assert_close(res.loss.detach(), again, rtol=1e-6, atol=1e-6)


# ------------------------------------------------------------------------------------------
# No anchor with a positive: exactly 0, zero gradients, no NaN
# ------------------------------------------------------------------------------------------

def _no_valid_anchor_case(case, randn, randint):
    if case == "distinct_labels":
        return dict(features=randn(9, 4), labels=torch.arange(9))
    if case == "distinct_labels_40":
        return dict(features=randn(40, 8), labels=torch.arange(40))
    if case == "no_labels_2d":
        return dict(features=randn(9, 4))
    if case == "all_negative_labels":
        return dict(features=randn(9, 4), labels=torch.full((9,), -1))
    if case == "single_row":
        return dict(features=randn(1, 4), labels=torch.tensor([3]))
    if case == "single_row_no_labels":
        return dict(features=randn(1, 1, 4))
    if case == "one_view_no_labels":
        return dict(features=randn(5, 1, 4), contrast_mode="one")
    if case == "cross_disjoint":
        return dict(features=randn(6, 4), labels=randint(0, 3, (6,)),
                    contrast=randn(8, 4), contrast_labels=randint(3, 6, (8,)))
    if case == "cross_negative":
        return dict(features=randn(6, 4), labels=torch.full((6,), -2),
                    contrast=randn(8, 4), contrast_labels=torch.full((8,), -2))
    raise ValueError(case)


NO_VALID_CASES = ["distinct_labels", "distinct_labels_40", "no_labels_2d", "all_negative_labels",
                  "single_row", "single_row_no_labels", "one_view_no_labels", "cross_disjoint",
                  "cross_negative"]


@pytest.mark.matrix(case=NO_VALID_CASES, reduction=["mean", "sum", "none"], normalize=[True, False],
                    focal_gamma=FOCAL_GAMMAS,
                    quick=lambda case, reduction, normalize, focal_gamma: reduction == "mean"
                    and normalize and focal_gamma == 0
                    and case in ("distinct_labels", "single_row", "cross_disjoint"))
def test_no_valid_anchor(backend, case, reduction, normalize, focal_gamma, randn, randint):
    _needs_focal(backend, focal_gamma)
    kw = backend.put(_no_valid_anchor_case(case, randn, randint))
    x = kw.pop("features").requires_grad_()
    c = kw.pop("contrast", None)
    if c is not None:
        c.requires_grad_()
    t = torch.tensor(0.07, requires_grad=True)
    out = scl_kernels.supcon_loss(x, temperature=t, contrast=c, reduction=reduction,
                                  normalize=normalize, backend=backend.name,
                                  focal_gamma=focal_gamma, **kw)
    assert out.dtype == torch.float32
    assert torch.isfinite(out).all()
    assert (out == 0).all()
    if reduction == "none":
        assert out.shape == (num_anchor_rows(dict(features=x, contrast=c, **kw)),)
    upstream = torch.ones_like(out) if reduction == "none" else torch.tensor(1.0, device=out.device)
    inputs = [x, t] + ([c] if c is not None else [])
    grads = torch.autograd.grad(out, inputs, upstream, allow_unused=True)
    for g, inp in zip(grads, inputs):
        assert g is not None
        assert g.shape == inp.shape and g.dtype == inp.dtype
        assert torch.isfinite(g).all() and (g == 0).all()


@pytest.mark.matrix(layout=["single_all", "multiview_one", "cross_labels"], focal_gamma=FOCAL_GAMMAS)
def test_nan_upstream_on_anchors_without_positives(backend, layout, focal_gamma, randn, randint, gen,
                                                   reproducible):
    """Anchors without positives are constant zeros: a NaN upstream gradient there must not
    leak into the inputs' gradients (as autograd through torch.where behaves)."""
    kw = make_layout(layout, randn, randint, n=20, d=6, classes=12)
    kw["labels"][:2] = -1  # no class: never a loss-bearing anchor
    ref = supcon_reference64(**kw, reduction="none", full=True)
    no_pos = ref.num_positives == 0
    assert no_pos.any() and (~no_pos).any()
    upstream = torch.randn(no_pos.shape, generator=gen)
    poisoned = upstream.masked_fill(no_pos, float("nan"))
    res = _run(backend, kw, gen, reduction="none", upstream=poisoned, focal_gamma=focal_gamma)
    clean = _run(backend, kw, gen, reduction="none", upstream=upstream.masked_fill(no_pos, 0),
                 focal_gamma=focal_gamma)
    for name in res.grads:
        assert torch.equal(res.grads[name], clean.grads[name]), name


@pytest.mark.matrix(focal_gamma=FOCAL_GAMMAS)
def test_single_row_clip(backend, focal_gamma, randn, gen):
    # N = M = 1 without labels: the positive is the only column (pi = 1), so the loss is exactly
    # 0 but the anchor is valid (it counts in the mean)
    kw = dict(features=randn(1, 5), contrast=randn(1, 5))
    res = _run(backend, kw, gen, reduction="none", focal_gamma=focal_gamma)
    assert res.ref.num_positives.tolist() == [1]
    assert abs(float(res.loss.detach())) < 1e-6


# ------------------------------------------------------------------------------------------
# The module
# ------------------------------------------------------------------------------------------

@pytest.mark.quick
def test_module(backend, randn, randint, gen):
    t = torch.nn.Parameter(torch.tensor(0.2))
    module = scl_kernels.SupConLoss(temperature=t, contrast_mode="one", reduction="sum",
                                    backend=backend.name)
    assert [p is t for p in module.parameters()] == [True]
    text = repr(module)
    for piece in ("contrast_mode='one'", "reduction='sum'", f"backend={backend.name!r}",
                  "normalize=True"):
        assert piece in text
    x = backend.put(randn(10, 3, 6)).requires_grad_()
    y = backend.put(randint(0, 3, (10,)))
    out = module(x, y)
    res = check_against_reference(backend.name, x, y, t, contrast_mode="one", reduction="sum",
                                  generator=gen, compute_dtype=backend.computes_in(x.dtype))
    torch.testing.assert_close(out, res.loss, rtol=1e-6, atol=1e-6)
    # backward through the module reaches the parameter and accumulates into existing .grad
    x.grad = torch.ones_like(x)
    out.backward()
    assert t.grad is not None and torch.isfinite(t.grad)
    grad_x, = torch.autograd.grad(module(x, y), [x])
    torch.testing.assert_close(x.grad, 1 + grad_x)

    # cross set through the module (its own options)
    cross = scl_kernels.SupConLoss(temperature=0.5, normalize=False, backend=backend.name)
    f, c = backend.put(randn(7, 4)), backend.put(randn(9, 4))
    yl, cl = backend.put(randint(0, 2, (7,))), backend.put(randint(0, 2, (9,)))
    torch.testing.assert_close(
        cross(f, yl, c, cl),
        scl_kernels.supcon_loss(f, yl, 0.5, contrast=c, contrast_labels=cl, normalize=False,
                                backend=backend.name))


# ------------------------------------------------------------------------------------------
# gradcheck in float64 (backends that compute float64 in float64; finite differences of a
# float32 computation say nothing at these step sizes)
# ------------------------------------------------------------------------------------------

def _needs_float64(backend):
    computes = backend.computes_in(torch.float64)
    if computes != torch.float64:
        pytest.skip(f"{backend} computes float64 inputs in {computes}: gradcheck needs float64 "
                    "(its gradients are checked against reference64 by the other tests)")


def _x(g, *shape):
    return torch.randn(*shape, generator=g, dtype=torch.float64)


GRADCHECK_CASES = {
    # name: (builder, temperature) -- 0.1 in fp64 takes the symmetric path for single set "all",
    # 0.002 the running-max path (fixed shift unsafe in fp64 below t ~ 0.003)
    "single_all_sym": (lambda g: dict(features=_x(g, 9, 4), labels=torch.tensor([0, 1, 0, 2, 1, 0, 2, 2, -1])), 0.1),
    "single_all_plain": (lambda g: dict(features=_x(g, 9, 4), labels=torch.tensor([0, 1, 0, 2, 1, 0, 2, 2, -1])), 0.002),
    "multiview_all": (lambda g: dict(features=_x(g, 4, 2, 3), labels=torch.tensor([0, 1, 0, 1])), 0.2),
    "multiview_one": (lambda g: dict(features=_x(g, 4, 3, 3), labels=torch.tensor([0, 1, 0, 1]),
                                     contrast_mode="one"), 0.2),
    "simclr": (lambda g: dict(features=_x(g, 4, 2, 3)), 0.3),
    "cross_labels": (lambda g: dict(features=_x(g, 5, 3), labels=torch.tensor([0, 1, 2, 0, 1]),
                                    contrast=_x(g, 7, 3), contrast_labels=torch.tensor([0, 0, 1, 2, 2, 1, -1])), 0.2),
    "clip": (lambda g: dict(features=_x(g, 5, 3), contrast=_x(g, 5, 3)), 0.2),
    "simcse": (lambda g: dict(features=_x(g, 4, 3), contrast=_x(g, 7, 3)), 0.2),
}


@pytest.mark.matrix(name=sorted(GRADCHECK_CASES), reduction=["mean", "none"],
                    normalize=[True, False], focal_gamma=FOCAL_GAMMAS,
                    quick=lambda name, reduction, normalize, focal_gamma: name in (
                        "single_all_sym", "cross_labels")
                    and reduction == "mean" and normalize and focal_gamma == 0)
def test_gradcheck_features_contrast_temperature(backend, name, reduction, normalize, focal_gamma):
    _needs_float64(backend)
    _needs_focal(backend, focal_gamma)
    build, t0 = GRADCHECK_CASES[name]
    kw = backend.put(build(torch.Generator().manual_seed(len(name))))
    x = kw.pop("features").requires_grad_()
    c = kw.pop("contrast", None)
    if not normalize:
        # unnormalised rows at t = 0.002 give logits ~ 1e3 and curvature ~ 1e5: too steep for
        # finite differences (and without normalisation every single-set layout is "plain" anyway)
        t0 = max(t0, 0.2)
    t = torch.tensor(t0, dtype=torch.float64, requires_grad=True)
    inputs = (x, t) if c is None else (x, t, c.requires_grad_())

    def fn(*args):
        contrast = args[2] if len(args) > 2 else None
        return scl_kernels.supcon_loss(args[0], temperature=args[1], contrast=contrast,
                                       reduction=reduction, normalize=normalize,
                                       backend=backend.name, focal_gamma=focal_gamma, **kw)

    assert gradcheck(fn, inputs, eps=1e-6, atol=1e-7, rtol=1e-6)


@pytest.mark.matrix(temperature=[0.002, 0.02, 0.1], focal_gamma=FOCAL_GAMMAS)
def test_gradcheck_temperature_paths(backend, temperature, focal_gamma):
    """Single set "all" in fp64 across the fixed-shift threshold (symmetric vs running max)."""
    _needs_float64(backend)
    _needs_focal(backend, focal_gamma)
    g = torch.Generator().manual_seed(7)
    x = backend.put(_x(g, 8, 3)).requires_grad_()
    y = backend.put(torch.tensor([0, 1, 1, 0, 2, 2, 0, 1]))
    t = torch.tensor(temperature, dtype=torch.float64, requires_grad=True)
    # tiny temperatures make the loss steep: scale the finite-difference step with t
    assert gradcheck(lambda a, b: scl_kernels.supcon_loss(a, y, b, backend=backend.name,
                                                          focal_gamma=focal_gamma), (x, t),
                     eps=1e-6 * temperature / 0.1, atol=1e-6, rtol=1e-5)


def test_gradcheck_float_temperature_only_features(backend):
    _needs_float64(backend)
    x = backend.put(_x(torch.Generator().manual_seed(11), 3, 2, 4)).requires_grad_()
    y = backend.put(torch.tensor([0, 1, 0]))
    assert gradcheck(lambda a: scl_kernels.supcon_loss(a, y, 0.15, backend=backend.name,
                                                       reduction="sum"), (x,), eps=1e-6, atol=1e-7)


@pytest.mark.matrix(layout=["single", "cross"])
def test_double_backward_is_correct_or_refused(backend, layout):
    """create_graph=True through the loss: a second derivative must either be right (as the
    float64 reference's) or raise; it must never be silently wrong."""
    import warnings

    g = torch.Generator().manual_seed(3)
    x = _x(g, 10, 4).requires_grad_()
    y = torch.tensor([0, 1, 2, 0, 1, 2, 0, 1, 2, 0])
    kw = {}
    if layout == "cross":
        kw = dict(contrast=_x(g, 7, 4), contrast_labels=torch.tensor([0, 1, 2, 0, 1, 2, 2]))
    want, = torch.autograd.grad(
        torch.autograd.grad(supcon_reference64(x, y, **kw), [x], create_graph=True)[0].sum(), [x])
    xd = backend.put(x.detach()).requires_grad_()
    gx, = torch.autograd.grad(scl_kernels.supcon_loss(xd, backend.put(y), backend=backend.name,
                                                      **backend.put(kw)), [xd], create_graph=True)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            got, = torch.autograd.grad(gx.sum(), [xd])
    except (RuntimeError, NotImplementedError):
        return  # refusing double backward is acceptable
    float64 = backend.computes_in(torch.float64) == torch.float64
    torch.testing.assert_close(got.cpu(), want, rtol=1e-6 if float64 else 1e-3,
                               atol=(1e-8 if float64 else 1e-4) * float(want.abs().max()),
                               msg=lambda m: "double backward silently wrong: " + m)
