"""A buffered sink for one ClickHouse table fed with encoded JSON rows (the hot path of ``request_events``).

Same contract as :class:`~pipeline.sinks.table.TableSink` (add → flush
returns once ClickHouse accepted the rows, else
:class:`~pipeline.sinks.errors.SinkWriteError` and the rows stay buffered;
:class:`~pipeline.sinks.errors.SinkBackpressure` when full), but what it
buffers is payloads: each a JSON array of rows (``msgspec.json.encode`` of a
list), e.g. one batch's ``request_events`` rows from
:func:`pipeline.sinks.rows.event_payload`, or (``fmt="JSONEachRow"``) JSON
objects one per line, e.g. whole batch envelopes (:mod:`pipeline.sinks.batches`).
A flush joins the buffered payloads into one insert into an input table
(``request_events_input_v2`` after ``infra/clickhouse/006_request_events_input.sql``;
``request_event_envelopes_v2`` after ``011_request_event_envelopes.sql``; both in ``014_error_fields.sql``) whose
materialized view writes the target table. ClickHouse parses the
values natively, so neither the worker nor the sink process touches a value
in Python, which costs less CPU per row than decode → Arrow columns → insert
(docs/THROUGHPUT.md, "Design measurements").

A payload ClickHouse cannot parse (a bug: rows come from validated
contract objects) must not stall every later flush: when an insert fails
with a data error (a ClickHouse parse or type error code, :data:`DATA_ERROR_CODES`)
the payloads are inserted one by one, and one that fails on its own is
handed to the sink's ``salvage`` (if any) to be written another way, else
dropped, logged at ERROR and reported by :meth:`JsonTableSink.take_rejected`.
Any other failure (ClickHouse unreachable, a timeout) keeps every row.
"""

from __future__ import annotations

import logging
import re
import time
from typing import Any, Callable, Hashable

from pipeline.sinks.buffer import DEFAULT_MAX_BYTES, DEFAULT_MAX_ROWS, BoundedBuffer
from pipeline.sinks.errors import SinkWriteError

log = logging.getLogger(__name__)

#: ClickHouse error codes that mean "these bytes are not valid rows of the input table" (ClickHouse
#: ``src/Common/ErrorCodes.cpp``): CANNOT_PARSE_TEXT 6, CANNOT_PARSE_QUOTED_STRING 26,
#: CANNOT_PARSE_INPUT_ASSERTION_FAILED 27, ATTEMPT_TO_READ_AFTER_EOF 32, CANNOT_READ_ALL_DATA 33,
#: CANNOT_PARSE_DATE 38, CANNOT_PARSE_DATETIME 41, TYPE_MISMATCH 53, ARGUMENT_OUT_OF_BOUND 69,
#: CANNOT_CONVERT_TYPE 70, CANNOT_PARSE_NUMBER 72, INCORRECT_DATA 117, CANNOT_READ_ARRAY_FROM_TEXT 130,
#: TOO_LARGE_STRING_SIZE 131, VALUE_IS_OUT_OF_RANGE_OF_DATA_TYPE 321, CANNOT_INSERT_NULL_IN_ORDINARY_COLUMN 349.
DATA_ERROR_CODES = frozenset({6, 26, 27, 32, 33, 38, 41, 53, 69, 70, 72, 117, 130, 131, 321, 349})
_CODE = re.compile(r"Code: (\d+)")

#: Settings of every insert, stated rather than left to the server's defaults (ClickHouse docs,
#: Settings → Format settings): keys of an event the input table does not list are skipped, absent
#: ones are NULL, JSON null in a non-Nullable column (``missing_fields``) is its default (an empty
#: array), true/false read as 1/0. ``input_format_parallel_parsing=0``: one thread parses one insert,
#: cheaper in CPU than parallel parsing for small inserts (docs/THROUGHPUT.md, "Design measurements").
#: ``optimize_on_insert=0``: see :data:`pipeline.sinks.table.INSERT_SETTINGS`.
#: ``input_format_skip_unknown_fields`` / ``input_format_json_read_arrays_as_strings``: for
#: ``JSONEachRow`` envelopes (:mod:`pipeline.sinks.batches`): top-level keys other than ``events`` are
#: skipped, a JSON array read into a String element keeps its JSON text (``missing_fields``).
INSERT_SETTINGS = {
    "input_format_json_ignore_unknown_keys_in_named_tuple": 1,
    "input_format_json_defaults_for_missing_elements_in_named_tuple": 1,
    "input_format_null_as_default": 1,
    "input_format_json_read_bools_as_numbers": 1,
    "input_format_skip_unknown_fields": 1,
    "input_format_json_read_arrays_as_strings": 1,
    "input_format_parallel_parsing": 0,
    "optimize_on_insert": 0,
}

#: The payloads each input format takes: ``JSONCompactEachRow``, a JSON array of rows (``[row, ...]``),
#: joined by their elements; ``JSONEachRow``, JSON objects one per line, joined by a line break.
FORMATS = ("JSONCompactEachRow", "JSONEachRow")


def is_data_error(exc: BaseException) -> bool:
    """True when ``exc`` (a clickhouse-connect / chDB error) carries a ClickHouse code of :data:`DATA_ERROR_CODES`.

    >>> is_data_error(RuntimeError("Code: 27. DB::Exception: Cannot parse input: expected '{'"))
    True
    >>> is_data_error(ConnectionError("ClickHouse unreachable"))
    False
    """
    m = _CODE.search(str(exc))
    return m is not None and int(m.group(1)) in DATA_ERROR_CODES


class JsonTableSink(BoundedBuffer):
    """Buffer JSON row payloads for one input table and write them in one ``JSONCompactEachRow`` insert per flush.

    ``client``: a clickhouse-connect client (HTTP or chDB: ``raw_insert``).
    ``table``: the ``database.table`` the rows end up in (named in errors and
    logs); ``via``: the input table inserted into (e.g.
    ``channel_health.request_events_input``), ``table`` itself by default.
    ``fmt``: the payloads' format, one of :data:`FORMATS`. ``salvage``:
    called with a payload ClickHouse refused as data, to write its rows
    another way (e.g. re-encoded, :func:`pipeline.sinks.batches.salvage_into`);
    the payload is dropped only when that raises a data error too.
    ``max_rows`` / ``max_bytes``: buffer bounds (bytes: payload sizes), >= 1.
    Raises ``ValueError`` for a bad bound or format. Thread-safety as
    :class:`~pipeline.sinks.table.TableSink`.
    """

    def __init__(self, client: Any, table: str, *, via: str | None = None, fmt: str = "JSONCompactEachRow",
                 salvage: Callable[[bytes], None] | None = None, max_rows: int = DEFAULT_MAX_ROWS,
                 max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        if fmt not in FORMATS:
            raise ValueError(f"{table}: format must be one of {FORMATS}, got {fmt!r}")
        super().__init__(table, max_rows, max_bytes)
        self.client = client
        self.via = via or table
        self.fmt = fmt
        self.salvage = salvage
        #: Buffered ``(payload, rows, tag)``; ``tag`` is the caller's name for the payload in rejections.
        #: Bytes counted: the payloads' sizes.
        self._items: list[tuple[bytes, int, Hashable]] = []
        self._rejected: list[tuple[Hashable, int, str]] = []
        #: Rows of payloads dropped since the start (ClickHouse could not read them).
        self.rejected_rows = 0

    def add_payload(self, payload: bytes, rows: int, tag: Hashable = None) -> None:
        """Buffer one payload of ``rows`` rows (``rows`` >= 0; an empty one is ignored), as :data:`FORMATS` says.

        ``tag``: returned with the payload by :meth:`take_rejected` if it is
        dropped. Raises ``ValueError`` when ``payload`` is not a JSON array
        (``JSONCompactEachRow``) or an object (``JSONEachRow``) by its first
        and last bytes, :class:`SinkBackpressure` (nothing buffered) when the
        buffer holds rows and would exceed a bound.
        """
        if rows <= 0:
            return
        ends = b"[]" if self.fmt == "JSONCompactEachRow" else b"{}"
        if payload[:1] != ends[:1] or payload[-1:] != ends[1:]:
            what = "a JSON array of rows" if self.fmt == "JSONCompactEachRow" else "JSON objects, one per line"
            raise ValueError(f"{self.table}: a payload must be {what}, got {payload[:40]!r}...")
        with self._lock:
            self._take_room(rows, len(payload))
            self._items.append((payload, rows, tag))

    def take_rejected(self) -> list[tuple[Hashable, int, str]]:
        """The payloads dropped since the last call, as ``(tag, rows, reason)``, and forget them."""
        with self._lock:
            out, self._rejected = self._rejected, []
        return out

    def flush(self) -> int:
        """Write every buffered payload in one insert; return the rows written (0 if none).

        Returns only after ClickHouse accepted them (rows of payloads it
        rejected as data errors are dropped, see the module doc). Raises
        :class:`SinkWriteError` when an insert fails otherwise; the rows not
        written stay buffered.
        """
        with self._flush_lock:
            with self._lock:
                items = list(self._items)
            if not items:
                return 0
            started = time.monotonic()
            try:
                self._insert(items)
                written = sum(rows for _, rows, _ in items)
            except Exception as exc:
                if not is_data_error(exc):
                    raise self._write_error(items, exc) from exc
                log.warning("%s rejected an insert of %d payloads as bad data (%s); inserting them one by one",
                            self.table, len(items), _first_line(exc))
                written = self._one_by_one(items)
            self._forget(items)
            log.debug("wrote %d rows to %s in %.3fs", written, self.table, time.monotonic() - started)
            return written

    def _one_by_one(self, items: list[tuple[bytes, int, Hashable]]) -> int:
        """Insert ``items`` separately, dropping those ClickHouse rejects as data; returns the rows written.

        On another error the items done so far are forgotten and
        :class:`SinkWriteError` is raised for the rest.
        """
        written = 0
        for done, item in enumerate(items):
            payload, rows, tag = item
            try:
                self._insert([item])
                written += rows
            except Exception as exc:
                unreadable = is_data_error(exc)
                if unreadable and self.salvage is not None:
                    exc = self._salvaged(payload, rows, exc)
                    if exc is None:
                        written += rows
                        continue
                    unreadable = is_data_error(exc) or isinstance(exc, ValueError)  # (msgspec's errors are)
                if not unreadable:
                    self._forget(items[:done])
                    raise self._write_error(items[done:], exc) from exc
                reason = _first_line(exc)
                log.error("%s: dropped a payload of %d rows that ClickHouse cannot read (tag %r): %s",
                          self.table, rows, tag, reason)
                with self._lock:
                    self._rejected.append((tag, rows, reason))
                    self.rejected_rows += rows
        return written

    def _salvaged(self, payload: bytes, rows: int, refused: Exception) -> Exception | None:
        """Write a payload ClickHouse refused through ``salvage``; None when done, else the error it raised."""
        try:
            self.salvage(payload)  # type: ignore[misc]
        except Exception as exc:  # noqa: BLE001 - judged by the caller like an insert error
            return exc
        log.warning("%s: ClickHouse refused a payload of %d rows as it came (%s); wrote its rows re-encoded",
                    self.table, rows, _first_line(refused))
        return None

    def _insert(self, items: list[tuple[bytes, int, Hashable]]) -> None:
        if self.fmt == "JSONCompactEachRow":  # rows of all payloads, one JSON array's elements
            body = b",".join(memoryview(payload)[1:-1] for payload, _, _ in items)  # (slices: copied once)
        else:
            body = b"\n".join(payload for payload, _, _ in items)
        self.client.raw_insert(self.via, insert_block=body, fmt=self.fmt, settings=INSERT_SETTINGS)

    def write_now(self, payload: bytes) -> None:
        """Insert one payload at once, outside the buffer (raises the client's error, e.g. for
        :func:`is_data_error`); for a salvage of another sink."""
        self._insert([(payload, 0, None)])

    def _forget(self, items: list[tuple[bytes, int, Hashable]]) -> None:
        """Take ``items`` (the buffer's first ``len(items)``: adds only append) off the buffer."""
        with self._lock:
            del self._items[: len(items)]
            self._give_back(sum(rows for _, rows, _ in items), sum(len(payload) for payload, _, _ in items))

    def _write_error(self, items: list[tuple[bytes, int, Hashable]], exc: Exception) -> SinkWriteError:
        rows = sum(r for _, r, _ in items)
        return SinkWriteError(f"insert of {rows} rows into {self.table} failed: {type(exc).__name__}: {exc}",
                              table=self.table, rows=rows)


def _first_line(exc: BaseException) -> str:
    """``exc``'s message up to its first line break (ClickHouse appends long row dumps), at most 500 characters."""
    text = f"{type(exc).__name__}: {exc}"
    return text.split("\n", 1)[0][:500]
