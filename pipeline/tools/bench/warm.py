"""Stage: replay a compact 48 h of event time through the pipeline, in-process.

Fills every channel's 24 h latency baseline (and short windows) the way a
worker would after a day of traffic, and shows that memory stays flat while
event time advances: ``days`` (default 2) days are replayed, the first to fill
the windows and the sink (their memory grows with it), the last to show the
steady state (docs/THROUGHPUT.md). The RSS is sampled after every replayed
hour, after a garbage collection and glibc's ``malloc_trim(0)`` (free heap
pages handed back: the figure is what the process holds, not the
allocator's cache of freed temporaries; docs/THROUGHPUT.md). Events go through the real hot path -- :class:`BatchProcessor`
(decode, validate, engine with its evaluation rounds) and the ClickHouse
sink (chDB) -- in 500-event envelopes. Each hour holds ``per_hour`` events
per channel packed into the hour's first 20 s (enough ``ok`` samples for the
policy's 500-request baseline minimum at a fraction of a real day's volume), then a lead-in minute right before the
measured traffic.

At the end every channel's state is exported
(:func:`pipeline.state.snapshot.export_channel`) to ``args["snapshots"]``
(msgpack list of ``[channel, bytes]``); the orchestrator seeds each
pipeline stage's state topic with them.
"""

from __future__ import annotations

import gc
import time
from pathlib import Path
from typing import Any

import msgspec

from pipeline.tools.bench import workload as W
from pipeline.tools.bench.fill import PartitionBatcher
from pipeline.tools.bench.rss import RssSampler, malloc_trim, peak_rss_mb
from pipeline.tools.bench.stage import scratch_dir, stage_main


def run(args: dict[str, Any]) -> dict[str, Any]:
    from pipeline.config import Settings
    from pipeline.engine import Engine
    from pipeline.sinks.clickhouse import ClickHouseSink
    from pipeline.state.snapshot import export_channel
    from pipeline.engine.batch import BatchProcessor

    sampler = RssSampler().start()
    sampler.mark("start")
    ch = W.Channels.make(int(args["channels"]), seed=int(args.get("seed", 0)))
    chdb_dir = scratch_dir(args, "chdb-")
    sink = ClickHouseSink.from_settings(Settings(kafka_bootstrap=None, clickhouse_url=f"chdb://{chdb_dir}"))
    processor = BatchProcessor(Engine())
    sampler.mark("ready")
    hours: list[dict[str, Any]] = []
    events = verdicts = 0
    busy = 0.0
    end_ms, days = int(args["end_ms"]), int(args.get("days", 2))
    replay = ((d, h, b) for d in range(days)
              for h, b in enumerate(W.warmup_day(ch, end_ms - (days - 1 - d) * 86_400_000,
                                                 per_hour=int(args.get("per_hour", 25)), seed=2 + 100 * d))
              if h < 24 or d == days - 1)  # the lead-in minute only before the measured traffic
    for d, h, batch in replay:
        batcher = PartitionBatcher(int(args.get("partitions", 4)), int(args.get("batch_size", 500)))
        msgs = batcher.add(batch) + batcher.flush()
        t = time.perf_counter()
        out = processor.process([v for _, v in msgs])
        sink.add_events(out.stored)
        sink.add_event_batches(out.envelopes)
        sink.add_verdicts(out.verdicts)
        sink.flush()
        busy += time.perf_counter() - t
        events += len(batch)
        verdicts += len(out.verdicts)
        if h < 24:  # the last day's 25th batch is the lead-in minute before the measured traffic
            dead = len(out.dead_letters)
            del out
            gc.collect()
            malloc_trim()
            hours.append({"hour": 24 * d + h + 1, "rss_mb": round(sampler.mark(f"hour {24 * d + h + 1}"), 1), "events": events,
                          "dead_letters": dead})
    engine = processor.engine
    snaps = [(name, export_channel(engine, i)) for i, name in enumerate(engine.store.names)]
    Path(args["snapshots"]).write_bytes(msgspec.msgpack.encode(snaps))
    sampler.stop()
    rss = [h["rss_mb"] for h in hours]
    return {
        "events": events, "verdicts": verdicts, "channels": engine.store.n_channels,
        "busy_s": round(busy, 2), "events_per_s": round(events / busy, 1) if busy else None,
        "hours": hours, "rss_after_hour_1_mb": rss[0], "rss_after_hour_24_mb": rss[-1],
        "rss_growth_hours_2_to_24_mb": round(rss[-1] - rss[1], 1) if len(rss) > 1 else 0.0,
        "peak_rss_mb": round(peak_rss_mb(), 1),
        "snapshot_bytes": sum(len(b) for _, b in snaps),
        "baseline_hours_min": _baseline_hours_min(engine, int(args["end_ms"])),
    }


def _baseline_hours_min(engine: object, at_ms: int) -> int:
    """Fewest baseline hours any channel has at ``at_ms`` (24 = every channel's baseline is full)."""
    view = engine.store.view(at_ms)  # type: ignore[attr-defined]
    return int(view.base_hours.min()) if view.base_hours.size else 0


if __name__ == "__main__":
    stage_main(run)
