"""How ``channel-health demo`` stops its processes: worker (which drains), its sink process, then the broker.

Issue #17: one Ctrl-C (or SIGTERM) must stop the simulator, the worker, the
sink process and the broker, in that order, within 10 s, leaving no process
and no chDB lock behind; a second Ctrl-C during the stop must not leave
anything behind either. So the demo starts the worker and the broker in
their own sessions (a Ctrl-C in the terminal reaches the demo only, not the
broker the worker still needs for its drain), and :func:`stop_in_order`
stops them one after the other. A second Ctrl-C or SIGTERM while it runs
kills the worker and its children at once; the worker gets SIGTERM from the
kernel should the demo itself die (:func:`worker_popen_kwargs`).
"""

from __future__ import annotations

import signal
import subprocess
from contextlib import contextmanager
from typing import Any, Iterator

import psutil

from pipeline.parent_death import death_signal_preexec, wait_ended
from pipeline.stream.runtime import STOP_LIMIT_S

#: Longest wait for the worker's own stop (drain and faust's shutdown, bounded by ``STOP_LIMIT_S``) (s).
WORKER_STOP_S = STOP_LIMIT_S + 0.5
#: Longest wait for the worker's children (the sink process) once the worker ended (s); then they are killed.
CHILDREN_STOP_S = 1.0
_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def worker_popen_kwargs() -> dict[str, Any]:
    """``subprocess.Popen`` arguments for the demo's worker: its own session, and SIGTERM (a drain) from the
    kernel if the demo dies (Linux, when called from the main thread; see :mod:`pipeline.parent_death`)."""
    return {"start_new_session": True, "preexec_fn": death_signal_preexec(signal.SIGTERM)}


@contextmanager
def sigterm_interrupts() -> Iterator[None]:
    """While the block runs, SIGTERM raises ``KeyboardInterrupt`` in the main thread, as Ctrl-C does.

    Python's default SIGTERM ends the process without running ``finally`` blocks (and so without
    stopping the worker and the broker). Call from the main thread only (``signal.signal``).
    """
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def stop_in_order(worker: subprocess.Popen | None, broker: Any, say: Any = print) -> None:
    """Stop ``worker`` (SIGTERM: it drains), then what is left of its children, then ``broker``.

    ``worker``: the worker process or None; ``broker``: an object with ``stop()`` (an
    :class:`~pipeline.tools.embedded.broker.EmbeddedBroker`) or None; ``say``: prints a progress line.
    Takes at most ``WORKER_STOP_S + CHILDREN_STOP_S`` plus the broker's stop (SIGINT: milliseconds). A
    Ctrl-C or SIGTERM meanwhile (the second of the demo) kills the worker and its children at once; later
    ones are ignored until the broker is stopped. Returns when none of them runs; call from the main thread.
    """
    children = _children(worker)
    previous = {sig: signal.signal(sig, _interrupt_once) for sig in _SIGNALS}
    try:
        try:
            if worker is not None and worker.poll() is None:
                say("Stopping the worker (flushes and commits)…")
                worker.send_signal(signal.SIGTERM)
                try:
                    worker.wait(WORKER_STOP_S)
                except subprocess.TimeoutExpired:
                    say(f"The worker did not stop within {WORKER_STOP_S:g} s; killing it.")
            children = wait_ended(children, CHILDREN_STOP_S if worker is not None else 0)
        except KeyboardInterrupt:
            say("Interrupted again: killing the worker and its sink process.")
        finally:
            for proc in children:
                _kill(proc)
            if worker is not None and worker.poll() is None:
                worker.kill()
                worker.wait()
            wait_ended(children, CHILDREN_STOP_S)
            if broker is not None:
                say("Stopping the broker…")
                broker.stop()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _children(worker: subprocess.Popen | None) -> list[psutil.Process]:
    """The worker's descendants now (after its death they are init's and cannot be found from it)."""
    if worker is None or worker.poll() is not None:
        return []
    try:
        return psutil.Process(worker.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []


def _kill(proc: psutil.Process) -> None:
    try:
        proc.kill()  # psutil checks that the pid still belongs to the same process
    except psutil.NoSuchProcess:
        pass


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


def _interrupt_once(signum: int, frame: Any) -> None:
    for sig in _SIGNALS:
        signal.signal(sig, signal.SIG_IGN)
    raise KeyboardInterrupt
