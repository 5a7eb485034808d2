"""hard_pairs: per anchor, its hardest positive and hardest negative, mined in one fused pass
(docs/MATH.md, "Hard pairs")."""
import warnings
from typing import Iterable, List, NamedTuple, Optional, Tuple

import torch

from ._extension import library_loaded
from ._types import BackendName
from ._validation import check_backend_name, check_inputs, check_normalize, has_values
from .backends import REGISTRY, Backend, resolve_backend
from .backends.hard_pairs_reference import hard_pairs_reference
from .functional import build_layout


class HardPairs(NamedTuple):
    """Per anchor (row of features): indices into the candidates (-1: none) and similarities
    (NaN: none)."""
    positive_index: torch.Tensor  # [N] int64, the least similar row of the anchor's class
    positive_similarity: torch.Tensor  # [N]
    negative_index: torch.Tensor  # [N] int64, the most similar row of another class
    negative_similarity: torch.Tensor  # [N]


def _hard_pairs_backends() -> List[str]:
    return [name for name, b in REGISTRY.items() if b.op_name is None or b.hard_pairs_op_name]


def _resolve(name: str, device: torch.device) -> Backend:
    """The backend that mines on ``device``: backend="auto" takes the first fused backend with
    a hard-pair op that may be chosen automatically and runs there, else the dense reference."""
    if name == "auto":
        if device.type == "meta":  # shapes only: the fake kernel of the CPU op
            return REGISTRY["cpu" if library_loaded() else "reference"]
        for backend in REGISTRY.values():
            if backend.hard_pairs_op_name and backend.auto_eligible and backend.available(device):
                return backend
        warnings.warn(f"scl_kernels.hard_pairs: no fused backend runs {device.type} tensors in "
                      "this installation; backend='auto' uses the dense O(N^2) 'reference' "
                      "backend", stacklevel=3)
        return REGISTRY["reference"]
    if name not in _hard_pairs_backends():
        raise ValueError(f"backend={name!r} has no hard_pairs; backends with hard_pairs: "
                         f"{_hard_pairs_backends()} (on CUDA tensors 'auto' uses 'triton')")
    return resolve_backend(name, device)


def _finite_flags(tensors: Iterable[Tuple[str, Optional[torch.Tensor]]]
                  ) -> List[Tuple[str, torch.Tensor]]:
    """(name, device bool) for each tensor whose values can be read."""
    return [(name, torch.isfinite(t).all()) for name, t in tensors
            if t is not None and has_values(t)]


def _raise_if_not_finite(flags: Iterable[Tuple[str, torch.Tensor]]) -> None:
    for name, finite in flags:
        if not bool(finite):
            raise ValueError(f"{name} contains NaN or inf")


def hard_pairs(features: torch.Tensor, labels: torch.Tensor, *,
               contrast: Optional[torch.Tensor] = None,
               contrast_labels: Optional[torch.Tensor] = None, normalize: bool = True,
               backend: BackendName = "auto") -> HardPairs:
    """Hard-pair mining: for every anchor (row of ``features``), the index and similarity of its
    hardest positive (the least similar other row with its label) and of its hardest negative
    (the most similar row with another label), in one pass over the similarities without
    storing them (the fused backends; "reference" is dense).

    Args:
        features: [N, D] floating-point anchors (and, without ``contrast``, the candidates).
        labels: [N] integer class labels. A negative label means "no class": such a row is
            nobody's positive and every anchor's negative; as an anchor it has no positive.
        contrast: optional [M, D] candidates (same dtype and device as features). Without it
            the candidates are the other rows of features (never the anchor itself).
        contrast_labels: [M] integer labels of ``contrast``, required with it.
        normalize: cosine similarity (rows scaled to unit length) if True, else the plain dot
            product.
        backend: "auto" (the C++ kernel on CPU tensors, Triton on CUDA tensors), "cpu",
            "triton" or "reference" (dense PyTorch). "cuda" has no hard-pair kernel.

    Returns:
        HardPairs(positive_index, positive_similarity, negative_index, negative_similarity):
        int64 indices into the candidates (-1 where an anchor has none) and similarities (NaN
        there) in float32, float64 for float64 input on the "cpu" and "reference" backends.
        Ties go to the lowest index. The outputs are detached: mining has no gradient, and
        inputs that require grad are read as they are.

    Raises:
        TypeError / ValueError naming the argument, for bad shapes, dtypes, devices, NaN / inf
        values or options.
    """
    check_inputs(features, labels)
    if labels is None:
        raise TypeError("labels must be a torch.Tensor, got NoneType")
    if labels.dim() != 1:
        raise ValueError(f"labels must be class ids of shape [N] (hard pairs of multi-hot labels "
                         f"are not defined), got shape {tuple(labels.shape)}")
    if features.dim() != 2:
        raise ValueError(f"features must have shape [N, D], got {tuple(features.shape)}")
    check_normalize(normalize)
    check_backend_name(backend)
    chosen = _resolve(backend, features.device)
    layout = build_layout(features.detach(), labels, None if contrast is None else contrast.detach(),
                          contrast_labels, "all")
    flags = _finite_flags((("features", layout.rows), ("contrast", layout.contrast)))
    if features.device.type == "cpu":  # on an accelerator the flags are read after the launch
        _raise_if_not_finite(flags)
    args = (layout.rows, layout.labels, layout.contrast, layout.contrast_labels, normalize)
    op = chosen.hard_pairs_op
    result = hard_pairs_reference(*args) if op is None else op(*args)
    if features.device.type != "cpu" and not _capturing(features.device):
        _raise_if_not_finite(flags)
    return HardPairs(*result)


def _capturing(device: torch.device) -> bool:
    return device.type == "cuda" and torch.cuda.is_current_stream_capturing()
