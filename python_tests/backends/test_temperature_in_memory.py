"""A temperature the op leaves unread on the host (csrc/core/tile_kernels.h,
TileKernels::reads_temperature): the GPU backends' path for a temperature tensor on the GPU,
which a CUDA graph can capture (a host read would end the capture) and which never makes the host
wait. The test hook temperature_in_memory takes it for host temperatures too:
the CUDA C++ backend's dry run and the Triton kernels in their interpreter then read t from memory
and form 1/t themselves, on the plain schedule (the symmetric one's fixed shift needs t's value on
the host). Checked against the float64 reference (the loss, the rows' and the temperature's
gradients), against the host-read path where both take the plain schedule, the deferred check of
a bad value, and the calls that cannot take t from memory; sizes around the tiles, no positives
and one class included."""
import os

import pytest
import torch

import scl_kernels
from scl_kernels.backends import triton_installed
from support import needs
from support.layouts import LAYOUTS, make_layout, op_args
from support.op_mean import check_op_mean
from support.reference64 import check_against_reference, check_op_against_reference
from support.triton_schedules import schedules_taken
from scl_kernels._testing import NOT_A_TEST_BUILD, cuda_dry_run_built, test_build, test_hooks

pytestmark = pytest.mark.skipif(not test_build(), reason=NOT_A_TEST_BUILD)
dry_run = pytest.mark.skipif(
    not cuda_dry_run_built(),
    reason="the library was built with CUDA: no dry run of the CUDA host code")
interpreter = pytest.mark.skipif(
    os.environ.get("TRITON_INTERPRET") != "1" or not triton_installed(),
    reason="needs triton and TRITON_INTERPRET=1 (set by support/backend_matrix.py without CUDA)")
IN_MEMORY_ERROR = "cannot take it from memory"


@pytest.fixture(autouse=True)
def temperature_in_memory():
    # the device's preparation too, as a GPU takes
    with test_hooks(temperature_in_memory=True, device_preparation=True):
        yield


def dry_run_ops():
    return torch.ops.scl.supcon_cuda_dry_run, torch.ops.scl.supcon_cuda_dry_run_backward


def awkward_labels(kind, n, randint, classes):
    """"random" (of `classes`), "no-positives" (every label once) or "one-class"."""
    if kind == "random":
        return randint(0, classes, (n,))
    return torch.arange(n) if kind == "no-positives" else torch.zeros(n, dtype=torch.int64)


def learnable(t):
    return torch.tensor(t, dtype=torch.float64, requires_grad=True)


@dry_run
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_dry_run_reads_the_temperature_from_memory(layout, dtype, randn, randint, gen):
    kw = make_layout(layout, randn, randint, dtype=dtype, n=70, d=37, classes=6)
    check_op_against_reference(*dry_run_ops(), op_args(kw, torch.tensor(0.1, dtype=torch.float64)),
                               compute_dtype=torch.float32, generator=gen,
                               weights_dtype=torch.float32)


# Sizes around the kernels' blocks (64, 128) and the terms' padding (256), and label cases
# without positives and with one class.
@dry_run
@pytest.mark.parametrize("n,d", [(1, 5), (2, 8), (129, 128), (257, 130)])
@pytest.mark.parametrize("labels", ["random", "no-positives", "one-class"])
def test_dry_run_awkward_sizes_with_the_temperature_in_memory(n, d, labels, randn, randint, gen):
    y = awkward_labels(labels, n, randint, classes=4)
    args = (randn(n, d, dtype=torch.bfloat16), y, None, None,
            torch.tensor(0.1, dtype=torch.float64), n, True)
    check_op_against_reference(*dry_run_ops(), args, compute_dtype=torch.float32, generator=gen,
                               weights_dtype=torch.float32)


@dry_run
@pytest.mark.parametrize("layout", ["single_all", "cross_labels"])
def test_dry_run_mean_reads_the_temperature_from_memory(layout, randn, randint):
    kw = make_layout(layout, randn, randint, dtype=torch.bfloat16, n=70, d=37, classes=17)
    check_op_mean(*dry_run_ops(), op_args(kw, torch.tensor(0.07)))


@dry_run
@pytest.mark.parametrize("layout", ["single_all", "multiview_one", "cross_labels"])
def test_in_memory_equals_the_host_read(layout, randn, randint):
    """At t = 0.02 the host-read path takes the plain schedule too: the same kernels, 1/t formed
    on the host or on the device by the same float64 division."""
    forward, backward = dry_run_ops()
    kw = make_layout(layout, randn, randint, n=70, d=37, classes=6)
    args = op_args(kw, torch.tensor(0.02, dtype=torch.float64))
    grad = torch.linspace(-1, 1, args[5] if args[2] is None else args[0].shape[0])
    outputs = []
    for in_memory in (True, False):
        with test_hooks(temperature_in_memory=in_memory):
            loss, lse, positives = forward(*args)
            grads = backward(grad.to(loss.dtype), *args, lse, temperature_grad=True)
        outputs.append((loss, lse, positives, *grads))
    for got, host in zip(*outputs):
        torch.testing.assert_close(got, host, rtol=1e-6, atol=1e-7)


@interpreter
@needs.library
@pytest.mark.parametrize("layout", ["single_all", "multiview_all", "multiview_one", "cross_labels"])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_triton_reads_the_temperature_from_memory(layout, reduction, randn, randint, gen):
    kw = make_layout(layout, randn, randint, n=40, d=20, classes=5)
    features = kw.pop("features")
    check_against_reference("triton", features, temperature=learnable(0.1), reduction=reduction,
                            generator=gen, compute_dtype=torch.float32, **kw)


@interpreter
@needs.library
@pytest.mark.parametrize("n,d", [(1, 3), (5, 2), (33, 70)])
@pytest.mark.parametrize("labels", ["random", "no-positives", "one-class"])
def test_triton_awkward_sizes_with_the_temperature_in_memory(n, d, labels, randn, randint, gen):
    y = awkward_labels(labels, n, randint, classes=3)
    check_against_reference("triton", randn(n, d), y, learnable(0.1), generator=gen,
                            compute_dtype=torch.float32)


@interpreter
@needs.library
def test_triton_takes_the_plain_schedule(randn, randint, monkeypatch):
    """A single set of unit rows at t = 0.1 takes the symmetric schedule when t is read on the
    host, the plain one when it is not."""
    calls = schedules_taken(monkeypatch)
    x, labels = randn(40, 20), randint(0, 5, (40,))
    for in_memory in (False, True):
        with test_hooks(temperature_in_memory=in_memory):
            scl_kernels.supcon_loss(x, labels, torch.tensor(0.1), backend="triton")
    assert calls == ["lse_symmetric", "lse_plain"]


@dry_run
@pytest.mark.parametrize("value", [0.0, -0.5, float("nan"), float("inf")])
def test_a_bad_temperature_in_memory_is_reported(value, randn, randint):
    """Its check joins the deferred value checks (on the CPU their verdict is read at the end
    of the call), with the host-read path's message."""
    forward, _ = dry_run_ops()
    args = (randn(30, 8), randint(0, 3, (30,)), None, None, torch.tensor(value), 30, True)
    with pytest.raises(ValueError, match="temperature must be positive and finite"):
        forward(*args)


@dry_run
def test_calls_that_cannot_take_it_from_memory_say_so(randn, randint):
    forward, _ = dry_run_ops()
    labels = randint(0, 3, (30,))
    t = torch.tensor(0.1)
    with pytest.raises(ValueError, match=IN_MEMORY_ERROR):
        forward(randn(30, 8, dtype=torch.float64), labels, None, None, t, 30, True)
    torch.use_deterministic_algorithms(True)
    try:
        with pytest.raises(ValueError, match=IN_MEMORY_ERROR):
            forward(randn(30, 8), labels, None, None, t, 30, True)
    finally:
        torch.use_deterministic_algorithms(False)


@interpreter
@needs.library
def test_triton_focal_loss_cannot_take_it_from_memory(randn, randint):
    with pytest.raises(ValueError, match=IN_MEMORY_ERROR):
        scl_kernels.supcon_loss(randn(30, 8), randint(0, 3, (30,)), torch.tensor(0.1),
                                backend="triton", focal_gamma=2.0)


def test_the_cpu_backend_reads_its_temperature_in_place(randn, randint):
    """The switch concerns the GPU backends' kernels: the CPU backend reads a host temperature in
    place, as always."""
    loss = scl_kernels.supcon_loss(randn(30, 8), randint(0, 3, (30,)), torch.tensor(0.1),
                                   backend="cpu")
    assert torch.isfinite(loss)
