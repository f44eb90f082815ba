"""How many CPU threads a step gets: every core while the cores are free, as many as are free while other work runs.

llama.cpp's CPU threads meet at a barrier after each operation of the graph, hundreds of times a step. While other
processes hold some of the cores, a thread waits at every barrier for a partner the OS has not scheduled yet, and a
step with a thread per core takes several times as long as one with fewer threads. On 2 cores with two spinning
processes beside it, one stream generated 15.1 tok/s with 2 threads and 36.8 with 1 (`scripts/busy_cpu.py`, figures
in docs/benchmarks.md). So the count follows what the machine has free: once a second the cores this
process used plus the cores that stood idle are the cores it can have, and two windows in a row that say so change
the count. Thread counts do not change llama.cpp's CPU numbers (each output is summed by one thread;
`tests/test_threads.py` checks the logits bit for bit), so a change mid-stream moves no token.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

WINDOW_S = 1.0  # seconds of CPU accounting behind each decision
AGREE = 2  # windows in a row that must ask for the same new count


@dataclass(frozen=True, slots=True)
class CpuSample:
    when: float  # time.monotonic()
    idle: float  # CPU-seconds every core of the machine has stood idle, since boot
    ours: float  # CPU-seconds this process has run, every thread


def read_cpu() -> CpuSample | None:
    """The machine's idle time and this process's CPU time now; None where /proc/stat is not there (not Linux)."""
    try:
        fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()
    except OSError:
        return None
    idle_ticks = int(fields[4]) + int(fields[5])  # idle, iowait
    return CpuSample(time.monotonic(), idle_ticks / os.sysconf("SC_CLK_TCK"), time.process_time())


class ThreadTuner:
    """Chooses the thread count of the next steps from how much CPU the machine had free in the last windows."""

    def __init__(
        self, n: int, read: Callable[[], CpuSample | None] = read_cpu, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.max = max(1, n)
        self.current = self.max
        self.changes = 0  # times the count changed
        self.read, self.clock = read, clock
        self._last = read()
        self._asked: list[int] = []  # the counts the last windows asked for

    def threads(self) -> int:
        """The thread count for the next step (cheap: reads the counters once a window)."""
        last = self._last
        if last is None or self.clock() - last.when < WINDOW_S:
            return self.current
        now = self.read()
        if now is None:
            return self.current
        self._last = now
        wall = now.when - last.when
        free = ((now.ours - last.ours) + (now.idle - last.idle)) / wall  # cores we had, plus cores nobody used
        self._asked = [*self._asked, min(self.max, max(1, round(free)))][-AGREE:]
        if len(self._asked) == AGREE and len(set(self._asked)) == 1 and self._asked[0] != self.current:
            self.current = self._asked[0]
            self.changes += 1
        return self.current
