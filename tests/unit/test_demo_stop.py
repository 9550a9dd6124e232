"""``stop_in_order`` when the demo's broker died first: the worker is not waited for its full stop limit.

Seen in full test runs (issue #17's Ctrl-C test): the embedded broker exited at the Ctrl-C, the worker's
drain could then neither save a snapshot nor commit and took its whole ``STOP_LIMIT_S`` (8 s), and the demo
exited after the 10 s the issue allows. With a live broker the worker keeps its full stop limit (the
integration test ``test_ctrl_c_stops_the_demo_and_leaves_no_process_and_no_lock``).
"""

from __future__ import annotations

import subprocess
import sys

from pipeline.tools.demo_stop import BROKER_GONE_STOP_S, stop_in_order

#: A worker stand-in that ignores SIGTERM (as a worker stuck in its drain does) and says when it is ready.
_STUCK = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('ready', flush=True); time.sleep(60)"


class _Broker:
    def __init__(self, running: bool) -> None:
        self.running = running
        self.stopped = False

    def stop(self) -> None:
        self.stopped = True


def _stuck_worker() -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", _STUCK], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
    return proc


def test_a_worker_is_killed_after_the_short_wait_when_the_broker_is_gone():
    worker, broker, said = _stuck_worker(), _Broker(running=False), []
    stop_in_order(worker, broker, said.append)
    assert worker.returncode == -9 and broker.stopped
    assert said == ["The broker is gone: the worker can write its rows but not commit.",
                    "Stopping the worker (flushes and commits)…",
                    f"The worker did not stop within {BROKER_GONE_STOP_S:g} s; killing it.",
                    "Stopping the broker…"]

