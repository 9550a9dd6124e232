"""Issues #16 / #17: no orphans, clean stop on SIGTERM (SPEC §8: child processes exit with their parent).

Real processes on loopback: a ``channel-health worker`` with its sink
process and quality scorer, ``channel-health broker`` with its Tansu
process, ``channel-health demo`` with all of them. Descendants are captured (psutil) while the parent runs, then the
parent gets a signal and every one of them must be gone within 10 s.
"""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from pipeline.stream.runtime import STOP_CUT_SHORT_EXIT_CODE
from workers import REPO, STATUS_RE, Stack, descendants, port_free, publish, query_chdb, steady_events, wait_gone

pytestmark = pytest.mark.integration

#: Longest time a descendant may outlive its parent (issue #16).
ORPHAN_LIMIT_S = 10.0


def test_kill9_of_the_worker_leaves_none_of_its_children(tmp_path):
    """Issue #16: ``kill -9`` of the worker; 10 s later none of its former children (sink, scorer) runs."""
    if importlib.util.find_spec("torch") is None:
        pytest.skip("quality extras (torch) not installed: the worker starts no scorer")
    stack = Stack(tmp_path, partitions=1).start()
    try:
        w = stack.worker("w", CHANNEL_HEALTH_QUALITY="on").start()
        w.wait_for_log(r"quality scoring on|quality scoring off", timeout_s=180)
        assert "quality scoring on" in w.current_log(), w.log_tail()
        kids = descendants(w.proc.pid)
        cmdlines = [" ".join(k.cmdline()) for k in kids]
        assert any("pipeline.sinks.child" in c for c in cmdlines), cmdlines
        assert any("multiprocessing" in c and "spawn_main" in c for c in cmdlines), cmdlines  # the scorer
        w.kill()
        alive = wait_gone(kids, ORPHAN_LIMIT_S)
        assert alive == [], [" ".join(p.cmdline()) for p in alive]
    finally:
        stack.close()


def test_sigterm_of_the_worker_with_the_broker_gone_exits_in_bounded_time(tmp_path):
    """Issue #17: the broker died first (one Ctrl-C); SIGTERM still ends the worker (exit status 0) and its
    sink process within 10 s. (SIGTERM with the broker up drains with status 0: test_reliability_*.)"""
    stack = Stack(tmp_path, partitions=1).start()
    try:
        w = stack.worker("w").start()
        w.wait_for_log(r"status: generation", timeout_s=120)
        kids = descendants(w.proc.pid)
        stack.broker.stop()
        w.proc.send_signal(signal.SIGTERM)
        assert w.proc.wait(ORPHAN_LIMIT_S) == 0, w.log_tail()
        assert wait_gone(kids, 1.0) == []
    finally:
        stack.close()


def test_a_stuck_sink_cannot_hold_the_workers_stop(tmp_path):
    """Issue #17: the sink process stops answering (SIGSTOP) with rows buffered; SIGTERM still ends the worker
    within 10 s (its stop limit, exit status 3), and the sink process ends once it runs again."""
    stack = Stack(tmp_path, partitions=1).start()
    sink = None
    try:
        w = stack.worker("w").start()
        w.wait_for_log(r"status: generation", timeout_s=120)
        kids = descendants(w.proc.pid)
        [sink] = [k for k in kids if "pipeline.sinks.child" in k.cmdline()]
        sink.suspend()
        publish(stack.settings, steady_events({"a/m@paid": "chat"}, int(time.time() * 1000) - 60_000, 30))
        w.wait_status(lambda st: st["events_in"] == 30 and st["pending"] > 0, 30, "30 events in, rows buffered")
        w.proc.send_signal(signal.SIGTERM)
        assert w.proc.wait(ORPHAN_LIMIT_S) == STOP_CUT_SHORT_EXIT_CODE, w.log_tail()
        assert "did not stop within 8 s" in w.current_log()
        sink.resume()
        assert wait_gone(kids, ORPHAN_LIMIT_S) == []
    finally:
        if sink is not None and sink.is_running():
            sink.resume()  # a stopped process cannot notice that its parent is gone
        stack.close()

def test_sigterm_of_channel_health_broker_stops_tansu(tmp_path):
    """Issue #16: ``channel-health broker`` stopped with SIGTERM (systemd, Kubernetes) takes Tansu with it."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CHANNEL_HEALTH_")}
    proc = subprocess.Popen([sys.executable, "-m", "pipeline.cli", "broker"], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL, text=True)
    try:
        bootstrap = proc.stdout.readline().strip()
        assert bootstrap.startswith("127.0.0.1:"), bootstrap
        port = int(bootstrap.rsplit(":", 1)[1])
        kids = descendants(proc.pid)
        assert [k for k in kids if "tansu" in k.name()], [k.name() for k in kids]
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(ORPHAN_LIMIT_S) == 0
        assert wait_gone(kids, 1.0) == []
        assert port_free(port)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_kill9_of_channel_health_broker_takes_tansu_with_it(tmp_path):
    """Issue #16: the parent of the Tansu process dies by SIGKILL (no clean-up runs); Tansu still ends, and
    no log file of it is left in the temporary directory (its output goes to an unnamed file)."""
    logs = Path(tempfile.gettempdir())
    before = set(logs.glob("tansu-*.log"))
    env = {k: v for k, v in os.environ.items() if not k.startswith("CHANNEL_HEALTH_")}
    proc = subprocess.Popen([sys.executable, "-m", "pipeline.cli", "broker"], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL, text=True)
    try:
        port = int(proc.stdout.readline().strip().rsplit(":", 1)[1])
        kids = descendants(proc.pid)
        assert kids
        proc.kill()
        proc.wait(5)
        assert wait_gone(kids, ORPHAN_LIMIT_S) == []
        assert port_free(port)
        assert set(logs.glob("tansu-*.log")) - before == set()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_ctrl_c_stops_the_demo_and_leaves_no_process_and_no_lock(tmp_path):
    """Issue #17: SIGINT to the demo's process group (a terminal's Ctrl-C) while the worker processes events:
    10 s later no descendant of the demo runs, and a new process can open the chDB directory."""
    from pipeline.tools.simulate.traces import DataNotFoundError, resolve_data_dir

    try:
        resolve_data_dir()  # the demo's scenario replays the shared traces
    except DataNotFoundError as exc:
        pytest.skip(f"shared data folder absent: {exc}")
    env = {k: v for k, v in os.environ.items() if not k.startswith("CHANNEL_HEALTH_")}
    env.update(CHANNEL_HEALTH_QUALITY="off", PYTHONUNBUFFERED="1")
    data = tmp_path / "demo"
    with open(tmp_path / "demo.out", "wb") as out:
        demo = subprocess.Popen([sys.executable, "-m", "pipeline.cli", "demo", "--data-dir", str(data)], cwd=REPO,
                                env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True, preexec_fn=_foreground_signals)
    try:
        deadline = time.monotonic() + 180
        while not _processing(data / "worker.log"):  # the worker has taken events: a drain with data to write
            assert demo.poll() is None, (tmp_path / "demo.out").read_text(errors="replace")[-3000:]
            assert time.monotonic() < deadline, "the demo's worker took no events within 180 s"
            time.sleep(0.2)
        kids = descendants(demo.pid)
        names = " ".join(" ".join(k.cmdline()) for k in kids)
        assert "tansu" in names and "pipeline.sinks.child" in names and " worker" in names, names
        os.killpg(demo.pid, signal.SIGINT)
        assert demo.wait(ORPHAN_LIMIT_S) == 130
        assert wait_gone(kids, 0.5) == []
        assert query_chdb(data / "chdb", "SELECT 1") == [[[1]]]  # no process holds the chDB directory
    finally:
        if demo.poll() is None:
            os.killpg(demo.pid, signal.SIGKILL)
            demo.wait()


def _foreground_signals() -> None:
    """In the demo's child before exec: SIGINT at its default, as for a terminal's foreground job.

    A shell's background job (a suite started with ``&`` from a script) starts with SIGINT ignored, and
    Python then installs no ``KeyboardInterrupt`` handler: the demo would ignore the test's Ctrl-C and be
    killed after the 10 s (this failed four full runs on 2026-12-02 before it was understood).
    """
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _processing(log_path) -> bool:
    """True once a status line of the worker counts events in."""
    text = log_path.read_text(errors="replace") if log_path.exists() else ""
    return any(int(m["events_in"]) > 0 for m in STATUS_RE.finditer(text))
