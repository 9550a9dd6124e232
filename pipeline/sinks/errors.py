"""Errors of the ClickHouse sinks (:mod:`pipeline.sinks.table`, :mod:`pipeline.sinks.clickhouse`)."""

from __future__ import annotations


class SinkError(RuntimeError):
    """Base class of sink errors."""


class SinkSetupError(SinkError):
    """The target table is missing or lacks a column the sink writes (apply the DDL)."""


class SinkWriteError(SinkError):
    """A flush failed; the rows stay buffered and offsets must not be committed.

    ``table``: target table; ``rows``: rows in the failed batch; ``attempts``:
    write attempts made (1 for a plain ``flush()``).
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
