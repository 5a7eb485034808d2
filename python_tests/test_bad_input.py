"""Bad arguments raise a ValueError / TypeError that names the argument, through supcon_loss and
through the raw op torch.ops.scl.supcon (whose checks live in C++)."""
import math

import pytest
import torch

import scl_kernels
from scl_kernels import supcon_loss

pytestmark = pytest.mark.usefixtures("cpu_library")

BACKENDS = ("cpu", "reference")


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
]

# backend is part of the case for these (they are not about the computation)
OPTION_CASES = [
    ("backend-unknown", dict(features=X, labels=Y, backend="cuda"), ValueError, r"backend"),
    ("backend-typo", dict(features=X, labels=Y, backend="CPU"), ValueError, r"backend"),
    ("backend-none", dict(features=X, labels=Y, backend=None), ValueError, r"backend"),
]


@pytest.mark.parametrize("case", LOSS_CASES, ids=[c[0] for c in LOSS_CASES])
@pytest.mark.parametrize("backend", BACKENDS)
def test_supcon_loss_rejects(backend, case):
    _, kwargs, error, pattern = case
    kwargs = dict(kwargs)
    features = kwargs.pop("features")
    with pytest.raises(error, match=pattern):
        supcon_loss(features, backend=backend, **kwargs)


@pytest.mark.parametrize("case", OPTION_CASES, ids=[c[0] for c in OPTION_CASES])
def test_supcon_loss_rejects_backend(case):
    _, kwargs, error, pattern = case
    kwargs = dict(kwargs)
    with pytest.raises(error, match=pattern):
        supcon_loss(kwargs.pop("features"), **kwargs)


@pytest.mark.parametrize("backend", BACKENDS)
def test_module_rejects_like_function(backend):
    with pytest.raises(ValueError, match="temperature"):
        scl_kernels.SupConLoss(temperature=-1.0, backend=backend)(X, Y)
    with pytest.raises(ValueError, match="reduction"):
        scl_kernels.SupConLoss(reduction="mean_over_all", backend=backend)(X, Y)
    with pytest.raises(ValueError, match="contrast_labels"):
        scl_kernels.SupConLoss(backend=backend)(X, Y, C)


def test_valid_edge_values_are_accepted():
    """Things that look odd but are valid: an int temperature, int32 / uint8 labels,
    a float64 temperature tensor for float32 features, a temperature tensor on the CPU."""
    base = supcon_loss(X, Y, 1.0, backend="cpu")
    assert torch.equal(supcon_loss(X, Y, 1, backend="cpu"), base)
    assert torch.equal(supcon_loss(X, Y.int(), 1.0, backend="cpu"), base)
    assert torch.equal(supcon_loss(X, Y.to(torch.uint8), 1.0, backend="cpu"), base)
    torch.testing.assert_close(supcon_loss(X, Y, torch.tensor(1.0, dtype=torch.float64),
                                           backend="cpu"), base)


# ------------------------------------------------------------------------------------------
# Devices: 'meta' stands in for a second device
# ------------------------------------------------------------------------------------------

META_CASES = [
    ("labels", dict(features=X, labels=Y.to("meta"))),
    ("contrast", dict(features=X, labels=Y, contrast=C.to("meta"), contrast_labels=CY)),
    ("contrast_labels", dict(features=X, labels=Y, contrast=C, contrast_labels=CY.to("meta"))),
    ("temperature", dict(features=X, labels=Y, temperature=torch.tensor(0.1, device="meta"))),
    # features elsewhere than the (CPU) labels: the labels are then the odd ones out
    ("labels", dict(features=X.to("meta"), labels=Y)),
    ("contrast", dict(features=X.to("meta"), labels=Y.to("meta"), contrast=C,
                      contrast_labels=CY.to("meta"))),
]


@pytest.mark.parametrize("case", META_CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(META_CASES)])
@pytest.mark.parametrize("backend", ["auto", *BACKENDS])
def test_mixed_devices(backend, case):
    name, kwargs = case
    kwargs = dict(kwargs)
    pattern = rf"{name} is on meta|{name} is on cpu"
    if backend == "cpu" and kwargs["features"].device.type == "meta":
        # whichever check comes first, the error is a ValueError that says what is wrong
        pattern += r"|backend='cpu'.*meta"
    with pytest.raises(ValueError, match=pattern):
        supcon_loss(kwargs.pop("features"), backend=backend, **kwargs)


def test_cpu_backend_rejects_other_device():
    with pytest.raises(ValueError, match=r"backend='cpu'.*meta"):
        supcon_loss(X.to("meta"), Y.to("meta"), backend="cpu")
    assert "cpu" not in scl_kernels.available_backends("meta")


# ------------------------------------------------------------------------------------------
# The raw op: its C++ checks raise ValueError / TypeError naming the argument
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


@pytest.mark.parametrize("case", OP_CASES, ids=[c[0] for c in OP_CASES])
def test_raw_op_rejects(case):
    _, args, error, pattern = case
    with pytest.raises(error, match=pattern):
        torch.ops.scl.supcon(*args)


# the backward skips the NaN/inf scan: forward already did it on the same saved inputs
BACKWARD_CASES = [c for c in OP_CASES if c[0] not in ("features-nan", "features-inf", "contrast-nan")]


@pytest.mark.parametrize("case", BACKWARD_CASES, ids=[c[0] for c in BACKWARD_CASES])
def test_raw_op_backward_rejects(case):
    _, args, error, pattern = case
    rows = args[0].shape[0] if args[0].dim() >= 1 else 1
    anchors = max(1, min(int(args[5]), rows)) if args[2] is None else rows
    grad = torch.ones(anchors)
    lse = torch.zeros(anchors, dtype=torch.float64 if args[0].dtype == torch.float64 else torch.float32)
    with pytest.raises(error, match=pattern):
        torch.ops.scl.supcon_backward(grad, *args, lse)


def test_raw_op_backward_rejects_bad_shapes():
    _, lse, _ = torch.ops.scl.supcon(X, Y, None, None, T, 6, True)
    with pytest.raises(ValueError, match="grad_loss"):
        torch.ops.scl.supcon_backward(torch.ones(5), X, Y, None, None, T, 6, True, lse)
    with pytest.raises(ValueError, match="lse"):
        torch.ops.scl.supcon_backward(torch.ones(6), X, Y, None, None, T, 6, True, lse[:4])


@pytest.mark.parametrize("which", ["labels", "contrast", "contrast_labels", "temperature"])
def test_raw_op_mixed_devices(which):
    """The raw op with one argument on another device ('meta') than the CPU features must
    raise, not return: the C++ checks name the argument."""
    args = dict(features=X, labels=Y, contrast=C, contrast_labels=CY, temperature=T)
    args[which] = args[which].to("meta")
    with pytest.raises((ValueError, TypeError), match=which):
        torch.ops.scl.supcon(args["features"], args["labels"], args["contrast"],
                             args["contrast_labels"], args["temperature"], 6, True)
