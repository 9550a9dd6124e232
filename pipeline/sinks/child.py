"""The sink process's side of :class:`~pipeline.sinks.process.ProcessSink`: decode payloads, buffer, write.

Started by the parent as ``python -m pipeline.sinks.child FD PARENT_PID``; runs
:func:`child_main` until the parent sends ``("close",)`` or its end of the
pipe closes (the parent exited or was killed). Should the socket not close
(or an insert hang) after the parent died, :func:`~pipeline.parent_death.watch_parent`
ends the process ``ORPHAN_GRACE_S`` later. A reader thread drains the pipe into a queue
while the main thread buffers and inserts, so the parent's ``send`` never
waits for an insert to finish. ``request_events`` payloads are JSON rows
that ClickHouse parses itself (:class:`~pipeline.sinks.json_table.JsonTableSink`),
and whole batch envelopes (:mod:`pipeline.sinks.batches`):
they are buffered as they come, with no Python per row; the other tables'
payloads are msgpack, decoded into Arrow columns here.

Messages (pickled over a socket pair with
:class:`multiprocessing.connection.Connection`; payloads are bytes, see
:mod:`pipeline.sinks.process`):

- parent → child: the :class:`~pipeline.config.Settings` first, then
  ``("add", seq, table, ingested_ms, rows, payload)``,
  ``("flush", seq)``, ``("close",)``;
- child → parent: ``("ready", pid)`` or ``("setup_failed", "module.Class",
  message)`` once at start, then per flush, in order, one
  ``("flushed", seq, {table: rows}, rejected)`` or
  ``("failed", seq, message, rejected)``.

``rejected`` lists ``(seq, table, reason)`` of the payloads since the last
reply that could not be buffered, or that ClickHouse could not read in this
flush (a bug: the parent checked the rows); they are reported instead of
stalling every later flush. SIGINT and SIGTERM are
ignored: the process ends when the parent closes the socket (or with
SIGKILL, or the parent's death), so a Ctrl-C or a process-group SIGTERM
(systemd's default stop signals every process of the unit) meant for the
worker does not take the sink away in the middle of the worker's drain.
"""

from __future__ import annotations

import logging
import os
import queue
import signal
import threading
from typing import Any, Callable

import msgspec

from pipeline.escape import install_log_escaping
from pipeline.parent_death import watch_parent
from pipeline.sinks.buffer import FLUSH_SHARE

log = logging.getLogger("channel_health.sink_process")

#: Time the sink process has to finish a write and exit after its parent died, before it is ended (s).
ORPHAN_GRACE_S = 5.0


#: An adder's arguments: the sink, the payload, its ``ingested_ms``, its row count and its seq.
Adder = Callable[[Any, bytes, int, int, int], None]


def _adders() -> dict[str, Adder]:
    """Per table name: buffer a payload's rows in a :class:`ClickHouseSink` (decoding msgpack ones)."""
    from pipeline.contracts import Verdict

    verdicts = msgspec.msgpack.Decoder(list[Verdict])
    rows = msgspec.msgpack.Decoder(list[tuple])
    return {
        "events": lambda sink, p, at, n, seq: sink.add_event_payload(p, n, seq),
        "event_batches": lambda sink, p, at, n, seq: sink.add_event_batch_payload(p, n, seq),
        "verdicts": lambda sink, p, at, n, seq: sink.add_verdicts(verdicts.decode(p), at),
        "quality_scores": lambda sink, p, at, n, seq: sink.add_quality_scores(rows.decode(p)),
        "quality_labels": lambda sink, p, at, n, seq: sink.add_quality_labels(rows.decode(p)),
        "overrides": lambda sink, p, at, n, seq: sink.add_overrides(rows.decode(p)),
    }


def _register_secrets(settings: Any) -> None:
    """Scrub the ClickHouse password and the control keys from this process's logs too (unpickling does not run
    ``Secret.__post_init__``)."""
    from pipeline.redaction import register_secret, register_url_password

    if settings.clickhouse_password is not None:
        register_secret(settings.clickhouse_password.reveal())
    for _, secret in settings.control.keys:
        register_secret(secret.reveal())
    register_url_password(settings.clickhouse_url)


def child_main(conn: Any, parent_pid: int | None = None) -> None:
    """Entry point of the sink process: open ClickHouse, then serve the parent until closed.

    ``conn``: this side of the socket pair; the first message is the
    worker's :class:`~pipeline.config.Settings`. ``parent_pid``: the worker's
    pid; the process ends at most ``ORPHAN_GRACE_S`` after the worker is gone
    (None: only when the socket closes). Buffers are unbounded here:
    the parent bounds what it sends (it keeps a copy of every unwritten payload).
    """
    install_log_escaping()  # names in log lines: one line each, no terminal escape (SPEC §8)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s [sink process] %(message)s")
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if parent_pid is not None:
        watch_parent(parent_pid, grace_s=ORPHAN_GRACE_S, name="sink process")
    try:
        settings = conn.recv()
    except (EOFError, OSError):
        return
    _register_secrets(settings)
    try:
        from pipeline.sinks.clickhouse import ClickHouseSink

        sink = ClickHouseSink.from_settings(settings, max_rows=1 << 62, max_bytes=1 << 62)
    except Exception as exc:  # reported to the parent, which raises it where the sink is opened
        conn.send(("setup_failed", f"{type(exc).__module__}.{type(exc).__qualname__}", str(exc)))
        return
    conn.send(("ready", os.getpid()))
    inbox: queue.SimpleQueue = queue.SimpleQueue()

    def read() -> None:
        try:
            while True:
                inbox.put(conn.recv())
        except BaseException as exc:  # the parent closed the socket or exited (EOFError), or a broken message
            if not isinstance(exc, (EOFError, OSError)):
                log.critical("cannot read from the worker (%s: %s); exiting", type(exc).__name__, exc)
            inbox.put(None)

    threading.Thread(target=read, name="sink-inbox", daemon=True).start()
    serve(inbox.get, conn.send, sink, _adders(), autoflush_rows=max(1, settings.sink_max_rows // FLUSH_SHARE))


def serve(receive: Callable[[], Any], reply: Callable[[Any], None], sink: Any, adders: dict[str, Adder],
          autoflush_rows: int | None = None) -> None:
    """The sink process's loop over parent messages (see the module doc); returns on ``close`` or None.

    ``autoflush_rows``: once this many rows are buffered, write them without
    waiting for the parent's flush (None: only on request). The rows
    written so are reported with the next ``flushed`` reply, which still
    comes only once every row added before the flush request is written, so
    the parent's at-least-once bookkeeping is unchanged; the worker's flush
    then waits for the rest only, not for a whole buffer (whose insert used
    to start only when the worker's event loop got round to asking). After a
    failed automatic write the process waits for the parent's next flush
    (which retries and reports the failure) before writing on its own again.
    """
    rejected: list[tuple[int, str, str]] = []
    early: dict[str, int] = {}  # rows per table written by automatic flushes since the last "flushed" reply
    autoflush = autoflush_rows
    while True:
        msg = receive()
        if msg is None or msg[0] == "close":
            return
        if msg[0] == "add":
            _, seq, table, at, rows, payload = msg
            try:
                adders[table](sink, payload, at, rows, seq)
            except Exception as exc:  # a bug: report it (the parent logs and drops the payload), keep going
                reason = f"{type(exc).__name__}: {exc}"
                log.error("cannot buffer %s payload %d: %s", table, seq, reason)
                rejected.append((seq, table, reason))
            if autoflush is not None and sink.pending_rows >= autoflush:
                try:
                    _count(early, sink.flush_counts())
                except Exception as exc:  # rows stay buffered; the parent's flush retries and reports it
                    log.warning("automatic flush failed (%s: %s); waiting for the worker's flush", type(exc).__name__,
                                exc)
                    autoflush = None
            continue
        seq = msg[1]
        try:
            out: tuple = ("flushed", seq, _count(sink.flush_counts(), early))
            early, autoflush = {}, autoflush_rows
        except Exception as exc:  # SinkWriteError and transport errors: rows stay buffered here
            out = ("failed", seq, f"{type(exc).__name__}: {exc}")
        rejected += [(tag, table, reason) for tag, table, _rows, reason in sink.take_rejected()]
        reply(out + (rejected,))
        rejected = []


def _count(total: dict[str, int], more: dict[str, int]) -> dict[str, int]:
    """Add ``more``'s rows per table to ``total``; returns ``total``."""
    for table, rows in more.items():
        total[table] = total.get(table, 0) + rows
    return total


if __name__ == "__main__":
    import sys
    from multiprocessing.connection import Connection

    child_main(Connection(int(sys.argv[1])), int(sys.argv[2]) if len(sys.argv) > 2 else None)
