"""The conformance suite, part 2: every backend's raw ops (``op_backend``: the backends whose
``get_backend(name).forward_op`` is not None) against the float64 reference, anchor_offset,
torch.library.opcheck, fake kernels, torch.compile through supcon_loss (``backend``), and bad
input through supcon_loss and through the raw ops."""
import math

import pytest
import torch

import scl_kernels
from support.layouts import LAYOUTS, make_layout, num_anchor_rows, op_args
from support.op_mean import check_op_mean
from support.reference64 import check_op_against_reference, poison_free_memory

FLOATS = [torch.float32, torch.float64]
FOCAL_GAMMAS = [0.0, 0.5, 2.0]  # as test_conformance.py: SupCon and the focal loss
OP_ARGUMENTS = ["features", "labels", "contrast", "contrast_labels", "temperature", "num_anchors",
                "normalize"]


def _check(op_backend, args, gen, **kw):
    if not op_backend.info.runs(kw.get("focal_gamma") or 0.0):
        pytest.skip(f"{op_backend} does not implement focal_gamma={kw['focal_gamma']}")
    args = op_backend.put(tuple(args))
    return check_op_against_reference(
        op_backend.forward_op, op_backend.backward_op, args,
        compute_dtype=op_backend.computes_in(args[0].dtype), generator=gen,
        weights_dtype=op_backend.info.gradient_weights_dtype(args[0].dtype), **kw)


# ------------------------------------------------------------------------------------------
# get_backend: what the suite asks of a backend
# ------------------------------------------------------------------------------------------

KNOWN_OPS = {"cpu": ("supcon", "supcon_backward"),
             "triton": ("supcon_triton", "supcon_triton_backward"),
             "reference": (None, None)}


@pytest.mark.quick
def test_get_backend(backend):
    info = scl_kernels.backends.get_backend(backend.name)
    assert info.name == backend.name
    if backend.name in KNOWN_OPS:
        forward, backward = KNOWN_OPS[backend.name]
        assert info.forward_op is (None if forward is None else getattr(torch.ops.scl, forward))
        assert info.backward_op is (None if backward is None else getattr(torch.ops.scl, backward))
    assert (info.forward_op is None) == (info.backward_op is None)
    if info.forward_op is not None:
        assert isinstance(info.forward_op, torch._ops.OpOverloadPacket)
        assert isinstance(info.backward_op, torch._ops.OpOverloadPacket)
    assert info.computes_in(torch.float32) == torch.float32
    for dtype in (torch.float16, torch.bfloat16):
        assert info.computes_in(dtype) in (dtype, torch.float32)
    assert info.computes_in(torch.float64) in (torch.float64, torch.float32)
    if backend.name in ("cpu", "reference"):
        assert info.computes_in(torch.float64) == torch.float64
    if backend.name == "triton":
        assert info.computes_in(torch.float64) == torch.float32
    # the tensor-core backends round the backward's weights to a 16-bit input's dtype, the
    # others keep them in the compute dtype; never coarser than the input
    for dtype in (torch.float16, torch.bfloat16, torch.float32, torch.float64):
        rounded = backend.name in ("triton", "cuda") and dtype in (torch.float16, torch.bfloat16)
        assert info.gradient_weights_dtype(dtype) == (dtype if rounded else info.computes_in(dtype))


# ------------------------------------------------------------------------------------------
# The raw ops: every output fully written (free memory poisoned with NaN first) and equal to
# the reference; lse is float64 for every input dtype
# ------------------------------------------------------------------------------------------

@pytest.mark.matrix(layout=LAYOUTS, dtype=FLOATS, temperature=[0.02, 0.1], normalize=[True, False],
                    focal_gamma=FOCAL_GAMMAS, quick="each")
def test_raw_op_outputs(op_backend, layout, dtype, temperature, normalize, focal_gamma, randn,
                        randint, gen):
    kw = make_layout(layout, randn, randint, dtype=dtype, n=op_backend.budget.rows(140), d=9,
                     classes=40)
    res = _check(op_backend, op_args(kw, temperature, normalize), gen, focal_gamma=focal_gamma)
    assert res.outputs[0].shape == (num_anchor_rows(kw),)


@pytest.mark.matrix(layout=["single_all", "multiview_one", "cross_labels"],
                    dtype=[torch.float16, torch.bfloat16], temperature=[0.02, 0.1],
                    focal_gamma=FOCAL_GAMMAS)
def test_raw_op_outputs_16_bit(op_backend, layout, dtype, temperature, focal_gamma, randn, randint,
                               gen):
    """16-bit inputs: float32 loss, float64 lse, gradients in the input dtype."""
    kw = make_layout(layout, randn, randint, dtype=dtype, n=40, d=24, classes=10)
    res = _check(op_backend, op_args(kw, temperature), gen, focal_gamma=focal_gamma)
    assert res.outputs[0].dtype == torch.float32
    assert res.grads[0].dtype == dtype


@pytest.mark.matrix(dtype=FLOATS, normalize=[True, False])
def test_raw_op_single_row(op_backend, dtype, normalize, randn, gen):
    # one row, single set: anchor 0 has no column at all; its loss must be 0 and finite
    res = _check(op_backend, (randn(1, 3, dtype=dtype), torch.tensor([0]), None, None,
                              torch.tensor(0.1, dtype=torch.float64), 1, normalize), gen)
    loss, _, num_positives = res.outputs
    assert loss.tolist() == [0.0]
    assert num_positives.tolist() == [0]
    assert (res.grads[0] == 0).all()


@pytest.mark.quick
def test_op_schemas(op_backend):
    forward = op_backend.forward_op.default._schema
    backward = op_backend.backward_op.default._schema
    names = [a.name for a in forward.arguments]
    assert names[:7] == OP_ARGUMENTS
    assert [r.name for r in forward.returns] == ["loss", "lse", "num_positives"]
    assert not forward.is_mutable and not backward.is_mutable
    assert [a.name for a in backward.arguments][:9] == ["grad_loss", *OP_ARGUMENTS, "lse"]
    assert [r.name for r in backward.returns] == ["grad_features", "grad_contrast",
                                                  "grad_temperature"]


def test_op_schemas_trailing_defaults(op_backend):
    """anchor_offset=0, focal_gamma=0.0, mean=False, no groups and multi_label="any" end the
    forward; the backward's end is the same, then temperature_grad=True."""
    defaulted = [("anchor_offset", "int", 0), ("focal_gamma", "float", 0.0),
                 ("mean", "bool", False), ("groups", "Optional[Tensor]", None),
                 ("contrast_groups", "Optional[Tensor]", None), ("multi_label", "str", "any")]
    for op, trailing in ((op_backend.forward_op, defaulted),
                         (op_backend.backward_op,
                          [*defaulted, ("temperature_grad", "bool", True)])):
        schema = op.default._schema
        found = [(a.name, str(a.type), a.default_value) for a in schema.arguments[-len(trailing):]]
        assert found == trailing, f"{schema}"
        assert all(a.default_value is None for a in schema.arguments[:-len(trailing)]), f"{schema}"


def test_backward_op_skips_the_temperature_gradient_when_not_asked(op_backend, randn, randint, reproducible):
    """temperature_grad=False: zeros on the temperature's device and dtype; the other gradients
    are those of the default call, bit for bit (reproducible: on a GPU the default schedules add
    with atomics)."""
    x, y = randn(11, 5), randint(0, 3, (11,))
    t = torch.tensor(0.2, dtype=torch.float64)
    args = op_backend.put((x, y, None, None)) + (t, 11, True)
    _, lse, _ = op_backend.forward_op(*args)
    upstream = op_backend.put(torch.ones(11))
    asked = op_backend.backward_op(upstream, *args, lse)
    skipped = op_backend.backward_op(upstream, *args, lse, temperature_grad=False)
    assert asked[2].abs().item() > 0
    assert skipped[2].device == t.device and skipped[2].dtype == t.dtype
    assert skipped[2].item() == 0
    torch.testing.assert_close(skipped[0], asked[0], rtol=0, atol=0)


# ------------------------------------------------------------------------------------------
# mean=True: the caller's "mean" reduction inside the op (0-dim loss, 0-dim gradient)
# ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("temperature", [0.02, 0.1])  # 0.02: the plain schedule in single set
def test_op_mean_is_the_mean_over_anchors_with_positives(op_backend, layout, temperature, randn,
                                                        randint):
    kw = make_layout(layout, randn, randint, n=40, d=9, classes=12)  # some anchors alone
    check_op_mean(op_backend.forward_op, op_backend.backward_op,
                  op_backend.put(op_args(kw, temperature)))


def test_op_mean_without_positives_is_zero(op_backend, randn):
    args = op_backend.put((randn(20, 6), torch.arange(20), None, None, torch.tensor(0.1), 20, True))
    assert check_op_mean(op_backend.forward_op, op_backend.backward_op, args).item() == 0
    grads = op_backend.backward_op(op_backend.put(torch.tensor(1.0)), *args,
                                   op_backend.forward_op(*args)[1], mean=True)
    assert not grads[0].any()


def test_op_mean_with_anchor_offset(op_backend, randn, randint):
    args = op_backend.put((randn(45, 7), randint(0, 4, (45,)), None, None, torch.tensor(0.1), 13,
                           True))
    per_anchor, lse, num_positives = op_backend.forward_op(*args, anchor_offset=17)
    mean = op_backend.forward_op(*args, anchor_offset=17, mean=True)[0]
    want = per_anchor.double().sum() / max(int(torch.count_nonzero(num_positives)), 1)
    torch.testing.assert_close(mean.double(), want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("mean,shape", [(True, (11,)), (False, ())])
def test_backward_op_rejects_a_grad_of_the_other_reduction(op_backend, mean, shape, randn, randint):
    args = op_backend.put((randn(11, 5), randint(0, 3, (11,)), None, None, torch.tensor(0.2), 11,
                           True))
    lse = op_backend.forward_op(*args)[1]
    with pytest.raises(ValueError, match="grad_loss"):
        op_backend.backward_op(op_backend.put(torch.ones(shape)), *args, lse, mean=mean)


@pytest.mark.quick
def test_fake_matches_real(op_backend, randn, randint):
    """The registered fake kernels give the real kernels' shapes and dtypes."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    cases = []
    for dtype in (torch.float32, torch.bfloat16, torch.float64):
        x = randn(7, 3, dtype=dtype)
        cases.append((x, randint(0, 2, (7,)), None, None, torch.tensor(0.1), 4, True))
        cases.append((x, randint(0, 2, (7,)), randn(5, 3, dtype=dtype), randint(0, 2, (5,)),
                      torch.tensor(0.1, dtype=torch.float32), 7, False))
    for args in cases:
        _assert_fake_matches_real(op_backend, op_backend.put(args), {}, FakeTensorMode)


def test_fake_matches_real_with_anchor_offset(op_backend, randn, randint):
    from torch._subclasses.fake_tensor import FakeTensorMode

    args = op_backend.put((randn(9, 3), randint(0, 3, (9,)), None, None, torch.tensor(0.1), 4, True))
    _assert_fake_matches_real(op_backend, args, {"anchor_offset": 3}, FakeTensorMode)


def test_fake_matches_real_with_mean(op_backend, randn, randint):
    from torch._subclasses.fake_tensor import FakeTensorMode

    args = op_backend.put((randn(9, 3), randint(0, 3, (9,)), None, None, torch.tensor(0.1), 9, True))
    _assert_fake_matches_real(op_backend, args, {"mean": True}, FakeTensorMode)


def _assert_fake_matches_real(op_backend, args, kwargs, FakeTensorMode):
    def fake(mode, values):
        return [mode.from_tensor(a) if isinstance(a, torch.Tensor) else a for a in values]

    real = op_backend.forward_op(*args, **kwargs)
    with FakeTensorMode(allow_non_fake_inputs=True) as mode:
        faked = op_backend.forward_op(*fake(mode, args), **kwargs)
    for r, f in zip(real, faked):
        assert r.shape == f.shape and r.dtype == f.dtype, (r.shape, f.shape, r.dtype, f.dtype)
    grad = torch.ones_like(real[0])
    real_b = op_backend.backward_op(grad, *args, real[1], **kwargs)
    with FakeTensorMode(allow_non_fake_inputs=True) as mode:
        fake_b = op_backend.backward_op(*fake(mode, (grad, *args, real[1])), **kwargs)
    for r, f in zip(real_b, fake_b):
        assert r.shape == f.shape and r.dtype == f.dtype, (r.shape, f.shape, r.dtype, f.dtype)


# ------------------------------------------------------------------------------------------
# anchor_offset: single-set anchors are rows [offset, offset + num_anchors), anchor i's self
# column is row offset + i, every row is a column
# ------------------------------------------------------------------------------------------

OFFSET_CASES = [
    # (id, rows N, num_anchors, anchor_offset)
    ("all-explicit", 45, 45, 0),
    ("first-block", 45, 13, 0),
    ("middle", 45, 13, 17),
    ("last-block", 45, 12, 33),
    ("one-first", 45, 1, 0),
    ("one-middle", 45, 1, 31),
    ("one-last", 45, 1, 44),
    ("two-rows", 2, 1, 1),
    ("past-tiles", 300, 130, 129),   # more than a 128 tile, starting one past it
    ("last-of-300", 300, 44, 256),
]


@pytest.mark.matrix(case=OFFSET_CASES, dtype=FLOATS, normalize=[True, False],
                    temperature=[0.02, 0.1], focal_gamma=FOCAL_GAMMAS,
                    sizes={"case": lambda c: (c[1], 0)}, quick="each")
def test_anchor_offset(op_backend, case, dtype, normalize, temperature, focal_gamma, randn, randint,
                       gen):
    _, n, num_anchors, offset = case
    x = randn(n, 37, dtype=dtype)
    labels = randint(-1, 5, (n,))
    t = torch.tensor(temperature, dtype=torch.float64)
    res = _check(op_backend, (x, labels, None, None, t, num_anchors, normalize), gen,
                 anchor_offset=offset, focal_gamma=focal_gamma)
    assert res.outputs[0].shape == (num_anchors,)
    assert res.grads[0].shape == (n, 37)


@pytest.mark.matrix(dtype=FLOATS)
def test_anchor_offset_zero_is_the_default(op_backend, dtype, randn, randint, reproducible):
    args = op_backend.put((randn(20, 6, dtype=dtype), randint(0, 3, (20,)), None, None,
                           torch.tensor(0.1, dtype=torch.float64), 8, True))
    default = op_backend.forward_op(*args)
    explicit = op_backend.forward_op(*args, anchor_offset=0)
    for a, b in zip(default, explicit):
        assert torch.equal(a, b)
    grad = torch.linspace(-1, 1, 8, device=default[0].device, dtype=default[0].dtype)
    for a, b in zip(op_backend.backward_op(grad, *args, default[1]),
                    op_backend.backward_op(grad, *args, default[1], anchor_offset=0)):
        assert torch.equal(a, b)


@pytest.mark.matrix(focal_gamma=FOCAL_GAMMAS)
def test_anchor_offset_blocks_add_up(op_backend, focal_gamma, randn, randint):
    """Anchor blocks that tile the rows give the losses and summed gradients of the whole set."""
    if not op_backend.info.runs(focal_gamma):
        pytest.skip(f"{op_backend} does not implement focal_gamma={focal_gamma}")
    n = 45
    args = op_backend.put((randn(n, 11, dtype=torch.float64), randint(0, 4, (n,)), None, None,
                           torch.tensor(0.2, dtype=torch.float64), n, True))
    focal = {"focal_gamma": focal_gamma}
    whole_loss, whole_lse, _ = op_backend.forward_op(*args, **focal)
    grad = torch.linspace(-1, 1, n, dtype=torch.float64, device=whole_loss.device)
    whole = op_backend.backward_op(grad.to(whole_loss.dtype), *args, whole_lse, **focal)
    losses, grads = [], [torch.zeros_like(whole[0]), None, torch.zeros_like(whole[2])]
    for start, count in ((0, 17), (17, 1), (18, 27)):
        block = list(args)
        block[5] = count
        loss, lse, _ = op_backend.forward_op(*block, anchor_offset=start, **focal)
        losses.append(loss)
        g = op_backend.backward_op(grad[start:start + count].to(loss.dtype), *block, lse,
                                   anchor_offset=start, **focal)
        grads[0] += g[0]
        grads[2] += g[2]
    float64 = op_backend.computes_in(torch.float64) == torch.float64
    rtol = 1e-10 if float64 else 1e-5
    torch.testing.assert_close(torch.cat(losses), whole_loss, rtol=rtol, atol=rtol)
    torch.testing.assert_close(grads[0], whole[0], rtol=rtol,
                               atol=rtol * float(whole[0].abs().max()))
    torch.testing.assert_close(grads[2], whole[2], rtol=rtol * 10, atol=rtol)


BAD_OFFSETS = [
    # (id, rows, num_anchors, anchor_offset, with a contrast set)
    ("negative", 6, 3, -1, False),
    ("past-the-end", 6, 3, 4, False),
    ("at-the-end", 6, 1, 6, False),
    ("far", 6, 6, 1000, False),
    ("with-contrast", 6, 6, 1, True),
]


@pytest.mark.matrix(case=BAD_OFFSETS, direction=["forward", "backward"])
def test_bad_anchor_offset(op_backend, case, direction, randn, randint):
    _, n, num_anchors, offset, cross = case
    contrast = (randn(5, 4), randint(0, 3, (5,))) if cross else (None, None)
    args = op_backend.put((randn(n, 4), randint(0, 3, (n,)), *contrast,
                           torch.tensor(0.1, dtype=torch.float64), num_anchors, True))
    with pytest.raises(ValueError, match="anchor_offset"):
        if direction == "forward":
            op_backend.forward_op(*args, anchor_offset=offset)
        else:
            grad = torch.ones(num_anchors, device=args[0].device)
            lse = torch.zeros(num_anchors, dtype=torch.float64, device=args[0].device)
            op_backend.backward_op(grad, *args, lse, anchor_offset=offset)


# ------------------------------------------------------------------------------------------
# torch.library.opcheck
# ------------------------------------------------------------------------------------------

ALL_CHECKS = {"test_schema", "test_autograd_registration", "test_faketensor",
              "test_aot_dispatch_dynamic"}


def _assert_opcheck(op, args, kwargs=None):
    result = torch.library.opcheck(op, args, kwargs)
    assert set(result) == ALL_CHECKS
    assert all(v == "SUCCESS" for v in result.values()), result


@pytest.mark.matrix(layout=LAYOUTS, grad=["none", "features", "all"], quick="each")
def test_opcheck_forward(op_backend, layout, grad, randn, randint):
    kw = make_layout(layout, randn, randint, n=10, d=4)
    features, labels, contrast, contrast_labels, t, anchors, normalize = op_backend.put(
        op_args(kw, 0.1))
    features = features.detach().clone()
    if grad in ("features", "all"):
        features.requires_grad_()
    if grad == "all":
        t = torch.tensor(0.1, dtype=torch.float32, requires_grad=True)
        if contrast is not None:
            contrast = contrast.detach().clone().requires_grad_()
    _assert_opcheck(op_backend.forward_op.default,
                    (features, labels, contrast, contrast_labels, t, anchors, normalize))


@pytest.mark.matrix(dtype=[torch.float64, torch.bfloat16, torch.float16], normalize=[True, False])
def test_opcheck_forward_dtypes(op_backend, dtype, normalize, randn, randint):
    x = op_backend.put(randn(9, 5, dtype=dtype)).requires_grad_()
    _assert_opcheck(op_backend.forward_op.default,
                    (x, op_backend.put(randint(0, 3, (9,))), None, None, torch.tensor(0.3), 9,
                     normalize))


@pytest.mark.matrix(layout=LAYOUTS, quick=lambda layout: layout in ("single_all", "multiview_one",
                                                                    "cross_labels"))
def test_opcheck_backward(op_backend, layout, randn, randint):
    kw = make_layout(layout, randn, randint, n=10, d=4)
    args = op_backend.put(op_args(kw, 0.1))
    _, lse, _ = op_backend.forward_op(*args)
    grad_loss = op_backend.put(randn(lse.shape[0]))
    _assert_opcheck(op_backend.backward_op.default, (grad_loss, *args, lse))


@pytest.mark.matrix(layout=["single_all", "cross_labels"], direction=["forward", "backward"])
def test_opcheck_mean(op_backend, layout, direction, randn, randint):
    """mean=True through opcheck: the 0-dim loss and its 0-dim gradient."""
    kw = make_layout(layout, randn, randint, n=10, d=4)
    args = op_backend.put(op_args(kw, 0.1))
    if direction == "forward":
        features, *rest = args
        _assert_opcheck(op_backend.forward_op.default,
                        (features.detach().clone().requires_grad_(), *rest), {"mean": True})
    else:
        _, lse, _ = op_backend.forward_op(*args)
        grad_loss = op_backend.put(torch.tensor(0.8))
        _assert_opcheck(op_backend.backward_op.default, (grad_loss, *args, lse), {"mean": True})


@pytest.mark.matrix(layout=["single_all", "cross_labels"], direction=["forward", "backward"])
def test_opcheck_focal(op_backend, layout, direction, randn, randint):
    """focal_gamma through opcheck: schema, autograd registration, fakes, AOT dispatch."""
    if not op_backend.info.runs(2.0):
        pytest.skip(f"{op_backend} does not implement focal_gamma=2")
    kw = make_layout(layout, randn, randint, n=10, d=4)
    args = op_backend.put(op_args(kw, 0.1))
    if direction == "forward":
        _assert_opcheck(op_backend.forward_op.default, args, {"focal_gamma": 2.0})
    else:
        _, lse, _ = op_backend.forward_op(*args, focal_gamma=2.0)
        grad_loss = torch.linspace(0.5, 1.5, lse.shape[0], device=lse.device)
        _assert_opcheck(op_backend.backward_op.default, (grad_loss, *args, lse),
                        {"focal_gamma": 2.0})


@pytest.mark.matrix(value=[-1.0, -1e-300, math.nan, math.inf], direction=["forward", "backward"])
def test_raw_op_rejects_focal_gamma(op_backend, value, direction, randn, randint):
    args = op_backend.put((randn(6, 4), randint(0, 3, (6,)), None, None,
                           torch.tensor(0.1, dtype=torch.float64), 6, True))
    with pytest.raises(ValueError, match="focal_gamma"):
        if direction == "forward":
            op_backend.forward_op(*args, focal_gamma=value)
        else:
            lse = torch.zeros(6, dtype=torch.float64, device=args[0].device)
            op_backend.backward_op(torch.ones(6, device=args[0].device), *args, lse,
                                   focal_gamma=value)


@pytest.mark.matrix(direction=["forward", "backward"], normalize=[True, False])
def test_opcheck_anchor_offset(op_backend, direction, normalize, randn, randint):
    x = op_backend.put(randn(12, 5)).requires_grad_()
    args = (x, op_backend.put(randint(0, 3, (12,))), None, None,
            torch.tensor(0.1, requires_grad=True), 4, normalize)
    if direction == "forward":
        _assert_opcheck(op_backend.forward_op.default, args, {"anchor_offset": 5})
    else:
        plain = [a.detach() if isinstance(a, torch.Tensor) else a for a in args]
        _, lse, _ = op_backend.forward_op(*plain, anchor_offset=5)
        _assert_opcheck(op_backend.backward_op.default,
                        (op_backend.put(randn(4)), *plain, lse), {"anchor_offset": 5})


# ------------------------------------------------------------------------------------------
# torch.compile through supcon_loss
# ------------------------------------------------------------------------------------------

class _Head(torch.nn.Module):
    """A projection, a learnable temperature and the loss: a typical training step."""

    def __init__(self, mode, backend, in_dim=6, out_dim=5):
        super().__init__()
        self.proj = torch.nn.Linear(in_dim, out_dim)
        self.log_t = torch.nn.Parameter(torch.tensor(-1.5))
        self.mode = mode
        self.backend = backend

    def forward(self, x, y=None, c=None, cy=None):
        z = self.proj(x)
        t = self.log_t.exp()
        b = self.backend
        if self.mode == "supervised":
            return scl_kernels.supcon_loss(z, y, t, backend=b)
        if self.mode == "one":
            return scl_kernels.supcon_loss(z, y, t, contrast_mode="one", backend=b)
        if self.mode == "simclr":
            return scl_kernels.supcon_loss(z, temperature=0.2, backend=b, reduction="sum")
        if self.mode == "clip":
            return scl_kernels.supcon_loss(z, temperature=t, contrast=self.proj(c), backend=b)
        if self.mode == "cross":
            return scl_kernels.supcon_loss(z, y, t, contrast=self.proj(c), contrast_labels=cy,
                                           backend=b, reduction="none").sum()
        raise ValueError(self.mode)


def _inputs(mode, randn, randint):
    if mode in ("supervised", "one"):
        return (randn(8, 2, 6), randint(0, 3, (8,)))
    if mode == "simclr":
        return (randn(8, 2, 6),)
    if mode == "clip":
        return (randn(8, 6), None, randn(11, 6))
    return (randn(8, 6), randint(0, 3, (8,)), randn(11, 6), randint(0, 3, (11,)))


def _step(module, args):
    module.zero_grad(set_to_none=True)
    out = module(*args)
    out.backward()
    # the float-temperature mode leaves log_t without a gradient
    return out.detach(), [None if p.grad is None else p.grad.clone() for p in module.parameters()]


def _compare_compiled(backend, mode, compiler, randn, randint, dynamic=None):
    torch._dynamo.reset()
    torch.manual_seed(0)
    module = _Head(mode, backend.name).to(backend.device)
    args = backend.put(_inputs(mode, randn, randint))
    eager_out, eager_grads = _step(module, args)
    compiled = torch.compile(module, fullgraph=True, backend=compiler, dynamic=dynamic)
    out, grads = _step(compiled, args)
    torch.testing.assert_close(out, eager_out, rtol=1e-5, atol=1e-6)
    assert sum(g is not None for g in grads) >= 2
    for a, b in zip(grads, eager_grads):
        assert (a is None) == (b is None)
        if a is not None:
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    return compiled, module


@pytest.mark.matrix(mode=["supervised", "one", "simclr", "clip", "cross"],
                    quick=lambda mode: mode == "supervised")
def test_compile_fullgraph_aot_eager(backend, mode, randn, randint):
    _compare_compiled(backend, mode, "aot_eager", randn, randint)


def test_compile_dynamic_shapes(backend, randn, randint):
    torch._dynamo.reset()
    module = _Head("supervised", backend.name).to(backend.device)
    compiled = torch.compile(module, fullgraph=True, backend="aot_eager", dynamic=True)
    for b in (6, 9, 13):
        args = backend.put((randn(b, 2, 6), randint(0, 3, (b,))))
        out, grads = _step(compiled, args)
        eager_out, eager_grads = _step(module, args)
        torch.testing.assert_close(out, eager_out, rtol=1e-5, atol=1e-6)
        for a, e in zip(grads, eager_grads):
            torch.testing.assert_close(a, e, rtol=1e-5, atol=1e-6)


@pytest.mark.slow
def test_compile_fullgraph_inductor(backend, randn, randint):
    """One inductor compile per backend (about half a minute on two cores)."""
    _compare_compiled(backend, "supervised", "inductor", randn, randint)


# ------------------------------------------------------------------------------------------
# Bad input through supcon_loss: a ValueError / TypeError that names the argument
# ------------------------------------------------------------------------------------------

def _x(*shape, dtype=torch.float32):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(0), dtype=dtype)


def _y(n, high=3):
    return torch.arange(n) % high


X, Y = _x(6, 4), _y(6)
C, CY = _x(5, 4), _y(5)


def _poison(t, value, index=2):
    t = t.clone()
    t.view(-1)[index] = value
    return t


# (id, kwargs for supcon_loss, exception type, a regex the message must match)
LOSS_CASES = [
    # features
    ("features-list", dict(features=[[1.0, 2.0]]), TypeError, r"features"),
    ("features-int", dict(features=torch.ones(6, 4, dtype=torch.long), labels=Y), TypeError,
     r"features.*floating"),
    ("features-bool", dict(features=torch.ones(6, 4, dtype=torch.bool)), TypeError, r"features"),
    ("features-complex", dict(features=torch.ones(6, 4, dtype=torch.complex64)), TypeError,
     r"features"),
    ("features-1d", dict(features=_x(6)), ValueError, r"features.*shape"),
    ("features-4d", dict(features=_x(2, 2, 3, 4)), ValueError, r"features.*shape"),
    ("features-4d-labels", dict(features=_x(2, 2, 3, 4), labels=_y(2)), ValueError, r"features"),
    ("features-0-rows", dict(features=_x(0, 4), labels=_y(0)), ValueError, r"features"),
    ("features-0-cols", dict(features=_x(6, 0), labels=Y), ValueError, r"features"),
    ("features-0-views", dict(features=_x(3, 0, 4), labels=_y(3)), ValueError, r"features"),
    # labels
    ("labels-list", dict(features=X, labels=[0, 1, 0, 1, 0, 1]), TypeError, r"labels"),
    ("labels-float", dict(features=X, labels=Y.float()), TypeError, r"labels.*integer"),
    ("labels-bool", dict(features=X, labels=Y.bool()), TypeError, r"labels.*integer"),
    ("labels-2d", dict(features=X, labels=Y.reshape(2, 3)), ValueError, r"labels"),
    ("labels-0d", dict(features=X, labels=torch.tensor(1)), ValueError, r"labels"),
    ("labels-short", dict(features=X, labels=Y[:5]), ValueError, r"labels"),
    ("labels-long", dict(features=X, labels=_y(7)), ValueError, r"labels"),
    ("labels-views", dict(features=_x(3, 2, 4), labels=_y(6)), ValueError, r"labels"),
    # temperature
    ("temperature-zero", dict(features=X, labels=Y, temperature=0.0), ValueError, r"temperature"),
    ("temperature-negative", dict(features=X, labels=Y, temperature=-0.1), ValueError,
     r"temperature"),
    ("temperature-nan", dict(features=X, labels=Y, temperature=math.nan), ValueError, r"temperature"),
    ("temperature-inf", dict(features=X, labels=Y, temperature=math.inf), ValueError, r"temperature"),
    ("temperature-str", dict(features=X, labels=Y, temperature="0.1"), TypeError, r"temperature"),
    ("temperature-none", dict(features=X, labels=Y, temperature=None), TypeError, r"temperature"),
    ("temperature-bool", dict(features=X, labels=Y, temperature=True), TypeError, r"temperature"),
    ("temperature-list", dict(features=X, labels=Y, temperature=[0.1]), TypeError, r"temperature"),
    ("temperature-int-tensor", dict(features=X, labels=Y, temperature=torch.tensor(1)), TypeError,
     r"temperature"),
    ("temperature-1d-tensor", dict(features=X, labels=Y, temperature=torch.tensor([0.1])),
     ValueError, r"temperature"),
    ("temperature-tensor-zero", dict(features=X, labels=Y, temperature=torch.tensor(0.0)),
     ValueError, r"temperature"),
    ("temperature-tensor-negative", dict(features=X, labels=Y, temperature=torch.tensor(-2.0)),
     ValueError, r"temperature"),
    ("temperature-tensor-nan", dict(features=X, labels=Y, temperature=torch.tensor(math.nan)),
     ValueError, r"temperature"),
    ("temperature-tensor-inf", dict(features=X, labels=Y, temperature=torch.tensor(math.inf)),
     ValueError, r"temperature"),
    ("temperature-tensor-grad-nan",
     dict(features=X, labels=Y, temperature=torch.tensor(math.nan, requires_grad=True)),
     ValueError, r"temperature"),
    # non-finite values
    ("features-nan", dict(features=_poison(X, math.nan), labels=Y), ValueError, r"features"),
    ("features-inf", dict(features=_poison(X, math.inf), labels=Y), ValueError, r"features"),
    ("features-neg-inf-3d", dict(features=_poison(_x(3, 2, 4), -math.inf, 17), labels=_y(3)),
     ValueError, r"features"),
    ("features-nan-no-normalize", dict(features=_poison(X, math.nan), labels=Y, normalize=False),
     ValueError, r"features"),
    ("contrast-nan", dict(features=X, labels=Y, contrast=_poison(C, math.nan), contrast_labels=CY),
     ValueError, r"contrast"),
    ("contrast-inf-clip", dict(features=X, contrast=_poison(_x(6, 4), math.inf, 23)), ValueError,
     r"contrast"),
    # contrast
    ("contrast-without-contrast-labels", dict(features=X, labels=Y, contrast=C), ValueError,
     r"contrast_labels"),
    ("contrast-labels-without-contrast", dict(features=X, labels=Y, contrast_labels=CY),
     ValueError, r"contrast"),
    ("contrast-labels-without-labels", dict(features=X, contrast=C, contrast_labels=CY),
     ValueError, r"labels"),
    ("contrast-wrong-dim", dict(features=X, labels=Y, contrast=_x(5, 3), contrast_labels=CY),
     ValueError, r"contrast"),
    ("contrast-3d", dict(features=X, labels=Y, contrast=_x(5, 1, 4), contrast_labels=CY),
     ValueError, r"contrast"),
    ("contrast-1d", dict(features=X, labels=Y, contrast=_x(4), contrast_labels=CY), ValueError,
     r"contrast"),
    ("contrast-int", dict(features=X, labels=Y, contrast=torch.ones(5, 4, dtype=torch.long),
                          contrast_labels=CY), TypeError, r"contrast"),
    ("contrast-list", dict(features=X, labels=Y, contrast=[[0.0] * 4], contrast_labels=CY),
     TypeError, r"contrast"),
    ("contrast-dtype-mismatch", dict(features=X, labels=Y, contrast=C.double(), contrast_labels=CY),
     TypeError, r"contrast"),
    ("contrast-labels-short", dict(features=X, labels=Y, contrast=C, contrast_labels=CY[:4]),
     ValueError, r"contrast_labels"),
    ("contrast-labels-2d", dict(features=X, labels=Y, contrast=_x(6, 4),
                                contrast_labels=_y(6).reshape(2, 3)), ValueError, r"contrast_labels"),
    ("contrast-labels-float", dict(features=X, labels=Y, contrast=C, contrast_labels=CY.float()),
     TypeError, r"contrast_labels"),
    ("contrast-labels-bool", dict(features=X, labels=Y, contrast=C, contrast_labels=CY.bool()),
     TypeError, r"contrast_labels"),
    ("clip-contrast-too-short", dict(features=X, contrast=C), ValueError, r"contrast"),
    ("contrast-mode-one-with-contrast", dict(features=X, labels=Y, contrast=C, contrast_labels=CY,
                                             contrast_mode="one"), ValueError, r"contrast_mode"),
    # options
    ("contrast-mode-unknown", dict(features=X, labels=Y, contrast_mode="two"), ValueError,
     r"contrast_mode"),
    ("contrast-mode-none", dict(features=X, labels=Y, contrast_mode=None), ValueError,
     r"contrast_mode"),
    ("reduction-unknown", dict(features=X, labels=Y, reduction="avg"), ValueError, r"reduction"),
    ("reduction-none-object", dict(features=X, labels=Y, reduction=None), ValueError, r"reduction"),
    ("focal-gamma-negative", dict(features=X, labels=Y, focal_gamma=-0.5), ValueError,
     r"focal_gamma"),
    ("focal-gamma-nan", dict(features=X, labels=Y, focal_gamma=math.nan), ValueError,
     r"focal_gamma"),
    ("focal-gamma-inf", dict(features=X, labels=Y, focal_gamma=math.inf), ValueError,
     r"focal_gamma"),
    ("focal-gamma-str", dict(features=X, labels=Y, focal_gamma="2"), TypeError, r"focal_gamma"),
    ("focal-gamma-bool", dict(features=X, labels=Y, focal_gamma=True), TypeError, r"focal_gamma"),
    ("focal-gamma-tensor", dict(features=X, labels=Y, focal_gamma=torch.tensor(2.0)), TypeError,
     r"focal_gamma"),
]

# one case per argument and kind of check, for the quick subset
QUICK_LOSS_CASES = {"features-int", "features-1d", "labels-short", "temperature-negative",
                    "temperature-tensor-nan", "features-nan", "contrast-nan", "contrast-wrong-dim",
                    "contrast-labels-short", "reduction-unknown", "focal-gamma-negative"}

# backend is part of the case for these (they are not about the computation)
OPTION_CASES = [
    ("backend-unknown", dict(features=X, labels=Y, backend="cuda"), ValueError, r"backend"),
    ("backend-typo", dict(features=X, labels=Y, backend="CPU"), ValueError, r"backend"),
    ("backend-none", dict(features=X, labels=Y, backend=None), ValueError, r"backend"),
]


def _raise_late_value_errors():
    """On a GPU the NaN / inf check's verdict may land after the call returns (README,
    SCL_VALUE_CHECKS): it is then the next call's error, or raise_deferred_value_errors'."""
    scl_kernels.raise_deferred_value_errors()


@pytest.mark.matrix(case=LOSS_CASES, quick=lambda case: case[0] in QUICK_LOSS_CASES)
def test_supcon_loss_rejects(backend, case):
    _, kwargs, error, pattern = case
    kwargs = backend.put(dict(kwargs))
    features = kwargs.pop("features")
    with pytest.raises(error, match=pattern):
        scl_kernels.supcon_loss(features, backend=backend.name, **kwargs)
        _raise_late_value_errors()


@pytest.mark.parametrize("case", OPTION_CASES, ids=[c[0] for c in OPTION_CASES])
def test_supcon_loss_rejects_backend(case):
    _, kwargs, error, pattern = case
    kwargs = dict(kwargs)
    with pytest.raises(error, match=pattern):
        scl_kernels.supcon_loss(kwargs.pop("features"), **kwargs)


@pytest.mark.quick
def test_module_rejects_like_function(backend):
    x, y, c = backend.put((X, Y, C))
    with pytest.raises(ValueError, match="temperature"):
        scl_kernels.SupConLoss(temperature=-1.0, backend=backend.name)(x, y)
    with pytest.raises(ValueError, match="reduction"):
        scl_kernels.SupConLoss(reduction="mean_over_all", backend=backend.name)(x, y)
    with pytest.raises(ValueError, match="contrast_labels"):
        scl_kernels.SupConLoss(backend=backend.name)(x, y, c)


def test_valid_edge_values_are_accepted(backend, reproducible):
    """Things that look odd but are valid: an int temperature, int32 / uint8 labels,
    a float64 temperature tensor for float32 features, a temperature tensor on the CPU."""
    x, y = backend.put((X, Y))
    base = scl_kernels.supcon_loss(x, y, 1.0, backend=backend.name)
    assert torch.equal(scl_kernels.supcon_loss(x, y, 1, backend=backend.name), base)
    assert torch.equal(scl_kernels.supcon_loss(x, y.int(), 1.0, backend=backend.name), base)
    assert torch.equal(scl_kernels.supcon_loss(x, y.to(torch.uint8), 1.0, backend=backend.name),
                       base)
    torch.testing.assert_close(scl_kernels.supcon_loss(
        x, y, torch.tensor(1.0, dtype=torch.float64), backend=backend.name), base)


# Devices: 'meta' stands in for a second device
META_CASES = [
    ("labels", dict(features=X, labels=Y.to("meta"))),
    ("contrast", dict(features=X, labels=Y, contrast=C.to("meta"), contrast_labels=CY)),
    ("contrast_labels", dict(features=X, labels=Y, contrast=C, contrast_labels=CY.to("meta"))),
    ("temperature", dict(features=X, labels=Y, temperature=torch.tensor(0.1, device="meta"))),
    # features elsewhere than the labels: the labels are then the odd ones out
    ("labels", dict(features=X.to("meta"), labels=Y)),
    ("contrast", dict(features=X.to("meta"), labels=Y.to("meta"), contrast=C,
                      contrast_labels=CY.to("meta"))),
]


def _on_device(backend, kwargs):
    """META_CASES' CPU tensors moved to the backend's device; meta ones stay on meta."""
    return {k: (v if not isinstance(v, torch.Tensor) or v.device.type == "meta" else backend.put(v))
            for k, v in kwargs.items()}


@pytest.mark.matrix(case=[(f"{c[0]}-{i}", *c) for i, c in enumerate(META_CASES)],
                    via=["auto", "named"])
def test_mixed_devices(backend, case, via):
    _, name, kwargs = case
    kwargs = _on_device(backend, kwargs)
    features = kwargs.pop("features")
    other = features.device if features.device.type != "meta" else torch.device(backend.device)
    pattern = rf"{name} is on meta|{name} is on {other.type}"
    chosen = "auto" if via == "auto" else backend.name
    if features.device.type == "meta":
        # whichever check comes first, the error is a ValueError that says what is wrong
        pattern += rf"|backend='{backend.name}'.*meta"
    with pytest.raises(ValueError, match=pattern):
        scl_kernels.supcon_loss(features, backend=chosen, **kwargs)


# ------------------------------------------------------------------------------------------
# Bad input through every backend's raw ops: the op checks its own arguments, with the same
# ValueError / TypeError naming the argument whichever backend runs it
# ------------------------------------------------------------------------------------------

T = torch.tensor(0.1, dtype=torch.float64)

# (id, (features, labels, contrast, contrast_labels, temperature, num_anchors, normalize), error, regex)
OP_CASES = [
    ("features-int", (torch.ones(6, 4, dtype=torch.long), Y, None, None, T, 6, True), TypeError,
     r"features"),
    ("features-3d", (_x(3, 2, 4), _y(3), None, None, T, 3, True), ValueError, r"features"),
    ("features-0-rows", (_x(0, 4), _y(0), None, None, T, 0, True), ValueError, r"features"),
    ("features-0-cols", (_x(6, 0), Y, None, None, T, 6, True), ValueError, r"features"),
    ("features-nan", (_poison(X, math.nan), Y, None, None, T, 6, True), ValueError, r"features"),
    ("features-inf", (_poison(X, math.inf), Y, None, None, T, 6, False), ValueError, r"features"),
    ("labels-float", (X, Y.float(), None, None, T, 6, True), TypeError, r"labels"),
    ("labels-bool", (X, Y.bool(), None, None, T, 6, True), TypeError, r"labels"),
    ("labels-2d", (X, Y.reshape(2, 3), None, None, T, 6, True), ValueError, r"labels"),
    ("labels-short", (X, Y[:4], None, None, T, 6, True), ValueError, r"labels"),
    ("num-anchors-zero", (X, Y, None, None, T, 0, True), ValueError, r"num_anchors"),
    ("num-anchors-too-many", (X, Y, None, None, T, 7, True), ValueError, r"num_anchors"),
    ("num-anchors-negative", (X, Y, None, None, T, -1, True), ValueError, r"num_anchors"),
    ("num-anchors-cross", (X, Y, C, CY, T, 5, True), ValueError, r"num_anchors"),
    ("contrast-without-labels", (X, Y, C, None, T, 6, True), ValueError, r"contrast_labels"),
    ("contrast-labels-without-contrast", (X, Y, None, CY, T, 6, True), ValueError, r"contrast"),
    ("contrast-wrong-dim", (X, Y, _x(5, 3), CY, T, 6, True), ValueError, r"contrast"),
    ("contrast-1d", (X, Y, _x(5), CY, T, 6, True), ValueError, r"contrast"),
    ("contrast-int", (X, Y, torch.ones(5, 4, dtype=torch.long), CY, T, 6, True), TypeError,
     r"contrast"),
    ("contrast-dtype", (X, Y, C.double(), CY, T, 6, True), TypeError, r"contrast"),
    ("contrast-nan", (X, Y, _poison(C, math.nan), CY, T, 6, True), ValueError, r"contrast"),
    ("contrast-labels-short", (X, Y, C, CY[:3], T, 6, True), ValueError, r"contrast_labels"),
    ("contrast-labels-float", (X, Y, C, CY.float(), T, 6, True), TypeError, r"contrast_labels"),
    ("temperature-zero", (X, Y, None, None, torch.tensor(0.0), 6, True), ValueError, r"temperature"),
    ("temperature-negative", (X, Y, None, None, torch.tensor(-1.0), 6, True), ValueError,
     r"temperature"),
    ("temperature-nan", (X, Y, None, None, torch.tensor(math.nan), 6, True), ValueError,
     r"temperature"),
    ("temperature-inf", (X, Y, None, None, torch.tensor(math.inf), 6, True), ValueError,
     r"temperature"),
    ("temperature-int", (X, Y, None, None, torch.tensor(1), 6, True), TypeError, r"temperature"),
    ("temperature-two-values", (X, Y, None, None, torch.tensor([0.1, 0.2]), 6, True), ValueError,
     r"temperature"),
]

QUICK_OP_CASES = {"features-int", "features-nan", "labels-short", "num-anchors-too-many",
                  "contrast-wrong-dim", "temperature-negative"}


def _op_case_on_device(op_backend, args):
    """The case's tensors on the backend's device; the temperature stays where it is (a CPU
    temperature goes with any device)."""
    return tuple(a if i == 4 else op_backend.put(a) for i, a in enumerate(args))


@pytest.mark.matrix(case=OP_CASES, quick=lambda case: case[0] in QUICK_OP_CASES)
def test_raw_op_rejects(op_backend, case):
    _, args, error, pattern = case
    with pytest.raises(error, match=pattern):
        op_backend.forward_op(*_op_case_on_device(op_backend, args))
        _raise_late_value_errors()


# the backward skips the NaN/inf scan: forward already did it on the same saved inputs
BACKWARD_CASES = [c for c in OP_CASES if c[0] not in ("features-nan", "features-inf", "contrast-nan")]


@pytest.mark.matrix(case=BACKWARD_CASES, quick=lambda case: case[0] in QUICK_OP_CASES)
def test_raw_op_backward_rejects(op_backend, case):
    _, args, error, pattern = case
    args = _op_case_on_device(op_backend, args)
    rows = args[0].shape[0] if args[0].dim() >= 1 else 1
    anchors = max(1, min(int(args[5]), rows)) if args[2] is None else rows
    grad = torch.ones(anchors, device=args[0].device)
    lse = torch.zeros(anchors, dtype=torch.float64, device=args[0].device)
    with pytest.raises(error, match=pattern):
        op_backend.backward_op(grad, *args, lse)


def test_raw_op_backward_rejects_bad_shapes(op_backend):
    x, y, t = op_backend.put((X, Y, T))
    _, lse, _ = op_backend.forward_op(x, y, None, None, t, 6, True)
    with pytest.raises(ValueError, match="grad_loss"):
        op_backend.backward_op(torch.ones(5, device=x.device), x, y, None, None, t, 6, True, lse)
    with pytest.raises(ValueError, match="lse"):
        op_backend.backward_op(torch.ones(6, device=x.device), x, y, None, None, t, 6, True,
                               lse[:4])


@pytest.mark.matrix(which=["labels", "contrast", "contrast_labels", "temperature"])
def test_raw_op_mixed_devices(op_backend, which):
    """The raw op with one argument on another device ('meta') than the features must raise,
    not return: the checks name the argument."""
    args = dict(zip(("features", "labels", "contrast", "contrast_labels"),
                    op_backend.put((X, Y, C, CY))), temperature=T)
    args[which] = args[which].to("meta")
    with pytest.raises((ValueError, TypeError), match=which):
        op_backend.forward_op(args["features"], args["labels"], args["contrast"],
                              args["contrast_labels"], args["temperature"], 6, True)


def test_poison_free_memory_shows_unwritten_outputs():
    """The output tests rely on this: after poisoning, fresh empty buffers hold NaN. Eight of
    each size, all alive, so that each takes its own freed chunk (one of each once came back
    without NaN in a whole-suite run)."""
    poison_free_memory("cpu")
    fresh = [torch.empty(size, dtype=torch.float64) for size in (16, 64, 256, 1024)
             for _ in range(8)]
    assert any(torch.isnan(t).any() for t in fresh), \
        "torch.empty after poison_free_memory never showed NaN"

