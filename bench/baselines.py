"""Plain-PyTorch SupCon losses to compare the fused op against: (features, labels, temperature)
-> scalar loss.

All three follow scl_kernels' semantics where that costs nothing extra, so that the timings
compare equal work: rows are L2-normalised inside, an anchor never contrasts with itself, a
negative label is never a positive, and the mean runs over anchors that have a positive.
``features`` is ``[N, D]`` or ``[B, V, D]`` (flattened view-major, as SupContrast); every
computation stays in the input dtype, as user code without the fused op would run.
"""
import functools

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint


def _flatten_views(features, labels):
    if features.dim() == 2:
        return features, labels
    views = features.shape[1]
    return torch.cat(torch.unbind(features, dim=1)), labels.repeat(views)


def dense_supcon(features, labels, temperature):
    """SupContrast-style: the whole N x N logit matrix plus float masks of the same size.

    Differences from HobbitLong/SupContrast, all to match scl_kernels: features are normalised
    here, no ``t / base_t`` factor, anchors without positives are left out of the mean instead of
    adding 0 to it, negative labels are never positives.
    """
    rows, labels = _flatten_views(features, labels)
    z = F.normalize(rows, dim=1)
    n = z.shape[0]
    logits = z @ z.T / temperature
    # Shifting by the row max (self column included) keeps exp in range; the shift cancels.
    logits = logits - logits.max(dim=1, keepdim=True).values.detach()
    not_self = torch.ones(n, n, dtype=z.dtype, device=z.device).fill_diagonal_(0)
    same_class = (labels[:, None] == labels[None, :]) & (labels[:, None] >= 0)
    positives = same_class.to(z.dtype) * not_self
    log_prob = logits - torch.log((torch.exp(logits) * not_self).sum(dim=1, keepdim=True))
    num_positives = positives.sum(dim=1)
    mean_log_prob_pos = (positives * log_prob).sum(dim=1) / num_positives.clamp_min(1)
    has_positive = num_positives > 0
    return -mean_log_prob_pos[has_positive].sum() / has_positive.sum().clamp_min(1)


def _chunk_logsumexp(z, start, size, temperature):
    logits = z[start:start + size] @ z.T / temperature
    # Row r of this chunk is anchor start + r, whose self column lies on diagonal `start`.
    logits.diagonal(start).fill_(float("-inf"))
    return torch.logsumexp(logits, dim=1)


def chunked_supcon(features, labels, temperature, chunk_size=1024):
    """Memory-bounded PyTorch: anchor rows in chunks, each chunk checkpointed.

    Only the log-sum-exp needs the logits; the positive term goes through per-class sums of the
    rows (O(N D)). Without checkpointing, autograd would keep every chunk's logits alive until
    backward, which is the whole N x N matrix again; with it, backward recomputes one chunk at a
    time, so memory stays O(chunk_size * N) at the price of a second forward GEMM.
    """
    rows, labels = _flatten_views(features, labels)
    z = F.normalize(rows, dim=1)
    lse = torch.cat([
        checkpoint(_chunk_logsumexp, z, start, chunk_size, temperature, use_reentrant=False)
        for start in range(0, z.shape[0], chunk_size)])

    valid = labels >= 0
    _, class_ids = torch.unique(labels, return_inverse=True)
    num_classes = int(class_ids.max()) + 1
    valid_rows = z * valid[:, None].to(z.dtype)
    class_sums = z.new_zeros(num_classes, z.shape[1]).index_add(0, class_ids, valid_rows)
    class_counts = torch.zeros(num_classes, dtype=torch.long, device=z.device).index_add(
        0, class_ids, valid.long())
    num_positives = torch.where(valid, class_counts[class_ids] - 1, 0)
    positive_dots = (z * (class_sums[class_ids] - valid_rows)).sum(dim=1) / temperature

    has_positive = num_positives > 0
    losses = lse - positive_dots / num_positives.clamp_min(1)
    return losses[has_positive].sum() / has_positive.sum().clamp_min(1)


@functools.lru_cache(maxsize=None)
def _pml_loss(temperature):
    from pytorch_metric_learning import losses
    return losses.SupConLoss(temperature=temperature)


def pml_supcon(features, labels, temperature):
    """pytorch-metric-learning's SupConLoss (cosine similarity: normalises inside; mean over
    anchors whose loss is non-zero, which are the anchors with a positive)."""
    rows, labels = _flatten_views(features, labels)
    return _pml_loss(temperature)(rows, labels)
