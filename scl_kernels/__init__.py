"""scl_kernels: a fused, memory-frugal supervised contrastive (SupCon) loss for PyTorch.

The public API: :func:`supcon_loss` (scl_kernels.functional), the modules in :mod:`scl_kernels.nn`,
:func:`hard_pairs` (hard-pair mining), :class:`GradientCache`, :class:`ClassBalancedBatchSampler`,
:func:`available_backends`, :func:`explain` (what a call would do, and why) and
:func:`raise_deferred_value_errors` (scl_kernels.value_checks).
Imported on demand: :mod:`scl_kernels.distributed`, :mod:`scl_kernels.compat` (SupContrast and
pytorch-metric-learning names), :mod:`scl_kernels.integrations` (Hugging Face Trainer,
sentence-transformers) and the fine-tuning application :mod:`scl_kernels.finetune`.
"""
from . import nn
from ._version import __version__
from .backends import available_backends
from .explain import Explanation, explain
from .functional import supcon_loss
from .grad_cache import GradientCache
from .hard_pairs import HardPairs, hard_pairs
from .nn import SupConCrossEntropyLoss, SupConLoss
from .sampling import ClassBalancedBatchSampler
from .value_checks import raise_deferred_value_errors

__all__ = ["ClassBalancedBatchSampler", "Explanation", "GradientCache", "HardPairs",
           "SupConCrossEntropyLoss", "SupConLoss", "__version__", "available_backends", "explain",
           "hard_pairs", "nn", "raise_deferred_value_errors", "supcon_loss"]
