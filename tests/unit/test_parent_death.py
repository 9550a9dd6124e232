"""pipeline.parent_death: a child ends once the process that started it is gone (issue #16)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import psutil
import pytest

from pipeline.parent_death import ORPHANED_EXIT_CODE, POLL_S, death_signal_preexec, wait_ended, watch_parent

REPO = Path(__file__).resolve().parents[2]
_CHILD = ("import sys, time; from pipeline.parent_death import watch_parent; watch_parent(int(sys.argv[1])); "
          "time.sleep(30)")


def test_a_child_whose_parent_is_already_gone_exits_with_the_orphan_status():
    """The pid passed in is not the child's parent (it died before the child looked): exit at once, status 75."""
    proc = subprocess.run([sys.executable, "-c", _CHILD, str(os.getppid())], cwd=REPO, timeout=20,
                          env=dict(os.environ, PYTHONPATH=str(REPO)))
    assert proc.returncode == ORPHANED_EXIT_CODE


def test_a_child_ends_within_a_second_of_its_parents_sigkill():
    """A parent starts a watching child and is killed with SIGKILL (no clean-up runs in it): the child ends."""
    parent_code = ("import os, subprocess, sys; c = subprocess.Popen([sys.executable, '-c', sys.argv[1], "
                   "str(os.getpid())]); print(c.pid, flush=True); c.wait()")
    parent = subprocess.Popen([sys.executable, "-c", parent_code, _CHILD], cwd=REPO, stdout=subprocess.PIPE,
                              text=True, env=dict(os.environ, PYTHONPATH=str(REPO)))
    child = psutil.Process(int(parent.stdout.readline()))
    try:
        parent.kill()
        parent.wait()
        assert wait_ended([child], 1.0 + POLL_S) == []
    finally:
        if child.is_running():
            child.kill()


def test_watch_parent_refuses_a_negative_grace_and_a_zero_poll():
    with pytest.raises(ValueError):
        watch_parent(os.getppid(), grace_s=-1.0)
    with pytest.raises(ValueError):
        watch_parent(os.getppid(), poll_s=0.0)


def test_no_parent_death_signal_from_a_thread_that_may_end_before_the_process():
    got = []
    t = threading.Thread(target=lambda: got.append(death_signal_preexec(signal.SIGTERM)))
    t.start()
    t.join()
    assert got == [None]
    assert (death_signal_preexec(signal.SIGTERM) is not None) == sys.platform.startswith("linux")
