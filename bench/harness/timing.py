"""How every timed benchmark measures: a training step to time, synchronised wall-clock medians
(alone or interleaved in rotated rounds), and CUDA-event medians for GPU-only sweeps."""
import math
import statistics
import time

import torch

from .other_processes import OthersCpu, wait_until_quiet


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


def interleaved_seconds(fns, device, *, warmup=3, rounds=20, min_seconds=0.0,
                        max_seconds=math.inf, min_rounds=5, quiet_threshold=None, max_wait=0.0,
                        round_hook=None):
    """Seconds per call of every function in ``fns`` ({name: fn}), measured in rounds.

    Each round times every function once (a timing is ``calls`` back-to-back calls, enough to last
    ``min_seconds``), in an order rotated by one per round: on a shared machine a slow spell then
    hits all functions alike, and no function always runs right after the same other one.
    Rounds stop after ``rounds``, or once ``max_seconds`` have been spent timing (but never before
    ``min_rounds``).

    With ``quiet_threshold`` (a share of all cores), a round counts only if other processes used
    less than that share while it ran (OthersCpu); a disturbed round is dropped, and before the
    next one the call waits for a quiet spell (wait_until_quiet, at most ``max_wait`` seconds in
    all). Once both budgets are spent, rounds count as they come, so the call always ends.

    ``round_hook(event)``, if given, is called with "start" before each round's timings and with
    "kept" or "dropped" after them (for callables that record more than their duration).

    Returns {name: [seconds per call, one entry per counted round]}, {name: calls per timing} and
    {"dropped": rounds dropped, "disturbed": disturbed rounds counted anyway, "others": median
    share of the cores other processes used during the counted rounds (None if unknown)}.
    """
    names = list(fns)
    calls = {}
    for name in names:
        for _ in range(warmup):
            fns[name]()
        synchronize(device)
        start = time.perf_counter()
        fns[name]()
        synchronize(device)
        first = time.perf_counter() - start
        calls[name] = max(1, math.ceil(min_seconds / first)) if first > 0 else 1
    times = {name: [] for name in names}
    info = {"dropped": 0, "disturbed": 0, "others": None}
    others_seen = []
    spent = waited = 0.0
    wait_first = quiet_threshold is not None
    kept = r = 0
    while kept < rounds and not (kept >= min_rounds and spent > max_seconds):
        if wait_first and waited < max_wait:
            started = time.perf_counter()
            wait_until_quiet(quiet_threshold, max_wait - waited, sample=0.2)
            waited += time.perf_counter() - started
        shift = r % len(names)
        r += 1
        round_times = {}
        if round_hook:
            round_hook("start")
        others = OthersCpu()
        for name in names[shift:] + names[:shift]:
            fn, count = fns[name], calls[name]
            start = time.perf_counter()
            for _ in range(count):
                fn()
            synchronize(device)
            elapsed = time.perf_counter() - start
            round_times[name] = elapsed / count
            spent += elapsed
        share = others.share()
        disturbed = quiet_threshold is not None and share is not None and share >= quiet_threshold
        wait_first = disturbed
        if disturbed and not (spent > max_seconds and waited >= max_wait):
            info["dropped"] += 1
            if round_hook:
                round_hook("dropped")
            continue
        if round_hook:
            round_hook("kept")
        info["disturbed"] += disturbed
        if share is not None:
            others_seen.append(share)
        for name, seconds in round_times.items():
            times[name].append(seconds)
        kept += 1
    if others_seen:
        info["others"] = statistics.median(others_seen)
    return times, calls, info


def cuda_median_ms(fn, *, long_call_ms=50.0, long_repeats=3):
    """Median milliseconds of ``fn`` on the current CUDA device: triton's do_bench for short
    calls; CUDA events over a few calls for long ones, where do_bench's own estimation runs would
    cost minutes."""
    import triton.testing
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    end.record()
    torch.cuda.synchronize()
    first = start.elapsed_time(end)
    if first < long_call_ms:
        return triton.testing.do_bench(fn, warmup=25, rep=200, return_mode="median")
    times = []
    for _ in range(long_repeats):
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)
