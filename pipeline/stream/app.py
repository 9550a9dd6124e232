"""The faust app: topics and the agent wiring the stages together.

Delivery is at-least-once: the agent takes batches with ``noack_take`` and
acks a batch's messages only after its verdicts and dead letters were
acknowledged by Kafka and its rows were written to ClickHouse (faust's plain
``take()`` acks even when the body raised — a failed insert would be skipped
for ever). Inserts are idempotent on ``event_id`` / ``(channel, seq)``, so a
replay after a crash stores nothing twice.
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
        **faust_broker_kwargs(settings),
    )
    state = WorkerState(processor=BatchProcessor(Engine(policy)), sink=sink, last_batch_wall_s=time.monotonic())
    requests = app.topic(topics.requests, key_serializer="raw", value_serializer="raw")
    health = app.topic(topics.health, key_serializer="raw", value_serializer="raw")
    dlq = app.topic(topics.dlq, key_serializer="raw", value_serializer="raw")

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
        async for events in stream.noack_take(TAKE_MAX, within=TAKE_WITHIN_S):
            out = state.processor.process([e.value for e in events])
            await publish(out)
            await store(out)
            for e in events:
                e.ack()
            state.last_batch_wall_s = time.monotonic()

    @app.timer(interval=5.0)
    async def idle_advance() -> None:
        idle = time.monotonic() - state.last_batch_wall_s
        if idle >= IDLE_ADVANCE_AFTER_S:
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
