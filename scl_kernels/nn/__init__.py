"""Loss modules: :class:`SupConLoss` and the fine-tuning objective :class:`SupConCrossEntropyLoss`."""
from ..loss import SupConLoss
from .supcon_cross_entropy import SupConCrossEntropyLoss, SupConCrossEntropyParts

__all__ = ["SupConCrossEntropyLoss", "SupConCrossEntropyParts", "SupConLoss"]
