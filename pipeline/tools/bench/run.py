"""``channel-health bench``: the whole benchmark in one run on the embedded broker.

Order (each measured stage is its own process, see :mod:`pipeline.tools.bench.stage`):

1. start the embedded broker; pre-fill two topics with the same synthetic
   events -- ``--events`` in 500-event envelopes, the first
   ``--single-events`` of them one per message -- while, in parallel,
   :mod:`~pipeline.tools.bench.warm` replays a compact 24 h of event time through
   the pipeline in-process (RSS per hour) and exports every channel's state;
2. (a) :mod:`~pipeline.tools.bench.ceiling` reads both topics with a bare aiokafka
   consumer that only decodes;
3. (b) :mod:`~pipeline.tools.bench.bare_faust`: a faust agent that does nothing,
   on each topic;
4. (c) :mod:`~pipeline.tools.bench.pipeline_run`: the full pipeline on each topic,
   as the production faust worker and as a plain aiokafka driver of the same
   processor and sink; each starts from a state topic seeded with the 24 h
   state of all channels (the assigned partitions' channels are restored
   before the first batch, as after a restart);
5. two aiokafka-driven workers splitting the partitions (1 vs 2 workers);
6. paced runs: the faust worker, then the aiokafka driver, on a live topic
   fed at half the batched rate each measured, event time running
   ``--paced-speed`` times faster than the wall clock so that evaluation
   rounds (and their 1,000 verdicts) come every ~1.5 s; the delay of each
   verdict is measured from the moment the first event at or past its event
   time was published until a subscriber on ``channel.health`` received it
   (an upper bound of "consumed → produced": it also holds the producer's
   batching and two broker hops); the aiokafka driver also reports the
   exact fetch → verdict acknowledged time per verdict;
7. :mod:`~pipeline.tools.bench.profile`: CPU per event of each step, in-process.

Stages run one after another (this is a 2-core machine); a failed stage is
reported and the rest still run. With ``--repeat N`` the throughput stages of
steps 2-4 run in N rounds, each stage once per round in the order above (own
consumer groups and topics per run), and each stage's run with the median
rate is reported, every run's rate beside it (:func:`median_run`).
Interleaving puts every stage's runs over the same stretch of time, so the
ratios between stages are not skewed by the machine speeding up or slowing
down between stages (on this shared VM the same stage varies by ±20 % from
one minute to the next); the report also gives the ratios round by round.
"""

from __future__ import annotations

import asyncio
import os
import platform
import shutil
import sys
import tempfile
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

import msgspec
import numpy as np

from pipeline.tools.bench import report
from pipeline.tools.bench import workload as W
from pipeline.tools.bench.fill import PartitionBatcher, Publisher, seed_state, single_messages
from pipeline.tools.bench.schedule import paced_schedule
from pipeline.tools.bench.stage import StageFailed, log_tail, run_stage, spawn, wait_result

HOUR_MS = 3_600_000
STAGE_TIMEOUT_S = 420.0
#: Pipeline workers run without the quality agent: it loads torch and the embedding model (+~330 MB,
#: seconds of CPU at start) and only works on sampled answer texts, which this traffic has none of;
#: ``channel-health bench --quality`` measures it on its own.
PIPELINE_ENV = {"CHANNEL_HEALTH_QUALITY": "off"}


@dataclass
class BenchOptions:
    """What to run; see ``channel-health bench --help``."""

    channels: int = 1_000
    events: int = 500_000
    single_events: int = 30_000
    batch_size: int = 500
    partitions: int = 4
    rps_per_channel: float = 10.0
    warm_per_hour: int = 25
    paced_seconds: float = 20.0
    paced_speed: float = 20.0
    #: Input rate of the paced runs (events/s); None: half of each driver's batched pipeline rate (which then
    #: needs the pipeline stage). Set it to run the paced stage alone (``--skip ceiling,bare,pipeline,...``).
    paced_rate: float | None = None
    profile_events: int = 200_000
    #: Runs of each throughput stage (ceiling, bare faust, pipeline); the run with the median rate is reported.
    repeat: int = 1
    skip: list[str] = field(default_factory=list)
    workdir: str | None = None
    #: The pipeline stages write ClickHouse from a sink process, as the worker does by default
    #: (``CHANNEL_HEALTH_SINK_PROCESS``); False: from the worker's own process.
    sink_process: bool = True

    @classmethod
    def quick(cls, **overrides: Any) -> "BenchOptions":
        """A smaller run: 150k batched / 10k single events, 10 s paced (the 24 h replay stays full)."""
        base = dict(events=150_000, single_events=10_000, paced_seconds=10.0, profile_events=50_000)
        base.update(overrides)
        return cls(**base)

    def validate(self) -> None:
        if self.channels < 1 or self.events < self.batch_size or self.single_events < 1:
            raise ValueError("need channels >= 1, events >= batch size, single events >= 1")
        if self.single_events > self.events:
            raise ValueError("--single-events must not exceed --events (they are the first events of the stream)")
        if self.partitions < 1 or self.batch_size < 1 or self.rps_per_channel <= 0:
            raise ValueError("partitions, batch size and rps per channel must be positive")
        if self.paced_rate is not None and not 0 < self.paced_rate <= 10_000_000:
            raise ValueError(f"--paced-rate must be in (0, 10,000,000] events/s, got {self.paced_rate}")
        if not 1 <= self.repeat <= 9:
            raise ValueError(f"--repeat must be 1..9, got {self.repeat}")


def skip_names(items: list[str]) -> set[str]:
    """The stages ``--skip`` names, given repeated, comma-separated, or both.

    >>> sorted(skip_names(["ceiling,bare", " workers ", "profile,"]))
    ['bare', 'ceiling', 'profile', 'workers']
    """
    return {name.strip() for item in items for name in item.split(",") if name.strip()}


def _run_tag(k: int) -> str:
    """Name suffix of repeated run ``k`` (its own consumer group, topics and result file); none for the first."""
    return f"_run{k + 1}" if k else ""


def median_run(results: list[dict[str, Any]]) -> dict[str, Any]:
    """The run with the median rate of ``results`` (one stage run several times), annotated with every run's rate.

    Rate: ``events_per_s``, or for the ceiling (one result per kind) the batched one. The kept run gets
    ``runs_events_per_s`` (the rates in run order; per kind for the ceiling).

    >>> r = median_run([{"events_per_s": 3.0}, {"events_per_s": 1.0}, {"events_per_s": 2.0}])
    >>> r["events_per_s"], r["runs_events_per_s"]
    (2.0, [3.0, 1.0, 2.0])
    """
    def rate(r: dict[str, Any]) -> float:
        return float(r["batched"]["events_per_s"] if "batched" in r else r["events_per_s"])

    kept = dict(sorted(results, key=rate)[(len(results) - 1) // 2])
    for key in ("peak_rss_mb", "sink_process_peak_rss_mb"):
        peaks = [r[key] for r in results if isinstance(r.get(key), (int, float))]
        if peaks:
            kept[f"runs_{key}"] = peaks  # the report's peak RSS is the largest of any run, not the median run's
    if "batched" in kept:
        for kind in ("batched", "single"):
            kept[kind] = {**kept[kind], "runs_events_per_s": [r[kind]["events_per_s"] for r in results]}
    else:
        kept["runs_events_per_s"] = [r["events_per_s"] for r in results]
    return kept


def _env() -> dict[str, str]:
    return {**os.environ, **PIPELINE_ENV}


def machine_info() -> dict[str, Any]:
    import importlib.metadata as md

    versions = {}
    for pkg in ("faust-streaming", "aiokafka", "msgspec", "numpy", "chdb", "clickhouse-connect"):
        try:
            versions[pkg] = md.version(pkg)
        except md.PackageNotFoundError:
            versions[pkg] = None
    return {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform(),
            "loadavg_start": [round(x, 2) for x in os.getloadavg()], "versions": versions}


def measure_start_ms(now_ms: int | None = None) -> int:
    """Event time of the first measured event: 5 min into the hour two hours ago, so the
    24 complete hours before it are the replayed day and the runs stay inside one hour.

    >>> measure_start_ms(10 * 3_600_000 + 123) == 8 * 3_600_000 + 300_000
    True
    """
    now_ms = int(time.time() * 1000) if now_ms is None else now_ms
    return (now_ms // HOUR_MS - 2) * HOUR_MS + 300_000


async def fill_topics(bootstrap: str, opts: BenchOptions, ch: W.Channels, start_ms: int,
                      batched_topic: str, single_topic: str) -> dict[str, Any]:
    from pipeline.kafka.admin import ensure_topics

    await ensure_topics(bootstrap, [batched_topic, single_topic], opts.partitions)
    t0 = time.perf_counter()
    batcher = PartitionBatcher(opts.partitions, opts.batch_size)
    batched_msgs = single_msgs = 0
    single_per_part = [0] * opts.partitions
    async with Publisher(bootstrap) as pub:
        done = 0
        for chunk in W.stream_chunks(ch, opts.events, start_ms, opts.rps_per_channel):
            for p, v in batcher.add(chunk):
                await pub.send(batched_topic, v, partition=p)
                batched_msgs += 1
            if done < opts.single_events:
                for p, k, v in single_messages(chunk[: opts.single_events - done], opts.partitions):
                    await pub.send(single_topic, v, key=k, partition=p)
                    single_msgs += 1
                    single_per_part[p] += 1
            done += len(chunk)
        for p, v in batcher.flush():
            await pub.send(batched_topic, v, partition=p)
            batched_msgs += 1
        sent_bytes = pub.bytes
    return {
        "seconds": round(time.perf_counter() - t0, 2), "bytes": sent_bytes,
        "batched": {"topic": batched_topic, "messages": batched_msgs, "events": opts.events,
                    "events_per_partition": batcher.events_per_partition},
        "single": {"topic": single_topic, "messages": single_msgs, "events": single_msgs,
                   "events_per_partition": single_per_part},
    }


class _Verdicts(msgspec.Struct):
    ts_ms: int


async def paced_run(bootstrap: str, opts: BenchOptions, ch: W.Channels, start_ms: int, rate: float,
                    snapshots: list, workdir: Path, tag: str, driver: str = "faust") -> dict[str, Any]:
    """A pipeline worker (``driver``) on a live topic fed at ``rate`` events/s; verdict delays (see module doc)."""
    from aiokafka import AIOKafkaConsumer, TopicPartition

    from pipeline.config import Topics
    from pipeline.kafka.admin import ensure_topics

    name = "paced" if driver == "faust" else f"paced_{driver}"
    prefix = f"bench{tag}.{name}."
    topics = Topics.with_prefix(prefix)
    await ensure_topics(bootstrap, [topics.requests, topics.health, topics.dlq, topics.state], opts.partitions)
    await seed_state(bootstrap, topics.state, snapshots, opts.partitions)
    # the whole feed is built before the worker starts: the clock only sends bytes (tools/bench/schedule.py)
    ticks = paced_schedule(ch, start_ms, rate, opts.paced_seconds, opts.paced_speed, opts.partitions,
                           opts.batch_size)
    out = workdir / f"{name}.json"
    log_path = workdir / f"{name}.log"
    ready, stop = out.with_suffix(".ready"), out.with_suffix(".stop")
    for p in (out, ready, stop):
        p.unlink(missing_ok=True)
    proc = spawn("pipeline_run", {"driver": driver, "bootstrap": bootstrap, "prefix": prefix,
                                  "group": f"bench{tag}-{name}", "topic": topics.requests, "events": None,
                                  "partitions": opts.partitions, "out": str(out), "sink_process": opts.sink_process},
                 log_path, _env())
    sub = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, group_id=None,
                           auto_offset_reset="earliest", fetch_max_wait_ms=20)
    await sub.start()
    received: list[tuple[int, float]] = []
    dec = msgspec.json.Decoder(_Verdicts)

    async def subscribe() -> None:
        sub.assign([TopicPartition(topics.health, p) for p in range(opts.partitions)])
        while True:
            got = await sub.getmany(timeout_ms=100)
            now = time.time()
            for records in got.values():
                for r in records:
                    received.append((dec.decode(r.value).ts_ms, now))

    sub_task = asyncio.create_task(subscribe())
    sent: list[tuple[int, float]] = []
    rng = np.random.default_rng(11)
    n_sent = 0
    try:
        async with Publisher(bootstrap) as pub:
            batcher = PartitionBatcher(opts.partitions, opts.batch_size)
            deadline = time.monotonic() + 120
            prime = 0
            while not ready.exists():  # a trickle until the worker has joined and restored
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise StageFailed(f"{name} worker not ready; end of {log_path}:\n{log_tail(log_path)}")
                evs = W.events(ch, np.full(5, start_ms - 1_000, np.int64), rng.integers(0, len(ch), 5), prime,
                               "prime", id_start=prime * 5)
                for p, v in batcher.add(evs) + batcher.flush():
                    await pub.send(topics.requests, v, partition=p)
                await pub.drain()
                prime += 1
                await asyncio.sleep(0.5)
            await asyncio.sleep(1.0)
            wall0 = time.monotonic()
            for tick in ticks:
                if (wait := wall0 + tick.offset_s - time.monotonic()) > 0:
                    await asyncio.sleep(wait)
                for p, v, mts in tick.messages:
                    await pub.send(topics.requests, v, partition=p)
                    sent.append((mts, time.time()))
                n_sent += tick.events
            if (wait := wall0 + opts.paced_seconds - time.monotonic()) > 0:
                await asyncio.sleep(wait)
            sent_rate = n_sent / (time.monotonic() - wall0)
            await asyncio.sleep(4.0)  # the last rounds' verdicts
        stop.write_text("stop")
        worker = await asyncio.to_thread(wait_result, proc, out, log_path, 60.0, name)
    finally:
        sub_task.cancel()
        await sub.stop()
        if proc.poll() is None:
            proc.kill()
    skip_ms = start_ms + int(3.0 * opts.paced_speed * 1000)  # the first seconds hold the worker's restore
    delays = report.verdict_delays(received, sent, after_ts_ms=skip_ms)
    internal = worker.pop("consumed_to_published_ms", None)
    return {"driver": driver, "rate_events_per_s": round(rate, 1), "sent_events_per_s": round(sent_rate, 1),
            "events": n_sent, "speed": opts.paced_speed, "seconds": opts.paced_seconds,
            "verdicts_received": len(received), "delays_ms": delays,
            "consumed_to_published_ms": [d for ts, d in internal or [] if ts >= skip_ms],
            "peak_rss_mb": worker.get("peak_rss_mb"), "worker": worker}


def run_bench(opts: BenchOptions, echo: Callable[[str], None] = print) -> dict[str, Any]:
    """Run every stage; return the JSON document (:func:`pipeline.tools.bench.report.build`)."""
    from pipeline.config import Topics
    from pipeline.tools.embedded.broker import EmbeddedBroker
    from pipeline.kafka.admin import ensure_topics_sync

    opts.validate()
    tag = uuid.uuid4().hex[:6]
    workdir = Path(opts.workdir or tempfile.mkdtemp(prefix="channel-health-bench-"))
    workdir.mkdir(parents=True, exist_ok=True)
    machine = machine_info()
    started = time.monotonic()
    stages: dict[str, Any] = {}
    ch = W.Channels.make(opts.channels)
    start_ms = measure_start_ms()
    skip = skip_names(opts.skip)

    def skipped(name: str) -> bool:
        return name.split("_")[0] in skip or name in skip

    def stage(name: str, fn: Callable[[], dict[str, Any]]) -> None:
        """Run stage ``name`` once."""
        rounds([(name, lambda k: fn())], 1)

    def rounds(named: list[tuple[str, Callable[[int], dict[str, Any]]]], repeat: int) -> None:
        """Run the throughput stages in ``repeat`` rounds, each stage once per round (``fn(k)`` in round k), and
        keep each stage's median-rate run (:func:`median_run`). Interleaved, every stage's runs span the same
        stretch of time, so the ratios between stages compare like with like on a machine whose speed drifts
        by tens of per cent from one minute to the next; run k of every stage belongs to round k."""
        runs: dict[str, list[dict[str, Any]]] = {name: [] for name, _ in named if not skipped(name)}
        for k in range(repeat):
            for name, fn in named:
                if name not in runs or "error" in stages.get(name, {}):
                    continue
                label = f" (round {k + 1}/{repeat})" if repeat > 1 else ""
                echo(f"[{time.monotonic() - started:5.0f} s] {name}{label} ...")
                t = time.monotonic()
                try:
                    r = fn(k)
                except StageFailed as exc:
                    stages[name] = {"error": str(exc)[-2000:]}
                    echo(f"    FAILED: {str(exc)[:300]}")
                    continue
                runs[name].append(r)
                rates = {kind: r[kind]["events_per_s"] for kind in ("batched", "single")} if "batched" in r else {
                    "": r.get("events_per_s")}
                if any(rates.values()):
                    echo("    " + ", ".join(f"{kind} {v:,.0f}".strip() for kind, v in rates.items() if v)
                         + f" events/s ({time.monotonic() - t:.0f} s)")
        for name, got in runs.items():
            if got and "error" not in stages.get(name, {}):
                stages[name] = median_run(got) if len(got) > 1 else got[0]

    echo(f"channel-health bench: {opts.channels:,} channels, {opts.events:,} batched events "
         f"({opts.batch_size}/message), {opts.single_events:,} single-event messages, "
         f"{opts.partitions} partitions; work dir {workdir}")
    broker = EmbeddedBroker().start()
    bootstrap = broker.bootstrap
    try:
        snap_path = workdir / "snapshots.msgpack"
        echo(f"[{time.monotonic() - started:5.0f} s] pre-filling topics; replaying 48 h for "
             f"{opts.channels:,} channels in parallel ...")
        warm_proc = spawn("warm", {"channels": opts.channels, "end_ms": start_ms, "per_hour": opts.warm_per_hour,
                                   "partitions": opts.partitions, "batch_size": opts.batch_size,
                                   "snapshots": str(snap_path), "out": str(workdir / "warm.json")},
                          workdir / "warm.log")
        fill = asyncio.run(fill_topics(bootstrap, opts, ch, start_ms, f"bench{tag}.batched.gateway.requests",
                                       f"bench{tag}.single.gateway.requests"))
        stages["fill"] = fill
        echo(f"    {fill['batched']['messages']:,} + {fill['single']['messages']:,} messages, "
             f"{fill['bytes'] / 1e6:,.0f} MB in {fill['seconds']} s")
        stages["warm"] = wait_result(warm_proc, workdir / "warm.json", workdir / "warm.log", STAGE_TIMEOUT_S, "warm")
        snapshots = msgspec.msgpack.decode(snap_path.read_bytes())
        echo(f"    {len(stages['warm']['hours'])} h replay: {stages['warm']['events']:,} events; RSS first / last hour: "
             f"{stages['warm']['rss_after_hour_1_mb']:.0f} / {stages['warm']['rss_after_hour_24_mb']:.0f} MB")
        kinds = {k: fill[k] for k in ("batched", "single")}

        throughput: list[tuple[str, Callable[[int], dict[str, Any]]]] = [
            ("ceiling", lambda k: run_stage("ceiling", {
                "bootstrap": bootstrap, "topics": {k2: {"topic": v["topic"], "messages": v["messages"]}
                                                   for k2, v in kinds.items()}}, workdir, f"ceiling{_run_tag(k)}",
                STAGE_TIMEOUT_S))]
        for kind in ("single", "batched"):
            throughput.append((f"bare_faust_{kind}", lambda k, kind=kind: run_stage("bare_faust", {
                "bootstrap": bootstrap, "topic": kinds[kind]["topic"], "group": f"bench{tag}-bare-{kind}{_run_tag(k)}",
                "messages": kinds[kind]["messages"], "events": kinds[kind]["events"]},
                workdir, f"bare_faust_{kind}{_run_tag(k)}", STAGE_TIMEOUT_S)))

        def pipeline(driver: str, kind: str, name: str, only: list[int] | None = None) -> dict[str, Any]:
            prefix = f"bench{tag}.{name}."
            t = Topics.with_prefix(prefix)
            ensure_topics_sync(bootstrap, [t.health, t.dlq, t.state, t.quality], opts.partitions)
            asyncio.run(seed_state(bootstrap, t.state, snapshots, opts.partitions))
            events = kinds[kind]["events"] if only is None else sum(
                kinds[kind]["events_per_partition"][p] for p in only)
            return {"bootstrap": bootstrap, "driver": driver, "prefix": prefix, "group": f"bench{tag}-{name}",
                    "topic": kinds[kind]["topic"], "events": events, "partitions": opts.partitions,
                    "only_partitions": only, "sink_process": opts.sink_process,
                    # for digging: a cProfile stats file per stage when the variable is set (docs/THROUGHPUT.md)
                    "cprofile": str(workdir / f"{name}.prof") if os.environ.get("CHANNEL_HEALTH_BENCH_CPROFILE") else None}

        for driver in ("faust", "aiokafka"):
            for kind in ("batched", "single"):
                name = f"pipeline_{driver}_{kind}"
                throughput.append((name, lambda k, name=name, driver=driver, kind=kind: run_stage(
                    "pipeline_run", pipeline(driver, kind, f"{name}{_run_tag(k)}"), workdir, f"{name}{_run_tag(k)}",
                    STAGE_TIMEOUT_S, env=_env())))
        rounds(throughput, opts.repeat)

        def two_workers() -> dict[str, Any]:
            halves = [list(range(opts.partitions))[k::2] for k in range(2)]
            procs = []
            for k, only in enumerate(halves):
                args = pipeline("aiokafka", "batched", f"workers2w{k}", only)
                out = workdir / f"workers_2_{k}.json"
                out.unlink(missing_ok=True)
                procs.append((spawn("pipeline_run", {**args, "out": str(out)}, workdir / f"workers_2_{k}.log", _env()),
                              out, workdir / f"workers_2_{k}.log"))
            per = [wait_result(p, o, lg, STAGE_TIMEOUT_S, "workers_2") for p, o, lg in procs]
            span = max(r["last_unix"] for r in per) - min(r["first_unix"] for r in per)
            total = sum(r["events"] for r in per)
            return {"events": total, "seconds": round(span, 3), "events_per_s": round(total / span, 1),
                    "per_worker": per}

        if opts.partitions >= 2:
            stage("workers_2", two_workers)

        def paced(driver: str) -> dict[str, Any]:
            if opts.paced_rate is not None:
                rate = opts.paced_rate
            else:
                best = (stages.get(f"pipeline_{driver}_batched") or {}).get("events_per_s")
                if not best:
                    raise StageFailed(f"no batched {driver} pipeline rate to take half of (or give --paced-rate)")
                rate = best / 2
            return asyncio.run(paced_run(bootstrap, opts, ch, start_ms, rate, snapshots, workdir, tag, driver))

        stage("paced", lambda: paced("faust"))
        stage("paced_aiokafka", lambda: paced("aiokafka"))
        stage("profile", lambda: run_stage("profile", {
            "channels": opts.channels, "start_ms": start_ms, "rps_per_channel": opts.rps_per_channel,
            "events": opts.profile_events, "partitions": opts.partitions, "batch_size": opts.batch_size,
            "snapshots": str(snap_path)}, workdir, "profile", STAGE_TIMEOUT_S))
    finally:
        broker.stop()
        shutil.rmtree(workdir / "scratch", ignore_errors=True)  # the stages' chDB and faust data
    machine["loadavg_end"] = [round(x, 2) for x in os.getloadavg()]
    machine["bench_seconds"] = round(time.monotonic() - started, 1)
    config = {**asdict(opts), "workdir": str(workdir), "event_time_start_ms": start_ms,
              "event_time_span_s": round(W.span_ms(opts.events, opts.channels, opts.rps_per_channel) / 1000, 1),
              "command": " ".join(["channel-health", *sys.argv[1:]]) if sys.argv else "channel-health bench"}
    return report.build(stages, config, machine)
