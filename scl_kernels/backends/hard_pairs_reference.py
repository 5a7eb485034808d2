"""Dense PyTorch hard-pair mining (``backend="reference"`` of scl_kernels.hard_pairs): the whole
M x N similarity matrix, for tests and small batches; memory grows as M * N."""
from typing import Optional, Tuple

import torch

from .fused_ops import loss_dtype

NORM_EPS = 1e-12  # as torch.nn.functional.normalize


def _inverse_norms(rows: torch.Tensor) -> torch.Tensor:
    norms: torch.Tensor = torch.linalg.vector_norm(rows, dim=1)  # torch.linalg is untyped
    return norms.clamp_min(NORM_EPS).reciprocal()


def _extreme(similarity: torch.Tensor, candidates: torch.Tensor,
             largest: bool) -> Tuple[torch.Tensor, torch.Tensor]:
    """Per row, the extreme similarity among the candidate columns and its lowest column
    (-1 and NaN for rows without candidates)."""
    fill = float("-inf") if largest else float("inf")
    masked = similarity.masked_fill(~candidates, fill)
    value = masked.amax(dim=1) if largest else masked.amin(dim=1)
    # Among the candidates that reach the extreme, the first: argmax returns the first maximum.
    reached = candidates & (similarity == value[:, None])
    found = reached.any(dim=1)
    index = torch.where(found, reached.to(torch.uint8).argmax(dim=1), -1)
    return index, value.masked_fill(~found, float("nan"))


def hard_pairs_reference(features: torch.Tensor, labels: torch.Tensor,
                         contrast: Optional[torch.Tensor], contrast_labels: Optional[torch.Tensor],
                         normalize: bool
                         ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Same arguments and results as torch.ops.scl.hard_pairs."""
    dtype = loss_dtype(features.dtype)
    q = features.to(dtype)
    z = q if contrast is None else contrast.to(dtype)
    if contrast is None:
        z_labels = labels
    else:
        assert contrast_labels is not None, "contrast comes with its contrast_labels"
        z_labels = contrast_labels
    # Dot products of raw rows scaled by both inverse norms, as the kernels round them.
    similarity = q @ z.T
    if normalize:
        similarity = similarity * _inverse_norms(q)[:, None] * _inverse_norms(z)[None, :]
    candidates = torch.ones_like(similarity, dtype=torch.bool)
    if contrast is None:
        candidates.fill_diagonal_(False)
    same_class = (labels[:, None] == z_labels[None, :]) & (labels[:, None] >= 0)
    positive_index, positive_similarity = _extreme(similarity, candidates & same_class, False)
    negative_index, negative_similarity = _extreme(similarity, candidates & ~same_class, True)
    return positive_index, positive_similarity, negative_index, negative_similarity
