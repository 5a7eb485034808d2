"""Registers the Triton tile kernels (the positive walk of the focal loss and of multi-hot labels
with the latter's positives, the forward's tiles with its per-anchor losses, the backward's
weights with its tiles and assembly, the preparation) as the CUDA (and, under Triton's
interpreter, CPU) kernels of the ops that csrc/triton/supcon_triton.cpp calls. Importing it is
what makes torch.ops.scl.supcon_triton runnable: scl_kernels.backends.triton.load_triton_backend
does."""
import torch
from triton.runtime.interpreter import InterpretedFunction

from . import TRITON_CPU_NEEDS_INTERPRETER, triton_interpreter_enabled
from .backward_assembly import assemble_backward
from .grouped_stages import lse_and_losses, weights_grads_and_assembly
from .hard_pairs import hard_pairs
from .positive_walk import multi_label_positives, positive_walk
from .row_preparation import prepare_rows
from .tiles import grad_tiles, lse_tiles

from .kernels import lse_merge_kernel

INTERPRET = triton_interpreter_enabled()
if isinstance(lse_merge_kernel, InterpretedFunction) != INTERPRET:
    raise RuntimeError("TRITON_INTERPRET changed between scl_kernels' first look at it and "
                       "triton's compiling or interpreting the kernels: set it before importing "
                       "scl_kernels")

_library = torch.library.Library("scl", "IMPL")


def _refused_on_cpu(*args):
    raise ValueError(TRITON_CPU_NEEDS_INTERPRETER)


# The ops (arguments in csrc/triton/stage_arguments.h) and the Python functions that implement them, whose
# parameters are the schemas' arguments (python_tests/backends/test_triton_stage_ops.py).
STAGE_OPS = {
    "supcon_triton_lse_tiles": lse_tiles,
    "supcon_triton_grad_tiles": grad_tiles,
    "hard_pairs_triton": hard_pairs,
    "supcon_triton_positive_walk": positive_walk,
    "supcon_triton_multi_label_positives": multi_label_positives,
    "supcon_triton_lse_and_losses": lse_and_losses,
    "supcon_triton_weights_grads_and_assembly": weights_grads_and_assembly,
    "supcon_triton_assemble_backward": assemble_backward,
    "supcon_triton_prepare_rows": prepare_rows,
}

# On CPU tensors the kernels run only in Triton's interpreter, chosen once for the process: the
# kernels themselves serve CPU calls there (no wrapper on the shared core's every crossing), an
# error otherwise.
for _name, _fn in STAGE_OPS.items():
    _library.impl(_name, _fn, "CUDA")
    _library.impl(_name, _fn if INTERPRET else _refused_on_cpu, "CPU")


def _host_may_wait(like):
    """False while the stream of ``like``'s device captures a CUDA graph: the shared core then
    leaves out the forward's NaN / inf check, the op's only host wait (csrc/core/tile_kernels.h)."""
    with torch.cuda.device(like.device):
        return not torch.cuda.is_current_stream_capturing()


_library.impl("supcon_triton_host_may_wait", _host_may_wait, "CUDA")
