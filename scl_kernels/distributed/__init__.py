"""The SupCon loss of a batch spread over the processes of a torch.distributed job (NCCL on GPUs,
gloo on CPUs): every rank passes its local rows and gets the loss of the global batch.

Not imported by ``import scl_kernels``: ``import scl_kernels.distributed``. docs/DISTRIBUTED.md
explains the two strategies, the gradient convention under DistributedDataParallel and torchrun.
"""
from ..global_batch import STRATEGIES, supcon_loss
from .supcon_module import SupConLoss

__all__ = ["STRATEGIES", "SupConLoss", "supcon_loss"]
