"""The fused ops' ``mean=True`` against their own per-anchor outputs and the float64 reference:
the forward's 0-dim loss is the mean of the per-anchor losses over the anchors with positives,
and its gradient (raw backward op and autograd alike) is the per-anchor backward of grad / that
count. Shared by the conformance suite (every backend with raw ops) and the CUDA dry run's
tests."""
import torch

from .reference64 import op_reference64

# The fused mean sums float64 losses where the per-anchor path rounds each to float32 first.
MEAN_RTOL, MEAN_ATOL = 1e-5, 1e-6
# Against the float64 reference: the per-anchor losses' float32 tolerance (reference64's
# checker: 2e-5 of the logits' scale, at least 1/t for unit rows), which a mean keeps.
REFERENCE_RTOL, REFERENCE_ATOL_PER_INV_T = 2e-5, 2e-5


def check_op_mean(forward_op, backward_op, args, grad=0.7):
    """Checks mean=True on ``args`` (features, labels, contrast, contrast_labels, temperature,
    num_anchors, normalize) against mean=False; returns the 0-dim mean."""
    features = args[0]
    per_anchor, lse, num_positives = forward_op(*args)
    mean, mean_lse, mean_positives = forward_op(*args, mean=True)
    counted = max(int(torch.count_nonzero(num_positives)), 1)
    assert mean.shape == () and mean.dtype == per_anchor.dtype, (mean.shape, mean.dtype)
    assert mean.device == features.device
    want = per_anchor.double().sum() / counted
    torch.testing.assert_close(mean.double(), want, rtol=MEAN_RTOL, atol=MEAN_ATOL)
    reference = op_reference64(*args).loss.sum() / counted
    inv_t = 1.0 / float(args[4])
    torch.testing.assert_close(mean.double().cpu(), reference, rtol=REFERENCE_RTOL,
                               atol=REFERENCE_ATOL_PER_INV_T * max(inv_t, 1.0))
    torch.testing.assert_close(mean_lse, lse, rtol=1e-6, atol=1e-6)
    assert torch.equal(mean_positives, num_positives)

    upstream = torch.tensor(grad, dtype=mean.dtype, device=mean.device)
    expanded = (upstream / counted).expand(per_anchor.shape)
    # Materialised, one value per anchor: the general backward, which sums the weighted class
    # rows. A mean's gradient and a sum's (expanded, stride 0) give every anchor of a class one
    # weight, and the single set's fused backward scales the class sums instead
    # (class_shares_weight in csrc/core/tile_kernels.h): both are held to the general one.
    want_grads = backward_op(expanded.contiguous(), *args, lse)
    raw = backward_op(upstream, *args, lse, mean=True)
    summed = backward_op(expanded, *args, lse)
    for got, also, expected in zip(raw, summed, want_grads):
        torch.testing.assert_close(got, expected, rtol=MEAN_RTOL, atol=MEAN_ATOL)
        torch.testing.assert_close(also, expected, rtol=MEAN_RTOL, atol=MEAN_ATOL)

    # Through autograd the backward reuses the forward's preparation and its count.
    leaves = [a.detach().requires_grad_(True) if i in (0, 2) and a is not None else a
              for i, a in enumerate(args)]
    loss = forward_op(*leaves, mean=True)[0]
    loss.backward(upstream)
    torch.testing.assert_close(leaves[0].grad, want_grads[0], rtol=MEAN_RTOL, atol=MEAN_ATOL)
    if leaves[2] is not None:
        torch.testing.assert_close(leaves[2].grad, want_grads[1], rtol=MEAN_RTOL, atol=MEAN_ATOL)
    return mean
