"""Loads the compiled library that registers torch.ops.scl, without failing the package import.

The package stays importable when the extension is missing (a source checkout that was never
built): the dense ``backend="reference"`` still works and the fused backends raise an error that
says how to build. ``SCL_KERNELS_LIBRARY=/path/to/lib.so`` loads another build of the same sources
(CI uses it to test the CMake build).
"""
import os

import torch

_load_error = None


def _load():
    global _load_error
    override = os.environ.get("SCL_KERNELS_LIBRARY")
    try:
        if override:
            torch.ops.load_library(override)
        else:
            from scl_kernels import _C  # noqa: F401  (importing registers the ops)
    except (ImportError, OSError) as error:
        _load_error = error


_load()


def library_loaded() -> bool:
    return _load_error is None


def require_library() -> None:
    if _load_error is not None:
        raise RuntimeError(
            "scl_kernels' compiled library is not available "
            f"({_load_error}); build it with `pip install --no-build-isolation .`, "
            "or use backend='reference'") from _load_error
