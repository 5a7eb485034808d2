"""The CUDA C++ backend (csrc/cuda, docs/CUDA_KERNELS.md).

Without a GPU: its registry entry, that backend="auto" chooses it only by the size rule measured
on an H100 (backends/auto_rule.py), its errors, and that the README says how far it is verified.
With a CUDA GPU and the CUDA kernels built (skipped otherwise): every layout and dtype at awkward
sizes against the float64 reference and against the Triton backend on the same inputs, the
wgmma path's shapes, determinism, memory, streams. The conformance suite runs it too
(support/backend_matrix.py lists every available backend)."""
import os

import pytest
import torch

import scl_kernels
from scl_kernels import backends
from scl_kernels._testing import test_hooks
from scl_kernels.backends import auto_rule
from support import needs
from support.layouts import LAYOUTS, make_layout
from support.reference64 import check_against_reference

README = os.path.join(os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..")), "README.md")


# ---- without a GPU ------------------------------------------------------------------------

@pytest.mark.quick
def test_registry_entry():
    cuda = backends.get_backend("cuda")
    assert cuda.device_types == ("cuda",) and cuda.op_name == "supcon"
    assert cuda.computes_in(torch.float64) == torch.float32
    assert not cuda.auto_eligible


@needs.library  # auto's choice among the backends that the library serves
def test_auto_takes_cuda_only_by_its_size_rule(monkeypatch):
    """Where the CUDA kernels could run, auto takes them for the call shapes measured faster on
    an H100 (backends/auto_rule.py), else Triton, else the dense reference."""
    cuda = backends.get_backend("cuda")
    monkeypatch.setattr(backends, "cuda_kernels_built", lambda: True)
    monkeypatch.setattr(auto_rule, "_is_hopper", lambda device: True)
    assert cuda.available("cuda")
    device = torch.device("cuda")
    monkeypatch.setattr(backends, "triton_installed", lambda: True)

    def auto(rows, dim, dtype=torch.bfloat16, one_set=True, focal_gamma=0.0):
        shape = backends.CallShape(rows, dim, dtype, one_set)
        chosen = backends._auto(device, focal_gamma, shape).name
        assert chosen == backends.auto_backend(device, focal_gamma, shape)
        return chosen

    assert auto(16384, 128) == auto(32768, 64) == auto(4096, 256, torch.float16) == "cuda"
    assert auto(65536, 256) == auto(1, 200) == "cuda"
    assert auto(32769, 128) == auto(65536, 64) == "triton"  # Triton's full-row backward wins
    assert auto(16384, 257) == auto(16384, 128, torch.float32) == "triton"  # not measured
    assert auto(16384, 128, one_set=False) == "triton"
    assert auto(16384, 128, focal_gamma=2.0) == "triton"  # no focal loss in the CUDA kernels
    monkeypatch.setattr(auto_rule, "_is_hopper", lambda device: False)
    assert auto(16384, 128) == "triton"
    # Without a shape (what labels a device's default), Triton.
    assert backends._auto(device).name == backends.auto_backend(device) == "triton"
    monkeypatch.setattr(backends, "triton_installed", lambda: False)
    with pytest.warns(UserWarning):
        monkeypatch.setattr(backends, "_warned_dense_devices", set())
        assert backends._auto(device).name == "reference"
    # What the demo and the benchmarks label as auto's choice, though cuda is the first that runs.
    assert backends.available_backends("cuda")[0] == "cuda"
    assert backends.auto_backend("cuda") == "reference"


def test_supcon_loss_gives_auto_the_call_shape(monkeypatch):
    """supcon_loss hands the rule N (the contrast set's rows), D, the dtype and whether every row
    is an anchor against its own set of unit rows."""
    seen = []
    real = scl_kernels.functional.resolve_backend

    def spy(name, device, focal_gamma=0.0, shape=None, **kwargs):
        seen.append(shape)
        return real(name, device, focal_gamma, shape, **kwargs)

    monkeypatch.setattr(scl_kernels.functional, "resolve_backend", spy)
    x, labels = torch.randn(6, 2, 5, dtype=torch.float64), torch.tensor([0, 0, 1, 1, 2, 2])
    scl_kernels.supcon_loss(x, labels, backend="reference")
    scl_kernels.supcon_loss(x, labels, contrast_mode="one", backend="reference")
    scl_kernels.supcon_loss(x[:, 0], labels, contrast=torch.randn(9, 5, dtype=torch.float64),
                            contrast_labels=torch.zeros(9, dtype=torch.long), backend="reference")
    scl_kernels.supcon_loss(x, labels, normalize=False, backend="reference")
    assert seen == [backends.CallShape(12, 5, torch.float64, True),
                    backends.CallShape(12, 5, torch.float64, False),
                    backends.CallShape(9, 5, torch.float64, False),
                    backends.CallShape(12, 5, torch.float64, False)]


def test_cpu_tensors_are_refused():
    with pytest.raises(ValueError, match="runs on cuda tensors"):
        scl_kernels.supcon_loss(torch.randn(4, 3), torch.tensor([0, 0, 1, 1]), backend="cuda")


@needs.library
def test_library_without_cuda_kernels_says_how_to_build(monkeypatch):
    monkeypatch.setattr(backends, "cuda_kernels_built", lambda: False)
    with pytest.raises(ValueError, match="SCL_BUILD_CUDA=1.*nvidia-cutlass|nvidia-cutlass.*SCL_BUILD_CUDA=1"):
        backends.resolve_backend("cuda", torch.device("cuda"))


def test_readme_says_how_far_it_is_verified_on_hardware():
    readme = open(README, encoding="utf-8").read()
    assert "partly verified on hardware](docs/STATUS.md" in readme
    status = open(os.path.join(os.path.dirname(README), "docs", "STATUS.md"), encoding="utf-8").read()
    assert 'backend="cuda"' in status and "bench/results/gpu_h100_2026-11-23" in status


# ---- on a GPU -------------------------------------------------------------------------------

gpu = pytest.mark.skipif(
    not (torch.cuda.is_available() and backends.cuda_kernels_built()),
    reason="needs a CUDA GPU and the library built with the CUDA kernels (SCL_BUILD_CUDA=1)")


def _loss_and_grads(backend, features, labels, **kw):
    x = features.detach().clone().requires_grad_(True)
    loss = scl_kernels.supcon_loss(x, labels, 0.1, backend=backend, **kw)
    loss.backward()
    return loss.detach(), x.grad


@gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("d", [100, 200])  # 16-bit on sm_90a: the 128- and 256-wide kernels
def test_layouts_against_reference(layout, dtype, d, cuda_randn, cuda_randint, gen):
    kw = make_layout(layout, cuda_randn, cuda_randint, dtype=dtype, n=300, d=d)
    check_against_reference("cuda", generator=gen, compute_dtype=torch.float32, **kw)


@gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("n,d", [(1, 1), (2, 3), (63, 100), (129, 128), (130, 129), (300, 256),
                                 (1000, 257), (300, 2048)])
def test_awkward_sizes_against_reference(n, d, dtype, cuda_randn, cuda_randint, gen):
    check_against_reference("cuda", cuda_randn(n, d, dtype=dtype), cuda_randint(0, 5, (n,)), 0.1,
                            generator=gen, compute_dtype=torch.float32)


@gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("n,d", [(63, 3), (129, 128), (1000, 100), (500, 200), (1000, 257)])
def test_agrees_with_triton(n, d, dtype, cuda_randn, cuda_randint):
    x, labels = cuda_randn(n, d, dtype=dtype), cuda_randint(0, 7, (n,))
    got_loss, got_grad = _loss_and_grads("cuda", x, labels)
    want_loss, want_grad = _loss_and_grads("triton", x, labels)
    tol = 1e-4 if dtype == torch.float32 else 2e-2
    assert abs(got_loss.item() - want_loss.item()) <= tol * abs(want_loss.item())
    err = (got_grad.float() - want_grad.float()).abs().max() / want_grad.float().abs().max()
    assert err.item() <= 10 * tol


@gpu
@pytest.mark.parametrize("dynamic", [False, True])
def test_auto_runs_the_backend_its_rule_names(dynamic, cuda_randn, cuda_randint):
    """Eager and under torch.compile(fullgraph=True), auto runs the backend that the size rule
    names on this GPU (CUDA C++ on sm_90 for this shape), with that backend's values."""
    x, labels = cuda_randn(300, 128, dtype=torch.bfloat16), cuda_randint(0, 5, (300,))
    chosen = backends.auto_backend("cuda", 0.0, backends.CallShape(300, 128, torch.bfloat16, True))
    assert chosen == ("cuda" if torch.cuda.get_device_capability() == (9, 0) else "triton")
    traced = []

    def recording(graph_module, example_inputs):
        traced.extend(str(node.target) for node in graph_module.graph.nodes
                      if node.op == "call_function")
        return graph_module.forward

    torch._dynamo.reset()
    compiled = torch.compile(lambda f, y: scl_kernels.supcon_loss(f, y, 0.1), fullgraph=True,
                             backend=recording, dynamic=dynamic)
    by_name = scl_kernels.supcon_loss(x, labels, 0.1, backend=chosen)
    torch.testing.assert_close(compiled(x, labels), by_name, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(scl_kernels.supcon_loss(x, labels, 0.1), by_name, rtol=1e-5,
                               atol=1e-6)
    assert ("scl.supcon" if chosen == "cuda" else "scl.supcon_triton") in traced


@gpu
@pytest.mark.parametrize("anchor_offset,num_anchors", [(0, 100), (37, 64), (200, 100)])
def test_anchor_offset_against_triton(anchor_offset, num_anchors, cuda_randn, cuda_randint):
    """The op's anchors [offset, offset + M) of the single set (distributed training's call), and
    its backward: the plain schedule, whose columns walk masks each anchor's own row at an offset."""
    x, labels = cuda_randn(300, 128, dtype=torch.bfloat16), cuda_randint(0, 5, (300,))
    t = torch.tensor(0.1)
    upstream = torch.ones(num_anchors, device=x.device)
    outs = {}
    for name in ("supcon", "supcon_triton"):
        if name == "supcon_triton":
            backends.load_triton_backend()
        loss, lse, _ = getattr(torch.ops.scl, name)(x, labels, None, None, t, num_anchors, True,
                                                     anchor_offset)
        grad, _, _ = getattr(torch.ops.scl, name + "_backward")(
            upstream, x, labels, None, None, t, num_anchors, True, lse, anchor_offset)
        outs[name] = (loss, lse, grad.float())
    torch.testing.assert_close(outs["supcon"][1], outs["supcon_triton"][1], rtol=0, atol=2e-3)
    torch.testing.assert_close(outs["supcon"][0], outs["supcon_triton"][0], rtol=2e-2, atol=2e-3)
    got, want = outs["supcon"][2], outs["supcon_triton"][2]
    assert ((got - want).abs().max() / want.abs().max()).item() <= 5e-2


@gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_deterministic_mode_is_bitwise_reproducible(dtype, cuda_randn, cuda_randint, reproducible):
    x, labels = cuda_randn(1000, 128, dtype=dtype), cuda_randint(0, 9, (1000,))
    first = _loss_and_grads("cuda", x, labels)
    second = _loss_and_grads("cuda", x, labels)
    assert torch.equal(first[0], second[0]) and torch.equal(first[1], second[1])


@gpu
@needs.hooks
@pytest.mark.parametrize("walk", ["triangle", "triangle-async"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("n", [1, 127, 129, 300, 385, 640, 1000, 2100])
@pytest.mark.parametrize("d,classes", [(5, 3), (64, 1), (100, 7), (128, None)])
def test_symmetric_backward_triangle_against_full_rows(n, d, classes, dtype, walk, cuda_randn,
                                                       cuda_randint, gen):
    """The single set's backward over the upper triangle by cluster pairs (sm_90a, D <= 128; on
    other GPUs the same walk as full rows), with either exchange between the partners (the
    default, or by st.async: the walk triangle-async): against the float64 reference and
    against the full-row walk (rows) on the same inputs, each chosen through the test hook
    symmetric_backward_walk (SCL_CUDA_SYMMETRIC_BACKWARD is read once per process). Row-block
    counts 1 to 17, odd ones with a padding partner, D odd (scalar atomics), one class, and
    classes=None: every label distinct, no positives."""
    x = cuda_randn(n, d, dtype=dtype)
    labels = cuda_randint(0, classes, (n,)) if classes else torch.randperm(n, device=x.device)
    with test_hooks(symmetric_backward_walk=walk):
        check_against_reference("cuda", x, labels, 0.1, generator=gen, compute_dtype=torch.float32)
        triangle = _loss_and_grads("cuda", x, labels)
    with test_hooks(symmetric_backward_walk="rows"):
        rows = _loss_and_grads("cuda", x, labels)
    # The same forward, up to the order of its atomic adds (the symmetric forward is not
    # bitwise reproducible outside deterministic mode).
    torch.testing.assert_close(triangle[0], rows[0], rtol=1e-5, atol=0)
    scale = rows[1].float().abs().max().clamp_min(1e-30)
    assert ((triangle[1].float() - rows[1].float()).abs().max() / scale).item() <= 5e-2


@gpu
def test_memory_stays_linear_in_n(cuda_randn, cuda_randint):
    n = 32768
    x, labels = cuda_randn(n, 128, dtype=torch.bfloat16), cuda_randint(0, 100, (n,))
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    _loss_and_grads("cuda", x, labels)
    torch.cuda.synchronize()
    assert torch.cuda.max_memory_allocated() - base < n * n * 4 // 16


@gpu
def test_side_stream_gives_the_same_result(cuda_randn, cuda_randint, reproducible):
    x, labels = cuda_randn(700, 128, dtype=torch.bfloat16), cuda_randint(0, 9, (700,))
    want = _loss_and_grads("cuda", x, labels)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        got = _loss_and_grads("cuda", x, labels)
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    assert torch.equal(want[0], got[0]) and torch.equal(want[1], got[1])


@gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs a second GPU")
def test_second_device(cuda_randn, cuda_randint):
    x, labels = cuda_randn(300, 64).to("cuda:1"), cuda_randint(0, 5, (300,)).to("cuda:1")
    loss, grad = _loss_and_grads("cuda", x, labels)
    ref_loss, ref_grad = _loss_and_grads("cuda", x.to("cuda:0"), labels.to("cuda:0"))
    assert loss.device.index == 1 and grad.device.index == 1
    torch.testing.assert_close(loss.cpu(), ref_loss.cpu())
    torch.testing.assert_close(grad.cpu(), ref_grad.cpu())
