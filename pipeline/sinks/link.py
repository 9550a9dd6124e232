"""One running sink process, seen from the worker: start it, send to it, read its replies, stop it.

:class:`SinkChild` starts ``python -m pipeline.sinks.child FD PID`` (see
:mod:`pipeline.sinks.child` for the messages) in its own session, so a
Ctrl-C in the worker's terminal reaches the worker only; the worker's drain
flushes through the child, then stops it. Sends go through a queue to a
sender thread, so a full socket never blocks the caller (the worker's event
loop); replies are read by the caller of :meth:`SinkChild.reply` (one at a
time).
"""

from __future__ import annotations

import importlib
import logging
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
from dataclasses import fields, replace
from multiprocessing.connection import Connection
from typing import Any

from pipeline.sinks.errors import SinkSetupError

log = logging.getLogger(__name__)

#: Modules whose exception classes a failed start is raised as (others become SinkSetupError).
_ERROR_MODULES = ("pipeline.storage.errors", "pipeline.sinks.errors")


def describe_exit(code: int | None) -> str:
    """How a process ended, for messages.

    >>> describe_exit(-9), describe_exit(1), describe_exit(None)
    ('was killed by SIGKILL', 'exited with code 1', 'stopped answering (still running)')
    """
    if code is None:
        return "stopped answering (still running)"
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"


class SinkChild:
    """A started sink process that opened ClickHouse; raises where it could not.

    ``settings``: a :class:`~pipeline.config.Settings` (only its ClickHouse
    part is sent). ``start_timeout_s`` > 0: longest wait for the child to open
    ClickHouse and apply the DDL. Raises the child's storage error
    (:class:`~pipeline.storage.errors.StorageError` subclasses, same message)
    or :class:`SinkSetupError`; nothing is left running then.
    """

    def __init__(self, settings: Any, start_timeout_s: float) -> None:
        ours, theirs = socket.socketpair()
        with theirs:
            self.proc = subprocess.Popen([sys.executable, "-m", "pipeline.sinks.child", str(theirs.fileno()),
                                          str(os.getpid())],
                                         pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL,
                                         start_new_session=True)
        self.conn = Connection(ours.detach())
        self._outbox: queue.SimpleQueue = queue.SimpleQueue()
        self._sender = threading.Thread(target=_send_loop, args=(self.conn, self._outbox), name="sink-outbox",
                                        daemon=True)
        self._sender.start()
        self._stopped = False
        try:
            self.send(clickhouse_part(settings))
            reply = self.reply(start_timeout_s)
        except TimeoutError:
            self.stop(0.0)
            raise SinkSetupError(f"the sink process did not open ClickHouse within {start_timeout_s:.0f} s") from None
        except BaseException:
            self.stop(0.0)
            raise
        if reply is None:
            raise SinkSetupError(f"the sink process {describe_exit(self.stop(5.0))} at start; see its log lines above")
        if reply[0] == "setup_failed":
            self.stop(5.0)
            raise _setup_error(reply[1], reply[2])
        log.info("sink process %d writes to %s", self.proc.pid, settings.clickhouse_url_redacted)

    @property
    def pid(self) -> int:
        """The sink process's id."""
        return self.proc.pid

    def send(self, msg: Any) -> None:
        """Queue ``msg`` for the sink process (never blocks; lost if the process is gone)."""
        self._outbox.put(msg)

    def reply(self, timeout_s: float, alive_check_s: float = 1.0) -> tuple | None:
        """The sink process's next reply; None when it died first. Raises ``TimeoutError`` after ``timeout_s``."""
        waited = 0.0
        while True:
            try:
                if self.conn.poll(alive_check_s):
                    return self.conn.recv()
            except (EOFError, OSError):
                return None
            if self.proc.poll() is not None and not self.conn.poll(0):
                return None
            waited += alive_check_s
            if waited >= timeout_s:
                raise TimeoutError(f"no reply from the sink process within {timeout_s:.0f} s")

    def exit_code(self, timeout_s: float) -> int | None:
        """The process's exit code, waiting up to ``timeout_s`` for it to end; None if it still runs."""
        try:
            return self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            return None

    def stop(self, timeout_s: float = 10.0) -> int | None:
        """Close the socket and end the process (SIGTERM after ``timeout_s``, SIGKILL 5 s later); its exit code.

        Idempotent. Queued messages are sent first when the process still reads them.
        """
        if not self._stopped:
            self._stopped = True
            self._outbox.put(None)  # the sender thread stops after what is queued (sent, or refused by a dead process)
            self._sender.join(max(timeout_s, 5.0))  # never close the socket under a send in progress
            self.conn.close()
        try:
            return self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.terminate()
            try:
                return self.proc.wait(5.0)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                return self.proc.wait()


def _send_loop(conn: Connection, outbox: queue.SimpleQueue) -> None:
    """Send the outbox's messages in order until None; a dead sink process is noticed by the next reply."""
    while True:
        msg = outbox.get()
        if msg is None:
            return
        try:
            conn.send(msg)
        except OSError:  # the sink process died or the socket closed: drain the queue (the caller keeps copies)
            pass


def clickhouse_part(settings: Any) -> Any:
    """``settings`` as a plain :class:`~pipeline.config.Settings` without the Kafka part.

    A subclass may live in ``__main__`` (which the sink process cannot
    unpickle), and the sink process needs no Kafka credentials.
    """
    from pipeline.config import KafkaSecurity, Settings

    plain = Settings(**{f.name: getattr(settings, f.name) for f in fields(Settings)})
    return replace(plain, kafka_bootstrap=None, kafka_security=KafkaSecurity())


def _setup_error(qualified_name: str, message: str) -> Exception:
    """The sink process's start-up error as the same class when it is one of ours, else a SinkSetupError."""
    module, _, name = qualified_name.rpartition(".")
    if module in _ERROR_MODULES:
        cls = getattr(importlib.import_module(module), name, None)
        if isinstance(cls, type) and issubclass(cls, Exception):
            try:
                return cls(message)
            except TypeError:  # needs more arguments
                pass
    return SinkSetupError(f"{name}: {message}")
