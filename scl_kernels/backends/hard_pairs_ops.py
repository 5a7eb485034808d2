"""Fake kernels of the hard-pair ops (schemas in csrc/scl_ops.cpp), so that they run on meta
tensors and trace under torch.compile. The similarities come in the precision each op computes
in: scl::hard_pairs (C++, CPU) in float64 for float64 input, scl::hard_pairs_triton always in
float32."""
from typing import Callable, Optional, Tuple

import torch

from .._extension import library_loaded
from .fused_ops import loss_dtype


_HardPairsResult = Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]


def _fake(similarity_dtype: Callable[[torch.dtype], torch.dtype]
          ) -> Callable[..., _HardPairsResult]:
    def fake(features: torch.Tensor, labels: torch.Tensor, contrast: Optional[torch.Tensor],
             contrast_labels: Optional[torch.Tensor], normalize: bool) -> _HardPairsResult:
        for name, tensor in (("labels", labels), ("contrast", contrast),
                             ("contrast_labels", contrast_labels)):
            if tensor is not None and tensor.device != features.device:
                raise ValueError(f"{name} is on {tensor.device} but features is on {features.device}")
        m = features.shape[0]
        index = features.new_empty((m,), dtype=torch.int64)
        similarity = features.new_empty((m,), dtype=similarity_dtype(features.dtype))
        return index, similarity, index.clone(), similarity.clone()
    return fake


if library_loaded():
    torch.library.register_fake("scl::hard_pairs")(_fake(loss_dtype))
    torch.library.register_fake("scl::hard_pairs_triton")(_fake(lambda dtype: torch.float32))
