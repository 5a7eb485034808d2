"""scl_kernels: a fused, memory-frugal supervised contrastive (SupCon) loss for PyTorch."""
from . import _op  # noqa: F401  (registers fake kernels and autograd for torch.ops.scl)
from .backends import available_backends
from .loss import SupConLoss, supcon_loss

__all__ = ["SupConLoss", "available_backends", "supcon_loss"]
__version__ = "0.1.0"
