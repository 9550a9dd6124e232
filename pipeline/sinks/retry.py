"""Retrying a sink flush with exponential backoff.

>>> from itertools import islice
>>> list(islice(backoff_delays(0.1, 1.0), 6))
[0.1, 0.2, 0.4, 0.8, 1.0, 1.0]
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, Callable, Iterator

from pipeline.sinks.errors import SinkWriteError

log = logging.getLogger(__name__)


def backoff_delays(initial_s: float, max_s: float, factor: float = 2.0) -> Iterator[float]:
    """Yield ``initial_s, initial_s*factor, ...`` seconds, capped at ``max_s``, forever.

    Raises ``ValueError`` for ``initial_s <= 0``, ``max_s < initial_s`` or ``factor < 1``.
    """
    if initial_s <= 0 or max_s < initial_s or factor < 1:
        raise ValueError(f"bad backoff: initial_s={initial_s}, max_s={max_s}, factor={factor}")
    delay = initial_s
    while True:
        yield delay
        delay = min(round(delay * factor, 9), max_s)


def retry_flush(
    flush: Callable[[], int],
    max_wait_s: float,
    *,
    initial_backoff_s: float = 0.1,
    max_backoff_s: float = 5.0,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> int:
    """Call ``flush()`` until it returns, retrying :class:`SinkWriteError` for up to ``max_wait_s`` seconds.

    Delays start at ``initial_backoff_s`` and double up to ``max_backoff_s``
    (never past the deadline). Returns what ``flush`` returned (rows written).
    Raises :class:`SinkWriteError` with ``attempts`` set when time is up.
    """
    deadline = clock() + max_wait_s
    attempts = 0
    for delay in backoff_delays(initial_backoff_s, max_backoff_s):
        attempts += 1
        try:
            return flush()
        except SinkWriteError as exc:
            remaining = deadline - clock()
            if remaining <= 0:
                raise _gave_up(exc, attempts, max_wait_s) from exc
            log.warning("%s (attempt %d); retrying in %.2fs", exc, attempts, min(delay, remaining))
            sleep(min(delay, remaining))
    raise AssertionError("unreachable: backoff_delays is infinite")


async def aretry_flush(
    flush: Callable[[], int], max_wait_s: float, *, initial_backoff_s: float = 0.1, max_backoff_s: float = 5.0
) -> int:
    """Async :func:`retry_flush`: each ``flush()`` runs in a worker thread, so the event loop never blocks."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + max_wait_s
    attempts = 0
    for delay in backoff_delays(initial_backoff_s, max_backoff_s):
        attempts += 1
        try:
            return await asyncio.to_thread(flush)
        except SinkWriteError as exc:
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise _gave_up(exc, attempts, max_wait_s) from exc
            log.warning("%s (attempt %d); retrying in %.2fs", exc, attempts, min(delay, remaining))
            await asyncio.sleep(min(delay, remaining))
    raise AssertionError("unreachable: backoff_delays is infinite")


def _gave_up(exc: SinkWriteError, attempts: int, max_wait_s: float) -> SinkWriteError:
    return SinkWriteError(
        f"gave up after {attempts} attempts in {max_wait_s:g}s, rows stay buffered; last error: {exc}",
        table=exc.table,
        rows=exc.rows,
        attempts=attempts,
    )


class FlushRetries:
    """``flush_with_retry`` / ``aflush_with_retry`` for a sink with a blocking ``flush() -> rows written``."""

    flush: Callable[[], int]

    def flush_with_retry(self, max_wait_s: float, **backoff: Any) -> int:
        """:meth:`flush`, retried with exponential backoff for up to ``max_wait_s`` seconds.

        ``backoff``: ``initial_backoff_s``, ``max_backoff_s``, ``sleep``, ``clock``
        (see :func:`~pipeline.sinks.retry.retry_flush`). Raises ``SinkWriteError``
        when time is up; unwritten rows stay buffered.
        """
        return retry_flush(self.flush, max_wait_s, **backoff)

    async def aflush_with_retry(self, max_wait_s: float, **backoff: Any) -> int:
        """Async :meth:`flush_with_retry`; inserts run in a worker thread."""
        return await aretry_flush(self.flush, max_wait_s, **backoff)
