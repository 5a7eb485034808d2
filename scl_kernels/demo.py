"""The main job: SupCon loss and gradient on a large batch, fused against dense PyTorch.

    python -m scl_kernels.demo [--n 16384] [--dim 128] [--classes 100] [--device cpu]

Prints the time and peak memory of each and how far apart their losses and gradients are (MB and
GB: 10^6 and 10^9 bytes). The dense half needs about 21 bytes per pair of rows (~5.7 GB at
N = 16,384); it is skipped, with a message, when the machine has less memory available than that.
"""
import argparse
import math
import os
import sys
import threading
import time
from typing import Callable, Dict, List, Literal, Optional, Sequence, TextIO, Tuple, Union

import torch

from ._types import BackendName
from .backends import require_fused
from .command_threads import prepare_command_threads
from .functional import supcon_loss
from .profiling import PeakMemory

# ------------------------------------------------------------------------------------------
# How much memory the dense half needs, and whether the machine has it
# ------------------------------------------------------------------------------------------

# Peak memory of dense PyTorch SupCon (backend="reference"), forward + backward, float32, above
# its inputs, as scl_kernels.profiling.PeakMemory measures it. Its N x N terms are about five
# float32 matrices alive at once (logits, their softmax, their gradients) plus boolean masks.
# Measured on the 2-core CPU machine (torch 2.13), in MiB:
#
#     N \ D      16      128     512
#     4,096     369-396  356-362  409-422
#     8,192    1,345    1,351-1,358  1,378-1,388
#     16,384           5,398-5,402
#
# 21.1 bytes per pair of rows from N = 8,192 on; below that, allocator slack adds a few tens of
# MiB, which the constant term covers. The estimate errs a little on the high side.
DENSE_BYTES_PER_PAIR = 21.2
DENSE_BYTES_PER_VALUE = 16  # N x D terms: copies of the features, normalised rows, gradients
DENSE_FIXED_BYTES = 64 * 2**20
# The dense half runs only if its estimate is within this share of the available memory; the
# rest is for the process itself and everything else on the machine.
MEMORY_HEADROOM = 0.9


def dense_peak_bytes(n: int, dim: int) -> int:
    """Estimated peak memory (bytes) of the dense reference's forward + backward on float32
    features of shape [n, dim]."""
    return int(DENSE_BYTES_PER_PAIR * n * n + DENSE_BYTES_PER_VALUE * n * dim + DENSE_FIXED_BYTES)


def largest_dense_batch(dim: int, available_bytes: int) -> int:
    """The largest N whose dense estimate fits in MEMORY_HEADROOM of ``available_bytes`` (0 if
    none does)."""
    budget = MEMORY_HEADROOM * available_bytes - DENSE_FIXED_BYTES
    if budget <= 0:
        return 0
    a, b = DENSE_BYTES_PER_PAIR, DENSE_BYTES_PER_VALUE * dim
    n = int((-b + math.sqrt(b * b + 4 * a * budget)) / (2 * a))
    while n > 0 and dense_peak_bytes(n, dim) > MEMORY_HEADROOM * available_bytes:
        n -= 1
    return n


def _meminfo_available() -> Optional[int]:
    with open("/proc/meminfo") as meminfo:
        for line in meminfo:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return None


def _read_int(path: str) -> Optional[int]:
    with open(path) as f:
        text = f.read().strip()
    return None if text == "max" else int(text)


def _stat_field(path: str, field: str) -> int:
    with open(path) as f:
        for line in f:
            key, _, value = line.partition(" ")
            if key == field:
                return int(value)
    return 0


def cgroup_available_bytes(root: str = "/sys/fs/cgroup") -> Optional[int]:
    """What this process's memory cgroup (a container's limit) still allows, or None without a
    limit. Usage counts the page cache, of which the inactive part is reclaimable."""
    for limit_file, usage_file, stat_file, inactive in (
            ("memory.max", "memory.current", "memory.stat", "inactive_file"),  # cgroup v2
            ("memory/memory.limit_in_bytes", "memory/memory.usage_in_bytes", "memory/memory.stat",
             "total_inactive_file")):  # cgroup v1
        try:
            limit = _read_int(os.path.join(root, limit_file))
            usage = _read_int(os.path.join(root, usage_file))
            reclaimable = _stat_field(os.path.join(root, stat_file), inactive)
        except (OSError, ValueError):
            continue
        if limit is None or usage is None or limit >= 2**60:  # "max", or v1's "no limit"
            return None
        return max(0, limit - max(0, usage - reclaimable))
    return None


def available_memory_bytes(device: Union[torch.device, str]) -> Tuple[Optional[int], str]:
    """(bytes available for new allocations on ``device``, where the figure comes from), or
    (None, reason) when it cannot be told."""
    device = torch.device(device)
    if device.type == "cuda":
        free, _total = torch.cuda.mem_get_info(device)
        return free, "torch.cuda.mem_get_info"
    available: Optional[int] = None
    source = ""  # set with available
    try:
        import psutil
        available, source = psutil.virtual_memory().available, "psutil"
    except ImportError:
        pass
    if available is None:
        try:
            available, source = _meminfo_available(), "/proc/meminfo"
        except (OSError, ValueError):
            pass
    if available is None:
        try:
            available = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
            source = "os.sysconf"
        except (AttributeError, ValueError, OSError):
            return None, "no psutil, /proc/meminfo or os.sysconf figure"
    limit = cgroup_available_bytes()
    if limit is not None and limit < available:
        return limit, "the memory cgroup's limit"
    return available, source


def _gb(nbytes: float) -> str:
    return f"{nbytes / 1e9:.1f} GB"


def dense_skip_reason(n: int, dim: int, available_bytes: Optional[int],
                      source: str = "available memory") -> Optional[str]:
    """Why the dense half should not run with ``available_bytes`` free (None: it fits, or the
    available memory is unknown)."""
    if available_bytes is None:
        return None
    needed = dense_peak_bytes(n, dim)
    if needed <= MEMORY_HEADROOM * available_bytes:
        return None
    fits = largest_dense_batch(dim, available_bytes)
    smaller = (f"; --n {fits} would fit" if fits >= 2 else "")
    return (f"skipping dense PyTorch: at N = {n:,} it needs about {_gb(needed)}, but only "
            f"{_gb(available_bytes)} is available ({source}){smaller}. --force-dense runs it "
            f"anyway.")


# ------------------------------------------------------------------------------------------
# Running and reporting
# ------------------------------------------------------------------------------------------

class _Progress:
    """Prints ``  running <what> ...``, then the elapsed seconds every ``interval`` while the
    block runs (so a long step shows that it is alive), then ``done``."""

    def __init__(self, what: str, interval: float = 5.0,
                 stream: Optional[TextIO] = None) -> None:
        self.what, self.interval = what, interval
        self.stream = stream or sys.stdout
        self._done = threading.Event()

    def _tick(self) -> None:
        while not self._done.wait(self.interval):
            print(f" {time.perf_counter() - self._start:.0f} s", end="", file=self.stream,
                  flush=True)

    def __enter__(self) -> "_Progress":
        print(f"  running {self.what} ...", end="", file=self.stream, flush=True)
        self._start = time.perf_counter()
        self._thread = threading.Thread(target=self._tick, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> Literal[False]:
        self._done.set()
        self._thread.join()
        print(" done" if exc[0] is None else " failed", file=self.stream, flush=True)
        return False


def run(features: torch.Tensor, labels: torch.Tensor, temperature: float,
        backend: BackendName) -> Tuple[torch.Tensor, torch.Tensor, float, int]:
    """Loss and gradient by one backend, with wall time and peak memory growth."""
    x = features.detach().clone().requires_grad_(True)
    with PeakMemory(x.device) as peak:
        start = time.perf_counter()
        loss = supcon_loss(x, labels, temperature, backend=backend)
        loss.backward()
        if x.device.type == "cuda":
            torch.cuda.synchronize()
        seconds = time.perf_counter() - start
    assert x.grad is not None and peak.peak_bytes is not None, "set by backward, by the block's end"
    return loss.detach(), x.grad, seconds, peak.peak_bytes


def _positive_int(minimum: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        value = int(text)
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be at least {minimum}, got {value}")
        return value
    return parse


def _positive_float(text: str) -> float:
    value = float(text)
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"must be positive and finite, got {value}")
    return value


def build_parser() -> argparse.ArgumentParser:
    default_device = "cuda" if torch.cuda.is_available() else "cpu"
    parser = argparse.ArgumentParser(
        prog="python -m scl_kernels.demo",
        description="SupCon loss and gradient on one large random batch, by the fused backend "
                    "and by dense PyTorch: time, peak memory, and how far apart their losses "
                    "and gradients are.",
        epilog=f"Memory: the fused backend needs O(N*D). The dense half builds N x N matrices, "
               f"about {DENSE_BYTES_PER_PAIR:.0f} bytes per pair of rows: "
               f"~{_gb(dense_peak_bytes(16384, 128))} at N = 16,384 (the default), "
               f"~{_gb(dense_peak_bytes(8192, 128))} at 8,192, "
               f"~{_gb(dense_peak_bytes(32768, 128))} at 32,768. It is skipped, with a message, "
               f"when the machine has less memory available (on CUDA: free GPU memory); "
               f"--force-dense runs it anyway. At the default size the dense half takes about "
               f"20-30 s on two CPU cores.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--n", type=_positive_int(2), default=16384,
                        help="batch size N: rows of the [N, D] features")
    parser.add_argument("--dim", type=_positive_int(1), default=128,
                        help="embedding dimension D")
    parser.add_argument("--classes", type=_positive_int(1), default=100,
                        help="number of classes the random labels are drawn from")
    parser.add_argument("--temperature", type=_positive_float, default=0.1,
                        help="softmax temperature t")
    parser.add_argument("--device", default=default_device,
                        help="device of the features (cpu, cuda, cuda:1, ...)")
    dense = parser.add_mutually_exclusive_group()
    dense.add_argument("--skip-dense", action="store_true",
                       help="only run the fused backend")
    dense.add_argument("--force-dense", action="store_true",
                       help="run the dense half even when the available memory looks too small")
    return parser


def main(argv: Optional[Sequence[str]] = None) -> None:
    args = build_parser().parse_args(argv)

    generator = torch.Generator().manual_seed(0)
    features = torch.randn(args.n, args.dim, generator=generator).to(args.device)
    labels = torch.randint(0, args.classes, (args.n,), generator=generator).to(args.device)
    # The demo compares the two: dense PyTorch must never be the "fused" side.
    fused = require_fused("auto", args.device, "python -m scl_kernels.demo")
    print(f"SupCon, N={args.n}, D={args.dim}, {args.classes} classes, t={args.temperature}, "
          f"float32 on {args.device} ({torch.get_num_threads()} threads)", flush=True)

    implementations: List[Tuple[str, BackendName]] = [("fused (" + fused + ")", fused)]
    if not args.skip_dense:
        available, source = available_memory_bytes(features.device)
        reason = (None if args.force_dense
                  else dense_skip_reason(args.n, args.dim, available, source))
        if reason is not None:
            print(f"  {reason}", flush=True)
        else:
            if available is None:
                print(f"  cannot tell the available memory ({source}); the dense half needs about "
                      f"{_gb(dense_peak_bytes(args.n, args.dim))}", flush=True)
            implementations.append(("dense PyTorch", "reference"))

    # A small warm-up call, so that one-time set-up is not charged to either side.
    supcon_loss(features[:256], labels[:256], args.temperature, backend=fused)
    results: Dict[str, Tuple[torch.Tensor, torch.Tensor, float, int]] = {}
    for name, backend in implementations:
        with _Progress(name):
            results[name] = run(features, labels, args.temperature, backend)

    print("\n| implementation | loss | fwd+bwd s | peak memory MB |\n|---|---|---|---|")
    for name, (loss, _, seconds, peak) in results.items():
        print(f"| {name} | {loss.item():.6f} | {seconds:.3f} | {peak / 1e6:.0f} |")
    if len(results) == 2:
        (loss_a, grad_a, sec_a, mem_a), (loss_b, grad_b, sec_b, mem_b) = results.values()
        grad_err = ((grad_a - grad_b).abs().max() / grad_b.abs().max()).item()
        print(f"\nfused is {sec_b / sec_a:.1f}x faster and uses {mem_b / max(mem_a, 1):.0f}x less "
              f"memory; |loss diff| = {abs(loss_a - loss_b).item():.2e}, max grad diff / max grad "
              f"= {grad_err:.2e}")


if __name__ == "__main__":
    prepare_command_threads()
    main()
