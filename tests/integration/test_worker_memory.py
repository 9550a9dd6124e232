"""A real worker's memory with many one-event channels (issue #34 part 1: 20,000 channels ≤ 1 GB RSS).

``python -m pipeline.cli worker`` (as the reliability tests start it: quality scoring off) on the embedded
broker, 8 input partitions, takes one ``ok`` event for each of ``CHANNELS`` channels (``p{i%7}/m-{i:05d}``,
routes of 5; in envelopes of 500), writes their rows to chDB and publishes their verdicts, then saves the
snapshots of every channel (the capture that cost 1.6 GB before, docs/MEMORY.md). The figure is the worker
process's peak RSS, the kernel's high-water mark (``VmHWM``, /proc/PID/status, proc(5)), read after that
capture; printed for docs/MEMORY.md (``pytest -s``). The 20,000-channel form is marked slow (~2 min).
"""

from __future__ import annotations

import time

import pytest

from pipeline.tools.bench.rss import peak_rss_mb

from workers import Stack, publish

pytestmark = pytest.mark.integration

GIB_MB = 1024.0


@pytest.mark.parametrize("channels", [2_000, pytest.param(20_000, marks=pytest.mark.slow)])
def test_worker_peak_rss_with_one_event_channels_is_under_1_gb(tmp_path, channels: int) -> None:
    import psutil

    stack = Stack(tmp_path, partitions=8).start()
    try:
        assert stack.settings is not None
        w = stack.worker("mem").start()
        w.wait_for_log(r"worker ready", 120)
        assert w.proc is not None
        before = psutil.Process(w.proc.pid).memory_info().rss / 2**20
        now = int(time.time() * 1000)
        events = [{"event_id": f"e-{i}", "ts_ms": now - 60_000 + i % 1000, "channel": f"p{i % 7}/m-{i:05d}",
                   "route": f"r{i // 5}", "status": "ok", "latency_ms": 100.0 + (i % 50) * 7}
                  for i in range(channels)]
        publish(stack.settings, events, span_ms=None)
        drained = w.wait_status(lambda st: st["events_in"] >= channels and st["pending"] == 0
                                and st["unacked"] == 0, 300, f"{channels} events processed and written")
        # Snapshots are saved every 5 s (``snapshot_interval_s``) of the channels changed since: three status
        # lines (~6 s apart) after the drained one, the capture of every channel is behind.
        seen = len(w.statuses())
        saved = w.wait_status(lambda st: len(w.statuses()) >= seen + 3, 60, "three more status lines")
        rss = psutil.Process(w.proc.pid).memory_info().rss / 2**20
        peak = peak_rss_mb(w.proc.pid)
    finally:
        stack.close()
    print(f"\nworker, {channels} one-event channels: RSS ready {before:.0f} MiB, after {rss:.0f} MiB, "
          f"peak {peak:.0f} MiB, snapshots saved {saved['snapshots']}")
    assert drained["events_in"] == channels and saved["snapshots"] >= 1
    assert peak <= GIB_MB
