"""Resident memory of the current process: samples over time and the peak.

:class:`RssSampler` samples ``psutil``'s RSS on a daemon thread (default
every 0.2 s) and can be asked for a labelled sample at any point (e.g. once
per replayed event-time hour). :func:`peak_rss_mb` is the kernel's own
high-water mark (``getrusage(RUSAGE_SELF).ru_maxrss``), which also catches
spikes between samples.
"""

from __future__ import annotations

import ctypes
import resource
import sys
import threading
import time

import psutil

_MB = 1024 * 1024


def rss_mb() -> float:
    """Current resident set size of this process, MiB."""
    return psutil.Process().memory_info().rss / _MB


def malloc_trim() -> bool:
    """glibc ``malloc_trim(0)``: hand the heap's free pages back to the OS (malloc_trim(3)), so that an RSS
    read next holds what the process uses, not what the allocator keeps cached after temporaries were
    freed. False where there is no glibc (the RSS is then read untrimmed)."""
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return False
    return bool(libc.malloc_trim(0))


def peak_rss_mb(pid: int | None = None) -> float:
    """Peak resident set size so far, MiB (kernel high-water mark) of this process, or of process ``pid``.

    On Linux the peak is ``VmHWM`` in ``/proc/PID/status`` (``/proc/self`` for this process: the memory of
    this program since its exec, not its parent's); elsewhere this process's ``ru_maxrss``. Raises
    ``OSError`` where that file cannot be read (another OS for ``pid``, process gone).
    """
    if pid is not None or sys.platform.startswith("linux"):
        # This process's own high-water mark too: ``ru_maxrss`` keeps the larger of it and the pre-exec
        # memory's (Linux ``exec_mmap`` → ``setmax_mm_hiwater_rss``), so a stage spawned by a bench
        # parent holding a large pre-built feed reported the parent's peak as its own.
        where = f"/proc/{pid if pid is not None else 'self'}/status"
        with open(where) as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
        raise OSError(f"no VmHWM in {where}")
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / (_MB if sys.platform == "darwin" else 1024)


class RssSampler:
    """Background RSS sampling; use as a context manager or call :meth:`start` / :meth:`stop`.

    ``interval_s`` > 0; ``pid``: the process to sample (default this one).
    ``samples``: ``(seconds since start, MiB)``; ``started_s``: :func:`time.monotonic` at :meth:`start`;
    ``marks``: ``(label, MiB)`` from :meth:`mark`.
    """

    def __init__(self, interval_s: float = 0.2, pid: int | None = None):
        if interval_s <= 0:
            raise ValueError("interval_s must be > 0")
        self.interval_s = interval_s
        self.pid = pid
        self.samples: list[tuple[float, float]] = []
        self.marks: list[tuple[str, float]] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.started_s = time.monotonic()

    def start(self) -> "RssSampler":
        self.started_s = time.monotonic()
        self._thread = threading.Thread(target=self._run, name="rss-sampler", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(2.0)

    def mark(self, label: str) -> float:
        """Take a labelled sample now; returns it (MiB)."""
        v = psutil.Process(self.pid).memory_info().rss / _MB
        self.marks.append((label, round(v, 1)))
        return v

    @property
    def max_mb(self) -> float:
        """Largest sampled RSS (MiB), or 0.0 before the first sample."""
        values = [v for _, v in self.samples] + [v for _, v in self.marks]
        return max(values, default=0.0)

    def _run(self) -> None:
        proc = psutil.Process(self.pid)
        while not self._stop.is_set():
            try:
                rss_mb = round(proc.memory_info().rss / _MB, 1)
                self.samples.append((round(time.monotonic() - self.started_s, 2), rss_mb))
            except psutil.Error:  # the sampled process ended
                return
            self._stop.wait(self.interval_s)

    def __enter__(self) -> "RssSampler":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
