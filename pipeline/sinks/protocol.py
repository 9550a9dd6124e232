"""The contract every ``request_events`` / ``channel_verdicts`` / ``channel_overrides`` sink of the worker keeps.

Shaped like quix-streams' sink contract (``quixstreams/sinks/base``: rows
are *added* as they are processed, *flushed* on the checkpoint, and only a
successful flush lets the input offsets be committed): the worker
(:mod:`pipeline.stream.flushing`) adds each batch's rows, a background
flusher calls :meth:`Sink.flush` off the event loop, and a snapshot and the
offset acks follow only a flush that returned.

Implemented by :class:`pipeline.sinks.clickhouse.ClickHouseSink` (writes in
this process) and :class:`pipeline.sinks.process.ProcessSink` (writes in a
child process); ``tests/unit/test_stream_flushing.py`` checks both keep it.
"""

from __future__ import annotations

from typing import Iterable, Mapping, Protocol, runtime_checkable

from pipeline.contracts import Verdict
from pipeline.sinks.batches import StoredRow


@runtime_checkable
class Sink(Protocol):
    """Buffered at-least-once writer: add → flush → written.

    ``add_*`` buffer rows and raise
    :class:`~pipeline.sinks.errors.SinkBackpressure` with nothing added
    when a table's buffer is full (the caller waits for a flush and adds
    again); ``ValueError`` for rows that cannot be stored. :meth:`flush`
    blocks (call it in a thread) until every row added before it is written
    and returns their count, or raises
    :class:`~pipeline.sinks.errors.SinkWriteError` with the unwritten rows
    kept (retry; commit nothing).
    """

    #: Rows written per table since the start (``pipeline.sinks.rows.TABLE_NAMES``).
    written: Mapping[str, int]

    @property
    def pending_rows(self) -> int:
        """Rows added and not yet written, all tables."""

    @property
    def max_rows(self) -> int:
        """Buffer bound per table, rows (>= 1)."""

    def add_events(self, stored: Iterable[StoredRow]) -> None:
        """Buffer ``request_events`` rows ``(event, parse_ok, missing_fields)`` (``ProcessedBatch.stored``)."""

    def add_event_batches(self, envelopes: Iterable[tuple[bytes, int]]) -> None:
        """Buffer whole batch envelopes ``(message bytes, events)`` (``ProcessedBatch.envelopes``)."""

    def add_verdicts(self, verdicts: Iterable[Verdict]) -> None:
        """Buffer ``channel_verdicts`` rows."""

    def add_overrides(self, rows: Iterable[tuple]) -> None:
        """Buffer ``channel_overrides`` audit rows (:func:`pipeline.stream.control.audit_row`)."""

    def flush(self) -> int:
        """Write every buffered row; return how many were written."""
