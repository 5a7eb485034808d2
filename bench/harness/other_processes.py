"""What other processes on a shared machine do to a measurement: the share of the cores they use,
and waiting for a quiet spell before timing."""
import os
import resource
import time


class OthersCpu:
    """Share of all cores that other processes use from construction to ``share()``: busy time
    in /proc/stat minus this process' own CPU time. Resolution one clock tick (10 ms) per core, so
    it needs spans of some 50 ms or more. None where /proc/stat cannot be read."""

    def __init__(self):
        self._start = self._sample()

    @staticmethod
    def _sample():
        try:
            busy, total = cpu_jiffies()
        except (OSError, ValueError, IndexError):
            return None
        usage = resource.getrusage(resource.RUSAGE_SELF)
        return busy, total, usage.ru_utime + usage.ru_stime

    def share(self):
        end = self._sample()
        if self._start is None or end is None or end[1] <= self._start[1]:
            return None
        tick = os.sysconf("SC_CLK_TCK")
        busy = (end[0] - self._start[0]) / tick - (end[2] - self._start[2])
        return max(0.0, busy / ((end[1] - self._start[1]) / tick))


def cpu_jiffies():
    with open("/proc/stat") as stat:
        fields = [int(v) for v in stat.readline().split()[1:]]
    idle = fields[3] + fields[4]  # idle + iowait
    return sum(fields[:8]) - idle, sum(fields[:8])


def busy_fraction(seconds=0.5):
    """Share of all cores busy over ``seconds`` while this process sleeps: what other processes
    use. None where /proc/stat cannot be read."""
    others = OthersCpu()
    time.sleep(seconds)
    return others.share()


def wait_until_quiet(threshold, max_wait, *, sample=0.5):
    """Sleeps until other processes use less than ``threshold`` of the cores (busy_fraction), for
    at most ``max_wait`` seconds. Returns the last busy fraction seen (None if unknown)."""
    deadline = time.perf_counter() + max_wait
    while True:
        busy = busy_fraction(sample)
        if busy is None or busy < threshold or time.perf_counter() >= deadline:
            return busy
