"""bench/launch_count.py: its classification of profiler events, and the ledgers of the Triton
backend and of the CUDA C++ backend's host code (its dry run) held under today's counts, so that
launches and host waits cannot creep back (the goal, 12 launches and no host wait a step, is
met)."""
import re
import subprocess
import sys
from dataclasses import dataclass
from typing import Optional

import pytest

from bench import launch_count
from scl_kernels._testing import cuda_dry_run_built

# Measured 2026-11-27 (Triton at N = 48 / 96, D = 20, the test's sizes): 9 Triton kernels (the
# preparation, the tiles, the column terms of each, which also zero the tiles' accumulators, the
# log-sum-exp's merge, the forward's per-anchor losses and their mean, the backward's per-anchor
# weights and assembly) and 3 ATen calls that launch work (one sort of the labels, one zeroed
# buffer for the class sums, the finiteness count and the mean's accumulators, autograd's seed
# of the loss's gradient); no host wait since the finiteness check reports when its verdict has
# landed (SCL_VALUE_CHECKS=when_ready). Earlier: 98 launches and 1 wait, then 77, 63 (before the
# preparation, weights and merge kernels), 21 (before the mean moved into the op and the host
# temperature's zero gradient was known to stay on the host), 16 (before the column terms zeroed
# the accumulators) and 14 (before the mean's accumulators joined the preparation's buffer and
# the single set's mean stopped summing weighted class rows: class_shares_weight).
TRITON_LAUNCH_CEILING = 12
TRITON_HOST_WAIT_CEILING = 0
# Measured 2026-11-27 (the dry run at N = 65,536, D = 128, bfloat16): 9 kernels (the
# preparation, the row terms of each tile step, which also zero the tiles' accumulators, the
# symmetric forward and its log-sum-exp merge, the per-anchor losses' mean, the backward's
# weights, the triangle backward, the assembly) and the same 3 ATen calls as Triton's. Before
# its fused stages: 116 launches; then 21, 16, 14.
CUDA_LAUNCH_CEILING = 12
CUDA_HOST_WAIT_CEILING = 0


@dataclass(eq=False)
class FakeEvent:
    name: str
    cpu_parent: Optional["FakeEvent"] = None


def test_views_are_free_and_reads_count_once():
    step = FakeEvent("autograd::engine::evaluate_function")
    view = FakeEvent("aten::view", step)
    to_copy = FakeEvent("aten::to", step)
    copy_inside = FakeEvent("aten::copy_", FakeEvent("aten::_to_copy", to_copy))
    same_dtype_to = FakeEvent("aten::to", step)  # returns its input: nothing below it
    mul = FakeEvent("aten::mul", step)
    nested_fill = FakeEvent("aten::fill_", mul)  # inside a counted call: not counted again
    item = FakeEvent("aten::item", step)
    scalar = FakeEvent("aten::_local_scalar_dense", item)
    wait = FakeEvent(launch_count.VALUE_CHECK_WAIT, step)
    kernel = FakeEvent(launch_count.KERNEL_SCOPE + "lse_symmetric_kernel", step)
    inside_kernel = FakeEvent("aten::add", kernel)  # the interpreter's own tensor work
    host_scope = FakeEvent("scl::host_temperature_grad", step)
    on_host = FakeEvent("aten::zeros_like", host_scope)  # stays on the host on a GPU too
    events = [step, view, to_copy, copy_inside.cpu_parent, copy_inside, same_dtype_to, mul,
              nested_fill, item, scalar, wait, kernel, inside_kernel, host_scope, on_host]
    ledger = launch_count.ledger_of(events)
    assert dict(ledger["kernels"]) == {"lse_symmetric_kernel": 1}
    assert dict(ledger["aten"]) == {"aten::to": 1, "aten::mul": 1}
    assert dict(ledger["waits"]) == {"aten::item": 1, launch_count.VALUE_CHECK_WAIT: 1}


def test_ledgers_stay_under_their_ceilings():
    pytest.importorskip("triton")
    done = subprocess.run([sys.executable, "-m", "bench.launch_count", "--n", "48", "--d", "20"],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    last = done.stdout.strip().splitlines()[-1]
    found = re.fullmatch(r"fwd\+bwd launches: triton (\d+), cuda (\d+|not counted); "
                         r"host waits: triton (\d+), cuda (\d+|not counted)", last)
    assert found, last
    assert int(found[1]) <= TRITON_LAUNCH_CEILING, done.stdout
    assert int(found[3]) <= TRITON_HOST_WAIT_CEILING, done.stdout
    assert "lse_symmetric_kernel 1" in done.stdout and "grad_rows_kernel 1" in done.stdout
    assert "column_terms_kernel 2" in done.stdout and "anchor_losses_kernel 1" in done.stdout
    assert "assemble_backward_kernel 1" in done.stdout
    assert "prepare_rows_kernel 1" in done.stdout and "anchor_weights_kernel 1" in done.stdout
    assert "lse_merge_kernel 1" in done.stdout
    # The CUDA host code is counted wherever the library has its dry run (built without CUDA).
    if not cuda_dry_run_built():
        assert found[2] == "not counted" and found[4] == "not counted", last
        return
    assert int(found[2]) <= CUDA_LAUNCH_CEILING, done.stdout
    assert int(found[4]) <= CUDA_HOST_WAIT_CEILING, done.stdout
    for kernel in ("row_stages.prepare_rows 1", "row_stages.row_terms 2", "sm90.lse_symmetric 1",
                   "row_stages.lse_merge 1", "row_stages.anchor_mean 1",
                   "row_stages.anchor_weights 1", "sm90.grad_triangle 1",
                   "row_stages.assemble_backward 1"):
        assert kernel in done.stdout, (kernel, done.stdout)


@pytest.mark.skipif(not cuda_dry_run_built(), reason="the library has no CUDA dry run")
@pytest.mark.parametrize("groups", [False, True])
def test_a_captured_multi_hot_cuda_step_waits_for_nothing(groups):
    """Multi-hot labels on the CUDA C++ backend: eagerly the sums over class subsets read their
    keys' sizes on the host; under graph capture the call takes the class overlaps in blocks of
    pairs, which read nothing there (csrc/cuda/supcon_cuda.cpp, by_class_subsets)."""
    import torch
    from scl_kernels._testing import test_hooks

    g = torch.Generator().manual_seed(0)
    n = 120
    features = torch.randn(n, 16, generator=g).to(torch.bfloat16).requires_grad_()
    hot = torch.rand(n, 12, generator=g) < 0.3  # rows of few classes: the sums, eagerly
    extra = dict(groups=torch.randint(-1, 4, (n,), generator=g)) if groups else {}
    temperature = torch.tensor(0.1, dtype=torch.float64)

    def step():
        loss, _lse, _num_positives = torch.ops.scl.supcon_cuda_dry_run(
            features, hot, None, None, temperature, n, True, 0, 0.0, True, multi_label="jaccard",
            **extra)
        return torch.autograd.grad(loss, [features])

    waits = {}
    for capturing in (False, True):
        with test_hooks(device_preparation=True, dry_run_capturing=capturing):
            waits[capturing] = dict(launch_count.profiled_ledger(step)["waits"])
    assert waits[False], "eagerly the sums over class subsets read sizes on the host"
    assert waits[True] == {}, waits[True]
