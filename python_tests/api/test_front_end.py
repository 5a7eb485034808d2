"""The user-facing layer: the single-view warning, SupConLoss's constructor checks and
docstrings, the demo's command line and memory guard, and meta tensors through supcon_loss."""
import os
import pydoc
import subprocess
import sys
import warnings

import pytest
import torch

import scl_kernels
from scl_kernels import SupConLoss, demo, supcon_loss
from scl_kernels import functional
from scl_kernels.backends import BACKENDS
from support import needs

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def _x(*shape):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(0))


X, Y = _x(6, 4), torch.arange(6) % 3


# ------------------------------------------------------------------------------------------
# 1. One view and no labels: no positive anywhere, a warning once per process
# ------------------------------------------------------------------------------------------

@pytest.fixture
def fresh_warning(monkeypatch):
    """As if no call had warned yet in this process; every warning recorded."""
    monkeypatch.setattr(functional, "_warned_single_view", False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        yield caught


def _single_view_warnings(caught):
    return [w for w in caught
            if issubclass(w.category, UserWarning) and "single view" in str(w.message)]


SINGLE_VIEW_CALLS = {
    "cat-2d": lambda b: supcon_loss(torch.cat([_x(4, 8), _x(4, 8)]), backend=b),
    "one-view-3d": lambda b: supcon_loss(_x(5, 1, 8), backend=b),
    "one-view-mode-one": lambda b: supcon_loss(_x(5, 1, 8), contrast_mode="one", backend=b),
    "module": lambda b: SupConLoss(backend=b)(_x(7, 8)),
    "sum": lambda b: supcon_loss(_x(7, 8), reduction="sum", backend=b),
}


@pytest.mark.parametrize("backend_name", [pytest.param("cpu", marks=needs.library), "reference"])
@pytest.mark.parametrize("call", SINGLE_VIEW_CALLS, ids=list(SINGLE_VIEW_CALLS))
def test_single_view_without_labels_warns(fresh_warning, call, backend_name):
    loss = SINGLE_VIEW_CALLS[call](backend_name)
    assert float(loss) == 0.0
    (warning,) = _single_view_warnings(fresh_warning)
    message = str(warning.message)
    assert "torch.stack([z1, z2], dim=1)" in message
    assert "[B, V, D]" in message and "labels" in message


def test_single_view_warning_is_shown_once_per_process(fresh_warning):
    z1, z2 = _x(4, 8), _x(4, 8)
    for _ in range(3):
        supcon_loss(torch.cat([z1, z2]))
    supcon_loss(_x(4, 1, 8), backend="reference")
    SupConLoss()(_x(4, 8))
    assert len(_single_view_warnings(fresh_warning)) == 1
    # even with a filter that shows every occurrence, and after the filters change
    warnings.resetwarnings()
    warnings.simplefilter("always")
    supcon_loss(torch.cat([z1, z2]))
    assert len(_single_view_warnings(fresh_warning)) == 1


def test_single_view_warning_points_at_the_caller(fresh_warning):
    supcon_loss(_x(4, 8))
    (warning,) = _single_view_warnings(fresh_warning)
    assert warning.filename == __file__


NO_WARNING_CALLS = {
    "two-views": lambda: supcon_loss(_x(4, 2, 8)),
    "three-views-mode-one": lambda: supcon_loss(_x(4, 3, 8), contrast_mode="one"),
    "labels-2d": lambda: supcon_loss(X, Y),
    "labels-one-view": lambda: supcon_loss(_x(6, 1, 4), Y),
    "labels-all-distinct": lambda: supcon_loss(X, torch.arange(6)),
    "clip": lambda: supcon_loss(_x(4, 8), contrast=_x(4, 8)),
    "clip-one-view-3d": lambda: supcon_loss(_x(4, 1, 8), contrast=_x(6, 8)),
    "cross-labels": lambda: supcon_loss(X, Y, contrast=_x(5, 4),
                                        contrast_labels=torch.arange(5) % 3),
    "module-views": lambda: SupConLoss()(_x(4, 2, 8)),
}


@pytest.mark.parametrize("call", NO_WARNING_CALLS, ids=list(NO_WARNING_CALLS))
def test_no_warning_when_positives_are_possible(fresh_warning, call):
    NO_WARNING_CALLS[call]()
    assert _single_view_warnings(fresh_warning) == []
    assert functional._warned_single_view is False


def test_bad_input_raises_before_warning(fresh_warning):
    with pytest.raises(ValueError, match="reduction"):
        supcon_loss(X, reduction="avg")
    assert _single_view_warnings(fresh_warning) == []


@needs.library
def test_single_view_warning_under_compile_fullgraph(fresh_warning):
    """warnings.warn cannot be traced by Dynamo: the warning must neither break a fullgraph
    compile nor be lost, and it is still shown once."""
    torch._dynamo.reset()

    def step(z):
        return supcon_loss(z, temperature=0.2, backend="cpu")

    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")
    for _ in range(2):
        assert float(compiled(_x(6, 4))) == 0.0
    assert len(_single_view_warnings(fresh_warning)) == 1
    views = _x(6, 2, 4)
    torch.testing.assert_close(compiled(views), step(views))
    assert len(_single_view_warnings(fresh_warning)) == 1


@needs.library
def test_a_float_temperature_passed_to_a_compiled_function_traces_in_one_graph():
    """A float temperature that is an input of the compiled function (a SymFloat to Dynamo, not a
    constant) is checked by comparisons Dynamo traces, so fullgraph holds: CUDA graphs'
    reduce-overhead mode needs one graph (docs/BACKENDS.md, "CUDA graphs"). A bad value still
    raises the ValueError where the graph may break."""
    torch._dynamo.reset()
    labels = torch.arange(8) % 3
    z = _x(8, 4)

    def step(features, temperature):
        return supcon_loss(features, labels, temperature, backend="cpu")

    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")
    for temperature in (0.1, 0.2, 0.3):
        torch.testing.assert_close(compiled(z, temperature), step(z, temperature))
    breaking = torch.compile(step, backend="aot_eager")
    for bad in (float("nan"), float("inf"), -1.0, 0.0):
        with pytest.raises(ValueError, match="temperature must be positive and finite"):
            breaking(z, bad)


# ------------------------------------------------------------------------------------------
# 2. SupConLoss checks its options when built, with supcon_loss's errors
# ------------------------------------------------------------------------------------------

POSITIVE = r"temperature must be positive"

# (id, constructor kwargs, exception type, a regex of the message)
BAD_OPTIONS = [
    ("reduction-avg", dict(reduction="avg"), ValueError, r"reduction must be one of"),
    ("reduction-none-object", dict(reduction=None), ValueError, r"reduction must be one of"),
    ("contrast-mode-two", dict(contrast_mode="two"), ValueError, r"contrast_mode must be one of"),
    ("contrast-mode-none", dict(contrast_mode=None), ValueError, r"contrast_mode must be one of"),
    ("normalize-int", dict(normalize=1), TypeError, r"normalize must be a bool"),
    ("normalize-str", dict(normalize="yes"), TypeError, r"normalize must be a bool"),
    ("backend-gpu", dict(backend="gpu"), ValueError, r"backend must be one of"),
    ("backend-upper", dict(backend="CPU"), ValueError, r"backend must be one of"),
    ("backend-none", dict(backend=None), ValueError, r"backend must be one of"),
    ("temperature-zero", dict(temperature=0.0), ValueError, POSITIVE),
    ("temperature-negative", dict(temperature=-0.1), ValueError, POSITIVE),
    ("temperature-nan", dict(temperature=float("nan")), ValueError, POSITIVE),
    ("temperature-inf", dict(temperature=float("inf")), ValueError, POSITIVE),
    ("temperature-str", dict(temperature="0.1"), TypeError, r"temperature must be a float"),
    ("temperature-none", dict(temperature=None), TypeError, r"temperature must be a float"),
    ("temperature-bool", dict(temperature=True), TypeError, r"temperature must be a float"),
    ("temperature-int-tensor", dict(temperature=torch.tensor(1)), TypeError,
     r"temperature must be a floating-point tensor"),
    ("temperature-1d-tensor", dict(temperature=torch.tensor([0.1])), ValueError,
     r"temperature must be a 0-dim tensor"),
    ("temperature-1d-parameter", dict(temperature=torch.nn.Parameter(torch.tensor([0.1, 0.2]))),
     ValueError, r"temperature must be a 0-dim tensor"),
]


@pytest.mark.parametrize("case", BAD_OPTIONS, ids=[c[0] for c in BAD_OPTIONS])
def test_constructor_rejects_with_supcon_loss_message(case):
    _, kwargs, error, pattern = case
    with pytest.raises(error, match=pattern) as built:
        SupConLoss(**kwargs)
    with pytest.raises(error) as called:
        supcon_loss(X, Y, **{"temperature": 0.1, **kwargs})
    assert str(built.value) == str(called.value)


@pytest.mark.parametrize("value", [0.0, -1.0, float("nan"), float("inf")])
@pytest.mark.parametrize("as_parameter", [False, True])
def test_constructor_checks_a_tensor_temperature_value(value, as_parameter):
    temperature = torch.tensor(value)
    if as_parameter:
        temperature = torch.nn.Parameter(temperature)
    with pytest.raises(ValueError, match="temperature must be positive and finite"):
        SupConLoss(temperature)


@pytest.mark.parametrize("backend_name", BACKENDS)
def test_constructor_accepts_every_backend_name(backend_name):
    assert SupConLoss(backend=backend_name).backend == backend_name


def test_constructor_accepts_valid_temperatures():
    assert SupConLoss(1).temperature == 1
    parameter = torch.nn.Parameter(torch.tensor(0.07))
    criterion = SupConLoss(parameter, reduction="sum")
    assert list(criterion.parameters()) == [parameter]
    assert "Parameter(0.07)" in repr(criterion)
    SupConLoss(torch.tensor(0.1, dtype=torch.float64))
    SupConLoss(torch.tensor(0.1, device="meta"))  # no value to check, and no .item() error
    loss = criterion(_x(6, 2, 4), Y)
    loss.backward()
    assert parameter.grad is not None


def test_docstrings_cover_every_argument():
    init_doc, forward_doc = SupConLoss.__init__.__doc__, SupConLoss.forward.__doc__
    assert init_doc and forward_doc
    for name in ("temperature", "contrast_mode", "normalize", "reduction", "backend"):
        assert f"{name}:" in init_doc, name
    for name in ("features", "labels", "contrast", "contrast_labels"):
        assert f"{name}:" in forward_doc, name
    assert "Returns:" in forward_doc and "[B, V, D]" in forward_doc
    assert "Raises:" in init_doc
    text = pydoc.render_doc(SupConLoss, renderer=pydoc.plaintext)
    assert "contrast_mode:" in text and "contrast_labels:" in text
    assert "Initialize internal Module state" not in text


# ------------------------------------------------------------------------------------------
# 3. The demo: --help, the dense half's memory estimate, and when it is skipped
# ------------------------------------------------------------------------------------------

def test_demo_help_shows_defaults_and_memory_note():
    result = subprocess.run([sys.executable, "-m", "scl_kernels.demo", "--help"], cwd=REPO,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    text = " ".join(result.stdout.split())  # argparse wraps lines to the terminal width
    for default in ("(default: 16384)", "(default: 128)", "(default: 100)", "(default: 0.1)"):
        assert default in text, default
    for option in ("--n", "--dim", "--classes", "--temperature", "--device", "--skip-dense",
                   "--force-dense"):
        assert option in text
    assert "N = 16,384" in text and "GB" in text and "skipped" in text


def test_dense_peak_estimate():
    # measured: 5,398-5,402 MiB at N = 16,384, D = 128; 1,345-1,388 MiB at N = 8,192
    assert 5_400 * 2**20 <= demo.dense_peak_bytes(16384, 128) <= 1.1 * 5_402 * 2**20
    assert 1_388 * 2**20 <= demo.dense_peak_bytes(8192, 512) <= 1.15 * 1_388 * 2**20
    assert demo.dense_peak_bytes(8192, 128) < demo.dense_peak_bytes(8192, 512)
    assert demo.dense_peak_bytes(4096, 128) < demo.dense_peak_bytes(8192, 128)
    # quadratic in N: doubling N about quadruples the estimate at large N
    ratio = demo.dense_peak_bytes(65536, 128) / demo.dense_peak_bytes(32768, 128)
    assert 3.9 < ratio < 4.0


@pytest.mark.parametrize("available", [10**6, 3 * 10**9, 6 * 10**9, 7 * 10**9, 10**12])
def test_dense_skip_decision(available):
    needed = demo.dense_peak_bytes(16384, 128)
    reason = demo.dense_skip_reason(16384, 128, available, "fake")
    if needed <= demo.MEMORY_HEADROOM * available:
        assert reason is None
        return
    assert reason.startswith("skipping dense PyTorch") and "--force-dense" in reason
    assert "16,384" in reason and "(fake)" in reason
    fits = demo.largest_dense_batch(128, available)
    if fits >= 2:
        assert f"--n {fits} would fit" in reason
        assert demo.dense_peak_bytes(fits, 128) <= demo.MEMORY_HEADROOM * available
        assert demo.dense_peak_bytes(fits + 1, 128) > demo.MEMORY_HEADROOM * available


def test_dense_runs_when_memory_is_unknown():
    assert demo.dense_skip_reason(16384, 128, None) is None


def _run_demo(monkeypatch, capsys, available, *args):
    monkeypatch.setattr(demo, "available_memory_bytes", lambda device: (available, "fake"))
    demo.main(["--n", "300", "--dim", "8", "--classes", "5", *args])
    return capsys.readouterr().out


@needs.library  # the demo compares a fused backend with dense PyTorch
def test_demo_skips_dense_when_memory_is_short(monkeypatch, capsys):
    out = _run_demo(monkeypatch, capsys, 10**6)
    assert "skipping dense PyTorch" in out and "(fake)" in out
    assert "| fused (" in out and "| dense PyTorch |" not in out


@needs.library
def test_demo_runs_dense_when_memory_suffices(monkeypatch, capsys):
    out = _run_demo(monkeypatch, capsys, 10**12)
    assert "skipping" not in out
    assert "running dense PyTorch ... done" in out and "| dense PyTorch |" in out
    assert "faster" in out


@needs.library
def test_demo_force_dense_and_skip_dense(monkeypatch, capsys):
    out = _run_demo(monkeypatch, capsys, 10**6, "--force-dense")
    assert "skipping" not in out and "| dense PyTorch |" in out
    out = _run_demo(monkeypatch, capsys, 10**12, "--skip-dense")
    assert "| dense PyTorch |" not in out


def test_available_memory_fallbacks(monkeypatch):
    monkeypatch.setattr(demo, "cgroup_available_bytes", lambda: None)
    monkeypatch.setitem(sys.modules, "psutil", None)  # import psutil raises ImportError
    available, source = demo.available_memory_bytes("cpu")
    if os.path.exists("/proc/meminfo"):
        assert source == "/proc/meminfo" and available > 0

    def no_meminfo():
        raise OSError("no /proc")

    monkeypatch.setattr(demo, "_meminfo_available", no_meminfo)
    available, source = demo.available_memory_bytes("cpu")
    if hasattr(os, "sysconf") and "SC_AVPHYS_PAGES" in os.sysconf_names:
        assert source == "os.sysconf" and available > 0
    monkeypatch.setattr(demo, "cgroup_available_bytes", lambda: 12345)
    available, source = demo.available_memory_bytes("cpu")
    assert (available, source) == (12345, "the memory cgroup's limit")


def test_cgroup_limits(tmp_path):
    assert demo.cgroup_available_bytes(str(tmp_path)) is None  # no cgroup files
    (tmp_path / "memory.max").write_text("1000000\n")
    (tmp_path / "memory.current").write_text("600000\n")
    (tmp_path / "memory.stat").write_text("anon 400000\ninactive_file 100000\n")
    assert demo.cgroup_available_bytes(str(tmp_path)) == 500000
    (tmp_path / "memory.max").write_text("max\n")
    assert demo.cgroup_available_bytes(str(tmp_path)) is None
    v1 = tmp_path / "v1"
    (v1 / "memory").mkdir(parents=True)
    (v1 / "memory" / "memory.limit_in_bytes").write_text(str(2**63 - 4096))
    (v1 / "memory" / "memory.usage_in_bytes").write_text("5000")
    (v1 / "memory" / "memory.stat").write_text("total_inactive_file 0\n")
    assert demo.cgroup_available_bytes(str(v1)) is None
    (v1 / "memory" / "memory.limit_in_bytes").write_text("8000")
    assert demo.cgroup_available_bytes(str(v1)) == 3000


# ------------------------------------------------------------------------------------------
# 4. Meta tensors: shapes out, or a clear ValueError, never the .item() error
# ------------------------------------------------------------------------------------------

def _meta(t):
    return t.to("meta")


# (id, kwargs for supcon_loss, expected shape with reduction="none")
META_CALLS = [
    ("supervised", dict(features=_meta(X), labels=_meta(Y)), (6,)),
    ("views", dict(features=_meta(_x(3, 2, 4)), labels=_meta(torch.arange(3))), (6,)),
    ("views-mode-one", dict(features=_meta(_x(3, 2, 4)), labels=_meta(torch.arange(3)),
                            contrast_mode="one"), (3,)),
    ("simclr", dict(features=_meta(_x(3, 2, 4))), (6,)),
    ("clip", dict(features=_meta(X), contrast=_meta(_x(8, 4))), (6,)),
    ("cross", dict(features=_meta(X), labels=_meta(Y), contrast=_meta(_x(5, 4)),
                   contrast_labels=_meta(torch.arange(5))), (6,)),
    ("tensor-temperature", dict(features=_meta(X), labels=_meta(Y),
                                temperature=torch.tensor(0.2)), (6,)),
    ("meta-temperature", dict(features=_meta(X), labels=_meta(Y),
                              temperature=torch.tensor(0.2, device="meta")), (6,)),
    ("no-normalize", dict(features=_meta(X), labels=_meta(Y), normalize=False), (6,)),
]


@pytest.mark.parametrize("backend_name", ["reference", "auto"])
@pytest.mark.parametrize("reduction", ["mean", "none"])
@pytest.mark.parametrize("case", META_CALLS, ids=[c[0] for c in META_CALLS])
def test_meta_features(case, reduction, backend_name):
    """Shapes only: "auto" goes through the fused op's fake kernel, "reference" runs dense."""
    _, kwargs, shape = case
    kwargs = dict(kwargs)
    out = supcon_loss(kwargs.pop("features"), backend=backend_name, reduction=reduction, **kwargs)
    assert out.device.type == "meta"
    assert out.dtype == torch.float32
    assert tuple(out.shape) == (shape if reduction == "none" else ())


def test_meta_module():
    criterion = SupConLoss(torch.tensor(0.1, device="meta"), backend="reference")
    out = criterion(_meta(_x(3, 2, 4)), _meta(torch.arange(3)))
    assert out.device.type == "meta" and out.shape == ()


def test_meta_float64_gives_float64():
    out = supcon_loss(_meta(X.double()), _meta(Y), backend="reference", reduction="none")
    assert out.dtype == torch.float64 and out.shape == (6,)


def test_meta_fused_backends_say_what_is_wrong():
    """The fused route for meta tensors is the op's fake kernel (backends.py); until then, or for
    a backend that cannot take the device, a ValueError that names it."""
    for backend in ("cpu", "triton"):
        try:
            out = supcon_loss(_meta(X), _meta(Y), backend=backend)
        except ValueError as error:
            assert "meta" in str(error) and "item()" not in str(error)
        else:
            assert out.device.type == "meta" and out.shape == ()


def test_package_exports():
    assert scl_kernels.SupConLoss is SupConLoss and scl_kernels.supcon_loss is supcon_loss
