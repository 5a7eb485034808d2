"""Where ``backend="auto"`` takes the CUDA C++ kernels instead of Triton on a GPU: a size rule read
off one H100 (bench/results/gpu_h100_2026-11-27b: bf16, one set, 100 classes, forward + backward,
``do_bench`` medians in ms)::

    D     N:  4,096  8,192  16,384  32,768  65,536
    64  cuda   0.32   0.68    0.79    2.06    7.26
      triton   1.43   1.55    1.36    2.09    4.64
    128 cuda   0.46   0.89    0.96    2.12    7.49
      triton   1.43   2.02    2.65    2.18    6.22
    256 cuda   0.69   0.71    1.02    3.51   13.48
      triton   1.88   2.02    1.98    4.58   18.37

Up to 32,768 rows the CUDA C++ call wins (its host issues a step in 0.6 ms against Triton's
1.7); from there on at D <= 128 Triton's full-row backward beats the triangle, whose tiles are
exp-bound at small D. Only what was measured is ruled: one set of unit rows, every row an anchor
(the symmetric schedule, which the core takes there at t above about 0.024), the 16-bit dtypes
(bf16 timed; fp16 runs the same kernels in both backends), D <= 256 (the CUDA C++ tensor-core
kernels' range) and sm_90. Everything else keeps Triton.
"""
from typing import Dict, NamedTuple

import torch

_TENSOR_CORE_DTYPES = (torch.bfloat16, torch.float16)
_MAX_DIM = 256
_TRITON_WINS_ABOVE_ROWS = 32768  # at D <= _TRITON_WINS_AT_MOST_DIM
_TRITON_WINS_AT_MOST_DIM = 128


class CallShape(NamedTuple):
    """What the rule reads of a call."""
    rows: int  # N: the rows every anchor is contrasted with
    dim: int  # D
    dtype: torch.dtype
    one_set: bool  # every row an anchor against its own set, normalised (the symmetric schedule)


_hopper_by_index: Dict[int, bool] = {}


def _is_hopper(device: torch.device) -> bool:
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index not in _hopper_by_index:
        _hopper_by_index[index] = torch.cuda.get_device_capability(index) == (9, 0)
    return _hopper_by_index[index]


# A constant while torch.compile traces (a device's capability never changes): what
# torch.compiler.assume_constant_result sets, without importing torch._dynamo with the package.
_is_hopper._dynamo_marked_constant = True  # type: ignore[attr-defined]  # a function attribute


def cuda_is_faster(device: torch.device, shape: CallShape) -> bool:
    """Whether the CUDA C++ kernels ran this call's kind faster than Triton's on the H100."""
    if (device.type != "cuda" or not shape.one_set or shape.dtype not in _TENSOR_CORE_DTYPES
            or shape.dim > _MAX_DIM or not _is_hopper(device)):
        return False
    return shape.rows <= _TRITON_WINS_ABOVE_ROWS or shape.dim > _TRITON_WINS_AT_MOST_DIM
