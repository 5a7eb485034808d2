"""The Triton backend run by Triton's interpreter on CPU tensors (fp32, small shapes), against the
float64 reference: every layout, sizes that are not multiples of the interpreter's 32-wide tiles,
the symmetric and the plain schedule, the column split, and deterministic mode.

TRITON_INTERPRET=1 must be set before triton is imported; conftest.py does so when no GPU is
present."""
import os

import pytest
import torch

import scl_kernels
from layouts import LAYOUTS, make_layout
from reference64 import check_against_reference
from scl_kernels.backends import triton_installed

pytestmark = [
    pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                       reason="needs TRITON_INTERPRET=1 (set by conftest.py on machines without CUDA)"),
    pytest.mark.skipif(not triton_installed(), reason="triton is not installed"),
]


def _symmetric_used(monkeypatch):
    """Records which schedule each forward call takes."""
    from scl_kernels.triton_backend import launch
    calls = []
    for name in ("lse_symmetric", "lse_plain"):
        original = getattr(launch, name)

        def spy(*args, _name=name, _original=original):
            calls.append(_name)
            return _original(*args)
        monkeypatch.setattr(launch, name, spy)
    return calls


@pytest.mark.parametrize("layout", LAYOUTS)
def test_layouts_match_reference(layout, randn, randint, gen):
    kw = make_layout(layout, randn, randint, n=45, d=37)
    check_against_reference("triton", generator=gen, **kw)


@pytest.mark.parametrize("n,d", [(1, 3), (5, 2), (32, 32), (33, 70), (70, 20)])
@pytest.mark.parametrize("temperature,schedule", [(0.1, "lse_symmetric"), (0.02, "lse_plain")])
def test_single_set_schedules(n, d, temperature, schedule, randn, randint, gen, monkeypatch):
    calls = _symmetric_used(monkeypatch)
    t = torch.tensor(temperature, dtype=torch.float64, requires_grad=True)
    check_against_reference("triton", randn(n, d), randint(0, 3, (n,)), t, generator=gen)
    assert calls == [schedule]


@pytest.mark.parametrize("layout", ["single_all", "multiview_one", "cross_labels", "simcse"])
def test_deterministic_mode(layout, randn, randint, monkeypatch):
    calls = _symmetric_used(monkeypatch)
    kw = make_layout(layout, randn, randint, n=70, d=40)
    previous = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        # the same upstream gradient both times
        first = check_against_reference("triton", generator=torch.Generator().manual_seed(1), **kw)
        again = check_against_reference("triton", generator=torch.Generator().manual_seed(1), **kw)
    finally:
        torch.use_deterministic_algorithms(previous)
    assert "lse_symmetric" not in calls
    for name, grad in first.grads.items():
        assert torch.equal(grad, again.grads[name]), f"grad of {name} differs between runs"


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_reductions_negative_labels_and_zero_rows(reduction, randn, randint, gen):
    x = randn(40, 33)
    x[3] = 0.0
    labels = randint(-1, 3, (40,))
    check_against_reference("triton", x, labels, 0.5, reduction=reduction, generator=gen)


@pytest.mark.parametrize("d", [1, 24])
def test_unnormalized_large_norms(d, randn, randint, gen):
    # D = 1 only without normalisation: unit rows of width 1 are +-1 and their gradient is 0.
    check_against_reference("triton", randn(36, d, scale=4.0), randint(0, 3, (36,)), 1.0,
                            normalize=False, generator=gen)


def test_no_valid_anchor_gives_zero_and_zero_grad(randn):
    x = randn(40, 8).requires_grad_(True)
    loss = scl_kernels.supcon_loss(x, torch.arange(40), backend="triton")
    loss.backward()
    assert loss.item() == 0.0
    assert torch.equal(x.grad, torch.zeros_like(x))


def test_triton_op_without_interpreter_is_a_clear_error(randn, randint, monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(ValueError, match="TRITON_INTERPRET"):
        scl_kernels.supcon_loss(randn(8, 4), randint(0, 2, (8,)), backend="triton")


@pytest.mark.parametrize("layout", ["single_all", "multiview_one", "cross_labels"])
def test_row_chunking_of_the_linear_terms(layout, randn, randint, gen, monkeypatch):
    from scl_kernels.triton_backend import problem
    monkeypatch.setattr(problem, "CHUNK_ELEMENTS", 7 * 20)  # 7-row chunks at D = 20
    kw = make_layout(layout, randn, randint, n=40, d=20)
    check_against_reference("triton", generator=gen, **kw)


@pytest.mark.parametrize("layout", ["single_all", "multiview_one", "simcse"])
def test_poisoned_scratch_is_fully_written(layout, randn, randint, gen, monkeypatch):
    from scl_kernels.triton_backend import launch
    monkeypatch.setattr(launch, "uninitialized",
                        lambda shape, device: torch.full(shape, float("nan"), device=device))
    kw = make_layout(layout, randn, randint, n=70, d=20)
    check_against_reference("triton", generator=gen, temperature=0.02, **kw)


@pytest.mark.parametrize("layout", ["single_all", "multiview_one", "cross_labels"])
def test_opcheck_supcon_triton(layout, randn, randint):
    from layouts import op_args
    scl_kernels.backends.load_triton_backend()
    kw = make_layout(layout, randn, randint, n=40, d=20)
    args = list(op_args(kw))
    args[0] = args[0].detach().requires_grad_(True)
    for op in (torch.ops.scl.supcon_triton.default, torch.ops.scl.supcon_triton_backward.default):
        if op is torch.ops.scl.supcon_triton_backward.default:
            loss, lse, _ = torch.ops.scl.supcon_triton(*[a.detach() if isinstance(a, torch.Tensor) else a
                                                         for a in args])
            args = [torch.ones_like(loss)] + [a.detach() if isinstance(a, torch.Tensor) else a
                                               for a in args] + [lse]
        result = torch.library.opcheck(op, args)
        assert all(v == "SUCCESS" for v in result.values()), result


def test_compile_fullgraph_with_triton_backend(randn, randint):
    x, y = randn(40, 20), randint(0, 4, (40,))

    def loss_fn(features, labels):
        return scl_kernels.supcon_loss(features * 2.0, labels, 0.1, backend="triton")

    eager = loss_fn(x, y)
    compiled = torch.compile(loss_fn, fullgraph=True, backend="aot_eager")(x, y)
    torch.testing.assert_close(compiled, eager)


def test_tensors_past_int32_offsets_are_refused():
    huge = torch.zeros(1, 1).expand(2**16, 2**15)  # 2^31 elements, no memory behind them
    with pytest.raises(ValueError, match="2\\^31"):
        scl_kernels.supcon_loss(huge, torch.zeros(2**16, dtype=torch.long), backend="triton")
