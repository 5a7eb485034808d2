"""Peak memory of a block of work, for the demo and the benchmarks.

CUDA: the caching allocator's peak. CPU: the process's resident set, whose high-water mark Linux
lets a process reset (ru_maxrss alone never goes down, so it cannot separate two calls).
"""
import ctypes
import threading
from typing import Literal, Optional, Union

import torch


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def process_status_bytes(field: str) -> int:
    """A memory field of /proc/self/status (``VmRSS``, ``VmHWM``, ``VmSize``, ...) in bytes."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024  # the file gives kB
    raise OSError(f"{field} not in /proc/self/status")


def _release_free_heap() -> None:
    # glibc keeps freed blocks below its (adaptive, up to 32 MiB) mmap threshold resident; they
    # would hide this call's allocations behind an inflated starting RSS. malloc_trim hands them
    # back to the OS. Without glibc there is nothing to do.
    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):
        pass


def _reset_peak_rss() -> bool:
    # Linux lets a process reset its own RSS high-water mark (VmHWM, also what ru_maxrss
    # reports); that makes the peak exact and per call, not per process.
    try:
        with open("/proc/self/clear_refs", "w") as clear_refs:
            clear_refs.write("5")
        return True
    except OSError:
        return False


class _RssSampler(threading.Thread):
    """Fallback where VmHWM cannot be reset: samples RSS every millisecond (may miss spikes
    shorter than that, which are rarely the large allocations that matter)."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self._done = threading.Event()
        self.peak = process_status_bytes("VmRSS")

    def run(self) -> None:
        while not self._done.wait(0.001):
            self.peak = max(self.peak, process_status_bytes("VmRSS"))

    def stop(self) -> int:
        self._done.set()
        self.join()
        self.peak = max(self.peak, process_status_bytes("VmRSS"))
        return self.peak


class PeakMemory:
    """Context manager: ``peak_bytes`` is the highest memory use inside the block minus the use
    at entry, i.e. what the call needs beyond its inputs.

    CUDA: the caching allocator's ``max_memory_allocated`` (tensor memory, not cached blocks).
    CPU: the process' resident set, since torch's CPU allocator returns large blocks to the OS.
    """

    def __init__(self, device: Union[torch.device, str]) -> None:
        self.device = torch.device(device)
        self.peak_bytes: Optional[int] = None
        self._sampler: Optional[_RssSampler]  # set by __enter__, as _start
        self._start: int

    def __enter__(self) -> "PeakMemory":
        _synchronize(self.device)
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
            self._start = torch.cuda.memory_allocated(self.device)
        else:
            _release_free_heap()
            self._sampler = None if _reset_peak_rss() else _RssSampler()
            if self._sampler is None:
                self._start = process_status_bytes("VmRSS")
            else:
                self._start = self._sampler.peak
                self._sampler.start()
        return self

    def __exit__(self, *exc: object) -> Literal[False]:
        _synchronize(self.device)
        if self.device.type == "cuda":
            peak = torch.cuda.max_memory_allocated(self.device)
        elif self._sampler is None:
            peak = process_status_bytes("VmHWM")
        else:
            peak = self._sampler.stop()
        self.peak_bytes = max(0, peak - self._start)
        return False
