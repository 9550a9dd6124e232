"""Stage (c): the full pipeline -- validate → detectors → verdicts → ClickHouse sink.

Two drivers of the same hot path (:class:`~pipeline.engine.batch.BatchProcessor`
and :class:`~pipeline.sinks.clickhouse.ClickHouseSink` on chDB):

``faust``
    The production worker itself: :func:`pipeline.stream.app.build_app`
    (intake batches, verdict/DLQ publishing, background ClickHouse
    flusher, state snapshots and acks, quality sampling hook) run by a
    ``faust.Worker`` in this process. The bench only wraps
    ``processor.process`` and the events table's ``flush`` to count.
``aiokafka``
    A plain aiokafka consumer (``getmany``, up to 2,000 messages) driving the
    same processor and sink: publish verdicts and dead letters, buffer rows,
    flush them on a thread about once a second. Without faust's per-message
    cost; optionally only some partitions (several such workers split the
    topic like members of one consumer group). It also records, per verdict,
    the time from its batch's fetch to Kafka's acknowledgement of the
    verdict (``consumed_to_published_ms``). No state snapshots or offset
    commits (the bench needs neither).

Both start from the seeded state topic (1,000 channels with 24 h baselines,
each record naming its channel's input partition, as a worker writes them):
as after a restart, the channels of the assigned partitions are restored
before the first batch (``reset_s``: reading the state topic + restoring), so
the rate below is that of a worker that is ready. The clock runs from the
first batch handed to the processor until every event's row is written to
ClickHouse (``events_per_s``); ``processed_per_s`` stops
at the last processed event. Without ``events`` (paced runs) a stage runs
until the file ``<out>.stop`` appears; it writes ``<out>.ready`` after its
first batch.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from pathlib import Path
from typing import Any

from pipeline.tools.bench.consume import Clock
from pipeline.tools.bench.rss import RssSampler, peak_rss_mb
from pipeline.tools.bench.stage import scratch_dir, stage_main
from pipeline.config import Settings, Topics

log = logging.getLogger("channel_health.bench")


@dataclasses.dataclass(frozen=True)
class BenchSettings(Settings):
    """Settings whose input topic is a shared pre-filled topic; the other topics follow the prefix."""

    requests_topic: str = ""

    @property
    def topics(self) -> Topics:
        t = Topics.with_prefix(self.topic_prefix)
        return dataclasses.replace(t, requests=self.requests_topic) if self.requests_topic else t


def bench_settings(args: dict[str, Any], chdb_dir: str) -> BenchSettings:
    return BenchSettings(kafka_bootstrap=args["bootstrap"], clickhouse_url=f"chdb://{chdb_dir}",
                         topic_prefix=args["prefix"], consumer_group=args["group"],
                         partitions=int(args.get("partitions", 4)), requests_topic=args["topic"],
                         sink_process=bool(args.get("sink_process", True)))


class _Counters:
    """Counts around the processor and the events table's flush."""

    def __init__(self) -> None:
        self.clock = Clock()
        self.processed_wall: float | None = None
        self.process_s = 0.0
        #: CPU time of the calling thread in ``process`` (less than ``process_s`` when it waited for the GIL).
        self.process_cpu_s = 0.0
        self.rows_written = 0
        self.flush_s = 0.0
        self.flushes = 0
        self.verdicts = 0
        self.dead_letters = 0
        #: CPU seconds of the sink process at the clock's reads (a ProcessSink only).
        self.sink_cpu_s: list[float] = []

    def wrap(self, processor: Any, sink: Any, expected: int | None) -> None:
        original = processor.process
        clock = self.clock

        def process(raws: Any, *a: Any, **kw: Any) -> Any:
            clock.start()
            t, c = time.perf_counter(), time.thread_time()
            out = original(raws, *a, **kw)
            self.process_s += time.perf_counter() - t
            self.process_cpu_s += time.thread_time() - c
            clock.messages += len(raws)
            clock.events = processor.events_in
            self.verdicts += len(out.verdicts)
            self.dead_letters += len(out.dead_letters)
            if expected is not None and self.processed_wall is None and processor.events_in >= expected:
                self.processed_wall = time.perf_counter()
            return out

        processor.process = process
        # request_events rows (as rows and as whole envelopes): a ProcessSink counts them per table in
        # ``written``, an in-process sink's flush_counts returns them
        tables = ("events", "event_batches")
        in_process = not hasattr(sink, "written")
        flush = sink.flush_counts if in_process else sink.flush

        def counted_flush() -> Any:
            t = time.perf_counter()
            before = 0 if in_process else sum(sink.written[name] for name in tables)
            out = flush()
            n = sum(out[name] for name in tables) if in_process else sum(sink.written[name] for name in tables) - before
            self.flush_s += time.perf_counter() - t
            self.rows_written += n
            self.flushes += 1 if n else 0
            return out

        if in_process:
            sink.flush_counts = counted_flush
        else:
            sink.flush = counted_flush
        pid = getattr(sink, "pid", None)
        if pid is not None:  # the sink process's CPU counts in events_per_cpu_s
            import psutil

            child = psutil.Process(pid)

            def cpu_s() -> float:
                t = child.cpu_times()
                self.sink_cpu_s.append(t.user + t.system)  # read at the clock's start and stop
                return time.process_time() + t.user + t.system

            self.clock.cpu_clock = cpu_s

    def result(self, extra: dict[str, Any]) -> dict[str, Any]:
        out = self.clock.result()
        first = self.clock.first_wall or 0.0
        if self.processed_wall is not None:
            out["processed_s"] = round(self.processed_wall - first, 3)
            out["processed_per_s"] = round(self.clock.events / max(self.processed_wall - first, 1e-9), 1)
        out.update({"verdicts": self.verdicts, "dead_letters": self.dead_letters, "rows_written": self.rows_written,
                    "process_s": round(self.process_s, 3), "process_cpu_s": round(self.process_cpu_s, 3),
                    "flush_s": round(self.flush_s, 3),
                    "flushes": self.flushes,
                    "sink_rows_per_flush_s": round(self.rows_written / self.flush_s, 1) if self.flush_s else None,
                    "sink_process_cpu_s": round(self.sink_cpu_s[-1] - self.sink_cpu_s[0], 3) if self.sink_cpu_s else None})
        out.update(extra)
        return out


class GcClock:
    """Wall time the garbage collector ran in this process, per generation (via ``gc.callbacks``)."""

    def __init__(self) -> None:
        import gc

        self.seconds = [0.0, 0.0, 0.0]
        self.collections = [0, 0, 0]
        self._t = 0.0
        gc.callbacks.append(self._callback)

    def _callback(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._t = time.perf_counter()
        else:
            g = int(info.get("generation", 0))
            self.seconds[g] += time.perf_counter() - self._t
            self.collections[g] += 1

    def result(self) -> dict[str, Any]:
        return {"gc_s_by_generation": [round(x, 3) for x in self.seconds], "gc_collections": list(self.collections)}


def _profiler(args: dict[str, Any]) -> Any:
    """A running cProfile profiler when ``args["cprofile"]`` names a stats file (for digging)."""
    if not args.get("cprofile"):
        return None
    import cProfile

    prof = cProfile.Profile()
    prof.enable()
    return prof


# -- faust driver ---------------------------------------------------------------------------------------------

def run_faust(args: dict[str, Any]) -> None:
    from pipeline.tools.bench.bare_faust import finish, run_worker
    from pipeline.sinks.process import open_sink
    from pipeline.stream.app import build_app
    from pipeline.stream.runtime import tune_gc

    sampler = RssSampler().start()
    settings = bench_settings(args, scratch_dir(args, "chdb-"))
    sink = open_sink(settings)  # as run_worker: ClickHouse from a sink process unless sink_process is off
    sink_sampler = RssSampler(pid=sink.pid).start() if getattr(sink, "pid", None) else None
    app, state = build_app(settings, None, sink, datadir=scratch_dir(args, "faust-"))
    expected = args.get("events")
    expected = int(expected) if expected is not None else None
    counters = _Counters()
    counters.wrap(state.processor, sink, expected)
    gc_clock = GcClock()
    profiler = _profiler(args)
    out_path = Path(args["out"])
    ready_path, stop_path = out_path.with_suffix(".ready"), out_path.with_suffix(".stop")
    tune_gc()  # as run_worker does

    @app.task
    async def watch() -> None:
        while True:
            await asyncio.sleep(0.02)
            if counters.clock.first_wall is not None and not ready_path.exists():
                ready_path.write_text("ready")
            done = (expected is not None and counters.processed_wall is not None
                    and counters.rows_written >= expected) or (expected is None and stop_path.exists())
            if done:
                if profiler is not None:
                    profiler.disable()
                    profiler.dump_stats(args["cprofile"])
                counters.clock.stop()
                counters.clock.events = state.processor.events_in
                sampler.stop()
                sink_rss = {}
                if sink_sampler is not None:
                    sink_sampler.stop()
                    sink_rss = {"sink_process_peak_rss_mb": round(peak_rss_mb(sink.pid), 1),
                                "sink_process_rss_max_sampled_mb": round(sink_sampler.max_mb, 1)}
                finish(args, counters.result({
                    "driver": "faust", "rss_max_sampled_mb": round(sampler.max_mb, 1), **sink_rss,
                    "rss_timeline": _timeline(sampler, counters),
                    "snapshots_written": state.checkpoint.snapshots_written,
                    "agent_wall_s": {k: round(v, 3) for k, v in state.wall_s.items()}, **gc_clock.result(),
                    "backpressure_waits": state.writes.backpressure_waits,
                    "restored_channels": getattr(state.processor, "restored", None),
                    "reset_s": round(state.assignment.reset_s, 3)}))

    run_worker(app)


# -- aiokafka driver ------------------------------------------------------------------------------------------

async def _aiokafka(args: dict[str, Any], sampler: RssSampler) -> dict[str, Any]:
    from aiokafka import AIOKafkaProducer

    from pipeline.tools.bench.consume import open_reader
    from pipeline.contracts import encode
    from pipeline.engine import Engine
    from pipeline.sinks.buffer import FLUSH_SHARE
    from pipeline.sinks.errors import SinkBackpressure
    from pipeline.sinks.process import open_sink
    from pipeline.engine.batch import BatchProcessor
    from pipeline.stream.state_topic import load_snapshot_records

    settings = bench_settings(args, scratch_dir(args, "chdb-"))
    topics = settings.topics
    sink = open_sink(settings)
    processor = BatchProcessor(Engine())
    parts = args.get("only_partitions")
    started = time.perf_counter()
    processor.load_snapshots(await load_snapshot_records(args["bootstrap"], topics.state),
                             parts if parts is not None else range(int(args.get("partitions", 4))))
    reset_s = time.perf_counter() - started
    from pipeline.stream.runtime import tune_gc

    tune_gc()  # as the production worker does
    expected = int(args["events"]) if args.get("events") is not None else None
    out_path = Path(args["out"])
    ready_path, stop_path = out_path.with_suffix(".ready"), out_path.with_suffix(".stop")
    delays: list[tuple[int, float]] = []  # per verdict: (ts_ms, published (acked by Kafka) minus its batch's fetch, ms)
    counters = _Counters()
    counters.wrap(processor, sink, expected)
    consumer = await open_reader(args["bootstrap"], topics.requests, parts)
    producer = AIOKafkaProducer(bootstrap_servers=args["bootstrap"], linger_ms=5, acks="all")
    await producer.start()
    tps = list(consumer.assignment())
    publish_s = add_s = 0.0
    kick = asyncio.Event()
    stopping = False

    async def flusher() -> None:
        while not stopping:
            try:
                await asyncio.wait_for(kick.wait(), 1.0)
            except asyncio.TimeoutError:
                pass
            kick.clear()
            if sink.pending_rows:
                await asyncio.to_thread(sink.flush)

    flush_task = asyncio.create_task(flusher())
    status_at = 0.0
    try:
        while (processor.events_in < expected) if expected is not None else not stop_path.exists():
            got = await consumer.getmany(timeout_ms=200, max_records=2_000)
            fetched = time.perf_counter()
            recs = [r for rs in got.values() for r in rs]
            if not recs:
                continue
            if not ready_path.exists():
                ready_path.write_text("ready")
            if time.monotonic() - status_at >= 1.0:  # as the faust worker: which partitions are caught up
                status_at = time.monotonic()
                processor.set_partition_status({
                    tp.partition: (await consumer.position(tp)) >= (consumer.highwater(tp) or 0) for tp in tps})
            out = processor.process([r.value for r in recs], [r.partition for r in recs], [r.offset for r in recs])
            t = time.perf_counter()
            futures = [await producer.send(topics.health, encode(v), key=v.channel.encode()) for v in out.verdicts]
            futures += [await producer.send(topics.dlq, d.to_kafka_value(), key=(d.event_id or "").encode() or None)
                        for d in out.dead_letters]
            if futures:
                await asyncio.gather(*futures)
            t2 = time.perf_counter()
            delays.extend((v.ts_ms, round((t2 - fetched) * 1000, 1)) for v in out.verdicts)
            publish_s += t2 - t
            for add, rows in ((sink.add_events, out.stored), (sink.add_event_batches, out.envelopes),
                              (sink.add_verdicts, out.verdicts)):
                while rows:
                    try:
                        add(rows)
                        break
                    except SinkBackpressure:
                        kick.set()
                        await asyncio.sleep(0.01)
            if sink.pending_rows * FLUSH_SHARE >= sink.max_rows:  # as the worker (pipeline.stream.app)
                kick.set()
            add_s += time.perf_counter() - t2
        while sink.pending_rows:
            kick.set()
            await asyncio.sleep(0.005)
        counters.clock.stop()
        counters.clock.events = processor.events_in
    finally:
        stopping = True
        kick.set()
        await flush_task
        await consumer.stop()
        await producer.stop()
        sink_rss = {"sink_process_peak_rss_mb": round(peak_rss_mb(sink.pid), 1)} if getattr(sink, "pid", None) else {}
        if hasattr(sink, "close"):
            sink.close()
    return counters.result({"driver": "aiokafka", **sink_rss, "partitions": sorted(tp.partition for tp in tps),
                            "rss_timeline": _timeline(sampler, counters),
                            "consumed_to_published_ms": delays if expected is None else None,
                            "publish_s": round(publish_s, 3), "sink_add_s": round(add_s, 3),
                            "restored_channels": processor.restored, "reset_s": round(reset_s, 3)})


def run(args: dict[str, Any]) -> dict[str, Any] | None:
    logging.basicConfig(level=logging.WARNING)
    if args["driver"] == "faust":
        run_faust(args)
        return None
    sampler = RssSampler().start()
    profiler = _profiler(args)
    result = asyncio.run(_aiokafka(args, sampler))
    if profiler is not None:
        profiler.disable()
        profiler.dump_stats(args["cprofile"])
    sampler.stop()
    result["peak_rss_mb"] = round(peak_rss_mb(), 1)
    result["rss_max_sampled_mb"] = round(sampler.max_mb, 1)
    return result


def _timeline(sampler: RssSampler, counters: _Counters, points: int = 40) -> list[tuple[float, float]]:
    """RSS samples ``(seconds since the first batch, MiB)``, at most ``points`` of them."""
    first = counters.clock.first_wall
    t0 = (first - time.perf_counter()) + (time.monotonic() - sampler.started_s) if first is not None else 0.0
    samples = [(round(t - t0, 2), v) for t, v in sampler.samples]
    step = max(1, len(samples) // points)
    return samples[::step]


if __name__ == "__main__":
    stage_main(run)
