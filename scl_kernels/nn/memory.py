"""Where :class:`SupConMemory` and :func:`supcon_loss_with_memory` used to live, kept so that
``from scl_kernels.nn.memory import ...`` (and checkpoints that pickled the class by this path) keep
working. They live in :mod:`scl_kernels.cross_batch_memory`, below both scl_kernels.nn and
scl_kernels.global_batch, which both use them."""
from ..cross_batch_memory import SupConMemory, check_memory, memory_labels, supcon_loss_with_memory

__all__ = ["SupConMemory", "check_memory", "memory_labels", "supcon_loss_with_memory"]
