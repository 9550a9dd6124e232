"""``python examples/producer.py`` (issue #36, part 3): a plain Python producer on the embedded default.

Run as a user would, from the repository root with no ``CHANNEL_HEALTH_*`` setting and nothing started: it
starts the embedded broker and a worker, publishes its events, prints the verdicts they caused, and stops
everything it started, also when stopped by SIGTERM or killed.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
#: pid -> command line of the descendants seen by :func:`_read_until`.
cmdlines: dict[int, str] = {}
FAILING = "example-a/gpt-4o-mini@paid"
HEALTHY = "example-b/gpt-4o-mini@paid"


def _start(*args: str) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CHANNEL_HEALTH_")}
    env.update(PYTHONPATH=str(REPO), PYTHONUNBUFFERED="1")
    return subprocess.Popen([sys.executable, "examples/producer.py", *args], cwd=REPO, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)


def _read_until(proc: subprocess.Popen, prefix: str) -> tuple[list[str], list[psutil.Process]]:
    """Lines up to and including the first one starting with ``prefix``, and the example's descendants then
    (their command lines are read at once, in ``cmdlines``)."""
    lines = []
    for line in proc.stdout:
        lines.append(line.rstrip("\n"))
        if line.startswith(prefix):
            children = psutil.Process(proc.pid).children(recursive=True)
            cmdlines.update({p.pid: " ".join(p.cmdline()) for p in children})
            return lines, children
    proc.wait(30)
    if any("no Tansu broker binary" in line for line in lines):
        pytest.skip("embedded broker not available")
    raise AssertionError(f"no line starting {prefix!r}; output:\n" + "\n".join(lines[-60:]))


def _assert_all_gone(procs: list[psutil.Process]) -> None:
    """Every process of ``procs`` ends within 15 s (awaited, not slept): nothing the example started is left."""
    _gone, alive = psutil.wait_procs(procs, timeout=15)
    for p in alive:
        p.kill()
    assert alive == [], f"left running: {[(p.pid, p.name()) for p in alive]}"


def test_producer_example_prints_the_verdicts_it_caused_and_stops_everything():
    proc = _start()
    try:
        head, children = _read_until(proc, "published ")
        rest, _ = proc.communicate(timeout=240)
    finally:
        proc.kill()
    out = head + rest.splitlines()
    text = "\n".join(out)
    assert proc.returncode == 0, text[-4000:]
    assert head[-1] == (f"published 240 events of {FAILING} and {HEALTHY} (route example/chat); "
                        f"{FAILING} fails from +100s")
    # The 5th failure in a row (at +104 s, one call per second from +100 s) opens the channel (SPEC §4:
    # consecutive_failures, 5); its sibling on the route stays healthy.
    assert f"verdict +104.0s {FAILING} open weight=0.00 reasons=consecutive_failures" in out, text
    assert [line for line in out if line.startswith("verdict ") and HEALTHY in line and " healthy " not in line] == []
    assert out[-4:] == [f"final {FAILING} open weight=0.00", f"final {HEALTHY} healthy weight=1.00",
                        "Stopping the worker (flushes and commits)…", "Stopping the broker…"], text
    # The broker, the worker and its sink process were running; all are gone, and so is the temporary folder.
    names = [cmdlines[p.pid] for p in children]
    assert any("-m pipeline.cli worker" in n for n in names) and any(" broker --listener-url " in n for n in names), names
    _assert_all_gone(children)
    log = re.search(r"log (\S+)/worker\.log\)", text)
    assert log and not Path(log.group(1)).exists()


def test_producer_example_drains_on_sigterm(tmp_path):
    proc = _start("--data-dir", str(tmp_path))
    try:
        head, children = _read_until(proc, "worker started ")
        assert len(children) >= 2  # the broker and the worker (its sink process may not be up yet)
        proc.send_signal(signal.SIGTERM)
        rest, _ = proc.communicate(timeout=60)
    finally:
        proc.kill()
    out = head + rest.splitlines()
    assert proc.returncode == 130, "\n".join(out)
    assert "interrupted" in out and "Stopping the worker (flushes and commits)…" in out
    assert not any("did not stop within" in line for line in out), "\n".join(out)  # drained, not killed
    _assert_all_gone(children)


def test_producer_example_killed_takes_its_children_along(tmp_path):
    proc = _start("--data-dir", str(tmp_path))
    try:
        _head, children = _read_until(proc, "worker started ")
        proc.kill()  # SIGKILL: no clean-up runs in the example; the kernel's parent-death signal ends them
        proc.wait(30)
    finally:
        proc.kill()
    _assert_all_gone(children)
