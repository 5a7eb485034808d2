"""A float64 SupCon reference for single-set batches too large for one N x N matrix: anchors in
chunks, gradients accumulated on the unit rows and then taken through the normalisation once.
Used by the GPU tests at N up to 65,536."""
import torch
import torch.nn.functional as F


def chunked_supcon64(features, labels, temperature, chunk=2048):
    """(mean loss, d loss / d features) in float64 for the single-set layout, normalize=True."""
    x = features.detach().to(torch.float64).requires_grad_(True)
    unit = F.normalize(x, dim=1)
    z = unit.detach().requires_grad_(True)
    n = z.shape[0]
    same = labels[:, None] == labels[None, :]
    counts = torch.bincount(labels - labels.min(), minlength=1)[labels - labels.min()] - 1
    anchors = int((counts > 0).sum())
    total = torch.zeros((), dtype=torch.float64, device=x.device)
    for start in range(0, n, chunk):
        rows = torch.arange(start, min(start + chunk, n), device=x.device)
        logits = z[rows] @ z.T / temperature
        self_column = torch.zeros_like(logits, dtype=torch.bool)
        self_column[torch.arange(rows.numel()), rows] = True
        lse = torch.logsumexp(logits.masked_fill(self_column, float("-inf")), dim=1)
        positive = same[rows] & ~self_column
        npos = positive.sum(1)
        part = torch.where(npos > 0, lse - (logits * positive).sum(1) / npos.clamp_min(1), 0.0).sum()
        (part / max(anchors, 1)).backward()
        total += part.detach()
    unit.backward(z.grad)
    return total / max(anchors, 1), x.grad
