"""What only the cpu backend (the fused C++ kernel) promises beyond the conformance suite
(test_conformance*.py): it is available wherever the library loaded, "auto" picks it for CPU
tensors, its results do not depend on the thread count, and its 256-wide tiles from 8,192 rows on.
"""

import os
import subprocess
import sys

import pytest
import torch

import scl_kernels
from support.layouts import make_layout
from support.reference64 import check_against_reference

pytestmark = pytest.mark.usefixtures("cpu_library")


def test_cpu_backend_is_under_test():
    """The conformance suite runs the backends that available_backends lists: a library that
    failed to load would silently drop the cpu backend from it."""
    assert scl_kernels.available_backends("cpu")[0] == "cpu"


def test_cpu_backend_rejects_other_device():
    x, y = torch.randn(6, 4), torch.arange(6) % 3
    with pytest.raises(ValueError, match=r"backend='cpu'.*meta"):
        scl_kernels.supcon_loss(x.to("meta"), y.to("meta"), backend="cpu")
    assert "cpu" not in scl_kernels.available_backends("meta")


# ------------------------------------------------------------------------------------------
# auto
# ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("layout", ["single_all", "multiview_one", "simcse"])
def test_auto_is_cpu_on_cpu(layout, randn, randint):
    assert scl_kernels.available_backends("cpu")[0] == "cpu"
    kw = make_layout(layout, randn, randint, n=20, d=5)
    a = scl_kernels.supcon_loss(**kw, backend="auto", reduction="none")
    b = scl_kernels.supcon_loss(**kw, backend="cpu", reduction="none")
    assert torch.equal(a, b)


# ------------------------------------------------------------------------------------------
# Determinism of the cpu backend
# ------------------------------------------------------------------------------------------

# Each past the grain (csrc/core/call_plan.cpp), so that two threads share its tiles: smaller
# calls stay on the calling thread whatever the thread count. N * D is past ATen's own grain
# (32,768 elements) too, where ATen's sums would split by thread count: the call's ATen steps
# run on the calling thread at every size (csrc/core/calling_thread.h).
DETERMINISM_CASES = {
    # single set, symmetric schedule over 4 x 4 blocks
    "single_sym": lambda randn, randint: dict(features=randn(300, 190),
                                              labels=randint(0, 9, (300,)), temperature=0.1),
    # single set, running-max path (t below the fixed-shift range)
    "single_plain": lambda randn, randint: dict(features=randn(300, 190),
                                                labels=randint(0, 9, (300,)), temperature=0.02),
    # few row blocks, many column blocks: the forward splits the columns between threads
    "cross_wide": lambda randn, randint: dict(features=randn(129, 190), labels=randint(0, 5, (129,)),
                                              contrast=randn(700, 190),
                                              contrast_labels=randint(0, 5, (700,)), temperature=0.1),
    "one_view": lambda randn, randint: dict(features=randn(150, 3, 85), labels=randint(0, 5, (150,)),
                                            contrast_mode="one", temperature=0.1),
    "no_normalize": lambda randn, randint: dict(features=randn(260, 250),
                                                labels=randint(0, 5, (260,)), temperature=0.5,
                                                normalize=False),
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
    assert scl_kernels.explain(**kw, backend="cpu").plan["threads"] == "parallel tiles"
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
    # (rows, contrast rows or None, temperature, dim, anchors); every one past the grain
    (300, None, 0.02, 190, 300),  # single set, running-max forward: 4 x 4 blocks
    (300, None, 0.1, 190, 300),   # single set, symmetric
    (450, None, 0.1, 85, 150),    # contrast_mode="one": 2 row blocks x 4 column blocks
    (129, 700, 0.1, 190, 129),    # cross set: 2 row blocks x 6 column blocks
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
    plan = torch.ops.scl.supcon_plan(x, y, c, cy, temp, anchors, True, 0, 0.0, True)
    assert "threads: parallel tiles" in plan.splitlines()
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
    from support.chunked_reference64 import chunked_supcon64
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


def _unique_calls(run):
    """How many times the O(N*D) preparation computed class ids (aten::_unique2) in run()."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        run()
    return sum(event.count for event in prof.key_averages() if event.key == "aten::_unique2")


@pytest.mark.parametrize("n, dim, kept", [(48, 40, True), (300, 1024, False)])
def test_backward_reuses_a_small_forwards_preparation(n, dim, kept):
    """Autograd hands a small problem's preparation from forward to backward
    (csrc/core/prepared_handoff.h): backward then prepares nothing, and its gradient is the one
    the raw backward op computes from scratch, bit for bit. Large problems prepare again."""
    generator = torch.Generator().manual_seed(n)
    x = torch.randn(n, dim, generator=generator, requires_grad=True)
    labels = torch.randint(0, 5, (n,), generator=generator)
    t = torch.tensor(0.1, dtype=torch.float64)

    def forward_backward():
        loss, lse, _ = torch.ops.scl.supcon(x, labels, None, None, t, n, True)
        loss.sum().backward()
        return lse

    x.grad = None
    assert _unique_calls(forward_backward) == (1 if kept else 2)
    x.grad = None
    lse = forward_backward()
    with torch.no_grad():
        grad, _, _ = torch.ops.scl.supcon_backward(torch.ones(n), x, labels, None, None, t, n, True, lse)
    assert torch.equal(x.grad, grad)


# ------------------------------------------------------------------------------------------
# Threads: a call below the grain (kSerialWork, csrc/core/call_plan.cpp) stays on the calling
# thread (csrc/core/calling_thread.h); a larger one uses torch's threads
# ------------------------------------------------------------------------------------------

# (rows, dim): the small call (N = 64, D = 768) and one well above the grain.
BELOW_GRAIN, ABOVE_GRAIN = (64, 768), (1024, 128)

# A fresh process, so that no earlier test has started OpenMP's threads: libgomp starts a
# worker thread at the first region with a team of two, and keeps it. The op's ATen steps
# include index_add_, whose sort-based scatter opens OpenMP regions of its own.
THREAD_PROBE = """
import os, sys, torch, scl_kernels
torch.set_num_threads(2)
def step(rows, dim):
    g = torch.Generator().manual_seed(rows)
    x = torch.randn(rows, dim, generator=g, requires_grad=True)
    scl_kernels.supcon_loss(x, torch.randint(0, 8, (rows,), generator=g), backend="cpu").backward()
counts = [len(os.listdir("/proc/self/task"))]
for rows, dim in ({below}, {above}):
    step(rows, dim)
    counts.append(len(os.listdir("/proc/self/task")))
print(*counts, torch.get_num_threads())
"""


def _threads_of_plan(rows, dim):
    x = torch.randn(rows, dim)
    return scl_kernels.explain(x, torch.arange(rows) % 8, backend="cpu").plan["threads"]


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="counts threads in /proc")
def test_small_call_starts_no_thread_and_large_one_does():
    assert _threads_of_plan(*BELOW_GRAIN) == "calling thread"
    assert _threads_of_plan(*ABOVE_GRAIN) == "parallel tiles"
    probe = THREAD_PROBE.format(below=BELOW_GRAIN, above=ABOVE_GRAIN)
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          timeout=300, env={**os.environ, "OMP_NUM_THREADS": "2"})
    assert done.returncode == 0, done.stderr
    start, after_small, after_large, torch_threads = map(int, done.stdout.split())
    assert after_small == start, "a call below the grain started threads"
    assert after_large > after_small, "a call above the grain ran on one thread"
    assert torch_threads == 2, "the call left another thread count behind"


def test_thread_count_restored_after_a_small_call_that_raises():
    """The calling thread's OpenMP thread count (what torch.get_num_threads reads) comes back
    also when the call raises inside (a NaN row, found by the forward's value checks)."""
    torch.set_num_threads(2)
    x = torch.randn(16, 8)
    x[3, 1] = float("nan")
    with pytest.raises(ValueError):
        scl_kernels.supcon_loss(x, torch.arange(16) % 4, backend="cpu")
    assert torch.get_num_threads() == 2
