"""Loss modules: :class:`SupConLoss`, the fine-tuning objectives :class:`SupConCrossEntropyLoss`
and :class:`CoreTuningLoss`, and the cross-entropy alternatives :class:`FocalLoss`,
:class:`SelfAdjustingDiceLoss` and :class:`MixedCrossEntropyLoss` (usable alone or as the ``ce=``
term of both objectives), and :class:`SupConMemory`, a cross-batch memory of past embeddings
that SupConLoss and SupConCrossEntropyLoss contrast against (``memory=``)."""
from .core_tuning import CoreTuningLoss, CoreTuningParts, GeneratedRows
from .dice_loss import SelfAdjustingDiceLoss
from .focal_loss import FocalLoss
from ..cross_batch_memory import SupConMemory
from .mixed_cross_entropy import MixedCrossEntropyLoss
from .supcon import SupConLoss
from .supcon_cross_entropy import SCL_REDUCTIONS, SupConCrossEntropyLoss, SupConCrossEntropyParts

__all__ = ["CoreTuningLoss", "CoreTuningParts", "FocalLoss", "GeneratedRows",
           "MixedCrossEntropyLoss", "SCL_REDUCTIONS", "SelfAdjustingDiceLoss",
           "SupConCrossEntropyLoss", "SupConCrossEntropyParts", "SupConLoss", "SupConMemory"]
