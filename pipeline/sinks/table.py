"""A buffered sink for one ClickHouse table (the quix-streams sink contract).

Contract with the caller (who owns the Kafka offsets):

1. :meth:`TableSink.add` buffers rows (tuples in column order, built by
   :mod:`pipeline.sinks.rows`) as an Arrow block. If the
   buffer already holds rows and the new ones would take it over
   ``max_rows`` or ``max_bytes``, nothing is added and
   :class:`~pipeline.sinks.errors.SinkBackpressure` is raised: pause
   consumption, flush, then add the same rows again. (An oversized batch into
   an empty buffer is accepted, so progress is always possible.)
2. :meth:`TableSink.flush` writes the whole buffer as one Arrow insert and
   returns only after ClickHouse accepted it; then the caller may commit the
   offsets of those messages. On failure it raises
   :class:`~pipeline.sinks.errors.SinkWriteError` and keeps the buffer: do
   NOT commit; retry (:meth:`TableSink.flush_with_retry`).
3. Writing a row twice is harmless: the tables are ReplacingMergeTree keyed
   on the row identity, so duplicates collapse on merge and read exactly with
   ``FINAL``.

Thread-safety: ``add`` and ``flush`` may run on different threads (e.g. the
flush in ``asyncio.to_thread``); one flush runs at a time, and rows added
during a flush stay buffered for the next one.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Iterable, Sequence

import pyarrow as pa

from pipeline.sinks.arrow import arrow_type, rows_to_table
from pipeline.sinks.buffer import DEFAULT_MAX_BYTES, DEFAULT_MAX_ROWS, BoundedBuffer
from pipeline.sinks.errors import SinkSetupError, SinkWriteError

log = logging.getLogger(__name__)

__all__ = ["DEFAULT_MAX_BYTES", "DEFAULT_MAX_ROWS", "INSERT_SETTINGS", "TableSink", "describe"]


#: Settings of every insert. ``optimize_on_insert=0``: ClickHouse does not merge duplicate keys inside
#: the inserted block (ReplacingMergeTree collapses them on merge, and readers use FINAL anyway, see
#: contract point 3), which costs less CPU per row (docs/THROUGHPUT.md, "Design measurements";
#: ClickHouse docs: Settings → optimize_on_insert).
INSERT_SETTINGS = {"optimize_on_insert": 0}


class TableSink(BoundedBuffer):
    """Buffer rows for one table and write them in columnar (Arrow) batches.

    ``client``: a clickhouse-connect client (:func:`pipeline.storage.client.open_client`).
    ``table``: ``database.table``. ``columns``: column names in row-tuple order.
    ``column_types``: ClickHouse type names of ``columns``; read with
    ``DESCRIBE TABLE`` when omitted (raises
    :class:`~pipeline.sinks.errors.SinkSetupError` when the table or a column
    is missing). ``max_rows`` / ``max_bytes``: buffer bounds; bytes are the
    Arrow buffers' size (``pyarrow.Table.nbytes``).
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
        super().__init__(table, max_rows, max_bytes)
        self.client = client
        self.columns = tuple(columns)
        self.column_types = tuple(column_types) if column_types is not None else describe(client, table, self.columns)
        if len(self.column_types) != len(self.columns):
            raise ValueError(f"{len(self.columns)} columns but {len(self.column_types)} column types")
        self.arrow_types = tuple(arrow_type(t) for t in self.column_types)
        self._blocks: list[pa.Table] = []  # bytes counted: the Arrow buffers (``pyarrow.Table.nbytes``)

    def add(self, rows: Iterable[tuple]) -> None:
        """Buffer ``rows`` (tuples in column order), all or none.

        Raises ``ValueError`` when a row's length differs from the column
        count or a value does not fit its column's type,
        :class:`~pipeline.sinks.errors.SinkBackpressure` when the buffer is
        non-empty and would exceed a bound.
        """
        try:
            block = rows_to_table(rows, self.columns, self.arrow_types)
        except ValueError as exc:
            raise ValueError(f"{self.table}: {exc}") from exc
        except TypeError as exc:  # pyarrow.ArrowTypeError
            raise ValueError(f"{self.table}: a value does not fit its column: {exc}") from exc
        n, size = block.num_rows, block.nbytes
        if n == 0:
            return
        with self._lock:
            self._take_room(n, size)
            self._blocks.append(block)

    def flush(self) -> int:
        """Write every buffered row in one insert; return the number written (0 if none).

        Returns only after ClickHouse accepted the batch. Raises
        :class:`~pipeline.sinks.errors.SinkWriteError` (buffer kept) when the
        insert fails.
        """
        with self._flush_lock:
            with self._lock:
                blocks = list(self._blocks)
            if not blocks:
                return 0
            data = pa.concat_tables(blocks) if len(blocks) > 1 else blocks[0]
            rows = data.num_rows
            started = time.monotonic()
            try:
                self.client.insert_arrow(self.table, data, settings=INSERT_SETTINGS)
            except Exception as exc:  # any driver/transport error: keep the buffer
                raise SinkWriteError(
                    f"insert of {rows} rows into {self.table} failed: {type(exc).__name__}: {exc}",
                    table=self.table,
                    rows=rows,
                ) from exc
            with self._lock:
                del self._blocks[: len(blocks)]
                self._give_back(rows, sum(b.nbytes for b in blocks))
            log.debug("wrote %d rows to %s in %.3fs", rows, self.table, time.monotonic() - started)
            return rows


def describe(client: Any, table: str, columns: Sequence[str]) -> tuple[str, ...]:
    """Return the ClickHouse type names of ``columns`` in ``table``.

    Raises :class:`~pipeline.sinks.errors.SinkSetupError` when the table cannot
    be described or lacks a column.
    """
    try:
        result = client.query(f"DESCRIBE TABLE {table}")
    except Exception as exc:
        raise SinkSetupError(f"cannot describe {table} (apply the DDL first): {type(exc).__name__}: {exc}") from exc
    types = {row[0]: row[1] for row in result.result_rows}
    missing = [c for c in columns if c not in types]
    if missing:
        raise SinkSetupError(f"table {table} lacks columns {missing} (apply the current DDL)")
    return tuple(types[c] for c in columns)
