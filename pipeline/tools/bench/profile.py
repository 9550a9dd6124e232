"""Stage: where the CPU goes per event, in-process, no Kafka.

On the same synthetic events (500-event envelopes and single-event
messages), with an engine already holding the 1,000 channels' 24 h state
(the seeded snapshots), it times each step of the hot path separately:

- ``msgspec_decode``: typed msgspec decode only (what the ceiling does);
- ``validate_decode``: :class:`pipeline.ingest.decode.Decoder` (decode + checks);
- ``engine``: :meth:`pipeline.engine.Engine.process` on decoded events;
- ``processor``: :meth:`BatchProcessor.process` (decode + engine + outputs);
- ``sink_rows``: :meth:`ClickHouseSink.add_events` and ``add_event_batches`` (the batch's
  ``request_events`` rows: whole envelopes as they came, the other events as one JSON payload);
- ``sink_insert_wall``: :meth:`ClickHouseSink.flush` (chDB parses the JSON and inserts; wall time).

Figures are microseconds of CPU per event (``time.process_time``), so they
hold on a busy machine too. The collector is tuned as in the worker
(:func:`pipeline.stream.runtime.tune_gc`, once the inputs are built),
since CPython's default thresholds would add 25-35 %.
"""

from __future__ import annotations

import time
from typing import Any, Callable

import msgspec

from pipeline.tools.bench import workload as W
from pipeline.tools.bench.fill import PartitionBatcher, single_messages
from pipeline.tools.bench.stage import scratch_dir, stage_main


def _cpu(fn: Callable[[], Any]) -> tuple[float, Any]:
    t = time.process_time()
    out = fn()
    return time.process_time() - t, out


def _engine_with_state(snapshots_path: str | None) -> Any:
    from pipeline.engine import Engine
    from pipeline.state.snapshot import decode_snapshot, import_channel

    engine = Engine()
    if snapshots_path:
        with open(snapshots_path, "rb") as fh:
            for _name, blob in msgspec.msgpack.decode(fh.read()):
                import_channel(engine, decode_snapshot(blob))
    return engine


def run(args: dict[str, Any]) -> dict[str, Any]:
    from pipeline.tools.bench.ceiling import Envelope
    from pipeline.config import Settings
    from pipeline.contracts import RequestEvent
    from pipeline.ingest.decode import Decoder
    from pipeline.sinks.clickhouse import ClickHouseSink
    from pipeline.engine.batch import BatchProcessor
    from pipeline.stream.runtime import tune_gc

    n = int(args.get("events", 200_000))
    ch = W.Channels.make(int(args["channels"]))
    evs = W.stream(ch, n, int(args["start_ms"]), float(args["rps_per_channel"]), seed=7, id_prefix="prof")
    batcher = PartitionBatcher(int(args.get("partitions", 4)), int(args.get("batch_size", 500)))
    batched = [v for _, v in batcher.add(evs) + batcher.flush()]
    single = [v for _, _, v in single_messages(evs[: n // 10], int(args.get("partitions", 4)))]
    del evs

    tune_gc()
    env_dec = msgspec.json.Decoder(Envelope)
    ev_dec = msgspec.json.Decoder(RequestEvent)
    decoder = Decoder()
    now = int(time.time() * 1000)
    us: dict[str, dict[str, float]] = {"batched": {}, "single": {}}

    t, _ = _cpu(lambda: [env_dec.decode(v) for v in batched])
    us["batched"]["msgspec_decode"] = t / n * 1e6
    t, _ = _cpu(lambda: [ev_dec.decode(v) for v in single])
    us["single"]["msgspec_decode"] = t / len(single) * 1e6
    t, decoded = _cpu(lambda: [e for v in batched for e in decoder.decode(v, now).events])
    us["batched"]["validate_decode"] = t / n * 1e6
    t, _ = _cpu(lambda: [decoder.decode(v, now) for v in single])
    us["single"]["validate_decode"] = t / len(single) * 1e6

    engine = _engine_with_state(args.get("snapshots"))
    step = 4_000  # events per engine call, about what one worker batch holds
    t, _ = _cpu(lambda: [engine.process(decoded[i:i + step], low_watermark_ms=0,
                                        fields=engine.read_fields(decoded[i:i + step])) for i in range(0, n, step)])
    us["batched"]["engine"] = t / n * 1e6

    processor = BatchProcessor(_engine_with_state(args.get("snapshots")))
    per_call = 8
    outs: list[Any] = []
    t, _ = _cpu(lambda: [outs.append(processor.process(batched[i:i + per_call], [0] * len(batched[i:i + per_call])))
                         for i in range(0, len(batched), per_call)])
    us["batched"]["processor"] = t / n * 1e6
    single_proc = BatchProcessor(_engine_with_state(None))
    t, _ = _cpu(lambda: [single_proc.process(single[i:i + 2000], [0] * len(single[i:i + 2000]))
                         for i in range(0, len(single), 2000)])
    us["single"]["processor"] = t / len(single) * 1e6

    sink = ClickHouseSink.from_settings(Settings(kafka_bootstrap=None,
                                                 clickhouse_url=f"chdb://{scratch_dir(args, 'chdb-')}"))
    add = ins = 0.0
    for k, out in enumerate(outs):
        t, _ = _cpu(lambda: (sink.add_events(out.stored), sink.add_event_batches(out.envelopes)))  # noqa: B023 (called now)
        add += t
        if sink.pending_rows >= 50_000 or k == len(outs) - 1:  # the worker flushes about once a second
            w0 = time.perf_counter()
            sink.flush()
            ins += time.perf_counter() - w0  # chDB works on its own threads too: wall time here
    us["batched"]["sink_rows"] = add / n * 1e6
    us["batched"]["sink_insert_wall"] = ins / n * 1e6
    return {"events": n, "single_messages": len(single),
            "us_per_event": {k: {s: round(v, 2) for s, v in d.items()} for k, d in us.items()}}


if __name__ == "__main__":
    stage_main(run)
