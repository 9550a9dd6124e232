"""Issue item 4: a ClickHouse outage.

The worker runs with the fault-injection hook
``CHANNEL_HEALTH_FAULT_SINK_DOWN_FILE`` (:mod:`pipeline.sinks.faults`): while
the file exists every insert fails like an unreachable server. With live
traffic flowing, ClickHouse is "down" for about 35 s: 20 s of live traffic at
20x wall time (400 s of event time, 3,200 rows), then a burst until the full
buffer pauses the intake, then two status periods (10 s) without progress:

* verdicts keep flowing to Kafka the whole time;
* nothing is acked (offsets stay behind the unwritten rows) and the sink
  backs off; its buffer stays within the configured bound -- at the end of
  the outage a burst fills it, and the worker stops taking input instead of
  growing (``SinkBackpressure``);
* when ClickHouse is back, the buffer is written and the worker catches up;
  the stored rows are exactly the events sent.
"""

from __future__ import annotations

import re
import time
from datetime import datetime

import pytest

from workers import PacedTraffic, Stack, VerdictTap, count_rows, latest_by_channel, publish, steady_events

pytestmark = pytest.mark.integration

CHANNELS = {f"prov{i}/model@paid": ("chat" if i % 2 else "embed") for i in range(8)}
LIVE_S = 20.0         # wall seconds of live traffic while ClickHouse is down
MAX_ROWS = 6_000      # per-table buffer bound (CHANNEL_HEALTH_SINK_MAX_ROWS)
SPEED = 20.0          # event time per wall time: LIVE_S of traffic is 400 s of event time
HELD_STATUSES = 2     # status lines (5 s apart, snapshot_interval_s) after the intake paused, none with progress


@pytest.fixture
def stack(tmp_path):
    s = Stack(tmp_path, partitions=4).start()
    try:
        yield s
    finally:
        s.close()


def _log_time(line_match: re.Match) -> float:
    return datetime.strptime(line_match.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()


def _wait_statuses(w, n: int, timeout_s: float) -> int:
    """Wait until the worker's current run has logged ``n`` status lines; return how many it has."""
    deadline = time.monotonic() + timeout_s
    while len(w.statuses()) < n:
        if not w.alive or time.monotonic() > deadline:
            pytest.fail(f"worker {w.name}: {len(w.statuses())} of {n} status lines after {timeout_s:.0f} s "
                        f"(alive: {w.alive}); log:\n{w.log_tail()}")
        time.sleep(0.2)
    return len(w.statuses())


def test_clickhouse_outage_verdicts_flow_memory_bounded_nothing_lost(stack, tmp_path):
    down = tmp_path / "clickhouse-down"
    now = int(time.time() * 1000)
    start = now - now % 30_000 - 60 * 60_000
    # Live traffic: 8 channels x 1 req/s at 20x wall time = 160 rows/s, ~3,200 rows in the first 20 s of the outage.
    live = steady_events(CHANNELS, start, 30 * 60, per_s=1, seed=9)
    tap = VerdictTap(stack.settings)
    traffic = None
    try:
        w = stack.worker("w1", CHANNEL_HEALTH_FAULT_SINK_DOWN_FILE=str(down),
                         CHANNEL_HEALTH_SINK_MAX_ROWS=str(MAX_ROWS)).start()
        traffic = PacedTraffic(stack.settings, live, speed=SPEED)
        w.wait_status(lambda st: st["written"] > 0, 60, "rows written")

        down.touch()                                 # ClickHouse goes away
        t_down = time.monotonic()
        w.wait_for_log(r"ClickHouse write failed \(1 in a row", 10)
        time.sleep(max(0.0, t_down + LIVE_S - time.monotonic()))
        traffic.stop()                               # 20 s of live traffic during the outage
        flowing = [(t, v) for t, v in tap.snapshot() if t >= t_down]
        # A burst: 10 min of backlog arriving at once, one event per message (4,800 messages: more than
        # two batches), larger than what is left of the buffer bound.
        burst = steady_events(CHANNELS, (traffic.last_ts or start) + 1000, 10 * 60, per_s=1, seed=10)
        publish(stack.settings, burst, span_ms=None, max_events=1)
        sent = traffic.sent + len(burst)
        # The burst fills the buffer and the intake pauses; then HELD_STATUSES more status lines (5 s apart)
        # must show no progress: the worker is alive and reporting, and takes no input.
        w.wait_status(lambda st: st["intake"] == "paused", 60, "intake paused by the full sink buffer")
        n1 = len(w.statuses())
        s1 = w.statuses()[-1]
        n2 = _wait_statuses(w, n1 + HELD_STATUSES, 30)
        s2 = w.statuses()[-1]
        statuses_down = [st for st in w.statuses() if st["sink"] == "down"]
        # From the first status line that reports the outage (a snapshot of rows written just before
        # the outage may still have been acked between the last "ok" line and the first failed write).
        acked_at_start = statuses_down[0]["acked"] if statuses_down else None

        down.unlink()                                # ClickHouse is back
        back_at = time.time()
        outage_s = time.monotonic() - t_down
        back = w.wait_for_log(r"\[(\S+ \S+)\] \[\d+\] \[WARNING\] ClickHouse writes recovered after ([\d.]+) s "
                              r"\((\d+) failed attempts\); (\d+) buffered rows written", 30)
        drained = w.wait_drained(burst[-1]["ts_ms"], 60)
        caught_up_s = time.time() - back_at
        assert w.stop() == 0, w.log_tail()
    finally:
        if traffic is not None and not traffic._stop.is_set():
            traffic.stop()
        tap.close()

    rows = count_rows(w.chdb_dir)
    peak = max(st["peak"] for st in w.statuses()) if w.statuses() else drained["peak"]
    verdict_ts = sorted(v.ts_ms for _, v in flowing)
    first_write_s = _log_time(back) - back_at
    print(f"\nMEASURED item4: outage {outage_s:.0f} s; verdicts published in its first {LIVE_S:.0f} s: {len(flowing)} "
          f"({(verdict_ts[-1] - verdict_ts[0]) / 1000 if verdict_ts else 0:.0f} s of event time); acked during the "
          f"outage: {max(st['acked'] for st in statuses_down) - acked_at_start}; peak buffered rows {peak} (bound "
          f"{MAX_ROWS}/table); burst held back: {s2['events_in']} of {sent} events taken, {s2['pending']} rows "
          f"buffered; after recovery: first write {first_write_s:.1f} s ({back.group(3)} failed attempts, "
          f"{back.group(4)} rows), everything written and acked {caught_up_s:.1f} s; rows {rows}")
    # Verdicts kept flowing to Kafka during the outage, for every channel, with event time advancing.
    assert len(latest_by_channel(v for _, v in flowing)) == len(CHANNELS)
    assert verdict_ts[-1] - verdict_ts[0] >= 0.5 * LIVE_S * SPEED * 1000   # >= 200 s of the 400 s sent
    # Offsets never ran ahead of the unwritten rows.
    assert statuses_down and all(st["acked"] == acked_at_start for st in statuses_down)
    # Memory stayed bounded: the full buffer stopped the intake (no progress between two statuses).
    assert n2 > n1 and s1["sink"] == s2["sink"] == "down"
    assert s1["intake"] == s2["intake"] == "paused"
    assert s1["events_in"] == s2["events_in"] < sent
    assert peak <= 2 * MAX_ROWS                 # events + verdicts tables, MAX_ROWS each
    # Caught up, nothing lost, nothing doubled.
    assert first_write_s < 10
    assert rows["final"] == sent and rows["distinct"] == sent


def test_a_killed_sink_process_is_replaced_and_no_row_is_lost(stack):
    """The worker's ClickHouse writer (a child process) is SIGKILLed mid-backlog: the worker keeps running,
    starts a new one with the rows not yet written, and every event is stored exactly once."""
    import psutil

    now = int(time.time() * 1000)
    start = now - now % 30_000 - 3 * 3_600_000
    events = steady_events(CHANNELS, start, 3600, per_s=1, seed=5)  # 28,800 events
    half = len(events) // 2
    w = stack.worker("w1")
    w.start()
    publish(stack.settings, events[:half])
    w.wait_status(lambda st: st["written"] > 0, 90, "rows written")
    [sink] = [c for c in psutil.Process(w.proc.pid).children() if "pipeline.sinks.child" in c.cmdline()]
    publish(stack.settings, events[half:])
    sink.kill()
    w.wait_drained(events[-1]["ts_ms"], 90)
    assert w.alive, w.log_tail()
    restarted = w.wait_for_log(r"sink process was killed by SIGKILL before writing; started a new sink process "
                               r"\(\d+\) and sent it the (\d+) unwritten rows", 5)
    [replacement] = [c for c in psutil.Process(w.proc.pid).children() if "pipeline.sinks.child" in c.cmdline()]
    assert replacement.pid != sink.pid
    assert w.stop() == 0, w.log_tail()
    rows = count_rows(w.chdb_dir)
    print(f"\nMEASURED sink process kill: {restarted.group(1)} rows re-sent to the new sink process; stored {rows}")
    assert rows["final"] == rows["distinct"] == len(events)
