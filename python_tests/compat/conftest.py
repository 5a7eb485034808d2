"""Fixtures shared by the tests of the drop-ins (scl_kernels.compat) against their originals."""
import pytest
import torch

import scl_kernels
from scl_kernels.compat import _dense_fallback

# The originals compute in the inputs' dtype and the fused kernels in their own order: float64
# agrees to rounding, float32 to a few ulps of the loss's terms.
TOLERANCES = {torch.float64: dict(rtol=1e-12, atol=1e-12),
              torch.float32: dict(rtol=2e-5, atol=2e-6)}


@pytest.fixture
def assert_results_close():
    """check(got, expected, dtype, names): tensors of the drop-in against the original's, named
    in the message (a loss, then gradients), to the tolerance of the inputs' dtype."""
    def check(got, expected, dtype, names):
        assert len(got) == len(expected) <= len(names)
        for name, ours, theirs in zip(names, got, expected):
            torch.testing.assert_close(ours, theirs.to(ours.dtype), **TOLERANCES[dtype],
                                       msg=lambda message: f"{name}: {message}")
    return check


@pytest.fixture(params=["cpu", "reference"])
def scl_backend(request):
    """The supcon_loss backend of the drop-in's fused calls."""
    if request.param == "cpu":
        request.getfixturevalue("cpu_library")
    return request.param


@pytest.fixture
def fresh_warnings(monkeypatch):
    """The drop-ins' once-per-process warnings, as if none had been shown yet."""
    monkeypatch.setattr(_dense_fallback, "_warned", set())


@pytest.fixture
def fused_calls(request, monkeypatch):
    """The keyword arguments of each supcon_loss call made by the test module's COMPAT_MODULE."""
    calls = []

    def recording_supcon_loss(*args, **kwargs):
        calls.append(kwargs)
        return scl_kernels.supcon_loss(*args, **kwargs)

    monkeypatch.setattr(request.module.COMPAT_MODULE, "supcon_loss", recording_supcon_loss)
    return calls
