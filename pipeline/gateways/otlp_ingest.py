"""The ``channel-health ingest otlp`` loop: OTLP span messages from Kafka -> request events + dead letters.

Reads ``topic`` (the Collector kafka exporter's, default ``otlp_spans``) in the
consumer group ``group_id`` (default ``channel-health-otlp``: several
processes share the partitions), turns each message into events with
:func:`pipeline.gateways.otlp.spans_to_events`, publishes them in batch
envelopes (:class:`~pipeline.kafka.producer.BatchingProducer`) to the
requests topic and the dead letters to the DLQ topic, waits for the broker's
acknowledgements, then commits the offsets: at-least-once (a restart may
publish a span again; its ``event_id`` is the same, so the worker's dedup
keeps it once).
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any, Callable

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

from pipeline.config import Settings
from pipeline.gateways.otlp import DEFAULT_TOPIC, Encoding, spans_to_events
from pipeline.ingest.dead_letter import raw_budget
from pipeline.kafka.producer import BatchingProducer

__all__ = ["IngestCounts", "run_otlp_ingest", "DEFAULT_GROUP"]

log = logging.getLogger("channel_health.ingest_otlp")

DEFAULT_GROUP = "channel-health-otlp"
_MAX_REQUEST_BYTES = 1_000_000


@dataclass
class IngestCounts:
    """Running totals: Kafka ``messages`` read, ``events`` published, ``dead_letters`` sent, spans ``skipped``."""

    messages: int = 0
    events: int = 0
    dead_letters: int = 0
    skipped: int = 0


async def run_otlp_ingest(settings: Settings, topic: str = DEFAULT_TOPIC, encoding: Encoding = "auto",
                          group_id: str = DEFAULT_GROUP, stop: asyncio.Event | None = None,
                          on_progress: Callable[[IngestCounts], None] | None = None) -> IngestCounts:
    """Run until ``stop`` is set (or forever); returns the totals. Raises ``ValueError`` without a bootstrap."""
    if not settings.kafka_bootstrap:
        raise ValueError("no Kafka bootstrap configured (CHANNEL_HEALTH_KAFKA_BOOTSTRAP)")
    security: dict[str, Any] = settings.kafka_security.aiokafka_kwargs()
    stop = stop or asyncio.Event()
    counts = IngestCounts()
    budget = raw_budget(_MAX_REQUEST_BYTES)
    consumer = AIOKafkaConsumer(topic, bootstrap_servers=settings.kafka_bootstrap, group_id=group_id,
                                auto_offset_reset="earliest", enable_auto_commit=False, **security)
    dlq = AIOKafkaProducer(bootstrap_servers=settings.kafka_bootstrap, acks="all",
                           max_request_size=_MAX_REQUEST_BYTES, **security)
    await consumer.start()
    await dlq.start()
    try:
        async with BatchingProducer(settings.kafka_bootstrap, settings.topics.requests, security=security) as events:
            while not stop.is_set():
                batch = await consumer.getmany(timeout_ms=500, max_records=500)
                if not batch:
                    continue
                pending = []
                for records in batch.values():
                    for record in records:
                        counts.messages += 1
                        out = spans_to_events(record.value or b"", encoding)
                        counts.skipped += out.skipped
                        await events.send_many(out.events)
                        counts.events += len(out.events)
                        for d in out.dead_letters:
                            pending.append(await dlq.send(settings.topics.dlq, d.to_kafka_value(budget),
                                                          key=d.kafka_key()))
                        counts.dead_letters += len(out.dead_letters)
                await events.flush()
                await asyncio.gather(*pending)
                await consumer.commit()
                if on_progress is not None:
                    on_progress(counts)
    finally:
        await consumer.stop()
        await dlq.stop()
    return counts
