"""What the benchmarks compare: supcon_loss and the baselines, the problem each runs on, and a
memory estimate per implementation so that a size that cannot fit is skipped, not crashed."""
import functools
import importlib.util
from dataclasses import dataclass
from typing import Callable, Optional

import torch

import scl_kernels

from . import baselines
from .harness.memory import available_bytes

# supcon_loss backends to benchmark. "auto" is what users get on each device (the fused C++ op
# on CPU, the Triton kernel on CUDA when triton is installed). Add names here, or compare specific ones per
# run: SCL_BENCH_BACKENDS=auto,triton for pytest, --impls scl_kernels,scl_kernels[triton],... for
# the sweep.
FUSED_BACKENDS = ("auto",)
TEMPERATURE = 0.1
NUM_CLASSES = 100
CHUNK_SIZE = 1024

# Fraction of the free memory an estimate may claim: the estimates are rough, and the OS and
# other processes need room too.
MEMORY_HEADROOM = 0.8


# Peak bytes of a forward+backward per logit held at once, from PeakMemory runs at
# N = 1024..8192, float32, CPU, rounded up: good enough to skip sizes that cannot fit.
DENSE_BYTES_PER_LOGIT = 40.0
CHUNKED_BYTES_PER_LOGIT = 64.0
PML_BYTES_PER_LOGIT = 56.0
REFERENCE_BYTES_PER_LOGIT = 40.0  # supcon_loss(backend="reference") is dense too


@dataclass(frozen=True)
class Implementation:
    name: str
    loss: Callable  # (features, labels, temperature) -> scalar loss
    bytes_per_logit: float = 0.0  # baselines; for supcon_loss it follows the resolved backend
    rows_held: Optional[int] = None  # anchor rows whose logits exist at once; None: all N
    backend: Optional[str] = None  # the supcon_loss backend; None for a baseline
    requires: Optional[str] = None  # module it imports

    def resolved_backend(self, device):
        """The backend that actually runs on ``device`` ("auto" resolved), or None."""
        if self.backend == "auto":
            return scl_kernels.backends.auto_backend(device)
        return self.backend

    def is_dense(self, device):
        """Whether it does the N x N work in plain PyTorch on ``device``: every baseline, and
        supcon_loss where it resolves to the reference backend (e.g. CUDA without triton)."""
        return self.backend is None or self.resolved_backend(device) == "reference"

    def not_fused_reason(self, device):
        """Why this supcon_loss implementation would run no fused kernel on ``device`` (None: it
        runs one, or it is a baseline, or the dense reference asked for by name)."""
        if self.backend in (None, "reference"):
            return None
        return scl_kernels.backends.why_not_fused(self.backend, device)

    def estimated_peak_bytes(self, n, d, device):
        per_logit = self.bytes_per_logit
        if self.backend is not None and self.resolved_backend(device) == "reference":
            per_logit = REFERENCE_BYTES_PER_LOGIT
        rows = n if self.rows_held is None else min(n, self.rows_held)
        # Row-sized work (normalised copies, gradients, class sums): a few [N, D] fp32 buffers.
        return per_logit * rows * n + 16 * n * d * 4

    def is_installed(self):
        return self.requires is None or importlib.util.find_spec(self.requires) is not None


def fused(backend):
    name = "scl_kernels" if backend == "auto" else f"scl_kernels[{backend}]"
    return Implementation(name, functools.partial(scl_kernels.supcon_loss, backend=backend),
                          backend=backend)


BASELINES = (
    Implementation("dense", baselines.dense_supcon, DENSE_BYTES_PER_LOGIT),
    Implementation("chunked", functools.partial(baselines.chunked_supcon, chunk_size=CHUNK_SIZE),
                   CHUNKED_BYTES_PER_LOGIT, rows_held=CHUNK_SIZE),
    Implementation("pml", baselines.pml_supcon, PML_BYTES_PER_LOGIT,
                   requires="pytorch_metric_learning"),
)


def implementations(backends=FUSED_BACKENDS):
    return [fused(b) for b in backends] + list(BASELINES)


def by_name(name):
    if name.startswith("scl_kernels"):
        return fused(name[len("scl_kernels["):-1] if name.endswith("]") else "auto")
    for impl in BASELINES:
        if impl.name == name:
            return impl
    raise KeyError(f"unknown implementation {name!r}")


def require_fused(impls, device, program):
    """Exits with one line saying why where an implementation named after the fused op would
    run dense PyTorch (the library failed to load, triton is absent, ...): a benchmark never
    reports the dense reference as fused."""
    for impl in impls:
        if impl.backend not in (None, "reference"):
            scl_kernels.backends.require_fused(impl.backend, device, program)


def make_inputs(n, d, dtype, device, *, num_classes=NUM_CLASSES, seed=0):
    """Single-set SupCon batch: [N, D] features that require grad, labels uniform over classes.
    Drawn on the CPU so every device sees the same numbers."""
    generator = torch.Generator().manual_seed(seed)
    features = torch.randn(n, d, generator=generator).to(device=device, dtype=dtype)
    labels = torch.randint(0, num_classes, (n,), generator=generator).to(device)
    return features.requires_grad_(), labels


def skip_reason(impl, n, d, device):
    """Why ``impl`` cannot run at N x D on ``device`` now, or None."""
    if not impl.is_installed():
        return f"{impl.requires} is not installed"
    not_fused = impl.not_fused_reason(device)
    if not_fused:
        return f"no fused kernel would run: {not_fused}"
    need = impl.estimated_peak_bytes(n, d, device)
    free = available_bytes(device)
    if need > MEMORY_HEADROOM * free:
        return f"needs ~{need / 2**30:.1f} GiB, {free / 2**30:.1f} GiB free"
    return None
