"""The ClickHouse sink in its own process: the worker's interpreter keeps detection only.

In one process, chDB's inserts compete with decoding and detection for
one interpreter, and an embedded chDB adds ~400 MB to the worker's memory.
:class:`ProcessSink` keeps the
:class:`~pipeline.sinks.clickhouse.ClickHouseSink` contract, but sends each
batch's rows as one payload to a child process (:mod:`pipeline.sinks.child`)
that writes them: ``request_events`` rows as the JSON that ClickHouse parses
itself (:func:`~pipeline.sinks.rows.event_payload`; the child does not
look inside), whole batch envelopes as the
messages' own bytes (:mod:`pipeline.sinks.batches`), the other tables'
rows as msgpack::

    sink = ProcessSink(settings)        # starts the sink process; raises its set-up error here
    sink.add_events(batch.stored)       # may raise SinkBackpressure (nothing added)
    sink.add_event_batches(batch.envelopes)
    sink.add_verdicts(batch.verdicts)
    await asyncio.to_thread(sink.flush)  # returns once every row added before it is written
    sink.close()

At-least-once: every payload is kept here until the child reports a flush
that covers it. If the child dies, the next :meth:`ProcessSink.flush` starts
a new one, sends it every kept payload again and raises
:class:`~pipeline.sinks.errors.SinkWriteError` (the caller retries, as for a
ClickHouse outage); rows written twice collapse (ReplacingMergeTree, read
with ``FINAL``). The buffer bounds (``max_rows`` per table, ``max_bytes`` of
kept payload per table) therefore bound both processes' buffers. A payload
the child cannot buffer (a bug: the rows passed the parent's checks) is
reported back, logged at ERROR, counted in ``rejected`` and dropped, so one
bad batch cannot stall the worker; so is a ``request_events`` payload that
ClickHouse cannot read. The child exits when the parent's end of
the socket closes, so a killed worker leaves no sink process holding the
chDB directory (:mod:`pipeline.sinks.link`).
"""

from __future__ import annotations

import atexit
import logging
import threading
import time
from collections import deque
from typing import Any, Iterable, Sequence

import msgspec

from pipeline.contracts import RequestEvent, Verdict
from pipeline.sinks.errors import SinkBackpressure, SinkError, SinkWriteError
from pipeline.sinks.link import SinkChild, describe_exit
from pipeline.sinks.retry import FlushRetries
from pipeline.sinks.batches import envelopes_payload
from pipeline.sinks.rows import TABLE_NAMES, event_payload, now_ms

log = logging.getLogger(__name__)

#: Longest wait for the sink process to open ClickHouse and apply the DDL (s).
START_TIMEOUT_S = 120.0
#: Longest wait for a flush's reply (s); then the sink process is replaced. Above the ClickHouse client's
#: own insert timeout (clickhouse-connect: send_receive_timeout, 300 s by default).
FLUSH_REPLY_TIMEOUT_S = 600.0


class ProcessSink(FlushRetries):
    """:class:`~pipeline.sinks.clickhouse.ClickHouseSink`'s contract (:class:`~pipeline.sinks.protocol.Sink`),
    with the writing done in a child process.

    ``settings``: the worker's :class:`~pipeline.config.Settings` (the child
    opens ``settings.clickhouse_url``). ``max_rows`` / ``max_bytes``: bounds
    per table of the rows not yet written (bytes: payload size, ~300 bytes
    per event). Raises :class:`~pipeline.sinks.errors.SinkSetupError`
    or the child's storage error (:class:`~pipeline.storage.errors.StorageError`
    subclasses, same message) when the sink process cannot start.
    """

    def __init__(self, settings: Any, *, max_rows: int | None = None, max_bytes: int | None = None,
                 start_timeout_s: float = START_TIMEOUT_S) -> None:
        self.settings = settings
        self.max_rows = int(max_rows if max_rows is not None else settings.sink_max_rows)
        self.max_bytes = int(max_bytes if max_bytes is not None else settings.sink_max_bytes)
        if self.max_rows < 1 or self.max_bytes < 1:
            raise ValueError(f"sink bounds must be positive, got max_rows={self.max_rows}, max_bytes={self.max_bytes}")
        self.start_timeout_s = start_timeout_s
        self._encode = msgspec.msgpack.Encoder().encode
        #: Payloads sent and not yet reported written: ``(seq, table, ingested_ms, payload, rows)``.
        self._kept: deque[tuple[int, str, int, bytes, int]] = deque()
        self._rows = dict.fromkeys(TABLE_NAMES, 0)
        self._bytes = dict.fromkeys(TABLE_NAMES, 0)
        self._seq = 0
        self._lock = threading.Lock()  # _kept, the counters, _child
        self._flush_lock = threading.Lock()  # one flush at a time (the pipe's receive side)
        #: Rows written per table since the start (as reported by the sink process).
        self.written = dict.fromkeys(TABLE_NAMES, 0)
        #: Rows per table the sink process could not buffer or ClickHouse could not read (logged at ERROR).
        self.rejected = dict.fromkeys(TABLE_NAMES, 0)
        #: Times the sink process was started again after it died.
        self.restarts = 0
        self._closed = False
        #: The running sink process; None while none runs (a restart failed: adds are only kept meanwhile).
        self._child: SinkChild | None = SinkChild(settings, start_timeout_s)

    # -- the child ------------------------------------------------------------------------------------------
    @property
    def pid(self) -> int | None:
        """Process id of the running sink process (None after :meth:`close` or while none runs)."""
        return self._child.pid if self._child is not None and not self._closed else None

    def _restart(self, why: str) -> SinkWriteError:
        """Replace the sink process and send it every kept payload again; returns the error for the flush to raise.

        The new process starts without ``_lock`` held (adds only keep their
        payloads meanwhile, so the caller's event loop never waits for a
        start); when it cannot start, none runs until the next flush tries again.
        """
        with self._lock:
            old, self._child = self._child, None
        if old is not None:
            old.stop(0.0)
        try:
            new = SinkChild(self.settings, self.start_timeout_s)
        except Exception as exc:
            return SinkWriteError(f"{why}; a new sink process could not start: {type(exc).__name__}: {exc}",
                                  table="*", rows=self.pending_rows)
        with self._lock:
            if self._closed:
                new.stop(0.0)
                return SinkWriteError(f"{why}; the sink is closed", table="*", rows=self.pending_rows)
            self._child = new
            self.restarts += 1
            for seq, table, at, payload, rows in self._kept:
                new.send(("add", seq, table, at, rows, payload))
            pending = self.pending_rows
        log.warning("%s; started a new sink process (%d) and sent it the %d unwritten rows again", why, new.pid, pending)
        return SinkWriteError(f"{why}; started a new one with the {pending} unwritten rows", table="*", rows=pending)

    # -- the sink contract ----------------------------------------------------------------------------------
    @property
    def pending_rows(self) -> int:
        """Rows added and not yet reported written, all tables."""
        return sum(self._rows.values())

    def _add(self, table: str, payload: bytes, rows: int, ingested_ms: int) -> None:
        """Send ``payload`` (``rows`` rows of ``table``), or raise ``SinkBackpressure`` (nothing sent).

        Raises :class:`SinkError` after :meth:`close`.
        """
        if rows == 0:
            return
        with self._lock:
            if self._closed:
                raise SinkError("the sink is closed")
            have, size = self._rows[table], self._bytes[table]
            if have and (have + rows > self.max_rows or size + len(payload) > self.max_bytes):
                raise SinkBackpressure(table, have, size, self.max_rows, self.max_bytes)
            self._seq += 1
            self._kept.append((self._seq, table, ingested_ms, payload, rows))
            self._rows[table] += rows
            self._bytes[table] += len(payload)
            if self._child is not None:  # else none runs (a start failed): the next flush starts one and sends it
                self._child.send(("add", self._seq, table, ingested_ms, rows, payload))

    def add_events(self, stored: Iterable[tuple[RequestEvent, bool | None, Sequence[str] | None]]) -> None:
        """Add ``request_events`` rows from ``(event, parse_ok, missing_fields)`` tuples (as ``ClickHouseSink``).

        Raises ``ValueError`` for an unchecked event with missing fields and
        :class:`SinkBackpressure`; in both cases nothing is added.
        """
        stored = stored if isinstance(stored, list) else list(stored)
        if stored:
            self._add("events", event_payload(stored), len(stored), 0)

    def add_event_batches(self, envelopes: Iterable[tuple[bytes, int]]) -> None:
        """Add the ``request_events`` rows of whole batch envelopes (as ``ClickHouseSink``): one payload of
        the messages' bytes. Raises :class:`SinkBackpressure` (nothing added)."""
        envelopes = envelopes if isinstance(envelopes, list) else list(envelopes)
        if envelopes:
            payload, rows = envelopes_payload(envelopes)
            self._add("event_batches", payload, rows, 0)

    def add_verdicts(self, verdicts: Iterable[Verdict], ingested_ms: int | None = None) -> None:
        """Add ``channel_verdicts`` rows. Raises :class:`SinkBackpressure` (nothing added)."""
        verdicts = list(verdicts)
        self._add("verdicts", self._encode(verdicts), len(verdicts), now_ms() if ingested_ms is None else ingested_ms)

    def add_quality_scores(self, rows: Iterable[tuple]) -> None:
        """Add ``quality_scores`` rows built with :func:`~pipeline.sinks.rows.quality_row`."""
        rows = list(rows)
        self._add("quality_scores", self._encode(rows), len(rows), 0)

    def add_quality_labels(self, rows: Iterable[tuple]) -> None:
        """Add ``quality_labels`` rows built with :func:`~pipeline.sinks.rows.label_row`."""
        rows = list(rows)
        self._add("quality_labels", self._encode(rows), len(rows), 0)

    def add_overrides(self, rows: Iterable[tuple]) -> None:
        """Add ``channel_overrides`` audit rows (:func:`pipeline.stream.control.audit_row`)."""
        rows = list(rows)
        self._add("overrides", self._encode(rows), len(rows), 0)

    def flush(self) -> int:
        """Have the sink process write every row added before this call; return the rows written.

        Returns only after ClickHouse accepted them. Raises
        :class:`SinkWriteError` (rows kept, do not commit) when a write failed
        or the sink process died or did not answer (it is replaced, with the
        kept rows, first), :class:`SinkError` after :meth:`close`.
        """
        with self._flush_lock:
            with self._lock:
                if self._closed:
                    raise SinkError("the sink is closed")
                if not self._kept:
                    return 0
                target, child = self._seq, self._child
                if child is not None:
                    child.send(("flush", target))
            if child is None:
                raise self._restart("no sink process was running (the last start failed)")
            try:
                reply = child.reply(FLUSH_REPLY_TIMEOUT_S)
            except TimeoutError:
                raise self._restart(
                    f"the sink process did not answer a flush within {FLUSH_REPLY_TIMEOUT_S:.0f} s") from None
            if reply is None:  # its socket closed: wait for the exit status (a process with many threads takes a moment)
                raise self._restart(f"the sink process {describe_exit(child.exit_code(5.0))} before writing")
            if reply[0] not in ("flushed", "failed") or reply[1] != target:
                raise self._restart(f"the sink process answered {reply[:2]!r} to flush {target}")
            self._drop_rejected(reply[3])
            if reply[0] == "failed":
                raise SinkWriteError(reply[2], table="*", rows=self.pending_rows)
            counts = reply[2]
            with self._lock:
                while self._kept and self._kept[0][0] <= target:
                    self._release(self._kept.popleft())
                for table, n in counts.items():
                    self.written[table] += n
            return sum(counts.values())

    def _drop_rejected(self, rejected: list[tuple[int, str, str]]) -> None:
        """Forget payloads the sink process could not buffer or write (``(seq, table, reason)``), logging each
        at ERROR."""
        if not rejected:
            return
        by_seq = {seq: reason for seq, _table, reason in rejected}
        with self._lock:
            kept: deque[tuple[int, str, int, bytes, int]] = deque()
            for entry in self._kept:
                seq, table, _, _, rows = entry
                if seq not in by_seq:
                    kept.append(entry)
                    continue
                self._release(entry)
                self.rejected[table] += rows
                log.error("the sink process could not buffer or write %d %s rows (payload %d), they are not stored: %s",
                          rows, table, seq, by_seq[seq])
            self._kept = kept

    def _release(self, entry: tuple[int, str, int, bytes, int]) -> None:
        """Take a payload that left ``_kept`` off the per-table counters (call with ``_lock`` held)."""
        _, table, _, payload, rows = entry
        self._rows[table] -= rows
        self._bytes[table] -= len(payload)

    def close(self, timeout_s: float = 30.0) -> None:
        """Stop the sink process (rows not yet flushed are not written: flush first). Idempotent.

        Waits up to ``timeout_s`` for a flush in progress to end first.
        """
        got = self._flush_lock.acquire(timeout=timeout_s)
        try:
            with self._lock:
                if self._closed:
                    return
                self._closed = True
                child, self._child = self._child, None
            if child is None:
                return
            child.send(("close",))
            started = time.monotonic()
            code = child.stop(timeout_s)
            log.info("sink process stopped in %.1f s (%s)", time.monotonic() - started, describe_exit(code))
        finally:
            if got:
                self._flush_lock.release()

    def __enter__(self) -> "ProcessSink":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def open_sink(settings: Any) -> Any:
    """The worker's sink for ``settings``: a :class:`ProcessSink` when ``settings.sink_process`` (the default),
    else an in-process :class:`~pipeline.sinks.clickhouse.ClickHouseSink`. Raises as their constructors.

    A ProcessSink is closed when the interpreter exits (``atexit``: faust's
    worker ends with ``sys.exit``, after the drain whose last flush it serves).
    """
    if getattr(settings, "sink_process", True):
        sink = ProcessSink(settings)
        atexit.register(sink.close)
        return sink
    from pipeline.sinks.clickhouse import ClickHouseSink

    return ClickHouseSink.from_settings(settings)
