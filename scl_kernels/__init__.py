"""scl_kernels: a fused, memory-frugal supervised contrastive (SupCon) loss for PyTorch."""
import torch

from . import _op  # noqa: F401  (registers fake kernels and autograd for torch.ops.scl)
from .backends import available_backends, load_triton_backend, triton_installed
from .loss import SupConLoss, supcon_loss

if triton_installed() and torch.cuda.is_available():
    load_triton_backend()  # registers the CUDA kernel of torch.ops.scl.supcon

__all__ = ["SupConLoss", "available_backends", "supcon_loss"]
__version__ = "0.1.0"
