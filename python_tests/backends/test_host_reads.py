"""The fused ops read nothing on the host off the CPU (no host synchronisation).

On a GPU every host read of a device value makes the host wait for all the work queued before
it, then leaves the GPU idle while the op's own launches follow. The shared core therefore
prepares an accelerator's inputs without host reads (csrc/core/supcon_problem.cpp: sort-based
class ids, value checks deferred to the op's end by deferred_value_check.h), and the backward
computes the temperature's gradient only when autograd asks for it.

Without a GPU: the CPU backend takes that path under the device_preparation test hook, and the
profiler, which records every ATen call the C++ op makes, must see none of the ops that read a
value on the host. With a GPU: the fused backends run under
torch.cuda.set_sync_debug_mode("error"), and a forward + backward is captured in a CUDA graph and
replayed on new inputs, and with a learnable temperature on the GPU on its new value
(test_temperature_in_memory.py checks that path without a GPU).
"""
import pytest
import torch

import scl_kernels
from scl_kernels._testing import test_hooks
from support import needs
from support.cuda_graphs import capture
from support.layouts import make_layout

pytestmark = needs.hooks

# ATen ops whose result needs a device value on the host (a scalar read, or an output whose size
# depends on the values).
HOST_READS = {"aten::item", "aten::_local_scalar_dense", "aten::is_nonzero", "aten::equal",
              "aten::_unique2", "aten::unique_dim", "aten::unique_consecutive", "aten::bincount",
              "aten::nonzero", "aten::masked_select"}

LAYOUTS = ("single_all", "multiview_one", "cross_labels", "simcse")


def _aten_calls_of_step(kw):
    """The names of the ATen calls of one forward + backward through supcon_loss (CPU), with
    a float temperature (a host tensor) and gradients for every row input."""
    inputs = [kw[name].requires_grad_() for name in ("features", "contrast")
              if kw[name] is not None]
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        loss = scl_kernels.supcon_loss(**kw, temperature=0.1, backend="cpu")
        torch.autograd.grad(loss, inputs)
    return {event.name for event in prof.events()}


# d = 1024 at n = 300: a problem too large for the forward to hand its preparation to the
# backward (csrc/core/prepared_handoff.cpp), so the backward prepares again.
@pytest.mark.parametrize("n, d", [(40, 7), (300, 1024)], ids=["kept", "prepared-again"])
@pytest.mark.parametrize("layout", LAYOUTS)
@needs.library
def test_device_preparation_reads_nothing_on_the_host(layout, n, d, randn, randint):
    kw = make_layout(layout, randn, randint, n=n, d=d)
    # The probe can fail: the CPU's own path reads (unique, the value check's scalar).
    direct = _aten_calls_of_step(kw)
    assert {"aten::_unique2", "aten::item"} <= direct
    with test_hooks(device_preparation=True):
        kw = make_layout(layout, randn, randint, n=n, d=d)
        calls = _aten_calls_of_step(kw)
        assert "aten::sort" in calls  # the profiler sees the op's nested calls
        assert not calls & HOST_READS


@needs.library
def test_device_preparation_still_raises_on_nan_and_inf(randn, randint):
    """Deferred value checks raise the CPU path's errors, features before contrast."""
    with test_hooks(device_preparation=True):
        x, c = randn(9, 4), randn(6, 4)
        x[2, 1], c[0, 3] = float("nan"), float("inf")
        y, cy = randint(0, 3, (9,)), randint(0, 3, (6,))
        with pytest.raises(ValueError, match="features contains NaN or inf"):
            scl_kernels.supcon_loss(x, y, backend="cpu")
        with pytest.raises(ValueError, match="features contains NaN or inf"):
            scl_kernels.supcon_loss(x, y, contrast=c, contrast_labels=cy, backend="cpu")
        with pytest.raises(ValueError, match="contrast contains NaN or inf"):
            scl_kernels.supcon_loss(randn(9, 4), y, contrast=c, contrast_labels=cy, backend="cpu")


@needs.library
def test_late_verdict_is_raised_by_the_next_call(randn, randint):
    """Value checks at next_call: the accelerator's late case (the device has not run the check
    when the call returns), forced on the CPU. The call returns a non-finite loss; the next
    call, forward or backward, raises the error naming the argument; the one after runs."""
    with test_hooks(device_preparation=True, value_checks="next_call"):
        x, y = randn(9, 4), randint(0, 3, (9,))
        x[2, 1] = float("nan")
        assert not torch.isfinite(scl_kernels.supcon_loss(x, y, backend="cpu"))
        with pytest.raises(ValueError, match=r"features contains NaN or inf \(in an earlier call"):
            scl_kernels.supcon_loss(randn(9, 4), y, backend="cpu")
        assert torch.isfinite(scl_kernels.supcon_loss(randn(9, 4), y, backend="cpu"))

        # The backward of the call that received the values is a later call.
        c, cy = randn(6, 4), randint(0, 3, (6,))
        c[0, 3] = float("inf")
        features = randn(9, 4).requires_grad_()
        loss = scl_kernels.supcon_loss(features, y, contrast=c, contrast_labels=cy, backend="cpu")
        with pytest.raises(ValueError, match="contrast contains NaN or inf"):
            loss.backward()

        # raise_deferred_value_errors: the explicit point; nothing pending afterwards.
        scl_kernels.supcon_loss(x, y, backend="cpu")
        with pytest.raises(ValueError, match="features contains NaN or inf"):
            scl_kernels.raise_deferred_value_errors()
        assert scl_kernels.raise_deferred_value_errors() is None
        assert torch.isfinite(scl_kernels.supcon_loss(randn(9, 4), y, backend="cpu"))


@needs.library
@pytest.mark.parametrize("mode", ["when_ready", "end_of_call"])
def test_known_verdict_is_raised_by_the_call_itself(mode, randn, randint):
    with test_hooks(device_preparation=True, value_checks=mode):
        x, y = randn(9, 4), randint(0, 3, (9,))
        x[0, 0] = float("inf")
        with pytest.raises(ValueError, match=r"^features contains NaN or inf$"):
            scl_kernels.supcon_loss(x, y, backend="cpu")
        assert scl_kernels.raise_deferred_value_errors() is None


@needs.library
def test_unknown_value_check_mode_is_named(randn, randint):
    with test_hooks(device_preparation=True, value_checks="later"):
        with pytest.raises(ValueError, match="value_checks must be when_ready, end_of_call or "
                                             "next_call, got 'later'"):
            scl_kernels.supcon_loss(randn(9, 4), randint(0, 3, (9,)), backend="cpu")


# ---- with a GPU ---------------------------------------------------------------------------

GPU_FUSED = [name for name in ("triton", "cuda")
             if torch.cuda.is_available() and name in scl_kernels.available_backends("cuda")]


@pytest.mark.skipif(not GPU_FUSED, reason="needs a CUDA GPU and a fused GPU backend")
@pytest.mark.parametrize("backend_name", GPU_FUSED)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_gpu_step_does_not_synchronise(backend_name, layout, randn, randint):
    kw = make_layout(layout, lambda *s, **k: randn(*s, **k).cuda(),
                     lambda *a: randint(*a).cuda(), n=300, d=100)

    def step():
        features = kw["features"].detach().requires_grad_()
        loss = scl_kernels.supcon_loss(**{**kw, "features": features}, temperature=0.1,
                                       backend=backend_name)
        return torch.autograd.grad(loss, features)[0]

    expected = step()  # first call: Triton's autotuner times its configurations (synchronises)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        got = step()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.testing.assert_close(got, expected)


@pytest.mark.skipif(not GPU_FUSED, reason="needs a CUDA GPU and a fused GPU backend")
@pytest.mark.parametrize("backend_name", GPU_FUSED)
def test_cuda_graph_replays_forward_and_backward(backend_name, randn, randint):
    """While a CUDA graph is captured the op reads nothing on the host (its NaN / inf check is
    left out, and earlier calls' verdicts wait), so a whole forward + backward can be captured
    and replayed on new inputs."""
    # The warm-up's verdicts are left unread (next_call), as a step issued just before the
    # capture leaves them when_ready: asking after them during the capture ended it (an H100,
    # 2026-11-27).
    with test_hooks(value_checks="next_call"):
        x = randn(300, 128, dtype=torch.bfloat16).cuda().requires_grad_()
        labels = randint(0, 5, (300,)).cuda()

        def step():
            x.grad = None
            loss = scl_kernels.supcon_loss(x, labels, 0.1, backend=backend_name)
            loss.backward()
            return loss

        graph, captured = capture(step)
        assert scl_kernels.raise_deferred_value_errors() is None  # the warm-up's, read after it
        fresh = randn(300, 128, dtype=torch.bfloat16, scale=2.0).cuda()
        with torch.no_grad():
            x.copy_(fresh)
        graph.replay()
        eager_x = fresh.clone().requires_grad_()
        eager = scl_kernels.supcon_loss(eager_x, labels, 0.1, backend=backend_name)
        eager.backward()
        torch.cuda.synchronize()
        torch.testing.assert_close(captured, eager, rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(x.grad.float(), eager_x.grad.float(), rtol=2e-2, atol=1e-3)


@pytest.mark.skipif(not GPU_FUSED, reason="needs a CUDA GPU and a fused GPU backend")
@pytest.mark.parametrize("backend_name", GPU_FUSED)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
def test_cuda_graph_replays_a_learnable_temperature(backend_name, dtype, randn, randint):
    """A temperature on the GPU is not read on the host: the kernels read it from memory (the
    plain schedule, in the warm-up as in the capture), so a replay sees its new value, and its
    gradient comes back like the rows'."""
    with test_hooks(value_checks="next_call"):
        x = randn(300, 128, dtype=torch.bfloat16).cuda().requires_grad_()
        labels = randint(0, 5, (300,)).cuda()
        temperature = torch.nn.Parameter(torch.tensor(0.1, dtype=dtype, device="cuda"))

        def step():
            x.grad, temperature.grad = None, None
            loss = scl_kernels.supcon_loss(x, labels, temperature, backend=backend_name)
            loss.backward()
            return loss

        graph, captured = capture(step)
        assert scl_kernels.raise_deferred_value_errors() is None
        with torch.no_grad():
            temperature.fill_(0.3)
        graph.replay()
        eager_x = x.detach().clone().requires_grad_()
        eager_t = torch.tensor(0.3, dtype=dtype, device="cuda", requires_grad=True)
        eager = scl_kernels.supcon_loss(eager_x, labels, eager_t, backend=backend_name)
        eager.backward()
        torch.cuda.synchronize()
        torch.testing.assert_close(captured, eager, rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(x.grad.float(), eager_x.grad.float(), rtol=2e-2, atol=1e-3)
        torch.testing.assert_close(temperature.grad, eager_t.grad, rtol=1e-3, atol=1e-5)


@pytest.mark.skipif(not GPU_FUSED, reason="needs a CUDA GPU and a fused GPU backend")
@pytest.mark.parametrize("backend_name", GPU_FUSED)
def test_gpu_nan_is_reported_without_a_wait(backend_name, randn, randint, monkeypatch):
    """The default SCL_VALUE_CHECKS=when_ready on a GPU: the forward does not synchronise, and a
    NaN is reported by the call itself or, at the latest, by raise_deferred_value_errors."""
    monkeypatch.delenv("SCL_VALUE_CHECKS", raising=False)
    labels = randint(0, 5, (300,)).cuda()
    clean = randn(300, 64).cuda()
    scl_kernels.supcon_loss(clean, labels, 0.1, backend=backend_name)  # autotuning off the check
    torch.cuda.synchronize()
    bad = clean.clone()
    bad[7, 3] = float("nan")
    raised_by_the_call = False
    torch.cuda.set_sync_debug_mode("error")
    try:
        loss = scl_kernels.supcon_loss(bad, labels, 0.1, backend=backend_name)
    except ValueError as error:  # the device had already run the check
        raised_by_the_call = True
        assert "features contains NaN or inf" in str(error)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()
    if raised_by_the_call:
        assert scl_kernels.raise_deferred_value_errors() is None
    else:
        assert not torch.isfinite(loss).item()
        with pytest.raises(ValueError, match="features contains NaN or inf"):
            scl_kernels.raise_deferred_value_errors()
