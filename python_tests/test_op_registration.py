"""torch.library.opcheck of torch.ops.scl and torch.compile(fullgraph=True) through supcon_loss."""
import pytest
import torch

import scl_kernels
from layouts import LAYOUTS, make_layout, op_args

pytestmark = pytest.mark.usefixtures("cpu_library")

ALL_CHECKS = {"test_schema", "test_autograd_registration", "test_faketensor",
              "test_aot_dispatch_dynamic"}


def _assert_opcheck(op, args):
    result = torch.library.opcheck(op, args)
    assert set(result) == ALL_CHECKS
    assert all(v == "SUCCESS" for v in result.values()), result


@pytest.mark.parametrize("grad", ["none", "features", "all"])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_opcheck_supcon(layout, grad, randn, randint):
    kw = make_layout(layout, randn, randint, n=10, d=4)
    features, labels, contrast, contrast_labels, t, anchors, normalize = op_args(kw, 0.1)
    features = features.detach().clone()
    if grad in ("features", "all"):
        features.requires_grad_()
    if grad == "all":
        t = torch.tensor(0.1, dtype=torch.float32, requires_grad=True)
        if contrast is not None:
            contrast = contrast.detach().clone().requires_grad_()
    _assert_opcheck(torch.ops.scl.supcon.default,
                    (features, labels, contrast, contrast_labels, t, anchors, normalize))


@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16, torch.float16],
                         ids=["f64", "bf16", "f16"])
@pytest.mark.parametrize("normalize", [True, False])
def test_opcheck_supcon_dtypes(dtype, normalize, randn, randint):
    x = randn(9, 5, dtype=dtype).requires_grad_()
    _assert_opcheck(torch.ops.scl.supcon.default,
                    (x, randint(0, 3, (9,)), None, None, torch.tensor(0.3), 9, normalize))


@pytest.mark.parametrize("layout", LAYOUTS)
def test_opcheck_supcon_backward(layout, randn, randint):
    kw = make_layout(layout, randn, randint, n=10, d=4)
    args = op_args(kw, 0.1)
    features, labels, contrast, contrast_labels, t, anchors, normalize = args
    _, lse, _ = torch.ops.scl.supcon(*args)
    grad_loss = randn(lse.shape[0])
    _assert_opcheck(torch.ops.scl.supcon_backward.default,
                    (grad_loss, features, labels, contrast, contrast_labels, t, anchors, normalize,
                     lse))


def test_op_schemas():
    supcon = torch.ops.scl.supcon.default._schema
    backward = torch.ops.scl.supcon_backward.default._schema
    assert [a.name for a in supcon.arguments] == [
        "features", "labels", "contrast", "contrast_labels", "temperature", "num_anchors",
        "normalize"]
    assert [r.name for r in supcon.returns] == ["loss", "lse", "num_positives"]
    assert not supcon.is_mutable and not backward.is_mutable
    assert [r.name for r in backward.returns] == ["grad_features", "grad_contrast",
                                                  "grad_temperature"]


def test_fake_matches_real(randn, randint):
    """The registered fake kernels give the real kernels' shapes and dtypes."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    cases = []
    for dtype in (torch.float32, torch.bfloat16, torch.float64):
        x = randn(7, 3, dtype=dtype)
        cases.append((x, randint(0, 2, (7,)), None, None, torch.tensor(0.1), 4, True))
        cases.append((x, randint(0, 2, (7,)), randn(5, 3, dtype=dtype), randint(0, 2, (5,)),
                      torch.tensor(0.1, dtype=torch.float32), 7, False))
    for args in cases:
        real = torch.ops.scl.supcon(*args)
        with FakeTensorMode(allow_non_fake_inputs=True) as mode:
            fake = torch.ops.scl.supcon(*[mode.from_tensor(a) if isinstance(a, torch.Tensor) else a
                                          for a in args])
        for r, f in zip(real, fake):
            assert r.shape == f.shape and r.dtype == f.dtype
        grad = torch.ones_like(real[0])
        real_b = torch.ops.scl.supcon_backward(grad, *args, real[1])
        with FakeTensorMode(allow_non_fake_inputs=True) as mode:
            fake_b = torch.ops.scl.supcon_backward(
                *[mode.from_tensor(a) if isinstance(a, torch.Tensor) else a
                  for a in (grad, *args, real[1])])
        for r, f in zip(real_b, fake_b):
            assert r.shape == f.shape and r.dtype == f.dtype


# ------------------------------------------------------------------------------------------
# torch.compile
# ------------------------------------------------------------------------------------------

class _Head(torch.nn.Module):
    """A projection, a learnable temperature and the loss: a typical training step."""

    def __init__(self, mode, in_dim=6, out_dim=5):
        super().__init__()
        self.proj = torch.nn.Linear(in_dim, out_dim)
        self.log_t = torch.nn.Parameter(torch.tensor(-1.5))
        self.mode = mode

    def forward(self, x, y=None, c=None, cy=None):
        z = self.proj(x)
        t = self.log_t.exp()
        if self.mode == "supervised":
            return scl_kernels.supcon_loss(z, y, t, backend="cpu")
        if self.mode == "one":
            return scl_kernels.supcon_loss(z, y, t, contrast_mode="one", backend="cpu")
        if self.mode == "simclr":
            return scl_kernels.supcon_loss(z, temperature=0.2, backend="cpu", reduction="sum")
        if self.mode == "clip":
            return scl_kernels.supcon_loss(z, temperature=t, contrast=self.proj(c), backend="cpu")
        if self.mode == "cross":
            return scl_kernels.supcon_loss(z, y, t, contrast=self.proj(c), contrast_labels=cy,
                                           backend="cpu", reduction="none").sum()
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


def _compare_compiled(mode, backend, randn, randint, dynamic=None):
    torch._dynamo.reset()
    torch.manual_seed(0)
    module = _Head(mode)
    args = _inputs(mode, randn, randint)
    eager_out, eager_grads = _step(module, args)
    compiled = torch.compile(module, fullgraph=True, backend=backend, dynamic=dynamic)
    out, grads = _step(compiled, args)
    torch.testing.assert_close(out, eager_out, rtol=1e-5, atol=1e-6)
    assert sum(g is not None for g in grads) >= 2
    for a, b in zip(grads, eager_grads):
        assert (a is None) == (b is None)
        if a is not None:
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    return compiled, module


@pytest.mark.parametrize("mode", ["supervised", "one", "simclr", "clip", "cross"])
def test_compile_fullgraph_aot_eager(mode, randn, randint):
    _compare_compiled(mode, "aot_eager", randn, randint)


def test_compile_dynamic_shapes(randn, randint):
    torch._dynamo.reset()
    module = _Head("supervised")
    compiled = torch.compile(module, fullgraph=True, backend="aot_eager", dynamic=True)
    for b in (6, 9, 13):
        args = (randn(b, 2, 6), randint(0, 3, (b,)))
        out, grads = _step(compiled, args)
        eager_out, eager_grads = _step(module, args)
        torch.testing.assert_close(out, eager_out, rtol=1e-5, atol=1e-6)
        for a, e in zip(grads, eager_grads):
            torch.testing.assert_close(a, e, rtol=1e-5, atol=1e-6)


def test_compile_fullgraph_inductor(randn, randint):
    """One inductor compile (about half a minute on two cores)."""
    _compare_compiled("supervised", "inductor", randn, randint)
