"""Triton backend: kernels.py (jit kernels) -> launch.py (tiles, grids) -> op.py (the op's
implementation) -> registration below."""
import os

import torch

from .. import _op
from .._extension import library_loaded

_library = torch.library.Library("scl", "FRAGMENT")
_library.define("supcon_triton" + _op.SUPCON_SCHEMA)
_library.define("supcon_triton_backward" + _op.SUPCON_BACKWARD_SCHEMA)


def interpreter_enabled() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


def _on_cpu(fn):
    def run(*args):
        if not interpreter_enabled():
            raise ValueError("backend='triton' runs CPU tensors only in Triton's interpreter: set "
                             "TRITON_INTERPRET=1 before importing triton, or use CUDA tensors")
        return fn(*args)
    return run


def _register():
    from .op import supcon_backward, supcon_forward
    for name, fn in (("supcon_triton", supcon_forward), ("supcon_triton_backward", supcon_backward)):
        _library.impl(name, fn, "CUDA")
        _library.impl(name, _on_cpu(fn), "CPU")
    _op.register_fakes_and_autograd("supcon_triton")
    if library_loaded():  # the Triton kernels are torch.ops.scl.supcon's CUDA implementation
        _library.impl("supcon", supcon_forward, "CUDA")
        _library.impl("supcon_backward", supcon_backward, "CUDA")


_register()
