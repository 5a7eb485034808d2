"""Forward and backward of supcon_loss(backend="cpu" / "reference") against reference64."""

import pytest
import torch

import scl_kernels
from layouts import LAYOUTS, make_layout, num_anchor_rows, op_args
from reference64 import check_against_reference, supcon_reference64

BACKENDS = ("cpu", "reference")

pytestmark = pytest.mark.usefixtures("cpu_library")


def _run(backend, kw, gen, **extra):
    kw = dict(kw)
    features = kw.pop("features")
    return check_against_reference(backend, features, generator=gen, **kw, **extra)


# ------------------------------------------------------------------------------------------
# Every layout, fp32 and fp64, three temperatures: 0.02 takes the running-max ("plain") path
# in fp32, 0.1 and 10 the fixed-shift symmetric path for single-set "all".
# ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("temperature", [0.02, 0.1, 10.0])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("backend", BACKENDS)
def test_layouts(backend, layout, dtype, temperature, randn, randint, gen):
    kw = make_layout(layout, randn, randint, dtype=dtype, n=26, d=11)
    res = _run(backend, kw, gen, temperature=temperature)
    assert res.loss.dim() == 0
    assert float(res.ref.loss.detach()) > 0  # a real loss, not the degenerate 0


@pytest.mark.parametrize("reduction", ["sum", "none"])
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("backend", BACKENDS)
def test_reductions(backend, layout, reduction, randn, randint, gen):
    # few classes among many rows would give every anchor a positive: use more classes so that
    # some anchors have none and must carry exactly 0
    kw = make_layout(layout, randn, randint, n=20, d=6, classes=12)
    res = _run(backend, kw, gen, temperature=0.1, reduction=reduction)
    if reduction == "none":
        assert res.loss.shape == (num_anchor_rows(kw),)
        assert res.loss.dtype == torch.float32
    else:
        assert res.loss.dim() == 0


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("backend", BACKENDS)
def test_reductions_are_consistent(backend, layout, randn, randint):
    kw = make_layout(layout, randn, randint, n=20, d=6, classes=12)
    per_anchor = scl_kernels.supcon_loss(**kw, reduction="none", backend=backend)
    total = scl_kernels.supcon_loss(**kw, reduction="sum", backend=backend)
    mean = scl_kernels.supcon_loss(**kw, reduction="mean", backend=backend)
    ref = supcon_reference64(**kw, reduction="none", full=True)
    valid = int((ref.num_positives > 0).sum())
    assert valid > 0
    torch.testing.assert_close(total, per_anchor.sum(), rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(mean, per_anchor.sum() / valid, rtol=1e-6, atol=1e-6)


# ------------------------------------------------------------------------------------------
# Temperature as a tensor that requires grad
# ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtypes", [(torch.float32, torch.float32), (torch.float64, torch.float64),
                                    (torch.float32, torch.float64), (torch.float64, torch.float32),
                                    (torch.float32, torch.bfloat16)],
                         ids=["f32-t32", "f64-t64", "f32-t64", "f64-t32", "f32-tbf16"])
@pytest.mark.parametrize("temperature", [0.02, 0.3])
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("backend", BACKENDS)
def test_temperature_tensor_grad(backend, layout, temperature, dtypes, randn, randint, gen):
    dtype, t_dtype = dtypes
    kw = make_layout(layout, randn, randint, dtype=dtype, n=18, d=5)
    t = torch.tensor(temperature, dtype=t_dtype, requires_grad=True)
    res = _run(backend, kw, gen, temperature=t, reduction="none")
    assert "temperature" in res.grads
    assert res.grads["temperature"].shape == ()
    assert res.grads["temperature"].dtype == t_dtype
    assert float(res.ref_grads["temperature"]) != 0


@pytest.mark.parametrize("backend", BACKENDS)
def test_temperature_tensor_without_grad(backend, randn, randint):
    x = randn(16, 5)
    y = randint(0, 3, (16,))
    a = scl_kernels.supcon_loss(x, y, torch.tensor(0.2), backend=backend)
    b = scl_kernels.supcon_loss(x, y, 0.2, backend=backend)
    torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)


# ------------------------------------------------------------------------------------------
# Awkward shapes around the 128-row CPU tile
# ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("case", ["single_sym", "single_plain", "multiview_one", "cross",
                                  "cross_narrow"])
@pytest.mark.parametrize("d", [1, 3, 130])
@pytest.mark.parametrize("n", [1, 2, 7, 127, 129, 300])
@pytest.mark.parametrize("backend", BACKENDS)
def test_awkward_shapes(backend, n, d, case, randn, randint, gen):
    classes = max(2, n // 5)
    if case in ("single_sym", "single_plain"):
        kw = dict(features=randn(n, d), labels=randint(0, classes, (n,)))
        t = 0.1 if case == "single_sym" else 0.02
    elif case == "multiview_one":
        b = max(1, n // 2)
        kw = dict(features=randn(b, 2, d), labels=randint(0, classes, (b,)), contrast_mode="one")
        t = 0.1
    else:
        # contrast rows span two tiles more than the anchors, or fewer rows than the anchors
        m = n + 131 if case == "cross" else 1 + n // 50
        kw = dict(features=randn(n, d), labels=randint(0, classes, (n,)),
                  contrast=randn(m, d), contrast_labels=randint(0, classes, (m,)))
        t = 0.1
    res = _run(backend, kw, gen, temperature=torch.tensor(t, requires_grad=True), reduction="none")
    assert res.loss.shape == (num_anchor_rows(kw),)


@pytest.mark.parametrize("temperature,dtype", [
    (0.005, torch.float32), (0.0235, torch.float32), (0.0245, torch.float32), (0.03, torch.float32),
    (0.0025, torch.float64), (0.0035, torch.float64), (100.0, torch.float32), (1e4, torch.float64)])
@pytest.mark.parametrize("backend", BACKENDS)
def test_temperature_range(backend, temperature, dtype, randn, randint, gen):
    """Either side of the fixed-shift threshold (t ~ 0.024 in fp32, ~0.003 in fp64) and far out."""
    kw = dict(features=randn(150, 12, dtype=dtype), labels=randint(0, 6, (150,)))
    _run(backend, kw, gen, temperature=torch.tensor(temperature, dtype=dtype, requires_grad=True))


# ------------------------------------------------------------------------------------------
# Label patterns
# ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("layout", ["single_all", "multiview_all", "multiview_one", "cross_labels"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_one_class_for_all(backend, layout, randn, randint, gen):
    kw = make_layout(layout, randn, randint, n=30, d=7, classes=1)
    res = _run(backend, kw, gen, reduction="none")
    assert (res.ref.num_positives > 0).all()


@pytest.mark.parametrize("backend", BACKENDS)
def test_all_labels_distinct_multiview(backend, randn, gen):
    # distinct labels with two views: each anchor's only positive is its other view
    b = 13
    kw = dict(features=randn(b, 2, 5), labels=torch.randperm(100, generator=gen)[:b])
    res = _run(backend, kw, gen, reduction="none")
    assert (res.ref.num_positives == 1).all()
    # the same as labels=None (SimCLR)
    same = scl_kernels.supcon_loss(kw["features"], None, reduction="none", backend=backend)
    torch.testing.assert_close(res.loss.detach(), same, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("layout", ["single_all", "multiview_all", "multiview_one", "cross_labels",
                                    "cross_multiview"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_negative_labels(backend, layout, randn, randint, gen):
    kw = make_layout(layout, randn, randint, n=30, d=7, classes=4)
    # about a third of the labels become "no class" (-1, -5, ...), on both sides
    kw["labels"] = torch.where(randint(0, 3, kw["labels"].shape) == 0,
                               -randint(1, 6, kw["labels"].shape), kw["labels"])
    if kw.get("contrast_labels") is not None:
        cl = kw["contrast_labels"]
        kw["contrast_labels"] = torch.where(randint(0, 3, cl.shape) == 0, -randint(1, 6, cl.shape), cl)
    res = _run(backend, kw, gen, reduction="none")
    ref = res.ref
    # anchors without class carry no loss, and their rows never count as positives
    assert (ref.num_positives == 0).any() and (ref.num_positives > 0).any()
    loss = res.loss.detach()
    assert (loss[ref.num_positives == 0] == 0).all()


@pytest.mark.parametrize("backend", BACKENDS)
def test_negative_labels_are_still_negatives(backend, randn, gen):
    """A no-class row enters every LSE: removing it changes the loss of the other anchors."""
    x = randn(9, 4)
    y = torch.tensor([0, 0, 1, 1, 2, 2, 0, 1, -1])
    with_row = scl_kernels.supcon_loss(x, y, reduction="none", backend=backend)
    without = scl_kernels.supcon_loss(x[:-1], y[:-1], reduction="none", backend=backend)
    assert with_row[-1] == 0
    assert (with_row[:-1] > without).all()
    _run(backend, dict(features=x, labels=y), gen, reduction="none")


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.int16, torch.uint8])
@pytest.mark.parametrize("backend", BACKENDS)
def test_label_dtypes_and_extreme_values(backend, dtype, randn, gen):
    info = torch.iinfo(dtype)
    values = torch.tensor([info.max, 0, info.max, 5, 5, max(info.min, -1), 0, 3, 3, info.max],
                          dtype=dtype)
    x, c = randn(10, 4), randn(12, 4)
    res = _run(backend, dict(features=x, labels=values), gen, reduction="none")
    small = torch.unique(values.long(), return_inverse=True)[1]  # the same partition, small ids
    small = torch.where(values.long() < 0, -1, small)
    same = scl_kernels.supcon_loss(x, small, reduction="none", backend=backend)
    torch.testing.assert_close(res.loss.detach(), same, rtol=0, atol=0)
    contrast_labels = values[torch.arange(12) % 10]
    _run(backend, dict(features=x, labels=values, contrast=c, contrast_labels=contrast_labels), gen,
         reduction="none")


# ------------------------------------------------------------------------------------------
# Degenerate values
# ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("temperature", [0.02, 0.1])
@pytest.mark.parametrize("layout", ["single_all", "multiview_one", "cross_labels"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_zero_rows_normalized(backend, layout, temperature, randn, randint, gen):
    kw = make_layout(layout, randn, randint, n=20, d=6, classes=3)
    f = kw["features"].clone()
    f.view(-1, f.shape[-1])[[0, 3, 7]] = 0
    kw["features"] = f
    if kw.get("contrast") is not None:
        c = kw["contrast"].clone()
        c[[1, 2, 20]] = 0
        kw["contrast"] = c
    res = _run(backend, kw, gen, temperature=temperature)
    # F.normalize semantics: an all-zero row gets dz / eps, huge but finite
    g = res.grads["features"].reshape(-1, f.shape[-1])
    assert torch.isfinite(g).all()


@pytest.mark.parametrize("temperature", [1.0, 10.0])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("layout", ["single_all", "multiview_all", "multiview_one", "clip",
                                    "cross_labels"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_large_norms_without_normalize(backend, layout, dtype, temperature, randn, randint, gen):
    kw = make_layout(layout, randn, randint, dtype=dtype, n=20, d=5)
    kw["features"] = (kw["features"].double() * 12).to(dtype)
    if kw.get("contrast") is not None:
        kw["contrast"] = (kw["contrast"].double() * 12).to(dtype)
    res = _run(backend, kw, gen, temperature=torch.tensor(temperature, dtype=dtype,
                                                          requires_grad=True), normalize=False)
    assert float(res.ref.logits.detach().abs().max()) > 50  # far beyond the fixed-shift range


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("backend", BACKENDS)
def test_small_norms_without_normalize(backend, layout, randn, randint, gen):
    kw = make_layout(layout, randn, randint, n=20, d=5)
    kw["features"] = kw["features"] * 0.3
    if kw.get("contrast") is not None:
        kw["contrast"] = kw["contrast"] * 0.3
    _run(backend, kw, gen, temperature=0.1, normalize=False, reduction="none")


# ------------------------------------------------------------------------------------------
# 16-bit inputs: float32 loss, gradients in the input dtype
# ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("temperature", [0.02, 0.1])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["f16", "bf16"])
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("backend", BACKENDS)
def test_half_precision(backend, layout, dtype, temperature, randn, randint, gen):
    kw = make_layout(layout, randn, randint, dtype=dtype, n=40, d=24)
    res = _run(backend, kw, gen, temperature=torch.tensor(temperature, requires_grad=True))
    assert res.loss.dtype == torch.float32
    assert res.grads["features"].dtype == dtype
    if "contrast" in res.grads:
        assert res.grads["contrast"].dtype == dtype


# ------------------------------------------------------------------------------------------
# Non-contiguous inputs
# ------------------------------------------------------------------------------------------

def _strided(randn, shape, kind, dtype=torch.float32):
    if kind == "transposed":
        if len(shape) == 2:
            x = randn(shape[1], shape[0], dtype=dtype).T
        else:
            x = randn(shape[1], shape[0], shape[2], dtype=dtype).transpose(0, 1)
    else:  # every other column of a wider tensor
        x = randn(*shape[:-1], 2 * shape[-1], dtype=dtype)[..., ::2]
    assert x.shape == tuple(shape) and not x.is_contiguous()
    return x


@pytest.mark.parametrize("kind", ["transposed", "strided"])
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("backend", BACKENDS)
def test_non_contiguous(backend, layout, kind, randn, randint, gen):
    kw = make_layout(layout, randn, randint, n=22, d=7)
    kw["features"] = _strided(randn, kw["features"].shape, kind)
    if kw.get("contrast") is not None:
        kw["contrast"] = _strided(randn, kw["contrast"].shape, kind)
    for key in ("labels", "contrast_labels"):
        if kw.get(key) is not None:
            n = kw[key].shape[0]
            kw[key] = randint(0, 4, (2 * n,))[::2]
            assert not kw[key].is_contiguous()
    res = _run(backend, kw, gen, temperature=torch.tensor(0.1, requires_grad=True),
               reduction="none")
    # same values as with contiguous copies
    contiguous = {k: (v.contiguous() if isinstance(v, torch.Tensor) else v) for k, v in kw.items()}
    again = scl_kernels.supcon_loss(**contiguous, reduction="none", backend=backend)
    torch.testing.assert_close(res.loss.detach(), again, rtol=1e-6, atol=1e-6)


# ------------------------------------------------------------------------------------------
# No anchor with a positive: exactly 0, zero gradients, no NaN
# ------------------------------------------------------------------------------------------

def _no_valid_anchor_case(case, randn, randint):
    if case == "distinct_labels":
        return dict(features=randn(9, 4), labels=torch.arange(9))
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


NO_VALID_CASES = ["distinct_labels", "no_labels_2d", "all_negative_labels", "single_row",
                  "single_row_no_labels", "one_view_no_labels", "cross_disjoint", "cross_negative"]


@pytest.mark.parametrize("normalize", [True, False])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("case", NO_VALID_CASES)
@pytest.mark.parametrize("backend", BACKENDS)
def test_no_valid_anchor(backend, case, reduction, normalize, randn, randint):
    kw = _no_valid_anchor_case(case, randn, randint)
    x = kw.pop("features").requires_grad_()
    c = kw.pop("contrast", None)
    if c is not None:
        c.requires_grad_()
    t = torch.tensor(0.07, requires_grad=True)
    out = scl_kernels.supcon_loss(x, temperature=t, contrast=c, reduction=reduction,
                                  normalize=normalize, backend=backend, **kw)
    assert out.dtype == torch.float32
    assert torch.isfinite(out).all()
    assert (out == 0).all()
    if reduction == "none":
        assert out.shape == (num_anchor_rows(dict(features=x, contrast=c, **kw)),)
    upstream = torch.ones_like(out) if reduction == "none" else torch.tensor(1.0)
    inputs = [x, t] + ([c] if c is not None else [])
    grads = torch.autograd.grad(out, inputs, upstream, allow_unused=True)
    for g, inp in zip(grads, inputs):
        assert g is not None
        assert g.shape == inp.shape and g.dtype == inp.dtype
        assert torch.isfinite(g).all() and (g == 0).all()


@pytest.mark.parametrize("layout", ["single_all", "multiview_one", "cross_labels"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_nan_upstream_on_anchors_without_positives(backend, layout, randn, randint, gen):
    """Anchors without positives are constant zeros: a NaN upstream gradient there must not
    leak into the inputs' gradients (as autograd through torch.where behaves)."""
    kw = make_layout(layout, randn, randint, n=20, d=6, classes=12)
    kw["labels"][:2] = -1  # no class: never a loss-bearing anchor
    ref = supcon_reference64(**kw, reduction="none", full=True)
    no_pos = ref.num_positives == 0
    assert no_pos.any() and (~no_pos).any()
    upstream = torch.randn(no_pos.shape, generator=gen)
    poisoned = upstream.masked_fill(no_pos, float("nan"))
    res = _run(backend, kw, gen, reduction="none", upstream=poisoned)
    clean = _run(backend, kw, gen, reduction="none", upstream=upstream.masked_fill(no_pos, 0))
    for name in res.grads:
        assert torch.equal(res.grads[name], clean.grads[name]), name


@pytest.mark.parametrize("backend", BACKENDS)
def test_single_row_clip(backend, randn, gen):
    # N = M = 1 without labels: the positive is the only column, so the loss is exactly 0
    # but the anchor is valid (it counts in the mean)
    kw = dict(features=randn(1, 5), contrast=randn(1, 5))
    res = _run(backend, kw, gen, reduction="none")
    assert res.ref.num_positives.tolist() == [1]
    assert abs(float(res.loss)) < 1e-6


# ------------------------------------------------------------------------------------------
# The raw op: every output fully written and consistent
# ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("normalize", [True, False])
@pytest.mark.parametrize("temperature", [0.02, 0.1])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_raw_op_outputs(layout, dtype, temperature, normalize, randn, randint):
    kw = make_layout(layout, randn, randint, dtype=dtype, n=140, d=9, classes=40)
    args = op_args(kw, temperature, normalize)
    # fill the allocator's free memory with NaN first, so that unwritten entries would show
    torch.full((1 << 16,), float("nan"), dtype=dtype).sum()
    loss, lse, num_positives = torch.ops.scl.supcon(*args)
    ref = supcon_reference64(**kw, temperature=temperature, normalize=normalize,
                             reduction="none", full=True)
    a = num_anchor_rows(kw)
    out_dtype = torch.float64 if dtype == torch.float64 else torch.float32
    assert loss.shape == lse.shape == num_positives.shape == (a,)
    assert loss.dtype == lse.dtype == out_dtype
    assert num_positives.dtype == torch.int64
    assert torch.equal(num_positives, ref.num_positives)
    assert torch.isfinite(loss).all() and torch.isfinite(lse).all()
    rtol = 1e-12 if dtype == torch.float64 else 2e-6
    scale = 1.0 / temperature if normalize else float(ref.logits.abs().max())
    torch.testing.assert_close(lse.double(), ref.lse, rtol=rtol, atol=rtol * scale)
    torch.testing.assert_close(loss.double(), ref.per_anchor.detach(), rtol=rtol * 10,
                               atol=rtol * 10 * scale)
    assert (loss[ref.num_positives == 0] == 0).all()


def test_raw_op_single_row_lse():
    # one row, single set: anchor 0 has no column at all; its loss must be 0 and finite
    loss, lse, num_positives = torch.ops.scl.supcon(
        torch.randn(1, 3), torch.tensor([0]), None, None, torch.tensor(0.1), 1, True)
    assert loss.tolist() == [0.0]
    assert num_positives.tolist() == [0]


# ------------------------------------------------------------------------------------------
# auto, the module
# ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("layout", ["single_all", "multiview_one", "simcse"])
def test_auto_is_cpu_on_cpu(layout, randn, randint):
    assert scl_kernels.available_backends("cpu")[0] == "cpu"
    kw = make_layout(layout, randn, randint, n=20, d=5)
    a = scl_kernels.supcon_loss(**kw, backend="auto", reduction="none")
    b = scl_kernels.supcon_loss(**kw, backend="cpu", reduction="none")
    assert torch.equal(a, b)


@pytest.mark.parametrize("backend", BACKENDS)
def test_module(backend, randn, randint, gen):
    t = torch.nn.Parameter(torch.tensor(0.2))
    module = scl_kernels.SupConLoss(temperature=t, contrast_mode="one", reduction="sum",
                                    backend=backend)
    assert [p is t for p in module.parameters()] == [True]
    text = repr(module)
    for piece in ("contrast_mode='one'", "reduction='sum'", f"backend={backend!r}", "normalize=True"):
        assert piece in text
    x = randn(10, 3, 6).requires_grad_()
    y = randint(0, 3, (10,))
    out = module(x, y)
    res = check_against_reference(backend, x, y, t, contrast_mode="one", reduction="sum",
                                  generator=gen)
    torch.testing.assert_close(out, res.loss, rtol=1e-6, atol=1e-6)
    # backward through the module reaches the parameter and accumulates into existing .grad
    x.grad = torch.ones_like(x)
    out.backward()
    assert t.grad is not None and torch.isfinite(t.grad)
    grad_x, = torch.autograd.grad(module(x, y), [x])
    torch.testing.assert_close(x.grad, 1 + grad_x)

    # cross set through the module (its own options)
    cross = scl_kernels.SupConLoss(temperature=0.5, normalize=False, backend=backend)
    f, c = randn(7, 4), randn(9, 4)
    yl, cl = randint(0, 2, (7,)), randint(0, 2, (9,))
    torch.testing.assert_close(
        cross(f, yl, c, cl),
        scl_kernels.supcon_loss(f, yl, 0.5, contrast=c, contrast_labels=cl, normalize=False,
                                backend=backend))


# ------------------------------------------------------------------------------------------
# Determinism of the cpu backend
# ------------------------------------------------------------------------------------------

DETERMINISM_CASES = {
    # single set, symmetric schedule over 3 x 3 blocks
    "single_sym": lambda randn, randint: dict(features=randn(300, 33), labels=randint(0, 9, (300,)),
                                              temperature=0.1),
    # single set, running-max path (t below the fixed-shift range)
    "single_plain": lambda randn, randint: dict(features=randn(300, 33),
                                                labels=randint(0, 9, (300,)), temperature=0.02),
    # few row blocks, many column blocks: the forward splits the columns between threads
    "cross_wide": lambda randn, randint: dict(features=randn(129, 17), labels=randint(0, 5, (129,)),
                                              contrast=randn(700, 17),
                                              contrast_labels=randint(0, 5, (700,)), temperature=0.1),
    "one_view": lambda randn, randint: dict(features=randn(150, 3, 9), labels=randint(0, 5, (150,)),
                                            contrast_mode="one", temperature=0.1),
    "no_normalize": lambda randn, randint: dict(features=randn(260, 9), labels=randint(0, 5, (260,)),
                                                temperature=0.5, normalize=False),
}


def _loss_and_grads(kw):
    kw = dict(kw)
    x = kw.pop("features").detach().requires_grad_()
    c = kw.pop("contrast", None)
    if c is not None:
        c = c.detach().requires_grad_()
    t = torch.tensor(kw.pop("temperature"), requires_grad=True)
    out = scl_kernels.supcon_loss(x, temperature=t, contrast=c, reduction="none", backend="cpu",
                                  **kw)
    inputs = [x, t] + ([c] if c is not None else [])
    upstream = torch.linspace(-1, 1, out.numel())
    return [out.detach()] + list(torch.autograd.grad(out, inputs, upstream))


@pytest.mark.parametrize("case", sorted(DETERMINISM_CASES))
def test_cpu_deterministic(case, randn, randint):
    kw = DETERMINISM_CASES[case](randn, randint)
    first = _loss_and_grads(kw)
    second = _loss_and_grads(kw)
    for a, b in zip(first, second):
        assert torch.equal(a, b), "two runs differ"
    results = {}
    for threads in (1, 2):
        torch.set_num_threads(threads)
        results[threads] = _loss_and_grads(kw)
    names = ["loss", "grad features", "grad temperature", "grad contrast"]
    for name, a, b in zip(names, results[1], results[2]):
        assert torch.equal(a, b), (f"{name} differs between 1 and 2 threads: max |diff| "
                                   f"{float((a.double() - b.double()).abs().max()):.3e}")


OP_DETERMINISM_CASES = [
    # (rows, contrast rows or None, temperature, dim, anchors)
    (300, None, 0.02, 33, 300),   # single set, running-max forward: 3 x 3 blocks
    (300, None, 0.1, 33, 300),    # single set, symmetric
    (450, None, 0.1, 9, 150),     # contrast_mode="one": 2 row blocks x 4 column blocks
    (129, 700, 0.1, 17, 129),     # cross set: 2 row blocks x 6 column blocks
]


def _determinism_inputs(case):
    n, m, t, d, anchors = case
    g = torch.Generator().manual_seed(n * 1000 + d)
    x = torch.randn(n, d, generator=g)
    y = torch.randint(0, 9, (n,), generator=g)
    c = None if m is None else torch.randn(m, d, generator=g)
    cy = None if m is None else torch.randint(0, 9, (m,), generator=g)
    return x, y, c, cy, torch.tensor(t, dtype=torch.float64), anchors


@pytest.mark.parametrize("case", OP_DETERMINISM_CASES, ids=lambda c: "-".join(map(str, c)))
def test_op_forward_independent_of_threads(case):
    """torch.ops.scl.supcon alone: loss and LSE bitwise equal for 1, 2 and 4 threads."""
    x, y, c, cy, temp, anchors = _determinism_inputs(case)
    outs = {}
    for threads in (1, 2, 4):
        torch.set_num_threads(threads)
        outs[threads] = torch.ops.scl.supcon(x, y, c, cy, temp, anchors, True)
    for threads in (2, 4):
        for name, a, b in zip(("loss", "lse", "num_positives"), outs[1], outs[threads]):
            assert torch.equal(a, b), (f"{name}: 1 vs {threads} threads, max |diff| "
                                       f"{float((a.double() - b.double()).abs().max()):.3e}")


@pytest.mark.parametrize("case", OP_DETERMINISM_CASES, ids=lambda c: "-".join(map(str, c)))
def test_op_backward_independent_of_threads(case):
    """torch.ops.scl.supcon_backward with a fixed LSE: bitwise equal for 1, 2 and 4 threads."""
    x, y, c, cy, temp, anchors = _determinism_inputs(case)
    torch.set_num_threads(1)
    _, lse, _ = torch.ops.scl.supcon(x, y, c, cy, temp, anchors, True)
    upstream = torch.linspace(-1, 1, anchors)
    outs = {}
    for threads in (1, 2, 4):
        torch.set_num_threads(threads)
        outs[threads] = torch.ops.scl.supcon_backward(upstream, x, y, c, cy, temp, anchors, True, lse)
    for threads in (2, 4):
        for name, a, b in zip(("features", "contrast", "temperature"), outs[1], outs[threads]):
            assert torch.equal(a, b), f"grad {name}: 1 vs {threads} threads"


# ------------------------------------------------------------------------------------------
# Large batches: from 8,192 rows on, the CPU kernel switches to 256-wide tiles
# ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("temperature", [0.1, 0.02])  # symmetric, plain schedule
def test_large_single_set_against_chunked_reference(temperature, cpu_library):
    from chunked_reference64 import chunked_supcon64
    g = torch.Generator().manual_seed(8250)
    x = torch.randn(8250, 5, generator=g, dtype=torch.float64).requires_grad_(True)
    labels = torch.randint(0, 40, (8250,), generator=g)
    loss = scl_kernels.supcon_loss(x, labels, temperature, backend="cpu")
    loss.backward()
    want_loss, want_grad = chunked_supcon64(x.detach(), labels, temperature)
    torch.testing.assert_close(loss, want_loss, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(x.grad, want_grad, rtol=1e-8, atol=1e-8 * float(want_grad.abs().max()))


def test_large_cross_set_against_reference(randn, randint, gen, cpu_library):
    check_against_reference("cpu", randn(300, 7), randint(-1, 9, (300,)), 0.1,
                            contrast=randn(8300, 7), contrast_labels=randint(-1, 9, (8300,)),
                            generator=gen)
