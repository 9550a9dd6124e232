"""Helpers of the reliability tests: the embedded broker, worker processes, traffic, verdicts, row counts.

Faults are injected for real: workers are separate ``python -m pipeline.cli
worker`` processes (the way ``channel-health demo`` starts them) that the
tests SIGKILL or SIGTERM; each has its own environment, chDB directory and
log file. chDB lets one process open a data directory, so rows are counted
only after the worker that wrote them has exited (:func:`count_rows` runs
the query in a subprocess).

Everything started here is stopped by the fixtures' ``finally`` blocks /
:meth:`Stack.close`, also when a test fails.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import random
import re
import signal
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

import pytest

from pipeline.config import Settings
from pipeline.contracts import Verdict, decode_verdict
from pipeline.parent_death import death_signal_preexec

REPO = Path(__file__).resolve().parents[2]
STATUS_RE = re.compile(
    r"status: generation (?P<generation>\S+), (?P<events_in>\d+) events in, (?P<verdicts_out>\d+) verdicts out, "
    r"(?P<pending>\d+) rows buffered \(peak (?P<peak>\d+)\), (?P<written>\d+) rows written, "
    r"(?P<unacked>\d+) messages unacked, (?P<acked>\d+) acked, (?P<snapshots>\d+) snapshots saved, sink (?P<sink>\w+), "
    r"low watermark (?P<watermark>[^,\s]+), intake (?P<intake>\w+)")


# -- broker and topics ---------------------------------------------------------------------------------------

def start_broker():
    """Start the embedded Tansu broker; skip the test when its binary is not installed."""
    from pipeline.tools.embedded.broker import BrokerStartError, EmbeddedBroker

    broker = EmbeddedBroker()
    try:
        broker.start()
    except BrokerStartError as exc:
        if "no Tansu broker binary" in str(exc):
            pytest.skip(f"embedded broker not available: {exc}")
        raise
    return broker


def make_settings(bootstrap: str, partitions: int) -> Settings:
    """Settings with a unique topic prefix and consumer group, and create the four topics."""
    from pipeline.kafka.admin import ensure_topics_sync

    tag = uuid.uuid4().hex[:8]
    settings = Settings(kafka_bootstrap=bootstrap, clickhouse_url="chdb:///nonexistent", topic_prefix=f"rel{tag}.",
                        consumer_group=f"rel-{tag}", partitions=partitions)
    t = settings.topics
    ensure_topics_sync(bootstrap, [t.requests, t.health, t.dlq, t.state], partitions)
    return settings


# -- process trees ------------------------------------------------------------------------------------------

def descendants(pid: int) -> list:
    """The ``psutil.Process`` objects of every descendant of ``pid`` now (capture them while ``pid`` runs:
    once it is gone, its orphans are init's)."""
    import psutil

    return psutil.Process(pid).children(recursive=True)


def wait_gone(procs: list, timeout_s: float) -> list:
    """Wait up to ``timeout_s`` for every process of ``procs`` to end (an unreaped orphan counts as ended);
    returns those still running (:func:`pipeline.parent_death.wait_ended`)."""
    from pipeline.parent_death import wait_ended

    return wait_ended(procs, timeout_s)


def port_free(port: int) -> bool:
    """True when nothing listens on ``127.0.0.1:port``."""
    from pipeline.tools.embedded.broker import _port_free

    return _port_free(port)


# -- workers -------------------------------------------------------------------------------------------------

class WorkerProcess:
    """One ``channel-health worker`` subprocess with its own env, chDB directory and log file."""

    def __init__(self, name: str, settings: Settings, chdb_dir: Path, log_path: Path,
                 extra_env: Mapping[str, str] | None = None) -> None:
        self.name = name
        self.settings = settings
        self.chdb_dir = chdb_dir
        self.log_path = log_path
        self.extra_env = dict(extra_env or {})
        self.proc: subprocess.Popen | None = None
        self.started_at: float | None = None
        self.exit_code: int | None = None

    def env(self) -> dict[str, str]:
        s = self.settings
        env = {k: v for k, v in os.environ.items() if not k.startswith("CHANNEL_HEALTH_")}
        env.update({
            "CHANNEL_HEALTH_KAFKA_BOOTSTRAP": s.kafka_bootstrap or "",
            "CHANNEL_HEALTH_CLICKHOUSE_URL": f"chdb://{self.chdb_dir}",
            "CHANNEL_HEALTH_TOPIC_PREFIX": s.topic_prefix,
            "CHANNEL_HEALTH_CONSUMER_GROUP": s.consumer_group,
            "CHANNEL_HEALTH_PARTITIONS": str(s.partitions),
            "PYTHONUNBUFFERED": "1",
            # The reliability tests send no response texts; skip loading the embedding model (seconds of CPU
            # per worker start on a small machine). Pass CHANNEL_HEALTH_QUALITY="on" to include it.
            "CHANNEL_HEALTH_QUALITY": "off",
        })
        env.update(self.extra_env)
        return env

    def start(self) -> "WorkerProcess":
        """Start the process (returns at once; it joins the group a few seconds later)."""
        assert self.proc is None or self.proc.poll() is not None, "already running"
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as fh:
            fh.write(f"\n===== start {self.name} at {time.time():.3f} =====\n".encode())
            fh.flush()
            # SIGKILL from the kernel should the test process die: no worker outlives a killed test run.
            self.proc = subprocess.Popen([sys.executable, "-m", "pipeline.cli", "worker", "--loglevel", "info"],
                                         cwd=REPO, env=self.env(), stdout=fh, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, preexec_fn=death_signal_preexec(signal.SIGKILL))
        self.started_at = time.monotonic()
        self.exit_code = None
        return self

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        """SIGKILL: no flush, no snapshot, no commit."""
        if self.alive:
            assert self.proc is not None
            self.proc.send_signal(signal.SIGKILL)
            self.exit_code = self.proc.wait(30)

    def stop(self, timeout_s: float = 45.0) -> int | None:
        """SIGTERM and wait (graceful drain); SIGKILL after ``timeout_s``. Returns the exit code."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(30)
        self.exit_code = self.proc.returncode
        return self.exit_code

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def log_tail(self, n: int = 4000) -> str:
        return self.log()[-n:]

    def current_log(self) -> str:
        """Log of the current (latest) start only."""
        text = self.log()
        return text[text.rfind("===== start "):]

    def wait_for_log(self, pattern: str, timeout_s: float) -> re.Match:
        """Wait until ``pattern`` (regex) appears in the current run's log; fail with the log tail otherwise."""
        rx = re.compile(pattern)
        deadline = time.monotonic() + timeout_s
        while True:
            m = rx.search(self.current_log())
            if m:
                return m
            if not self.alive:
                pytest.fail(f"worker {self.name} exited ({self.proc and self.proc.returncode}) waiting for "
                            f"{pattern!r}; log:\n{self.log_tail()}")
            if time.monotonic() > deadline:
                pytest.fail(f"worker {self.name}: {pattern!r} not in its log after {timeout_s:.0f} s; "
                            f"log:\n{self.log_tail()}")
            time.sleep(0.2)

    def wait_status(self, predicate: Callable[[dict[str, Any]], bool], timeout_s: float,
                    what: str = "status") -> dict[str, Any]:
        """Wait for a periodic status line (of the current run) that satisfies ``predicate``; return it."""
        deadline = time.monotonic() + timeout_s
        while True:
            for st in reversed(self.statuses()):
                if predicate(st):
                    return st
            if not self.alive:
                pytest.fail(f"worker {self.name} exited waiting for {what}; log:\n{self.log_tail()}")
            if time.monotonic() > deadline:
                pytest.fail(f"worker {self.name}: no {what} after {timeout_s:.0f} s; log:\n{self.log_tail()}")
            time.sleep(0.2)

    def wait_drained(self, last_ts_ms: int, timeout_s: float = 30.0) -> dict[str, Any]:
        """Wait until the worker has processed input up to ``last_ts_ms`` and written and acked all of it."""
        return self.wait_status(lambda st: isinstance(st["watermark"], int) and st["watermark"] >= last_ts_ms
                                and st["pending"] == 0 and st["unacked"] == 0, timeout_s,
                                f"status with everything up to {last_ts_ms} processed, written and acked")

    def statuses(self) -> list[dict[str, Any]]:
        """Parsed periodic status lines of the current run."""
        out = []
        for m in STATUS_RE.finditer(self.current_log()):
            d: dict[str, Any] = {k: (int(v) if v.isdigit() else v) for k, v in m.groupdict().items()}
            out.append(d)
        return out


@dataclass
class Stack:
    """A broker, topics and the worker processes of one test; :meth:`close` stops everything."""

    root: Path
    partitions: int = 4
    broker: Any = None
    settings: Settings | None = None
    workers: list[WorkerProcess] = field(default_factory=list)

    def start(self) -> "Stack":
        self.broker = start_broker()
        self.settings = make_settings(self.broker.bootstrap, self.partitions)
        return self

    def worker(self, name: str, chdb_dir: Path | None = None, **extra_env: str) -> WorkerProcess:
        assert self.settings is not None
        w = WorkerProcess(name, self.settings, chdb_dir or self.root / f"chdb-{name}", self.root / f"{name}.log",
                          extra_env)
        self.workers.append(w)
        return w

    def close(self) -> None:
        for w in self.workers:
            try:
                w.kill()
            except Exception:  # keep stopping the rest
                pass
        if self.broker is not None:
            self.broker.stop()


# -- traffic -------------------------------------------------------------------------------------------------

def steady_events(channels: Mapping[str, str], start_ms: int, duration_s: int, *, per_s: int = 1, seed: int = 0,
                  latency_ms: Callable[[str, int, random.Random], float] | None = None,
                  status: Callable[[str, int], str] | None = None) -> list[dict]:
    """Events of ``channels`` (name → route), ``per_s`` per second each, at whole-second event times.

    Sorted by ``ts_ms``; ``event_id`` is unique. Default latency: lognormal
    around 200 ms with a ±25 % day/night swing; default status ``ok``.
    """
    rng = random.Random(seed)
    out = []
    step = 1000 // per_s
    for k in range(duration_s * per_s):
        ts = start_ms + k * step
        for ch, route in channels.items():
            if latency_ms is not None:
                lat = latency_ms(ch, ts, rng)
            else:
                day = 1.0 + 0.25 * math.sin(2 * math.pi * (ts % 86_400_000) / 86_400_000)
                lat = 200.0 * day * math.exp(rng.gauss(0.0, 0.25))
            st = status(ch, ts) if status is not None else "ok"
            out.append({"event_id": f"{ch}#{ts}", "ts_ms": ts, "channel": ch, "route": route, "status": st,
                        "latency_ms": round(lat, 2), "tier": "paid"})
    return out


async def _publish(settings: Settings, events: Iterable[dict], span_ms: int | None, max_events: int,
                   raw: Iterable[tuple[bytes, bytes]] = ()) -> int:
    from aiokafka import AIOKafkaProducer

    from pipeline.kafka.producer import BatchingProducer

    async with BatchingProducer(settings.kafka_bootstrap or "", settings.topics.requests, max_events=max_events,
                                max_delay_ms=10_000_000, max_event_span_ms=span_ms) as prod:
        await prod.send_many(events)
        await prod.flush()
        sent = prod.events_sent
    raw = list(raw)
    if raw:
        p = AIOKafkaProducer(bootstrap_servers=settings.kafka_bootstrap, acks="all")
        await p.start()
        try:
            for key, value in raw:
                await p.send(settings.topics.requests, value, key=key)
            await p.flush()
        finally:
            await p.stop()
    return sent


def publish(settings: Settings, events: Iterable[dict], *, span_ms: int | None = 10_000, max_events: int = 500,
            raw: Iterable[tuple[bytes, bytes]] = ()) -> int:
    """Publish events in batch envelopes (:class:`~pipeline.kafka.producer.BatchingProducer`), then raw messages."""
    return asyncio.run(_publish(settings, events, span_ms, max_events, raw))


class Publisher:
    """A background thread publishing batches of events on demand (for paced traffic)."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="test-publisher", daemon=True)
        self.thread.start()
        self.prod = None
        asyncio.run_coroutine_threadsafe(self._start(), self.loop).result(30)

    async def _start(self) -> None:
        from pipeline.kafka.producer import BatchingProducer

        self.prod = BatchingProducer(self.settings.kafka_bootstrap or "", self.settings.topics.requests,
                                     max_delay_ms=10_000_000)
        await self.prod.__aenter__()

    def send(self, events: list[dict]) -> None:
        async def go() -> None:
            await self.prod.send_many(events)  # type: ignore[union-attr]
            await self.prod.flush()  # type: ignore[union-attr]
        asyncio.run_coroutine_threadsafe(go(), self.loop).result(60)

    def close(self) -> None:
        if self.prod is not None:
            asyncio.run_coroutine_threadsafe(self.prod.__aexit__(None, None, None), self.loop).result(30)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


class PacedTraffic:
    """Publish pre-generated events (sorted by ``ts_ms``) from a background thread, ``speed`` × wall time.

    Every ``tick_s`` it publishes the events whose event time is due.
    ``sent`` counts published events; ``last_ts`` is the newest event time published.
    """

    def __init__(self, settings: Settings, events: list[dict], speed: float = 10.0, tick_s: float = 0.5) -> None:
        self.events = events
        self.speed = speed
        self.tick_s = tick_s
        self.sent = 0
        self.last_ts: int | None = None
        self.error: BaseException | None = None
        self._publisher = Publisher(settings)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="paced-traffic", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            t0 = time.monotonic()
            e0 = self.events[0]["ts_ms"]
            while self.sent < len(self.events) and not self._stop.is_set():
                due = e0 + (time.monotonic() - t0) * self.speed * 1000
                k = self.sent
                while k < len(self.events) and self.events[k]["ts_ms"] <= due:
                    k += 1
                if k > self.sent:
                    self._publisher.send(self.events[self.sent:k])
                    self.last_ts = self.events[k - 1]["ts_ms"]
                    self.sent = k
                self._stop.wait(self.tick_s)
        except BaseException as exc:  # surfaced by stop()
            self.error = exc

    @property
    def done(self) -> bool:
        return self.sent >= len(self.events)

    def stop(self) -> None:
        """Stop publishing (what was sent stays sent); raises what the thread raised."""
        self._stop.set()
        self._thread.join(60)
        self._publisher.close()
        if self.error is not None:
            raise RuntimeError("paced publishing failed") from self.error


# -- verdicts ------------------------------------------------------------------------------------------------

class VerdictTap:
    """Reads ``channel.health`` from the beginning on a background thread; records (receive time, verdict)."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.received: list[tuple[float, Verdict]] = []
        self.bad = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._ready = threading.Event()
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=lambda: asyncio.run(self._run()), name="verdict-tap", daemon=True)
        self.thread.start()
        if not self._ready.wait(30):
            raise RuntimeError(f"verdict tap did not start: {self.error!r}")

    async def _run(self) -> None:
        from aiokafka import AIOKafkaConsumer

        consumer = AIOKafkaConsumer(self.settings.topics.health, bootstrap_servers=self.settings.kafka_bootstrap,
                                    group_id=None, enable_auto_commit=False, auto_offset_reset="earliest")
        try:
            await consumer.start()
            self._ready.set()
            while not self._stop.is_set():
                batches = await consumer.getmany(timeout_ms=200)
                now = time.monotonic()
                for records in batches.values():
                    for r in records:
                        try:
                            v = decode_verdict(r.value)
                        except Exception:
                            self.bad += 1
                            continue
                        with self._lock:
                            self.received.append((now, v))
        except BaseException as exc:  # surfaced to the test
            self.error = exc
            self._ready.set()
        finally:
            await consumer.stop()

    def snapshot(self) -> list[tuple[float, Verdict]]:
        with self._lock:
            return list(self.received)

    def verdicts(self) -> list[Verdict]:
        return [v for _, v in self.snapshot()]

    def wait_for(self, predicate: Callable[[list[tuple[float, Verdict]]], bool], timeout_s: float,
                 what: str = "condition", on_fail: Callable[[], str] = lambda: "") -> None:
        deadline = time.monotonic() + timeout_s
        while not predicate(self.snapshot()):
            if self.error is not None:
                raise RuntimeError("verdict tap failed") from self.error
            if time.monotonic() > deadline:
                pytest.fail(f"{what} not reached within {timeout_s:.0f} s; {on_fail()}")
            time.sleep(0.2)

    def close(self) -> None:
        self._stop.set()
        self.thread.join(10)


def latest_by_channel(verdicts: Iterable[Verdict]) -> dict[str, Verdict]:
    out: dict[str, Verdict] = {}
    for v in verdicts:
        if v.channel not in out or v.seq >= out[v.channel].seq:
            out[v.channel] = v
    return out


def dedup_by_seq(verdicts: Iterable[Verdict]) -> tuple[dict[tuple[str, int], Verdict], list[str]]:
    """``(channel, seq) → verdict`` and a list of conflicts (same seq, different content)."""
    out: dict[tuple[str, int], Verdict] = {}
    conflicts = []
    for v in verdicts:
        key = (v.channel, v.seq)
        prev = out.get(key)
        if prev is None:
            out[key] = v
        elif prev != v:
            conflicts.append(f"{key}: {prev} != {v}")
    return out, conflicts


# -- ClickHouse ----------------------------------------------------------------------------------------------

_COUNT_SCRIPT = """
import json, sys
from pipeline.config import Settings
from pipeline.storage.client import open_client
client = open_client(Settings(kafka_bootstrap=None, clickhouse_url=sys.argv[1]))
out = [list(client.query(q).result_rows) for q in json.loads(sys.argv[2])]
print(json.dumps(out, default=str))
"""


def query_chdb(chdb_dir: Path, *sql: str) -> list[list[list[Any]]]:
    """Run queries against a chDB directory in a subprocess (its writer must have exited); rows per query."""
    res = subprocess.run([sys.executable, "-c", _COUNT_SCRIPT, f"chdb://{chdb_dir}", json.dumps(list(sql))],
                         cwd=REPO, capture_output=True, text=True, timeout=120)
    if res.returncode != 0:
        raise RuntimeError(f"chDB query failed: {res.stderr[-3000:]}")
    return json.loads(res.stdout.strip().splitlines()[-1])


def stored_event_ids(chdb_dir: Path) -> list[str]:
    """Every stored event_id (after dedup), sorted; duplicates listed once per stored row."""
    (rows,) = query_chdb(chdb_dir, "SELECT event_id FROM channel_health.request_events FINAL ORDER BY event_id")
    return [r[0] for r in rows]


def count_rows(chdb_dir: Path) -> dict[str, int]:
    """Stored request_events rows (FINAL), distinct event_ids, and raw rows before dedup."""
    final, distinct, raw, verdicts = query_chdb(
        chdb_dir,
        "SELECT count() FROM channel_health.request_events FINAL",
        "SELECT uniqExact(event_id) FROM channel_health.request_events",
        "SELECT count() FROM channel_health.request_events",
        "SELECT count() FROM channel_health.channel_verdicts FINAL",
    )
    return {"final": final[0][0], "distinct": distinct[0][0], "raw": raw[0][0], "verdicts": verdicts[0][0]}
