"""The dense path of the drop-ins, for the positive sets that labels cannot describe.

The fused kernels take positives as "same label", which covers every call of SupContrast and
pytorch-metric-learning but two: a SupContrast ``mask`` that is not a same-label mask, and
pytorch-metric-learning's pair exclusion when ``ref_labels is labels`` with its own ``ref_emb``.
Those build the N x M logits here; every other call goes through :func:`scl_kernels.supcon_loss`.
"""
import warnings
from typing import Callable, Set

import torch

from .._types import Temperature

_warned: Set[str] = set()

# A warning raised in a drop-in's forward points at the user's `criterion(...)` line: past this
# function, forward, and nn.Module's _call_impl and _wrapped_call_impl.
_CALLER_OF_MODULE_FORWARD = 5


def warn_once(key: str, describe: Callable[[], str]) -> None:
    """Warns the first time ``key`` is seen in this process, and never again for it.

    ``describe()`` gives the message; it is called only then, as finding what to say about a
    call may cost host reads that the later calls need not pay.
    """
    if key in _warned:
        return
    _warned.add(key)
    warnings.warn(describe() + " This warning is shown once per process.", UserWarning,
                  stacklevel=_CALLER_OF_MODULE_FORWARD)


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype the loss is computed in, as the fused kernels do: float64 stays, others float32."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def masked_supcon_per_anchor(anchors: torch.Tensor, contrast: torch.Tensor,
                             positive_weights: torch.Tensor, temperature: Temperature, *,
                             exclude_self: bool) -> torch.Tensor:
    """SupContrast's per-anchor loss with an arbitrary positive mask, densely.

    Args:
        anchors: ``[M, D]`` rows, used as given (normalise before if wanted).
        contrast: ``[N, D]`` rows.
        positive_weights: ``[M, N]`` weight of each (anchor, contrast row) pair as a positive; a
            0/1 mask in the usual case, any weights in SupContrast's. Their sums are taken in
            their own dtype (float32 in SupContrast, whatever the features').
        temperature: float or 0-dim tensor.
        exclude_self: leave out column i of anchor i (its own row), from both the softmax and the
            positives.

    Returns:
        ``[M]``: ``-(sum_j w_ij log p_ij) / sum_j w_ij`` with ``p_i`` the softmax of anchor i's
        logits over its columns; an anchor whose weights add up to less than 1e-6 gets 0, as in
        SupContrast, where such an anchor would otherwise divide 0 by 0.
    """
    logits = anchors @ contrast.T / temperature
    weights = positive_weights
    if exclude_self:
        own_column = torch.eye(*logits.shape, dtype=torch.bool, device=logits.device)
        log_normaliser = torch.logsumexp(logits.masked_fill(own_column, float("-inf")), dim=1,
                                         keepdim=True)
        weights = weights.masked_fill(own_column, 0)
    else:
        log_normaliser = torch.logsumexp(logits, dim=1, keepdim=True)
    log_prob = logits - log_normaliser
    weight_sums = weights.sum(dim=1)
    weight_sums = torch.where(weight_sums < 1e-6, torch.ones_like(weight_sums), weight_sums)
    return -(weights * log_prob).sum(dim=1) / weight_sums
