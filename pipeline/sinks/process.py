"""The ClickHouse sink in its own process: the worker's interpreter keeps detection only.

In one process, building the Arrow columns of ``request_events``
(~1.7 µs of GIL-holding Python per event) and chDB's insert compete with
decoding and detection for one interpreter, and an embedded chDB adds
~400 MB to the worker's memory. :class:`ProcessSink` keeps the
:class:`~pipeline.sinks.clickhouse.ClickHouseSink` contract, but sends each
batch's rows as one msgpack payload (~0.4 µs per event to encode) to a child
process (:mod:`pipeline.sinks.child`) that decodes them, builds the columns
and writes them::

    sink = ProcessSink(settings)        # starts the sink process; raises its set-up error here
    sink.add_events(batch.stored)       # may raise SinkBackpressure (nothing added)
    sink.add_verdicts(batch.verdicts)
    await asyncio.to_thread(sink.flush)  # returns once every row added before it is written
    sink.close()

At-least-once: every payload is kept here until the child reports a flush
that covers it. If the child dies, the next :meth:`ProcessSink.flush` starts
a new one, sends it every kept payload again and raises
:class:`~pipeline.sinks.errors.SinkWriteError` (the caller retries, as for a
ClickHouse outage); rows written twice collapse (ReplacingMergeTree, read
with ``FINAL``). The buffer bounds (``max_rows`` per table, ``max_bytes`` of
kept payload per table) therefore bound both processes' buffers. The child
exits when the parent's end of the pipe closes, so a killed worker leaves no
sink process holding the chDB directory.
"""

from __future__ import annotations

import logging
import queue
import socket
import subprocess
import sys
import threading
import time
from collections import deque
from multiprocessing.connection import Connection
from typing import Any, Iterable, Sequence

import msgspec

from pipeline.contracts import RequestEvent, Verdict
from pipeline.sinks.errors import SinkBackpressure, SinkError, SinkSetupError, SinkWriteError
from pipeline.sinks.retry import FlushRetries
from pipeline.sinks.rows import now_ms, refuse_unchecked_missing

log = logging.getLogger(__name__)

#: Table names (as in :data:`pipeline.sinks.clickhouse.TABLE_NAMES`, not imported: that module needs pyarrow).
TABLES = ("events", "verdicts", "quality_scores", "quality_labels")
#: Longest wait for the sink process to open ClickHouse and apply the DDL (s).
START_TIMEOUT_S = 120.0
#: How often a waiting flush checks that the sink process is still alive (s).
ALIVE_CHECK_S = 1.0


class ProcessSink(FlushRetries):
    """:class:`~pipeline.sinks.clickhouse.ClickHouseSink`'s contract, with the writing done in a child process.

    ``settings``: the worker's :class:`~pipeline.config.Settings` (the child
    opens ``settings.clickhouse_url``). ``max_rows`` / ``max_bytes``: bounds
    per table of the rows not yet written (bytes: msgpack payload size,
    ~240 bytes per event). Raises :class:`~pipeline.sinks.errors.SinkSetupError`
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
        self._rows = dict.fromkeys(TABLES, 0)
        self._bytes = dict.fromkeys(TABLES, 0)
        self._seq = 0
        self._lock = threading.Lock()  # _kept, the counters, the outbox
        self._flush_lock = threading.Lock()  # one flush at a time (the pipe's receive side)
        #: Rows written per table since the start (as reported by the sink process).
        self.written = dict.fromkeys(TABLES, 0)
        #: Times the sink process was started again after it died.
        self.restarts = 0
        self._proc: Any = None
        self._conn: Any = None
        self._closed = False
        #: Messages for the sender thread (sends never block the caller, e.g. the worker's event loop).
        self._outbox: queue.SimpleQueue | None = None
        self._sender: threading.Thread | None = None
        self._start()

    # -- the child ------------------------------------------------------------------------------------------
    def _start(self) -> None:
        """Start a sink process and wait until it opened ClickHouse (call with ``_lock`` held or before use).

        The child is ``python -m pipeline.sinks.child FD`` speaking over a
        socket pair (not ``multiprocessing``'s spawn, which would import the
        worker's ``__main__`` again; never fork a process with threads).
        """
        ours, theirs = socket.socketpair()
        with theirs:
            self._proc = subprocess.Popen([sys.executable, "-m", "pipeline.sinks.child", str(theirs.fileno())],
                                          pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL)
        self._conn = Connection(ours.detach())
        self._conn.send(_plain(self.settings))
        self._outbox = queue.SimpleQueue()
        self._sender = threading.Thread(target=_send_loop, args=(self._conn, self._outbox), name="sink-outbox",
                                        daemon=True)
        self._sender.start()
        if not self._conn.poll(self.start_timeout_s):
            self._stop_child()
            raise SinkSetupError(f"the sink process did not open ClickHouse within {self.start_timeout_s:.0f} s")
        try:
            reply = self._conn.recv()
        except (EOFError, OSError):
            code = self._stop_child()
            raise SinkSetupError(f"the sink process exited at start (exit code {code}); see its log lines above")
        if reply[0] == "setup_failed":
            self._stop_child()
            _, cls, message = reply
            try:
                error = cls(message)
            except Exception:  # an exception type that needs more arguments
                error = SinkSetupError(f"{cls.__name__}: {message}")
            raise error
        log.info("sink process %d writes to %s", reply[1], self.settings.clickhouse_url_redacted)

    def _stop_child(self, timeout_s: float = 10.0) -> int | None:
        """Close the pipe and end the sink process (terminate it after ``timeout_s``); returns its exit code."""
        if self._outbox is not None:
            self._outbox.put(None)  # the sender thread stops after what is queued (sent, or refused by a dead process)
            self._outbox = None
            self._sender.join(max(timeout_s, 5.0))  # never close the socket under a send in progress
        try:
            self._conn.close()
        except OSError:
            pass
        try:
            return self._proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self._proc.terminate()
            try:
                return self._proc.wait(5.0)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                return self._proc.wait()

    def _restart(self) -> SinkWriteError:
        """Replace a dead sink process and send it every kept payload again; returns the error for the caller.

        When the new process cannot start either, none runs until the next
        call (payloads added meanwhile are only kept).
        """
        with self._lock:
            code = self._stop_child(0.0) if self._outbox is not None else None
            try:
                self._start()
            except Exception as exc:
                self._outbox = None
                return SinkWriteError(f"the sink process exited (code {code}) and a new one could not start: "
                                      f"{type(exc).__name__}: {exc}", table="*", rows=self.pending_rows)
            self.restarts += 1
            for seq, table, at, payload, _rows in self._kept:
                self._outbox.put(("add", seq, table, at, payload))
        log.warning("sink process exited (code %s); started a new one and sent it the %d unwritten rows again",
                    code, self.pending_rows)
        return SinkWriteError(f"the sink process exited (code {code}) before writing; restarted it with "
                              f"the {self.pending_rows} unwritten rows", table="*", rows=self.pending_rows)

    @property
    def pid(self) -> int | None:
        """Process id of the running sink process (None after :meth:`close` or while none runs)."""
        return self._proc.pid if self._outbox is not None else None

    # -- the sink contract ----------------------------------------------------------------------------------
    @property
    def pending_rows(self) -> int:
        """Rows added and not yet reported written, all tables."""
        return sum(self._rows.values())

    def _add(self, table: str, obj: Any, rows: int, ingested_ms: int) -> None:
        """Encode ``obj`` (``rows`` rows of ``table``) and send it, or raise ``SinkBackpressure`` (nothing sent).

        Raises :class:`SinkError` after :meth:`close`.
        """
        if rows == 0:
            return
        payload = self._encode(obj)
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
            if self._outbox is not None:  # else no sink process runs (a restart failed): the next flush starts one
                self._outbox.put(("add", self._seq, table, ingested_ms, payload))

    def add_events(self, stored: Iterable[tuple[RequestEvent, bool | None, Sequence[str] | None]],
                   ingested_ms: int | None = None) -> None:
        """Add ``request_events`` rows from ``(event, parse_ok, missing_fields)`` triples (as ``ClickHouseSink``).

        Raises ``ValueError`` for an unchecked event with missing fields and
        :class:`SinkBackpressure`; in both cases nothing is added.
        """
        stored = stored if isinstance(stored, list) else list(stored)
        refuse_unchecked_missing(stored)
        self._add("events", stored, len(stored), now_ms() if ingested_ms is None else ingested_ms)

    def add_verdicts(self, verdicts: Iterable[Verdict], ingested_ms: int | None = None) -> None:
        """Add ``channel_verdicts`` rows. Raises :class:`SinkBackpressure` (nothing added)."""
        verdicts = list(verdicts)
        self._add("verdicts", verdicts, len(verdicts), now_ms() if ingested_ms is None else ingested_ms)

    def add_quality_scores(self, rows: Iterable[tuple]) -> None:
        """Add ``quality_scores`` rows built with :func:`~pipeline.sinks.rows.quality_row`."""
        rows = list(rows)
        self._add("quality_scores", rows, len(rows), 0)

    def add_quality_labels(self, rows: Iterable[tuple]) -> None:
        """Add ``quality_labels`` rows built with :func:`~pipeline.sinks.rows.label_row`."""
        rows = list(rows)
        self._add("quality_labels", rows, len(rows), 0)

    def flush(self) -> int:
        """Have the sink process write every row added before this call; return the rows written.

        Returns only after ClickHouse accepted them. Raises
        :class:`SinkWriteError` (rows kept, do not commit) when a write failed
        or the sink process died (it is restarted with the kept rows first).
        """
        with self._flush_lock:
            with self._lock:
                if not self._kept:
                    return 0
                target = self._seq
                running = self._outbox is not None
                if running:
                    self._outbox.put(("flush", target))
            reply = self._wait_reply() if running else None
            if reply is None:
                raise self._restart()
            if reply[0] == "failed":
                raise SinkWriteError(reply[2], table="*", rows=self.pending_rows)
            counts = reply[2]
            with self._lock:
                while self._kept and self._kept[0][0] <= target:
                    _, table, _, payload, rows = self._kept.popleft()
                    self._rows[table] -= rows
                    self._bytes[table] -= len(payload)
                for table, n in counts.items():
                    self.written[table] += n
            return sum(counts.values())

    def _wait_reply(self) -> tuple | None:
        """The sink process's reply to a flush, or None when it died first."""
        while True:
            try:
                if self._conn.poll(ALIVE_CHECK_S):
                    return self._conn.recv()
            except (EOFError, OSError):
                return None
            if self._proc.poll() is not None and not self._conn.poll(0):
                return None

    def close(self, timeout_s: float = 30.0) -> None:
        """Stop the sink process (rows not yet flushed are not written: flush first). Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            if self._outbox is None:
                return
            self._outbox.put(("close",))
            started = time.monotonic()
            self._stop_child(timeout_s)
            log.info("sink process stopped in %.1f s", time.monotonic() - started)

    def __enter__(self) -> "ProcessSink":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _send_loop(conn: Connection, outbox: queue.SimpleQueue) -> None:
    """Send the outbox's messages in order until None; a dead sink process is noticed by the next flush."""
    while True:
        msg = outbox.get()
        if msg is None:
            return
        try:
            conn.send(msg)
        except OSError:  # the sink process died or the pipe closed: drain the queue, the kept payloads stay
            pass


def _plain(settings: Any) -> Any:
    """``settings`` as a plain :class:`~pipeline.config.Settings` (a subclass may live in ``__main__``,
    which the sink process cannot unpickle)."""
    from dataclasses import fields

    from pipeline.config import Settings

    return Settings(**{f.name: getattr(settings, f.name) for f in fields(Settings)})


def open_sink(settings: Any) -> Any:
    """The worker's sink for ``settings``: a :class:`ProcessSink` when ``settings.sink_process`` (the default),
    else an in-process :class:`~pipeline.sinks.clickhouse.ClickHouseSink`. Raises as their constructors."""
    if getattr(settings, "sink_process", True):
        return ProcessSink(settings)
    from pipeline.sinks.clickhouse import ClickHouseSink

    return ClickHouseSink.from_settings(settings)
