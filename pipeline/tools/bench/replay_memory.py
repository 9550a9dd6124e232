"""Where a long replay's RSS goes, hour by hour: a leak or the allocator (issue #34).

The bench's ``warm`` stage replayed 24 h of event time and reported the RSS growth over the second 12 h
(target <= 25 MB); three runs on an idle machine read 36, -14.9 and 46 MB (it now replays 48 h and
compares floors, :func:`pipeline.tools.bench.report.replay_growth_mb`). This tool replays ``days``
such days back to back through the same path (:class:`~pipeline.engine.batch.BatchProcessor` and the
chDB sink, :func:`pipeline.tools.bench.workload.warmup_day`'s hours) and records after every hour:

- ``rss_mb``: the process RSS (psutil), as the bench reads it;
- ``trimmed_mb``: the RSS after glibc ``malloc_trim(0)`` (free heap pages handed back; glibc manual,
  "Memory Allocation Tunables" / malloc_trim(3)), i.e. without the allocator's cached free memory;
- ``traced_mb``: memory allocated through Python's allocators and numpy, still live (``tracemalloc``,
  numpy reports its data buffers to it) -- what our objects hold;
- ``objects``: live objects the garbage collector tracks (``gc.get_objects``).

A leak of ours grows ``traced_mb`` or ``objects`` with event time; allocator noise moves ``rss_mb`` but
not ``trimmed_mb`` / ``traced_mb``; growth only in ``trimmed_mb`` is memory outside Python's allocators
(chDB's engine: this path has no Kafka client).

``python -m pipeline.tools.bench.replay_memory [--days 2] [--channels 1000] [--no-trace] [--no-sink]
[--json PATH]``
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import tempfile
import tracemalloc
from typing import Any

from pipeline.tools.bench import workload as W
from pipeline.tools.bench.fill import PartitionBatcher
from pipeline.tools.bench.rss import malloc_trim, rss_mb

HOUR_MS = 3_600_000
DAY_MS = 24 * HOUR_MS


def replay(days: int = 2, channels: int = 1_000, per_hour: int = 25, trace: bool = True, sink: bool = True,
           end_ms: int | None = None) -> dict[str, Any]:
    """Replay ``days`` (>= 1) days of ``per_hour`` events per channel per hour for ``channels`` channels,
    ending at ``end_ms`` (ms, at least 60 s into its hour); per hour the figures of the module doc (MiB).
    ``sink`` False: without the chDB sink (what the engine alone holds). ``end_ms`` None: as the bench's
    (:func:`~pipeline.tools.bench.run.measure_start_ms`, relative to the wall clock; a replay of event time
    months past showed none of the sink's swing, docs/THROUGHPUT.md)."""
    from pipeline.tools.bench.run import measure_start_ms

    from pipeline.config import Settings
    from pipeline.engine import Engine
    from pipeline.engine.batch import BatchProcessor
    from pipeline.sinks.clickhouse import ClickHouseSink

    end_ms = measure_start_ms() if end_ms is None else end_ms
    if trace:
        tracemalloc.start()
    ch = W.Channels.make(channels)
    chdb = (ClickHouseSink.from_settings(Settings(kafka_bootstrap=None,
                                                  clickhouse_url=f"chdb://{tempfile.mkdtemp(prefix='chdb-')}"))
            if sink else None)
    processor = BatchProcessor(Engine())
    hours: list[dict[str, Any]] = []
    for d in range(days):
        day_end = end_ms - (days - 1 - d) * DAY_MS
        for h, batch in enumerate(W.warmup_day(ch, day_end, per_hour=per_hour, seed=2 + 100 * d)):
            if h == 24:  # the lead-in minute before the measured traffic: not an hour
                continue
            batcher = PartitionBatcher(4, 500)
            out = processor.process([v for _, v in batcher.add(batch) + batcher.flush()])
            if chdb is not None:
                chdb.add_events(out.stored)
                chdb.add_event_batches(out.envelopes)
                chdb.add_verdicts(out.verdicts)
                chdb.flush()
            del out, batch
            gc.collect()
            row: dict[str, Any] = {"hour": len(hours) + 1, "rss_mb": round(rss_mb(), 1)}
            if trace:
                row["traced_mb"] = round(tracemalloc.get_traced_memory()[0] / 2**20, 1)
            row["objects"] = len(gc.get_objects())
            malloc_trim()
            row["trimmed_mb"] = round(rss_mb(), 1)
            hours.append(row)
            print(json.dumps(row), file=sys.stderr, flush=True)
    n = len(hours)
    keys = [k for k in ("rss_mb", "trimmed_mb", "traced_mb", "objects") if k in hours[0]]
    return {"days": days, "channels": channels, "per_hour": per_hour, "sink": sink, "hours": hours,
            "growth_second_half": {k: round(hours[-1][k] - hours[n // 2][k], 1) for k in keys},
            "growth_last_day": {k: round(hours[-1][k] - hours[n - 24][k], 1) for k in keys} if n >= 48 else None}


def main(argv: list[str] | None = None) -> None:
    """Command line: see the module doc."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--days", type=int, default=2)
    ap.add_argument("--channels", type=int, default=1_000)
    ap.add_argument("--per-hour", type=int, default=25)
    ap.add_argument("--no-trace", action="store_true")
    ap.add_argument("--no-sink", action="store_true")
    ap.add_argument("--json")
    a = ap.parse_args(argv)
    if a.days < 1 or a.channels < 1 or a.per_hour < 1:
        ap.error("--days, --channels and --per-hour must be >= 1")
    out = replay(a.days, a.channels, a.per_hour, trace=not a.no_trace, sink=not a.no_sink)
    text = json.dumps(out, indent=1)
    if a.json:
        with open(a.json, "w") as fh:
            fh.write(text)
    print(json.dumps({k: v for k, v in out.items() if k != "hours"}))


if __name__ == "__main__":
    main()
