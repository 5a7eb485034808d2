"""torch.autograd.gradcheck of the cpu backend (through supcon_loss) in float64."""
import pytest
import torch
from torch.autograd import gradcheck

import scl_kernels

pytestmark = pytest.mark.usefixtures("cpu_library")


def _gen(seed):
    return torch.Generator().manual_seed(seed)


def _x(g, *shape):
    return torch.randn(*shape, generator=g, dtype=torch.float64)


CASES = {
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


@pytest.mark.parametrize("normalize", [True, False])
@pytest.mark.parametrize("reduction", ["mean", "none"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_gradcheck_features_contrast_temperature(name, reduction, normalize):
    build, t0 = CASES[name]
    kw = build(_gen(len(name)))
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
                                       reduction=reduction, normalize=normalize, backend="cpu",
                                       **kw)

    assert gradcheck(fn, inputs, eps=1e-6, atol=1e-7, rtol=1e-6)


@pytest.mark.parametrize("temperature", [0.002, 0.02, 0.1])
def test_gradcheck_temperature_paths(temperature):
    """Single set "all" in fp64 across the fixed-shift threshold (symmetric vs running max)."""
    g = _gen(7)
    x = _x(g, 8, 3).requires_grad_()
    y = torch.tensor([0, 1, 1, 0, 2, 2, 0, 1])
    t = torch.tensor(temperature, dtype=torch.float64, requires_grad=True)
    # tiny temperatures make the loss steep: scale the finite-difference step with t
    assert gradcheck(lambda a, b: scl_kernels.supcon_loss(a, y, b, backend="cpu"), (x, t),
                     eps=1e-6 * temperature / 0.1, atol=1e-6, rtol=1e-5)


def test_gradcheck_float_temperature_only_features():
    g = _gen(11)
    x = _x(g, 3, 2, 4).requires_grad_()
    assert gradcheck(lambda a: scl_kernels.supcon_loss(a, torch.tensor([0, 1, 0]), 0.15, backend="cpu",
                                                       reduction="sum"), (x,), eps=1e-6, atol=1e-7)


@pytest.mark.parametrize("layout", ["single", "cross"])
def test_double_backward_is_correct_or_refused(layout):
    """create_graph=True through the fused op: a second derivative must either be right (as the
    float64 reference's) or raise; it must never be silently wrong."""
    import warnings

    from reference64 import supcon_reference64

    g = _gen(3)
    x = _x(g, 10, 4).requires_grad_()
    y = torch.tensor([0, 1, 2, 0, 1, 2, 0, 1, 2, 0])
    kw = {}
    if layout == "cross":
        kw = dict(contrast=_x(g, 7, 4), contrast_labels=torch.tensor([0, 1, 2, 0, 1, 2, 2]))
    gx, = torch.autograd.grad(scl_kernels.supcon_loss(x, y, backend="cpu", **kw), [x],
                              create_graph=True)
    want, = torch.autograd.grad(
        torch.autograd.grad(supcon_reference64(x, y, **kw), [x], create_graph=True)[0].sum(), [x])
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            got, = torch.autograd.grad(gx.sum(), [x])
    except (RuntimeError, NotImplementedError):
        return  # refusing double backward is acceptable
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-8,
                               msg=lambda m: "double backward silently wrong: " + m)
