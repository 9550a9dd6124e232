"""Buffered, at-least-once ClickHouse sink (the quix-streams sink contract).

Contract with the caller (a stream agent that owns Kafka offsets):

1. :meth:`ClickHouseSink.add` buffers rows built by :mod:`pipeline.sinks.rows`.
   If the buffer already holds rows and the new ones would take it over its
   bound (``max_rows`` or ``max_bytes``), nothing is added and
   :class:`SinkBackpressure` is raised: pause consumption, flush, then add
   the same rows again.
2. :meth:`ClickHouseSink.flush` writes the whole buffer as one columnar insert
   and returns only after ClickHouse accepted it; then the caller may commit
   the offsets of the flushed messages. On failure it raises
   :class:`SinkWriteError` and keeps the buffer, so the caller must NOT commit
   (it retries, e.g. with :meth:`ClickHouseSink.flush_with_retry`).
3. Re-writing rows is harmless: every table is a ReplacingMergeTree keyed on
   the row identity, so a batch written twice (a retry after a timeout whose
   insert did land, or a redelivery after a crash) collapses on merge and
   reads exactly with ``FINAL``.

Timestamps in rows are UTC epoch milliseconds, never naive datetimes.
Thread-safety: ``add`` and ``flush`` may run on different threads (e.g. the
flush in ``asyncio.to_thread``); only one flush runs at a time, and rows added
during a flush stay buffered for the next one.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from typing import Any, Callable, Iterable, Sequence

from pipeline.sinks.backoff import backoff_delays
from pipeline.sinks.rows import (
    EVENT_COLUMNS,
    EVENTS_TABLE,
    QUALITY_LABEL_COLUMNS,
    QUALITY_LABELS_TABLE,
    QUALITY_SCORE_COLUMNS,
    QUALITY_SCORES_TABLE,
    VERDICT_COLUMNS,
    VERDICTS_TABLE,
    event_row,
    label_row,
    quality_row,
    verdict_row,
)

__all__ = [
    "ClickHouseSink",
    "SinkError",
    "SinkSetupError",
    "SinkWriteError",
    "SinkBackpressure",
    "event_row",
    "verdict_row",
    "quality_row",
    "label_row",
]

log = logging.getLogger(__name__)

DEFAULT_MAX_ROWS = 100_000
DEFAULT_MAX_BYTES = 64 * 1024 * 1024


class SinkError(RuntimeError):
    """Base class of sink errors."""


class SinkSetupError(SinkError):
    """The target table is missing or lacks a column the sink writes (apply the DDL)."""


class SinkWriteError(SinkError):
    """A flush failed; the rows stay buffered and offsets must not be committed.

    ``table``: target table; ``rows``: rows in the failed batch; ``attempts``:
    write attempts made (1 for a plain :meth:`ClickHouseSink.flush`).
    """

    def __init__(self, message: str, *, table: str, rows: int, attempts: int = 1) -> None:
        super().__init__(message)
        self.table = table
        self.rows = rows
        self.attempts = attempts


class SinkBackpressure(SinkError):
    """The buffer is full: pause consumption and flush before adding more.

    ``pending_rows`` / ``pending_bytes``: what the buffer holds; ``max_rows`` /
    ``max_bytes``: its bounds. The rows of the refused ``add`` were not buffered.
    """

    def __init__(self, table: str, pending_rows: int, pending_bytes: int, max_rows: int, max_bytes: int) -> None:
        super().__init__(
            f"sink buffer for {table} is full ({pending_rows} rows / {pending_bytes} bytes buffered, "
            f"bounds {max_rows} rows / {max_bytes} bytes): pause consumption and flush"
        )
        self.table = table
        self.pending_rows = pending_rows
        self.pending_bytes = pending_bytes
        self.max_rows = max_rows
        self.max_bytes = max_bytes


class ClickHouseSink:
    """Buffer rows for one table and write them in columnar batches.

    ``client``: a clickhouse-connect client (:func:`pipeline.storage.client.open_client`).
    ``table``: ``database.table``. ``columns``: column names in row-tuple order.
    ``column_types``: ClickHouse type names of ``columns``; looked up with
    ``DESCRIBE TABLE`` when omitted (raises :class:`SinkSetupError` when the
    table or a column is missing). ``max_rows`` / ``max_bytes``: buffer bounds
    (bytes are an estimate of the in-memory payload: string lengths, 8 per number).
    """

    def __init__(
        self,
        client: Any,
        table: str,
        columns: Sequence[str],
        *,
        column_types: Sequence[str] | None = None,
        max_rows: int = DEFAULT_MAX_ROWS,
        max_bytes: int = DEFAULT_MAX_BYTES,
    ) -> None:
        if max_rows < 1 or max_bytes < 1:
            raise ValueError(f"sink bounds must be positive, got max_rows={max_rows}, max_bytes={max_bytes}")
        self.client = client
        self.table = table
        self.columns = tuple(columns)
        self.column_types = tuple(column_types) if column_types is not None else _describe(client, table, self.columns)
        if len(self.column_types) != len(self.columns):
            raise ValueError(f"{len(self.columns)} columns but {len(self.column_types)} column types")
        self.max_rows = max_rows
        self.max_bytes = max_bytes
        self._rows: list[tuple] = []
        self._sizes: list[int] = []
        self._bytes = 0
        self._lock = threading.Lock()
        self._flush_lock = threading.Lock()

    # -- constructors for the schema's tables --------------------------------------------

    @classmethod
    def for_events(cls, client: Any, **bounds: int) -> "ClickHouseSink":
        """Sink for ``request_events`` rows from :func:`event_row`."""
        return cls(client, EVENTS_TABLE, EVENT_COLUMNS, **bounds)

    @classmethod
    def for_verdicts(cls, client: Any, **bounds: int) -> "ClickHouseSink":
        """Sink for ``channel_verdicts`` rows from :func:`verdict_row`."""
        return cls(client, VERDICTS_TABLE, VERDICT_COLUMNS, **bounds)

    @classmethod
    def for_quality_scores(cls, client: Any, **bounds: int) -> "ClickHouseSink":
        """Sink for ``quality_scores`` rows from :func:`quality_row`."""
        return cls(client, QUALITY_SCORES_TABLE, QUALITY_SCORE_COLUMNS, **bounds)

    @classmethod
    def for_quality_labels(cls, client: Any, **bounds: int) -> "ClickHouseSink":
        """Sink for ``quality_labels`` rows from :func:`label_row`."""
        return cls(client, QUALITY_LABELS_TABLE, QUALITY_LABEL_COLUMNS, **bounds)

    # -- buffer -------------------------------------------------------------------------

    @property
    def pending_rows(self) -> int:
        """Rows buffered and not yet written."""
        return len(self._rows)

    @property
    def pending_bytes(self) -> int:
        """Estimated bytes buffered and not yet written."""
        return self._bytes

    def add(self, rows: Iterable[tuple]) -> None:
        """Buffer ``rows`` (all or none).

        Raises ``ValueError`` when a row's length differs from the column
        count, and :class:`SinkBackpressure` when the buffer is non-empty and
        would exceed a bound (an oversized batch into an empty buffer is
        accepted, so progress is always possible).
        """
        new = list(rows)
        width = len(self.columns)
        for row in new:
            if len(row) != width:
                raise ValueError(f"row for {self.table} has {len(row)} values, expected {width}: {row[:3]!r}...")
        sizes = [_row_bytes(row) for row in new]
        added = sum(sizes)
        with self._lock:
            if self._rows and (
                len(self._rows) + len(new) > self.max_rows or self._bytes + added > self.max_bytes
            ):
                raise SinkBackpressure(self.table, len(self._rows), self._bytes, self.max_rows, self.max_bytes)
            self._rows.extend(new)
            self._sizes.extend(sizes)
            self._bytes += added

    # -- writes -------------------------------------------------------------------------

    def flush(self) -> int:
        """Write every buffered row in one insert; return the number written (0 if none).

        Returns only after ClickHouse accepted the batch. Raises
        :class:`SinkWriteError` (buffer kept) when the insert fails.
        """
        with self._flush_lock:
            with self._lock:
                batch = list(self._rows)
                batch_bytes = sum(self._sizes[: len(batch)])
            if not batch:
                return 0
            data = [list(column) for column in zip(*batch)]
            started = time.monotonic()
            try:
                self.client.insert(
                    self.table,
                    data,
                    column_names=list(self.columns),
                    column_type_names=list(self.column_types),
                    column_oriented=True,
                )
            except Exception as exc:  # any driver/transport error: keep the buffer
                raise SinkWriteError(
                    f"insert of {len(batch)} rows into {self.table} failed: {type(exc).__name__}: {exc}",
                    table=self.table,
                    rows=len(batch),
                ) from exc
            with self._lock:
                del self._rows[: len(batch)]
                del self._sizes[: len(batch)]
                self._bytes -= batch_bytes
            log.debug("wrote %d rows to %s in %.3fs", len(batch), self.table, time.monotonic() - started)
            return len(batch)

    def flush_with_retry(
        self,
        max_wait_s: float,
        *,
        initial_backoff_s: float = 0.1,
        max_backoff_s: float = 5.0,
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.monotonic,
    ) -> int:
        """:meth:`flush`, retrying failures with exponential backoff for up to ``max_wait_s`` seconds.

        Delays start at ``initial_backoff_s`` and double up to ``max_backoff_s``.
        Returns the rows written. Raises :class:`SinkWriteError` (with
        ``attempts``) when the time is up; the buffer is kept.
        """
        deadline = clock() + max_wait_s
        attempts = 0
        for delay in backoff_delays(initial_backoff_s, max_backoff_s):
            attempts += 1
            try:
                return self.flush()
            except SinkWriteError as exc:
                remaining = deadline - clock()
                if remaining <= 0:
                    raise self._gave_up(exc, attempts, max_wait_s) from exc
                log.warning("%s (attempt %d), retrying in %.2fs", exc, attempts, min(delay, remaining))
                sleep(min(delay, remaining))
        raise AssertionError("unreachable: backoff_delays is infinite")

    async def aflush_with_retry(
        self, max_wait_s: float, *, initial_backoff_s: float = 0.1, max_backoff_s: float = 5.0
    ) -> int:
        """Async :meth:`flush_with_retry`: each insert runs in a worker thread, so the event loop never blocks."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + max_wait_s
        attempts = 0
        for delay in backoff_delays(initial_backoff_s, max_backoff_s):
            attempts += 1
            try:
                return await asyncio.to_thread(self.flush)
            except SinkWriteError as exc:
                remaining = deadline - loop.time()
                if remaining <= 0:
                    raise self._gave_up(exc, attempts, max_wait_s) from exc
                log.warning("%s (attempt %d), retrying in %.2fs", exc, attempts, min(delay, remaining))
                await asyncio.sleep(min(delay, remaining))
        raise AssertionError("unreachable: backoff_delays is infinite")

    def _gave_up(self, exc: SinkWriteError, attempts: int, max_wait_s: float) -> SinkWriteError:
        return SinkWriteError(
            f"gave up after {attempts} attempts in {max_wait_s:g}s; rows stay buffered; last error: {exc}",
            table=self.table,
            rows=exc.rows,
            attempts=attempts,
        )


def _describe(client: Any, table: str, columns: Sequence[str]) -> tuple[str, ...]:
    """Return the ClickHouse type names of ``columns`` in ``table``."""
    try:
        result = client.query(f"DESCRIBE TABLE {table}")
    except Exception as exc:
        raise SinkSetupError(f"cannot describe {table} (apply the DDL first): {type(exc).__name__}: {exc}") from exc
    types = {row[0]: row[1] for row in result.result_rows}
    missing = [c for c in columns if c not in types]
    if missing:
        raise SinkSetupError(f"table {table} lacks columns {missing} (apply the current DDL)")
    return tuple(types[c] for c in columns)


def _row_bytes(row: tuple) -> int:
    """Estimated in-memory size of a row: string lengths plus 8 per number/None."""
    size = 0
    for value in row:
        if isinstance(value, str):
            size += len(value) + 8
        elif isinstance(value, (list, tuple)):
            size += 8 + sum(len(x) + 8 if isinstance(x, str) else 8 for x in value)
        else:
            size += 8
    return size
