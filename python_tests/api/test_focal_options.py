"""focal_gamma in the front end: the module keeps and shows it, backend="auto" never picks a
backend that cannot run the focal loss and an explicit one that cannot says so, and the
distributed ring strategy refuses it. Its values against the float64 reference are the
conformance suite's (test_conformance*.py, FOCAL_GAMMAS)."""
import dataclasses

import pytest
import torch

import scl_kernels
from scl_kernels import backends


def _x(*shape):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(0))


X, Y = _x(12, 4), torch.arange(12) % 3


def test_module_passes_focal_gamma():
    module = scl_kernels.SupConLoss(temperature=0.2, focal_gamma=2, backend="reference")
    assert module.focal_gamma == 2.0 and isinstance(module.focal_gamma, float)
    assert "focal_gamma=2" in repr(module)
    assert "focal_gamma" not in repr(scl_kernels.SupConLoss())
    torch.testing.assert_close(
        module(X, Y), scl_kernels.supcon_loss(X, Y, 0.2, focal_gamma=2.0, backend="reference"))


def test_focal_loss_is_below_supcon():
    """(1 - pi)^gamma <= 1 weighs every positive term down, more as gamma grows."""
    losses = [float(scl_kernels.supcon_loss(X, Y, focal_gamma=g, backend="reference"))
              for g in (0.0, 0.5, 2.0)]
    assert losses[0] > losses[1] > losses[2] > 0


@pytest.mark.parametrize("value, error", [(-1.0, ValueError), (float("nan"), ValueError),
                                          (float("inf"), ValueError), ("2", TypeError),
                                          (None, TypeError)])
def test_module_checks_focal_gamma(value, error):
    with pytest.raises(error, match="focal_gamma"):
        scl_kernels.SupConLoss(focal_gamma=value)


@pytest.fixture
def cpu_without_focal(monkeypatch):
    """The registry with a cpu backend whose kernels have no focal walk (as "cuda")."""
    if "cpu" not in scl_kernels.available_backends("cpu"):
        pytest.skip("the cpu backend is not available")
    registry = dict(backends.REGISTRY)
    registry["cpu"] = dataclasses.replace(registry["cpu"], focal=False)
    monkeypatch.setattr(backends, "REGISTRY", registry)


def test_auto_skips_backends_without_focal(cpu_without_focal):
    assert backends.auto_backend("cpu") == "cpu"
    chosen = backends.auto_backend("cpu", focal_gamma=2.0)
    assert chosen != "cpu" and backends.REGISTRY[chosen].focal


def test_explicit_backend_without_focal_says_so(cpu_without_focal):
    with pytest.raises(ValueError, match=r"backend='cpu' on cpu with focal_gamma=2.0: the plan's "
                                         r"line 'cannot_run: no focal walk' refuses it; it does not "
                                         r"implement .*'reference'"):
        scl_kernels.supcon_loss(X, Y, focal_gamma=2.0, backend="cpu")
    scl_kernels.supcon_loss(X, Y, focal_gamma=0.0, backend="cpu")  # SupCon still runs


def test_cuda_backend_has_no_focal_loss():
    assert not backends.get_backend("cuda").focal
    with pytest.raises(ValueError, match="focal"):
        backends.resolve_backend("cuda", torch.device("cuda"), 2.0)
    assert set(backends.focal_backends()) == {"cpu", "triton", "reference"}


def test_distributed_ring_refuses_focal():
    from scl_kernels.distributed import SupConLoss as DistributedSupConLoss
    with pytest.raises(ValueError, match="focal_gamma.*gather"):
        DistributedSupConLoss(strategy="ring", focal_gamma=1.0)
    assert DistributedSupConLoss(strategy="gather", focal_gamma=1.0).focal_gamma == 1.0
