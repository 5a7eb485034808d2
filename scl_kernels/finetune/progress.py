"""Progress for long loops: tqdm's redrawn bar on a terminal, whole lines in a redirected log.

A bar redrawn with carriage returns turns a log file into one unreadable line, so where stderr
is not a terminal the same calls print a plain line at each tenth of the work instead.
"""
import sys
import time


class PlainProgress:
    """The part of tqdm's interface the training loop uses, as lines on stderr."""

    STEPS = 10

    def __init__(self, total, desc):
        self.total, self.desc, self.done = total, desc, 0
        self.postfix = ""
        self.started = time.perf_counter()
        self.next_report = 1

    def update(self, count=1):
        self.done += count
        if self.total and self.done * self.STEPS >= self.next_report * self.total:
            self.next_report = self.done * self.STEPS // self.total + 1
            self._line()

    def set_postfix(self, **values):
        self.postfix = ", ".join(f"{key}={value}" for key, value in values.items())

    def close(self):
        if self.total and self.done < self.total:
            self._line()

    def _line(self):
        seconds = time.perf_counter() - self.started
        postfix = f", {self.postfix}" if self.postfix else ""
        print(f"{self.desc}: {self.done}/{self.total} ({seconds:.0f} s{postfix})", file=sys.stderr,
              flush=True)


class _Silent:
    def update(self, count=1):
        pass

    def set_postfix(self, **values):
        pass

    def close(self):
        pass


def progress_bar(total, desc, enabled=True, *, leave=True):
    """A bar (tqdm) on a terminal, plain lines otherwise, nothing when not ``enabled``. A bar
    that does not stay (``leave=False``: short steps such as an evaluation) prints nothing into a
    log."""
    if not enabled:
        return _Silent()
    if sys.stderr.isatty():
        from tqdm import tqdm  # the finetune extra's; imported here so that --help needs none of it
        return tqdm(total=total, desc=desc, leave=leave)
    return PlainProgress(total, desc) if leave else _Silent()
