"""The bounded buffer behind every table sink: row and byte bounds, backpressure, locks.

:class:`BoundedBuffer` is the part of the sink contract (:mod:`pipeline.sinks.table`)
that :class:`~pipeline.sinks.table.TableSink` (Arrow blocks) and
:class:`~pipeline.sinks.json_table.JsonTableSink` (JSON payloads) share: an
add that would take a non-empty buffer over ``max_rows`` or ``max_bytes``
raises :class:`~pipeline.sinks.errors.SinkBackpressure` and adds nothing (an
oversized add into an empty buffer is accepted, so progress is always
possible).

>>> b = BoundedBuffer("t", max_rows=10, max_bytes=100)
>>> with b._lock:
...     b._take_room(8, 50)
>>> b.pending_rows, b.pending_bytes
(8, 50)
>>> with b._lock:
...     b._take_room(3, 10)  # doctest: +ELLIPSIS
Traceback (most recent call last):
...
pipeline.sinks.errors.SinkBackpressure: sink buffer for t is full (8 rows / 50 bytes buffered, ...
"""

from __future__ import annotations

import threading

from pipeline.sinks.errors import SinkBackpressure
from pipeline.sinks.retry import FlushRetries

#: Default buffer bounds: rows, and estimated bytes (64 MiB).
DEFAULT_MAX_ROWS = 100_000
DEFAULT_MAX_BYTES = 64 * 1024 * 1024
#: A buffer is written once it holds 1/FLUSH_SHARE of its row bound: the worker asks for a flush then
#: (``pipeline.stream.app``), and the sink process writes on its own then (``pipeline.sinks.child``), so a
#: write is under way long before the bound makes the worker wait.
FLUSH_SHARE = 4


class BoundedBuffer(FlushRetries):
    """Counters and bounds of one table's buffer.

    ``table``: ``database.table`` (named in errors). ``max_rows`` /
    ``max_bytes``: bounds, >= 1, else ``ValueError``. ``_lock`` guards the
    buffer and its counters; ``_flush_lock`` lets one flush run at a time.
    """

    def __init__(self, table: str, max_rows: int = DEFAULT_MAX_ROWS, max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        if max_rows < 1 or max_bytes < 1:
            raise ValueError(f"sink bounds must be positive, got max_rows={max_rows}, max_bytes={max_bytes}")
        self.table = table
        self.max_rows = max_rows
        self.max_bytes = max_bytes
        self._rows = 0
        self._bytes = 0
        self._lock = threading.Lock()
        self._flush_lock = threading.Lock()

    @property
    def pending_rows(self) -> int:
        """Rows buffered and not yet written."""
        return self._rows

    @property
    def pending_bytes(self) -> int:
        """Bytes buffered and not yet written (the subclass says how they are counted)."""
        return self._bytes

    def _take_room(self, rows: int, size: int) -> None:
        """Count ``rows`` / ``size`` bytes in, or raise :class:`SinkBackpressure` (call with ``_lock`` held)."""
        if self._rows and (self._rows + rows > self.max_rows or self._bytes + size > self.max_bytes):
            raise SinkBackpressure(self.table, self._rows, self._bytes, self.max_rows, self.max_bytes)
        self._rows += rows
        self._bytes += size

    def _give_back(self, rows: int, size: int) -> None:
        """Count written (or dropped) ``rows`` / ``size`` bytes out (call with ``_lock`` held)."""
        self._rows -= rows
        self._bytes -= size
