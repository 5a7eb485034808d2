"""How the benchmarks measure: a training step to time, synchronised wall-clock medians, and the
peak memory a call adds on top of what was allocated before it."""
import math
import statistics
import time

import torch

from scl_kernels.profiling import PeakMemory  # noqa: F401  (the benchmarks import it from here)


def synchronize(device):
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def make_step(loss_fn, features, labels, temperature, *, backward):
    """One call of the loss as in training: the graph is built (features require grad), and
    with ``backward`` the gradient is computed. Returns the detached loss."""
    def step():
        features.grad = None  # so each call allocates, and does, the same as the first
        loss = loss_fn(features, labels, temperature)
        if backward:
            loss.backward()
        synchronize(features.device)
        return loss.detach()
    return step


def median_seconds(fn, device, *, warmup=1, repeats=5, min_seconds=0.0, max_seconds=math.inf):
    """Median seconds per call of ``fn``.

    Each of the ``repeats`` timings runs enough back-to-back calls to last ``min_seconds``, so
    that launch and synchronisation overheads of short calls average out. Timing stops early,
    after at least three timings, once ``max_seconds`` have been spent, so slow baselines do not
    hold a sweep for hours.
    """
    for _ in range(warmup):
        fn()
    synchronize(device)
    start = time.perf_counter()
    fn()
    synchronize(device)
    first = time.perf_counter() - start
    calls = max(1, math.ceil(min_seconds / first)) if first > 0 else 1
    # A call long enough on its own is already a valid timing; slow configurations save one.
    times, spent = ([first], first) if calls == 1 else ([], 0.0)
    while len(times) < repeats and (len(times) < 3 or spent < max_seconds):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        synchronize(device)
        elapsed = time.perf_counter() - start
        times.append(elapsed / calls)
        spent += elapsed
    return statistics.median(times)


def available_bytes(device):
    """Memory a new allocation can still get on ``device``."""
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    import psutil
    return psutil.virtual_memory().available


