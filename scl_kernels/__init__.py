"""scl_kernels: a fused, memory-frugal supervised contrastive (SupCon) loss for PyTorch."""
from . import _op  # noqa: F401  (registers fake kernels and autograd for torch.ops.scl)
from . import nn
from .backends import available_backends
from .grad_cache import GradientCache
from .loss import SupConLoss, supcon_loss
from .nn import SupConCrossEntropyLoss
from .sampling import ClassBalancedBatchSampler

__all__ = ["ClassBalancedBatchSampler", "GradientCache", "SupConCrossEntropyLoss", "SupConLoss",
           "available_backends", "nn", "supcon_loss"]
__version__ = "0.1.0"
