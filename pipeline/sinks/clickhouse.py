"""The pipeline's ClickHouse sink: one buffered sink per table.

:class:`ClickHouseSink` is what the stream worker holds::

    sink = ClickHouseSink.from_settings(settings)   # opens the client, applies the DDL
    sink.add_events(batch.stored)                   # [(RequestEvent, parse_ok, missing_fields)]: one JSON payload
    sink.add_event_batches(batch.envelopes)         # [(envelope bytes, events)]: the messages as they came
    sink.add_verdicts(batch.verdicts)               # [Verdict]
    await asyncio.to_thread(sink.flush)             # then commit offsets

It keeps the worker's :class:`~pipeline.sinks.protocol.Sink` contract, and
follows the contract of :mod:`pipeline.sinks.table` for every table:
``add_*`` raises :class:`SinkBackpressure` (nothing added) when that table's
buffer is full, ``flush`` returns only after every buffered row was written
and raises :class:`SinkWriteError` otherwise (unwritten rows stay buffered;
do not commit offsets). Rows are written with UTC epoch-millisecond
timestamps; re-writing is idempotent (ReplacingMergeTree, read with FINAL).
``request_events`` rows go through :class:`~pipeline.sinks.json_table.JsonTableSink`
(JSON payloads that ClickHouse parses itself; a payload it cannot read is
dropped, logged at ERROR and counted in ``rejected``), whole batch
envelopes through a second one (``event_batches``, :mod:`pipeline.sinks.batches`:
an envelope payload ClickHouse refuses is written as rows instead), the
other tables through Arrow :class:`TableSink` buffers.

Row builders (:func:`event_row`, :func:`verdict_row`, :func:`quality_row`,
:func:`label_row`) live in :mod:`pipeline.sinks.rows` and are re-exported here.
"""

from __future__ import annotations

import logging
from typing import Any, Iterable, Sequence

from pipeline.config import Settings
from pipeline.contracts import RequestEvent, Verdict
from pipeline.sinks.errors import SinkBackpressure, SinkError, SinkSetupError, SinkWriteError
from pipeline.sinks.batches import envelopes_payload, salvage_into
from pipeline.sinks.json_table import JsonTableSink
from pipeline.sinks.retry import FlushRetries
from pipeline.sinks.rows import (
    EVENT_BATCHES_TABLE,
    EVENTS_INPUT_TABLE,
    EVENTS_TABLE,
    QUALITY_LABEL_COLUMNS,
    QUALITY_LABELS_TABLE,
    QUALITY_SCORE_COLUMNS,
    QUALITY_SCORES_TABLE,
    OVERRIDE_COLUMNS,
    OVERRIDES_TABLE,
    TABLE_NAMES,
    VERDICT_COLUMNS,
    VERDICTS_TABLE,
    event_payload,
    event_row,
    label_row,
    now_ms,
    quality_row,
    verdict_row,
)
from pipeline.sinks.buffer import DEFAULT_MAX_BYTES, DEFAULT_MAX_ROWS
from pipeline.sinks.table import TableSink

log = logging.getLogger(__name__)

__all__ = [
    "ClickHouseSink",
    "TableSink",
    "SinkError",
    "SinkSetupError",
    "SinkWriteError",
    "SinkBackpressure",
    "event_row",
    "verdict_row",
    "quality_row",
    "label_row",
]


class ClickHouseSink(FlushRetries):
    """Buffered at-least-once writer of ``request_events``, ``channel_verdicts``,
    ``quality_scores`` and ``quality_labels``.

    ``client``: a clickhouse-connect client whose database has the schema
    (:func:`pipeline.storage.schema.apply_ddl`). ``max_rows`` / ``max_bytes``:
    buffer bounds per table. Raises :class:`SinkSetupError` when a table or
    column is missing.
    """

    def __init__(self, client: Any, *, max_rows: int = DEFAULT_MAX_ROWS, max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        bounds = {"max_rows": max_rows, "max_bytes": max_bytes}
        self.client = client
        self.events = JsonTableSink(client, EVENTS_TABLE, via=EVENTS_INPUT_TABLE, **bounds)
        self.event_batches = JsonTableSink(client, EVENTS_TABLE, via=EVENT_BATCHES_TABLE, fmt="JSONEachRow",
                                           salvage=salvage_into(self.events), **bounds)
        self.verdicts = TableSink(client, VERDICTS_TABLE, VERDICT_COLUMNS, **bounds)
        self.quality_scores = TableSink(client, QUALITY_SCORES_TABLE, QUALITY_SCORE_COLUMNS, **bounds)
        self.quality_labels = TableSink(client, QUALITY_LABELS_TABLE, QUALITY_LABEL_COLUMNS, **bounds)
        self.overrides = TableSink(client, OVERRIDES_TABLE, OVERRIDE_COLUMNS, **bounds)
        self._tables = tuple(getattr(self, name) for name in TABLE_NAMES)
        #: Rows written per table since the start (the :class:`~pipeline.sinks.protocol.Sink` contract).
        self.written = dict.fromkeys(TABLE_NAMES, 0)
        # The first conversion of Python values makes pyarrow import pandas (~0.25 s, 400 modules): pay it
        # here, at start-up, rather than on the first batch of the stream.
        self.verdicts.add([])

    @classmethod
    def from_settings(cls, settings: Settings, **bounds: int) -> "ClickHouseSink":
        """Open the configured ClickHouse (:func:`~pipeline.storage.client.open_client`),
        apply the DDL, and return a sink on it.

        Buffer bounds default to ``settings.sink_max_rows`` / ``sink_max_bytes``.
        With ``settings.fault_sink_down_file`` set (a test hook), inserts fail
        while that file exists (:class:`~pipeline.sinks.faults.OutageSwitchClient`).
        Raises the storage errors of those two steps
        (:class:`~pipeline.storage.errors.StorageError` subclasses).
        """
        from pipeline.storage.client import open_client
        from pipeline.storage.schema import apply_ddl

        client = open_client(settings)
        apply_ddl(client)
        down_file = getattr(settings, "fault_sink_down_file", None)
        if down_file:
            from pipeline.sinks.faults import OutageSwitchClient

            log.warning("fault injection on: ClickHouse inserts fail while %s exists", down_file)
            client = OutageSwitchClient(client, down_file)
        bounds = {"max_rows": getattr(settings, "sink_max_rows", DEFAULT_MAX_ROWS),
                  "max_bytes": getattr(settings, "sink_max_bytes", DEFAULT_MAX_BYTES), **bounds}
        return cls(client, **bounds)

    @property
    def max_rows(self) -> int:
        """Buffer bound per table, rows."""
        return self.events.max_rows

    @property
    def rejected(self) -> dict[str, int]:
        """Rows per table that ClickHouse could not read and that were dropped (logged at ERROR) since the start."""
        return {name: getattr(table, "rejected_rows", 0) for name, table in zip(TABLE_NAMES, self._tables)}

    @property
    def pending_rows(self) -> int:
        """Rows buffered in all tables and not yet written."""
        return sum(t.pending_rows for t in self._tables)

    def add_events(self, stored: Iterable[tuple[RequestEvent, bool | None, Sequence[str] | None]]) -> None:
        """Buffer ``request_events`` rows from ``(event, parse_ok, missing_fields)`` tuples.

        ``missing_fields`` None is stored as an empty list; ``ingested_at`` is
        the time of the insert. Raises ``ValueError`` for an unchecked event
        with missing fields (see :func:`event_row`) and
        :class:`SinkBackpressure`; in both cases nothing is buffered.
        """
        stored = stored if isinstance(stored, list) else list(stored)
        if stored:
            self.events.add_payload(event_payload(stored), len(stored))

    def add_event_payload(self, payload: bytes, rows: int, tag: Any = None) -> None:
        """Buffer ``rows`` ``request_events`` rows encoded by :func:`~pipeline.sinks.rows.event_payload`.

        ``tag`` names the payload in :meth:`take_rejected`. Raises as
        :meth:`JsonTableSink.add_payload <pipeline.sinks.json_table.JsonTableSink.add_payload>`.
        """
        self.events.add_payload(payload, rows, tag)

    def add_event_batches(self, envelopes: Iterable[tuple[bytes, int]]) -> None:
        """Buffer the ``request_events`` rows of whole batch envelopes, ``(message bytes, events)`` as in
        ``ProcessedBatch.envelopes``, as one payload (:func:`~pipeline.sinks.batches.envelopes_payload`).

        Raises ``ValueError`` for bytes that are not a JSON object and
        :class:`SinkBackpressure`; in both cases nothing is buffered.
        """
        envelopes = envelopes if isinstance(envelopes, list) else list(envelopes)
        if envelopes:
            self.event_batches.add_payload(*envelopes_payload(envelopes))

    def add_event_batch_payload(self, payload: bytes, rows: int, tag: Any = None) -> None:
        """Buffer an :func:`~pipeline.sinks.batches.envelopes_payload` of ``rows`` events (as
        :meth:`add_event_payload`)."""
        self.event_batches.add_payload(payload, rows, tag)

    def take_rejected(self) -> list[tuple[Any, str, int, str]]:
        """Payloads dropped by flushes since the last call (ClickHouse could not read them), as
        ``(tag, table, rows, reason)``; they stay counted in :attr:`rejected`."""
        return [(tag, name, rows, reason) for name, table in zip(TABLE_NAMES, self._tables)
                if isinstance(table, JsonTableSink) for tag, rows, reason in table.take_rejected()]

    def add_verdicts(self, verdicts: Iterable[Verdict], ingested_ms: int | None = None) -> None:
        """Buffer ``channel_verdicts`` rows. Raises :class:`SinkBackpressure` (nothing buffered)."""
        at = now_ms() if ingested_ms is None else ingested_ms
        self.verdicts.add([verdict_row(v, at) for v in verdicts])

    def add_quality_scores(self, rows: Iterable[tuple]) -> None:
        """Buffer ``quality_scores`` rows built with :func:`quality_row`."""
        self.quality_scores.add(rows)

    def add_quality_labels(self, rows: Iterable[tuple]) -> None:
        """Buffer ``quality_labels`` rows built with :func:`label_row`."""
        self.quality_labels.add(rows)

    def add_overrides(self, rows: Iterable[tuple]) -> None:
        """Buffer ``channel_overrides`` audit rows (:func:`pipeline.stream.control.audit_row`)."""
        self.overrides.add(rows)

    def flush(self) -> int:
        """Write every table's buffer; return the rows written.

        Tables are flushed in the order of ``TABLE_NAMES`` (events, event
        batches, verdicts, quality scores, labels); the first failure raises
        :class:`SinkWriteError` and leaves that table's rows and those of the
        tables after it buffered (tables before it were written and are not
        rewritten).
        """
        return sum(self.flush_counts().values())

    def flush_counts(self) -> dict[str, int]:
        """:meth:`flush`, returning the rows written per table (``TABLE_NAMES``); raises as :meth:`flush`
        (the tables written before the failure are counted in :attr:`written`)."""
        counts: dict[str, int] = {}
        for name, table in zip(TABLE_NAMES, self._tables):
            counts[name] = table.flush()
            self.written[name] += counts[name]
        return counts
