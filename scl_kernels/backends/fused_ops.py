"""Fake kernels for the fused ops, so that they trace under torch.compile and run on meta tensors.

The fused ops' schemas (made from csrc/core/call_arguments.h) are the one description of their
arguments: the fakes bind what they receive to the schema's names and defaults, and read only the
arguments that the output shapes depend on, by name. The registry registers them for each fused
op of the loaded library (register_fakes, fused_op_names: its scl::supcon and scl::supcon_triton,
and a test build's dry run of the CUDA backend).
"""
import inspect
from typing import Any, Callable, Optional, Tuple

import torch

from .._extension import library_loaded
from .._signatures import bind_arguments

_Outputs = Tuple[torch.Tensor, torch.Tensor, torch.Tensor]


def loss_dtype(dtype: torch.dtype) -> torch.dtype:
    """float32 for float16 / bfloat16 / float32 inputs, float64 for float64."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def fused_op_names() -> Tuple[str, ...]:
    """The fused ops the loaded library registers: each scl::<name> that has a
    scl::<name>_backward, whichever backend or build added it (a test build's dry run of the
    CUDA backend too)."""
    ops = {name.removeprefix("scl::") for name in torch._C._dispatch_get_all_op_names()
           if name.startswith("scl::")}
    return tuple(sorted(name.removesuffix("_backward") for name in ops
                        if name.endswith("_backward") and name.removesuffix("_backward") in ops))


def _schema_signature(op_name: str) -> inspect.Signature:
    """torch.ops.scl.<op_name>'s schema as a Python signature: its argument names in order,
    its defaults, its keyword-only arguments."""
    parameters = []
    for argument in getattr(torch.ops.scl, op_name).default._schema.arguments:
        kind = (inspect.Parameter.KEYWORD_ONLY if argument.kwarg_only
                else inspect.Parameter.POSITIONAL_OR_KEYWORD)
        default = (argument.default_value if argument.has_default_value()
                   else inspect.Parameter.empty)
        parameters.append(inspect.Parameter(argument.name, kind, default=default))
    return inspect.Signature(parameters)


def _check_devices(*, features: torch.Tensor, labels: torch.Tensor,
                   contrast: Optional[torch.Tensor], contrast_labels: Optional[torch.Tensor],
                   temperature: torch.Tensor, **_others: object) -> None:
    """The fakes run instead of a real kernel whenever one argument is on the meta device, so
    they repeat the kernels' device checks; a CPU temperature goes with any device."""
    for name, tensor in (("labels", labels), ("contrast", contrast), ("contrast_labels", contrast_labels)):
        if tensor is not None and tensor.device != features.device:
            raise ValueError(f"{name} is on {tensor.device} but features is on {features.device}")
    if temperature.device not in (features.device, torch.device("cpu")):
        raise ValueError(f"temperature is on {temperature.device} but features is on {features.device}")


# The shapes read the arguments they depend on by name; the others (**_others) do not change
# them.
def _forward_shapes(*, features: torch.Tensor, contrast: Optional[torch.Tensor],
                    num_anchors: int, mean: bool, **_others: object) -> _Outputs:
    m = num_anchors if contrast is None else features.shape[0]
    return (features.new_empty(() if mean else (m,), dtype=loss_dtype(features.dtype)),
            features.new_empty((m,), dtype=torch.float64),
            features.new_empty((m,), dtype=torch.int64))


def _backward_shapes(*, features: torch.Tensor, contrast: Optional[torch.Tensor],
                     temperature: torch.Tensor, **_others: object) -> _Outputs:
    grad_contrast = (features.new_empty((0, features.shape[1])) if contrast is None
                     else torch.empty_like(contrast))
    return torch.empty_like(features), grad_contrast, torch.empty_like(temperature)


def _fake(op_name: str, shapes: Callable[..., _Outputs]) -> Callable[..., _Outputs]:
    """The fake of torch.ops.scl.<op_name>: the dispatcher passes the arguments positionally
    (keyword-only ones by name, trailing defaults possibly left out), so they are bound to the
    schema's names before ``shapes`` reads them."""
    signature = _schema_signature(op_name)

    def fake(*args: Any, **kwargs: Any) -> _Outputs:
        arguments = bind_arguments(signature, args, kwargs)
        _check_devices(**arguments)
        return shapes(**arguments)
    return fake


def register_fakes() -> None:
    """The fakes of each fused op scl::<name> and its scl::<name>_backward."""
    if not library_loaded():
        return
    for name in fused_op_names():
        torch.library.register_fake(f"scl::{name}")(_fake(name, _forward_shapes))
        torch.library.register_fake(f"scl::{name}_backward")(_fake(f"{name}_backward",
                                                                   _backward_shapes))
