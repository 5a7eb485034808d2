"""Fake kernels for the fused ops, so that they trace under torch.compile and run on meta tensors.

The schemas of the registry's fused ops (torch.ops.scl.supcon, torch.ops.scl.supcon_triton: the
same op with the Triton tile kernels) live in csrc/scl_ops.cpp, their autograd in
csrc/autograd.cpp; the registry registers the fakes below for each (register_fakes).
"""
from typing import Iterable, Optional, Tuple

import torch

from .._extension import library_loaded

def loss_dtype(dtype: torch.dtype) -> torch.dtype:
    """float32 for float16 / bfloat16 / float32 inputs, float64 for float64."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def _check_devices(features: torch.Tensor, labels: torch.Tensor, contrast: Optional[torch.Tensor],
                   contrast_labels: Optional[torch.Tensor], temperature: torch.Tensor) -> None:
    """The fakes run instead of a real kernel whenever one argument is on the meta device, so
    they repeat the kernels' device checks; a CPU temperature goes with any device."""
    for name, tensor in (("labels", labels), ("contrast", contrast), ("contrast_labels", contrast_labels)):
        if tensor is not None and tensor.device != features.device:
            raise ValueError(f"{name} is on {tensor.device} but features is on {features.device}")
    if temperature.device not in (features.device, torch.device("cpu")):
        raise ValueError(f"temperature is on {temperature.device} but features is on {features.device}")


def _fake_forward(features: torch.Tensor, labels: torch.Tensor, contrast: Optional[torch.Tensor],
                  contrast_labels: Optional[torch.Tensor], temperature: torch.Tensor,
                  num_anchors: int, normalize: bool, anchor_offset: int = 0,
                  focal_gamma: float = 0.0,
                  mean: bool = False) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    _check_devices(features, labels, contrast, contrast_labels, temperature)
    m = num_anchors if contrast is None else features.shape[0]
    return (features.new_empty(() if mean else (m,), dtype=loss_dtype(features.dtype)),
            features.new_empty((m,), dtype=torch.float64),
            features.new_empty((m,), dtype=torch.int64))


def _fake_backward(grad_loss: torch.Tensor, features: torch.Tensor, labels: torch.Tensor,
                   contrast: Optional[torch.Tensor], contrast_labels: Optional[torch.Tensor],
                   temperature: torch.Tensor, num_anchors: int, normalize: bool,
                   lse: torch.Tensor, anchor_offset: int = 0, temperature_grad: bool = True,
                   focal_gamma: float = 0.0,
                   mean: bool = False) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    _check_devices(features, labels, contrast, contrast_labels, temperature)
    grad_contrast = (features.new_empty((0, features.shape[1])) if contrast is None
                     else torch.empty_like(contrast))
    return torch.empty_like(features), grad_contrast, torch.empty_like(temperature)


def register_fakes(op_names: Iterable[str]) -> None:
    """The fakes of each fused op scl::<name> and its scl::<name>_backward."""
    if not library_loaded():
        return
    for name in op_names:
        torch.library.register_fake(f"scl::{name}")(_fake_forward)
        torch.library.register_fake(f"scl::{name}_backward")(_fake_backward)
