"""The Triton backend: the kernels of the stage ops that csrc/triton/supcon_triton.cpp calls for
the shared core (csrc/core/tile_kernels.h). kernels.py holds the tile kernels, launch.py starts them
(tiles, grids, the temperature's two forms, the autotuner's choices and compiled kernels kept per
key), tiles.py serves the two tiled steps (the log-sum-exp and the softmax part of the gradient)
from it; row_preparation.py, anchor_losses.py, anchor_weights.py, backward_assembly.py and
positive_walk.py are the O(N D) stages and the positive walk (of the focal loss and of multi-hot
labels, with the latter's positives), one kernel each;
grouped_stages.py runs the stages that follow each other as one op each way (one crossing from
the shared core instead of one a stage); hard_pairs.py is scl::hard_pairs_triton;
registration.py registers them all as the ops' kernels.

This module only answers whether the backend can run here and loads it on first use: importing it
never imports triton, so the registry can ask it on every call.
"""
import importlib
import importlib.util
import os

from ..._extension import require_library

# Looked up once: a package search stats the file system, and backend="auto" asks on every call.
_TRITON_INSTALLED = importlib.util.find_spec("triton") is not None


def triton_installed() -> bool:
    return _TRITON_INSTALLED


TRITON_MISSING = "backend='triton' needs the triton package (pip install triton)"
TRITON_CPU_NEEDS_INTERPRETER = ("backend='triton' runs CPU tensors only in Triton's interpreter: "
                                "set TRITON_INTERPRET=1 before importing triton, or use CUDA "
                                "tensors")


# Triton chooses its interpreter or its compiler from TRITON_INTERPRET when it decorates the
# kernels (when the backend loads). It is read here only, once, at the first question (test
# support sets it after importing scl_kernels, before any call), so that every check and launcher
# agrees; registration.py refuses to load kernels that Triton decorated otherwise.
_interpret = None


def triton_interpreter_enabled() -> bool:
    global _interpret
    if _interpret is None:
        _interpret = os.environ.get("TRITON_INTERPRET") == "1"
    return _interpret


_triton_loaded = False


def load_triton_backend():
    """Imports the registration of the Triton tile kernels. Once done, a plain flag check:
    torch.compile traces it without tracing an import."""
    global _triton_loaded
    if _triton_loaded:
        return
    require_library()
    if not triton_installed():
        raise ValueError(TRITON_MISSING)
    importlib.import_module(f"{__name__}.registration")
    _triton_loaded = True
