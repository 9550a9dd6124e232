"""The faust app: topics and the agent wiring the stages together.

Delivery is at-least-once and restarts are exact:

1. the agent takes batches with ``noack_take`` (faust's plain ``take()`` acks
   even when the body raised — a failed insert would be skipped for ever);
2. a batch's verdicts and dead letters are sent and acknowledged by Kafka,
   and its rows written to ClickHouse (retried with backoff until it works);
3. every ``SNAPSHOT_INTERVAL_S`` the engine's per-channel state is written to
   the state topic, and only then are the input messages processed before
   that snapshot acked (so committed offsets never run ahead of saved state).

After a crash the worker reloads the snapshots and re-reads the messages
after the committed offsets: windows, baselines, runs, circuit timers and
verdict ``seq`` continue exactly. Re-sent verdicts carry the same ``seq``
(routers ignore them) and re-inserted rows are deduplicated by ClickHouse
(``event_id``, ``(channel, seq)``).
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import faust

from pipeline.config import Settings
from pipeline.contracts import encode
from pipeline.engine import Engine
from pipeline.policy.defaults import PolicyConfig
from pipeline.stream.processor import BatchProcessor, ProcessedBatch

log = logging.getLogger("channel_health.worker")

#: Batch size and wait of the agent (messages, seconds).
TAKE_MAX = 2_000
TAKE_WITHIN_S = 0.2
#: Wall-clock idle time after which event time advances on its own (s).
IDLE_ADVANCE_AFTER_S = 10.0
#: How often channel state is snapshotted and input offsets acked (s).
SNAPSHOT_INTERVAL_S = 5.0


def faust_broker_kwargs(settings: Settings) -> dict[str, Any]:
    """faust.App keyword arguments for the broker, credentials and group timeouts.

    Timeouts are short so that a new or restarted member joins the group in
    seconds on the embedded broker (Tansu otherwise takes ~30 s).
    """
    if not settings.kafka_bootstrap:
        raise ValueError("no Kafka bootstrap configured (CHANNEL_HEALTH_KAFKA_BOOTSTRAP)")
    sec = settings.kafka_security
    kwargs: dict[str, Any] = {
        "broker": [f"kafka://{h.strip()}" for h in settings.kafka_bootstrap.split(",")],
        "broker_session_timeout": 10.0,
        "broker_heartbeat_interval": 1.0,
        "broker_rebalance_timeout": 10.0,
        "broker_commit_every": 1_000,
        "broker_commit_interval": 1.0,
    }
    if sec.protocol.startswith("SASL"):
        kwargs["broker_credentials"] = faust.SASLCredentials(
            username=sec.sasl_username or "",
            password=sec.sasl_password.reveal() if sec.sasl_password else "",
            mechanism=sec.sasl_mechanism or "PLAIN",
            ssl_context=sec.aiokafka_kwargs().get("ssl_context") if sec.protocol == "SASL_SSL" else None,
        )
    elif sec.protocol == "SSL":
        kwargs["broker_credentials"] = faust.SSLCredentials(sec.aiokafka_kwargs()["ssl_context"])
    return kwargs


@dataclass
class WorkerState:
    """What the agents share: the processor and the ClickHouse sink (or None)."""

    processor: BatchProcessor
    sink: Any = None
    last_batch_wall_s: float = 0.0
    restored: bool = False
    lock: asyncio.Lock | None = None
    unacked: list | None = None
    snapshots_written: int = 0
    offsets: dict | None = None
    status_checked_s: float = 0.0


def build_app(settings: Settings, policy: PolicyConfig | None = None, sink: Any = None,
              datadir: str | None = None) -> tuple[faust.App, WorkerState]:
    """Create the faust app, its topics, the agent and the idle timer.

    ``sink``: an object with ``add_events(rows)``, ``add_verdicts(verdicts)``
    and ``flush()`` (see :mod:`pipeline.sinks.clickhouse`), or None to skip
    storage.
    """
    topics = settings.topics
    if datadir is None:
        import tempfile

        datadir = str(Path(tempfile.gettempdir()) / f"channel-health-faust-{os.getpid()}")
    app = faust.App(
        f"{settings.consumer_group}",
        store="memory://",
        datadir=datadir,
        web_enabled=False,
        topic_partitions=settings.partitions,
        consumer_auto_offset_reset="earliest",
        topic_allow_declare=True,
        producer_acks=-1,
        # Unacked messages are simply re-read after a restart (at-least-once);
        # waiting for them at shutdown would only delay the stop.
        stream_wait_empty=False,
        **faust_broker_kwargs(settings),
    )
    state = WorkerState(processor=BatchProcessor(Engine(policy)), sink=sink, last_batch_wall_s=time.monotonic(),
                        unacked=[], offsets={})
    requests = app.topic(topics.requests, key_serializer="raw", value_serializer="raw")
    health = app.topic(topics.health, key_serializer="raw", value_serializer="raw")
    dlq = app.topic(topics.dlq, key_serializer="raw", value_serializer="raw")
    state_topic = app.topic(topics.state, key_serializer="raw", value_serializer="raw")

    async def restore() -> None:
        from pipeline.stream.state_topic import load_snapshots

        bootstrap = settings.kafka_bootstrap or ""
        state.processor.pending_snapshots = await load_snapshots(
            bootstrap, topics.state, settings.kafka_security.aiokafka_kwargs())
        state.restored = True
        log.warning("worker ready: %d channel snapshots available for restore",
                    len(state.processor.pending_snapshots))

    async def update_partition_status() -> None:
        """Tell the processor which input partitions are consumed to their end (at most once a second)."""
        now = time.monotonic()
        if now - state.status_checked_s < 1.0:
            return
        state.status_checked_s = now
        tps = [tp for tp in app.consumer.assignment() if tp.topic == topics.requests]
        if not tps:
            return
        highwaters = await app.consumer.highwaters(*tps)
        state.processor.set_partition_status({
            tp.partition: state.offsets.get(tp.partition, -1) + 1 >= (highwaters.get(tp) or 0) for tp in tps})

    async def snapshot_and_ack() -> None:
        """Write every channel's state, then ack the messages it covers."""
        assert state.lock is not None and state.unacked is not None
        async with state.lock:
            pending, state.unacked = state.unacked, []
            blobs = state.processor.snapshots() if pending else []
            futures = [await state_topic.send(key=name.encode(), value=blob) for name, blob in blobs]
            if futures:
                await asyncio.gather(*futures)
            for e in pending:
                e.ack()
            state.snapshots_written += 1 if blobs else 0
            pr = state.processor
            log.info("snapshot: %d channels, %d messages acked; partitions %s; low watermark %s",
                     len(blobs), len(pending), {p: v[0] for p, v in pr.partition_wm.items()}, pr.low_watermark_ms())

    async def publish(out: ProcessedBatch) -> None:
        futures = [await health.send(key=v.channel.encode(), value=encode(v)) for v in out.verdicts]
        futures += [await dlq.send(key=(d.event_id or "").encode() or None, value=d.to_kafka_value())
                    for d in out.dead_letters]
        if futures:
            await asyncio.gather(*futures)

    async def store(out: ProcessedBatch) -> None:
        if state.sink is None:
            return
        state.sink.add_events(out.stored)
        state.sink.add_verdicts(out.verdicts)
        delay = 0.5
        while True:
            try:
                await asyncio.to_thread(state.sink.flush)
                return
            except Exception as exc:  # SinkWriteError and transport errors: retry, never ack
                log.warning("ClickHouse write failed (%s); retrying in %.1f s, offsets not committed",
                            type(exc).__name__, delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 30.0)

    @app.agent(requests)
    async def process(stream: faust.StreamT) -> None:
        if state.lock is None:
            state.lock = asyncio.Lock()
        try:
            if not state.restored:
                await restore()
            async for events in stream.noack_take(TAKE_MAX, within=TAKE_WITHIN_S):
                async with state.lock:
                    for e in events:
                        tp = e.message.tp
                        state.offsets[tp.partition] = max(state.offsets.get(tp.partition, -1), e.message.offset)
                    await update_partition_status()
                    out = state.processor.process([e.value for e in events],
                                                  [e.message.partition for e in events])
                    await publish(out)
                    await store(out)
                    state.unacked.extend(events)  # acked after the next snapshot
                state.last_batch_wall_s = time.monotonic()
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a bug, not bad input (bad input is dead-lettered): stop loudly
            log.critical("stream agent failed: %r; stopping the worker (offsets not committed)", exc)
            await app.crash(exc)
            raise

    @app.timer(interval=SNAPSHOT_INTERVAL_S)
    async def periodic_snapshot() -> None:
        if state.lock is not None and state.restored:
            await snapshot_and_ack()

    @app.timer(interval=5.0)
    async def idle_advance() -> None:
        idle = time.monotonic() - state.last_batch_wall_s
        if idle >= IDLE_ADVANCE_AFTER_S and state.lock is not None:
            async with state.lock:
                verdicts = state.processor.advance_idle(int(5_000))
                if verdicts:
                    out = ProcessedBatch(verdicts=verdicts)
                    await publish(out)
                    await store(out)

    return app, state


def run_worker(settings: Settings, policy: PolicyConfig | None = None, loglevel: str = "warning") -> None:
    """Run a worker until interrupted (SIGINT/SIGTERM): consumes, detects, publishes, stores."""
    from pipeline.sinks.clickhouse import ClickHouseSink

    sink = ClickHouseSink.from_settings(settings)
    app, _state = build_app(settings, policy, sink)
    worker = faust.Worker(app, loglevel=loglevel, quiet=True)
    worker.execute_from_commandline()
