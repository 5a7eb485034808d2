"""The computation behind scl_kernels.distributed, in the library layer so that scl_kernels.nn
(SupConCrossEntropyLoss(distributed=True)) can use it without importing the layer above it:
the global batch's supcon_loss, its two strategies and the collectives they are made of.

Not imported by ``import scl_kernels``: it imports torch.distributed.
"""
from .agreement import STRATEGIES
from .loss import supcon_loss

__all__ = ["STRATEGIES", "supcon_loss"]
