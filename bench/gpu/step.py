"""The step the GPU scripts time and profile: one forward + backward of ``supcon_loss`` on issue
23's problem (100 classes, temperature 0.1), after the warm-up that compiles, autotunes and fills
the caching allocator."""
import torch

from bench.harness.timing import synchronize

TEMPERATURE = 0.1
CLASSES = 100


def supcon_step(backend, layout, n, d, dtype, device):
    """A function running one forward + backward on fixed random inputs, returning the gradients.
    ``layout`` "single": one set (the symmetric schedule); "cross": n anchors against n other
    rows, gradients for both (the plain schedule, both backward walks)."""
    import scl_kernels
    g = torch.Generator().manual_seed(0)

    def rows():
        return torch.randn(n, d, generator=g).to(device=device, dtype=dtype).requires_grad_()

    def classes():
        return torch.randint(0, CLASSES, (n,), generator=g).to(device)

    features, labels = rows(), classes()
    cross = {"contrast": rows(), "contrast_labels": classes()} if layout == "cross" else {}
    inputs = [features] + ([cross["contrast"]] if cross else [])

    def step():
        loss = scl_kernels.supcon_loss(features, labels, TEMPERATURE, backend=backend, **cross)
        return torch.autograd.grad(loss, inputs)
    return step


def warm_up(step, device):
    for _ in range(3):
        step()
    synchronize(device)
