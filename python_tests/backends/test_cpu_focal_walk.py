"""What the cpu backend's positive walk of the focal loss (csrc/cpu/positive_walk.cpp) promises
beyond the conformance suite: exact results where its blocks (256 class-sorted anchors x 1024
class-sorted columns) are crossed and cut by class boundaries, with one, two and many classes;
results independent of the thread count; and O(block) memory at N = 65,536."""

import pytest
import torch

import scl_kernels
from scl_kernels.profiling import PeakMemory
from support.reference64 import check_op_against_reference

pytestmark = pytest.mark.usefixtures("cpu_library")

OPS = (torch.ops.scl.supcon, torch.ops.scl.supcon_backward)

WALK_CASES = [
    # (id, rows N, contrast rows M (None: single set), classes, num_anchors, anchor_offset)
    ("one-class", 1500, None, 1, 1500, 0),        # 6 anchor blocks x 2 column blocks, all pairs
    ("two-classes", 2100, None, 2, 2100, 0),      # blocks cut at the class boundary
    ("many-classes", 1300, None, 97, 1300, 0),    # a block spans several classes
    ("anchor-offset", 1500, None, 3, 300, 700),   # the self column moves with the offset
    ("cross-set", 600, 2500, 2, 600, 0),          # a class spans 2 column blocks, no self column
    ("negative-labels", 1100, None, 4, 1100, 0),  # about a third of the rows have no class
]


def _inputs(case, dtype=torch.float64):
    _, n, m, classes, anchors, _offset = case
    g = torch.Generator().manual_seed(n + classes)
    x = torch.randn(n, 13, generator=g, dtype=dtype)
    y = torch.randint(0, classes, (n,), generator=g)
    if case[0] == "negative-labels":
        y = torch.where(torch.rand(n, generator=g) < 0.3, -1, y)
    c = None if m is None else torch.randn(m, 13, generator=g, dtype=dtype)
    cy = None if m is None else torch.randint(0, classes, (m,), generator=g)
    return x, y, c, cy, torch.tensor(0.1, dtype=torch.float64), anchors


@pytest.mark.parametrize("focal_gamma", [0.5, 2.0])
@pytest.mark.parametrize("case", WALK_CASES, ids=[c[0] for c in WALK_CASES])
def test_walk_blocks_against_reference(case, focal_gamma):
    args = _inputs(case)
    res = check_op_against_reference(*OPS, (*args, True), anchor_offset=case[5],
                                     compute_dtype=torch.float64, focal_gamma=focal_gamma,
                                     generator=torch.Generator().manual_seed(1))
    assert (res.ref.num_positives > 0).any()


def test_walk_float32_against_reference():
    """float32: x = (lse_hi - s) + lse_lo and expm1 keep the loss to float32 accuracy."""
    args = _inputs(WALK_CASES[1], torch.float32)
    check_op_against_reference(*OPS, (*args, True), compute_dtype=torch.float32, focal_gamma=2.0,
                               generator=torch.Generator().manual_seed(2))


ONE_BLOCK = ("one-block", 200, None, 1, 200, 0)


@pytest.mark.parametrize("case", [WALK_CASES[1], WALK_CASES[2], WALK_CASES[4], ONE_BLOCK],
                         ids=["two-classes", "many-classes", "cross", "one-block"])
def test_walk_independent_of_threads(case):
    """Forward and backward with focal_gamma: bitwise equal for 1, 2 and 4 threads (the walk's
    rounds fix each output row's order of accumulation; a lone block runs on one thread)."""
    x, y, c, cy, t, anchors = _inputs(case, torch.float32)
    upstream = torch.linspace(-1, 1, anchors)
    previous = torch.get_num_threads()
    outs = {}
    try:
        for threads in (1, 2, 4):
            torch.set_num_threads(threads)
            loss, lse, _ = torch.ops.scl.supcon(x, y, c, cy, t, anchors, True, focal_gamma=2.0)
            grads = torch.ops.scl.supcon_backward(upstream, x, y, c, cy, t, anchors, True, lse,
                                                  focal_gamma=2.0)
            outs[threads] = (loss, *grads)
    finally:
        torch.set_num_threads(previous)
    for threads in (2, 4):
        for name, a, b in zip(("loss", "features", "contrast", "temperature"), outs[1],
                              outs[threads]):
            assert torch.equal(a, b), f"{name}: 1 vs {threads} threads"


@pytest.mark.slow
def test_walk_memory_at_65536_rows():
    """N = 65,536, D = 128, focal_gamma = 2, forward and backward: under 1 GiB above the inputs
    (a dense [N, N] float32 buffer alone would be 16 GiB)."""
    g = torch.Generator().manual_seed(65536)
    n = 65536
    x = torch.randn(n, 128, generator=g).requires_grad_(True)
    labels = torch.randint(0, 256, (n,), generator=g)
    with PeakMemory("cpu") as peak:
        loss = scl_kernels.supcon_loss(x, labels, 0.1, focal_gamma=2.0, backend="cpu")
        loss.backward()
    assert torch.isfinite(loss) and float(loss.detach()) > 0
    assert torch.isfinite(x.grad).all()
    assert peak.peak_bytes < 2**30, f"peak {peak.peak_bytes / 2**20:.0f} MiB above the inputs"
