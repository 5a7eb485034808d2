"""What only the Triton backend does, run by Triton's interpreter on CPU tensors: which schedule
each call takes (symmetric or plain) at sizes around the interpreter's 32-wide tiles,
deterministic mode, the row chunking of its O(N*D) terms, scratch buffers written in full, and its
own limits. Everything every backend must do is in the conformance suite (test_conformance*.py),
which runs the Triton backend too.

TRITON_INTERPRET=1 must be set before triton is imported; support/backend_matrix.py does so when
no GPU is present."""
import inspect
import os
import re
from pathlib import Path

import pytest
import torch

import scl_kernels
from scl_kernels.backends import triton_installed
from support import needs
from support.layouts import make_layout
from support.reference64 import check_against_reference
from support.triton_schedules import schedules_taken

pytestmark = [
    pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                       reason="needs TRITON_INTERPRET=1 (set by support/backend_matrix.py on machines "
                              "without CUDA)"),
    pytest.mark.skipif(not triton_installed(), reason="triton is not installed"),
    needs.library,  # it registers the Triton backend's op
]


def test_triton_backend_is_under_test():
    """The conformance suite runs the backends that available_backends lists."""
    assert "triton" in scl_kernels.available_backends("cpu")


@pytest.mark.parametrize("n,d", [(1, 3), (5, 2), (32, 32), (33, 70), (70, 20)])
@pytest.mark.parametrize("temperature,schedule", [(0.1, "lse_symmetric"), (0.02, "lse_plain")])
def test_single_set_schedules(n, d, temperature, schedule, randn, randint, gen, monkeypatch):
    calls = schedules_taken(monkeypatch)
    t = torch.tensor(temperature, dtype=torch.float64, requires_grad=True)
    check_against_reference("triton", randn(n, d), randint(0, 3, (n,)), t, generator=gen)
    assert calls == [schedule]


@pytest.mark.parametrize("layout", ["single_all", "multiview_one", "cross_labels", "simcse"])
def test_deterministic_mode(layout, randn, randint, monkeypatch, reproducible):
    calls = schedules_taken(monkeypatch)
    kw = make_layout(layout, randn, randint, n=70, d=40)
    # the same upstream gradient both times
    first = check_against_reference("triton", generator=torch.Generator().manual_seed(1), **kw)
    again = check_against_reference("triton", generator=torch.Generator().manual_seed(1), **kw)
    assert "lse_symmetric" not in calls
    for name, grad in first.grads.items():
        assert torch.equal(grad, again.grads[name]), f"grad of {name} differs between runs"


def _deterministic_launches(monkeypatch):
    """The list that each later gradient launch appends its `deterministic` argument to."""
    from scl_kernels.backends.triton import launch
    seen = []
    for name in ("grad_plain", "grad_symmetric"):
        original = getattr(launch, name)

        def spy(*args, _original=original):
            seen.append(inspect.signature(_original).bind(*args).arguments["deterministic"])
            return _original(*args)
        monkeypatch.setattr(launch, name, spy)
    return seen


@pytest.mark.parametrize("deterministic", [False, True])
def test_deterministic_mode_reaches_the_launchers_from_the_plan(deterministic, randn, randint,
                                                                monkeypatch, reproducible_if):
    """The plan's `deterministic` is what the gradient launchers take: the grad op's argument,
    never a second read of torch's switch."""
    seen = _deterministic_launches(monkeypatch)
    reproducible_if(deterministic)
    x, y = randn(40, 8).requires_grad_(), randint(0, 3, (40,))
    assert scl_kernels.explain(x, y, backend="triton").plan["deterministic"] == \
        ("yes" if deterministic else "no")
    scl_kernels.supcon_loss(x, y, backend="triton").backward()
    assert seen == [deterministic]
    # The op follows its argument whatever torch's switch says now.
    seen.clear()
    reproducible_if(not deterministic)
    unit = torch.nn.functional.normalize(x.detach(), dim=1)
    ones = torch.ones(40)
    t = torch.tensor([0.1], dtype=torch.float64)  # a host value: 1/t = 10
    torch.ops.scl.supcon_triton_grad_tiles(unit, unit, ones, ones, t, False, 0, True, None,
                                           None, None, None, None, None, deterministic, ones,
                                           ones, ones)
    assert seen == [deterministic]


def test_triton_op_without_interpreter_is_a_clear_error(randn, randint, monkeypatch):
    import scl_kernels.backends.triton as triton_backend
    monkeypatch.setattr(triton_backend, "_interpret", False)
    with pytest.raises(ValueError, match="TRITON_INTERPRET"):
        scl_kernels.supcon_loss(randn(8, 4), randint(0, 2, (8,)), backend="triton")


@pytest.mark.parametrize("layout", ["single_all", "multiview_one", "simcse"])
def test_poisoned_scratch_is_fully_written(layout, randn, randint, gen, monkeypatch):
    from scl_kernels.backends.triton import launch
    monkeypatch.setattr(launch, "uninitialized",
                        lambda shape, device: torch.full(shape, float("nan"), device=device))
    kw = make_layout(layout, randn, randint, n=70, d=20)
    check_against_reference("triton", generator=gen, temperature=0.02, **kw)


@pytest.mark.slow
def test_tensors_past_int32_offsets_are_refused():
    huge = torch.zeros(1, 1).expand(2**16, 2**15)  # 2^31 elements, no memory behind them
    labels = torch.zeros(2**16, dtype=torch.long)
    refusal = ("rows of 2147483648 elements: the plan's line 'cannot_run: too many elements' "
               "refuses it")
    with pytest.raises(ValueError, match=refusal + ".*2\\^31 - 1.*Plan: temperature"):
        scl_kernels.supcon_loss(huge, labels, backend="triton")
    assert scl_kernels.explain(huge, labels, backend="triton").plan["cannot_run"] == \
        "too many elements"


def _row_widths_recorded(monkeypatch):
    """Records how each launch walks D (launch.row_width)."""
    from scl_kernels.backends.triton import launch
    seen = []
    width = launch.row_width

    def spy(d, element_size):
        seen.append(width(d, element_size))
        return seen[-1]
    monkeypatch.setattr(launch, "row_width", spy)
    # The launchers keep each row shape's constants: emptied, so that this test's come from spy.
    launch._row_constants.cache_clear()
    return seen


# D = 24: one resident K block and one output chunk (the column tile serves both products);
# 40: resident rows, two output chunks; 70: rows streamed in K steps. 21 and 37 are not 16-byte
# rows in fp32: through tensor descriptors they are first copied into padded rows.
FEEDING = [(24, True, 1), (40, True, 2), (70, False, 3), (21, True, 1), (37, True, 2)]


@pytest.mark.parametrize("d,resident,chunks", FEEDING)
@pytest.mark.parametrize("tma", [True, False], ids=["descriptors", "pointers"])
@pytest.mark.parametrize("layout,temperature", [("single_all", 0.1), ("single_all", 0.02),
                                                ("multiview_one", 0.1), ("cross_labels", 0.1)])
def test_every_way_of_feeding_the_tiles(d, resident, chunks, tma, layout, temperature, randn,
                                        randint, gen, monkeypatch):
    from scl_kernels.backends.triton import launch
    monkeypatch.setattr(launch, "use_tma", lambda device: tma)
    widths = _row_widths_recorded(monkeypatch)
    kw = make_layout(layout, randn, randint, n=67, d=d)
    check_against_reference("triton", generator=gen, temperature=temperature, **kw)
    assert {w.resident for w in widths} == {resident}
    assert {-(-d // w.block_do) for w in widths} == {chunks}


def test_rows_are_padded_for_descriptors_only_when_they_must_be():
    from scl_kernels.backends.triton import launch
    aligned = torch.randn(5, 8)
    assert launch.tma_rows(aligned) is aligned
    odd = torch.randn(5, 7)
    padded = launch.tma_rows(odd)
    assert torch.equal(padded, odd) and padded.stride(0) == 8
    shifted = torch.randn(41)[1:].view(5, 8)  # a base 4 bytes past an aligned one
    assert launch.tma_rows(shifted).data_ptr() % 16 == 0


@pytest.mark.parametrize("kernel", ["_lse_plain", "_lse_symmetric", "_grad_plain", "_grad_symmetric",
                                    "_grad_columns"])
def test_tile_pruning_reads_keyword_arguments(kernel, monkeypatch):
    """The launchers pass every kernel argument by keyword; Triton <= 3.6 hands the autotuner's
    pruning function only the positional ones as named_args (the rest as keywords), later releases
    all of them. Both must prune the GPU's tiles alike. The interpreter's single tile never
    prunes, so this calls the pruning function itself (on a GPU the mistake failed every call:
    bench/results/gpu_h100_2026-11-23/README.md)."""
    from scl_kernels.backends.triton import launch
    tuner = getattr(launch, kernel)
    monkeypatch.setattr(launch, "INTERPRET", False)
    gpu_configs = launch._configs(launch.KERNEL_USES[kernel.lstrip("_")])
    z = torch.empty(4, 128, dtype=torch.bfloat16)
    as_keywords = tuner.early_config_prune(gpu_configs, {}, D=128, z_ptr=z)
    as_named = tuner.early_config_prune(gpu_configs, {"D": 128, "z_ptr": z})
    assert as_keywords
    assert [c.kwargs for c in as_keywords] == [c.kwargs for c in as_named]


def test_autotuning_keys_by_size_octave():
    """The autotuner's key has an N bucket (the next power of two, at least 1,024): a ragged last
    batch reuses its neighbours' tile, and N = 16,384 and 65,536 can tune apart."""
    from scl_kernels.backends.triton import launch
    assert [launch.n_bucket(n) for n in (1, 1000, 1024, 1025, 16384, 16385, 65536)] == \
        [1024, 1024, 1024, 2048, 16384, 32768, 65536]
    for autotuned in (launch._lse_plain, launch._lse_symmetric, launch._grad_plain,
                      launch._grad_symmetric, launch._grad_columns):
        assert "n_bucket" in autotuned.keys


def test_float32_rounding_of_the_scale_matches_torch():
    from scl_kernels.backends.triton import launch
    for x in (0.1 * launch.LOG2E, 1 / 0.07 * launch.LOG2E, 1 / 3, 1e39, -1e39, 1e-46):
        assert launch._fp32(x) == float(torch.tensor(x, dtype=torch.float32))


def test_test_extra_allows_only_the_releases_the_cached_launches_were_read_for():
    """The test extra's triton range and handles.VERIFIED_RELEASES are one list: a release the
    extra lets pip install takes the cached launch, and the test below runs on it, not skips."""
    from scl_kernels.backends.triton import handles
    pyproject = (Path(__file__).resolve().parents[2] / "pyproject.toml").read_text()
    low, high = re.search(r'"triton>=(\d+\.\d+),<(\d+\.\d+);', pyproject).groups()
    (major, first), (_, end) = ([int(part) for part in bound.split(".")] for bound in (low, high))
    assert handles.VERIFIED_RELEASES == {(major, minor) for minor in range(first, end)}


def test_compiled_kernels_reuse_a_binary_only_for_the_same_specialisation(monkeypatch):
    """The GPU's launch through cached handles (handles.py), which the interpreter never takes:
    here with Triton's own binder for sm_90, a stand-in for the device and for the JIT's launch.
    A call reuses the kernel the JIT compiled only where the JIT would have chosen it too (an
    integer's divisibility by 16 or value 1, a pointer's alignment, a dtype, a constexpr each
    pick another), and starts it as the JIT does."""
    from scl_kernels.backends.triton import handles
    if handles.TRITON_RELEASE not in handles.VERIFIED_RELEASES:
        pytest.skip(f"the cached handles serve the triton releases read for them "
                    f"({handles.VERIFIED_RELEASES}); triton {handles.TRITON_RELEASE} takes the "
                    "JIT's own path")
    from triton import knobs
    from triton.backends.compiler import GPUTarget
    from triton.compiler import CompiledKernel
    from triton.compiler.compiler import make_backend
    from triton.runtime.jit import JITFunction, create_function_from_signature
    from scl_kernels.backends.triton import kernels

    jit = JITFunction(kernels.lse_merge_kernel.fn)
    backend = make_backend(GPUTarget("cuda", 90, 32))
    jit.device_caches[0] = ({}, {}, None, backend,
                            create_function_from_signature(jit.signature, jit.params, backend))
    active = type("Active", (), {"get_current_device": lambda self: 0,
                                 "get_current_stream": lambda self, device: 1234})()
    monkeypatch.setattr(handles, "driver", type("Driver", (), {"active": active})())
    compiled, launched = [], []

    def jit_run(*args, grid, warmup, **kwargs):
        kernel = object.__new__(CompiledKernel)
        kernel._run = lambda *launch: launched.append((len(compiled) - 1, launch))
        kernel.function, kernel.packed_metadata = "function", "metadata"
        kernel.module = None  # nothing loaded, so nothing for 3.9's destructor to unload
        compiled.append(kernel)
        return kernel
    monkeypatch.setattr(jit, "run", jit_run)
    assert not handles.CompiledKernels(kernels.lse_merge_kernel).usable  # interpreted
    kernel = handles.CompiledKernels(jit)
    assert kernel.usable
    parts, lse = torch.zeros(2, 64), torch.zeros(64, dtype=torch.float64)

    def call(part_max, m, fixed_shift=False):
        kernel.launch((3, 2), (part_max, parts, lse, m, 2, 0.5),
                      dict(log2e_hi=1.0, log2e_lo=0.0, FIXED_SHIFT=fixed_shift, BLOCK=256))
        return len(compiled) - 1, len(launched)

    assert call(parts, 64) == (0, 0)  # compiled and started by the JIT
    assert call(parts, 64) == (0, 1)
    assert launched[-1] == (0, (3, 2, 1, 1234, "function", "metadata", None, None, None, parts,
                                parts, lse, 64, 2, 0.5, 1.0, 0.0, False, 256))
    assert call(parts, 48) == (0, 2)  # 48 and 64: both i32 divisible by 16
    assert call(parts, 17) == (1, 2)
    assert call(parts, 1) == (2, 2)
    assert call(torch.zeros(129)[1:].view(2, 64), 64) == (3, 2)  # 4 bytes past an aligned base
    assert call(parts.double(), 64) == (4, 2)
    assert call(parts, 64, fixed_shift=True) == (5, 2)
    assert call(parts, 17) == (5, 3)
    monkeypatch.setattr(knobs.runtime.launch_enter_hook, "calls", [lambda metadata: None])
    assert call(parts, 64) == (6, 3)  # a profiler's hook: the JIT's path
