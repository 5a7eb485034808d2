"""The step the GPU scripts time and profile: one forward + backward of ``supcon_loss`` on issue
23's problem (100 classes, temperature 0.1), after the warm-up that compiles, autotunes and fills
the caching allocator. A backend may name the CUDA C++ symmetric backward's walk after a colon
("cuda:triangle", "cuda:triangle-async", "cuda:rows"): the step then runs inside
``walk_of(spec)``."""
import contextlib
import re

import torch

from bench.harness.timing import synchronize
from bench.static.cuda_static import WALKS as WALK_KINDS

TEMPERATURE = 0.1
CLASSES = 100
WALKS = ("triangle", "triangle-async", "rows")
# The sm90 walk_kernel's Walk argument as the profiler and Nsight Compute print it in the
# demangled name ("(scl::cuda::Walk)5").
WALK_KERNEL_TAGS = {"triangle": f"Walk){WALK_KINDS.index('kGradTriangle')}",
                    "triangle-async": f"Walk){WALK_KINDS.index('kGradTriangleAsync')}",
                    "rows": f"Walk){WALK_KINDS.index('kGradRowsSymmetric')}"}


def short_kernel(name):
    """"kGradTriangle" of an sm90 walk_kernel's demangled name; other names up to their template
    or argument list."""
    match = re.search(r"Walk\)(\d)", name)
    return WALK_KINDS[int(match.group(1))] if match else name.split("(")[0].split("<")[0]


def split_backend(spec):
    """("cuda", "rows") of "cuda:rows"; (backend, None) of a spec without a walk."""
    backend, _, walk = spec.partition(":")
    if walk and (backend != "cuda" or walk not in WALKS):
        raise ValueError(f"{spec!r}: only the cuda backend takes a walk, one of {WALKS}")
    return backend, walk or None


@contextlib.contextmanager
def walk_of(spec):
    """The walk a backend spec asks for, chosen while its steps are made (and captured): the test
    hook symmetric_backward_walk, which the call plan reads on every call (the library reads
    SCL_CUDA_SYMMETRIC_BACKWARD once per process), so that one process times every walk. A spec
    without a walk changes nothing; one with a walk needs a test build (bench.gpu.build's)."""
    _, walk = split_backend(spec)
    if walk is None:
        yield
        return
    from scl_kernels._testing import test_hooks
    with test_hooks(symmetric_backward_walk=walk):
        yield


def walk_that_ran(kernel_names):
    """Which CUDA C++ symmetric backward walk the profiled kernels show, or None (no sm90 walk
    kernel of either: another backend, or the mma.sync family)."""
    ran = {walk for walk, tag in WALK_KERNEL_TAGS.items()
           if any(tag in name for name in kernel_names)}
    return ran.pop() if len(ran) == 1 else None


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
