"""The Triton backend: kernels.py (jit kernels) -> launch.py (tiles, grids) -> tiles.py (the two
tiled steps of the shared core) -> registration.py (their registration as the kernels of the ops
that csrc/triton/supcon_triton.cpp calls).

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


def triton_interpreter_enabled() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


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
