"""Loss modules: :class:`SupConLoss` and the fine-tuning objective :class:`SupConCrossEntropyLoss`."""
from .supcon import SupConLoss
from .supcon_cross_entropy import SCL_REDUCTIONS, SupConCrossEntropyLoss, SupConCrossEntropyParts

__all__ = ["SCL_REDUCTIONS", "SupConCrossEntropyLoss", "SupConCrossEntropyParts", "SupConLoss"]
