"""``stop_in_order`` when the demo's broker died first: the worker is not waited for its full stop limit.

Seen in full test runs (issue #17's Ctrl-C test): the embedded broker exited at the Ctrl-C, the worker's
drain could then neither save a snapshot nor commit and took its whole ``STOP_LIMIT_S`` (8 s), and the demo
exited after the 10 s the issue allows (in the last run the broker died 5 ms after the worker's SIGTERM). With a live broker the worker keeps its full stop limit (the
integration test ``test_ctrl_c_stops_the_demo_and_leaves_no_process_and_no_lock``).
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from pipeline.tools.demo_stop import BROKER_GONE_STOP_S, stop_in_order

#: A worker stand-in that ignores SIGTERM (as a worker stuck in its drain does) and says when it is ready.
_STUCK = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('ready', flush=True); time.sleep(60)"


class _Broker:
    """A broker that answers ``running`` True ``alive_checks`` times, then False (it died meanwhile)."""

    def __init__(self, alive_checks: int) -> None:
        self.alive_checks = alive_checks
        self.stopped = False

    @property
    def running(self) -> bool:
        self.alive_checks -= 1
        return self.alive_checks >= 0

    def stop(self) -> None:
        self.stopped = True


def _stuck_worker() -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", _STUCK], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
    return proc


@pytest.mark.parametrize("alive_checks", [0, 3])
def test_a_worker_is_killed_after_the_short_wait_when_the_broker_is_gone(alive_checks):
    """``alive_checks`` 0: the broker was gone before the stop; 3: it died while the worker drained (as in the
    failed runs, 5 ms after the worker's SIGTERM)."""
    worker, broker, said = _stuck_worker(), _Broker(alive_checks), []
    stop_in_order(worker, broker, said.append)
    assert worker.returncode == -9 and broker.stopped and broker.alive_checks < 0
    assert said == ["Stopping the worker (flushes and commits)…",
                    "The broker is gone: the worker can write its rows but not commit.",
                    f"The worker did not stop within {BROKER_GONE_STOP_S:g} s; killing it.",
                    "Stopping the broker…"]

