"""Peak-memory measurement for the demo and the benchmarks.

CPU: the process's resident set size sampled by a thread (ru_maxrss never goes down, so it cannot
separate two phases of one process). CUDA: the caching allocator's peak.
"""
import os
import threading
import time

import torch

_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def current_rss_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * _PAGE


class PeakMemory:
    """``with PeakMemory(device) as peak: ...`` then ``peak.bytes``: peak growth over the start."""

    def __init__(self, device="cpu", interval_s=0.002):
        self.device = torch.device(device)
        self.interval_s = interval_s
        self.bytes = 0
        self._stop = threading.Event()

    def __enter__(self):
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            self._start = torch.cuda.memory_allocated(self.device)
        else:
            self._start = current_rss_bytes()
            self._peak = self._start
            self._thread = threading.Thread(target=self._sample, daemon=True)
            self._thread.start()
        return self

    def _sample(self):
        while not self._stop.is_set():
            self._peak = max(self._peak, current_rss_bytes())
            time.sleep(self.interval_s)

    def __exit__(self, *exc):
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            self.bytes = torch.cuda.max_memory_allocated(self.device) - self._start
        else:
            self._stop.set()
            self._thread.join()
            self._peak = max(self._peak, current_rss_bytes())
            self.bytes = self._peak - self._start
        return False
