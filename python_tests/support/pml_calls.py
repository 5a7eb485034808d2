"""What the tests of the pytorch-metric-learning drop-ins (compat/test_compat_pml*.py) share:
seeded embeddings, and a call's loss with its gradients in pml's calling convention."""
import torch


def random_rows(seed, rows, dim, dtype):
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(rows, dim, generator=generator, dtype=torch.float64).to(dtype)


def value_and_grads(criterion, embeddings, labels, ref_emb=None, ref_labels=None):
    """Loss and gradients of the embeddings (and of ref_emb when it is a tensor of its own)."""
    embeddings = embeddings.clone().requires_grad_(True)
    wrt = [embeddings]
    if ref_emb is not None:
        ref_emb = ref_emb.clone().requires_grad_(True)
        wrt.append(ref_emb)
    loss = criterion(embeddings, labels, ref_emb=ref_emb, ref_labels=ref_labels)
    # pml's 0 for a batch without pairs is embeddings.sum() * 0: ref_emb is then not in its graph.
    grads = torch.autograd.grad(loss, wrt, allow_unused=True, materialize_grads=True)
    return (loss.detach(),) + tuple(g.detach() for g in grads)
