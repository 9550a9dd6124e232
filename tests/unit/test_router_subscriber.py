"""pipeline.router.subscriber with a fake consumer: decoding, bad messages, lifecycle."""

from __future__ import annotations

import asyncio
import logging
from types import SimpleNamespace

import pytest
from aiokafka.errors import KafkaConnectionError

from pipeline.config import KafkaSecurity, Settings
from pipeline.redaction import Secret
from pipeline.contracts import Verdict, encode
from pipeline.router.subscriber import HealthSubscriber, wait_for

SETTINGS = Settings(kafka_bootstrap="localhost:1", clickhouse_url="chdb:///tmp/unused", topic_prefix="t1.")


def verdict_bytes(channel: str, weight: float, seq: int, route: str = "r") -> bytes:
    return encode(Verdict(channel=channel, route=route, state="healthy", weight=weight, reasons=[], metrics={},
                          ts_ms=1_750_000_000_000 + seq, seq=seq))


class FakeConsumer:
    """Stands in for AIOKafkaConsumer: hands out queued batches, then idles."""

    def __init__(self, topic: str, **kwargs: object):
        self.topic, self.kwargs = topic, kwargs
        self.batches: list[object] = []
        self.started = self.stopped = False

    async def start(self) -> None:
        self.started = True

    async def stop(self) -> None:
        self.stopped = True

    async def getmany(self, timeout_ms: int) -> dict:
        if self.batches:
            item = self.batches.pop(0)
            if isinstance(item, BaseException):
                raise item
            return {("t", 0): [SimpleNamespace(key=k, value=v) for k, v in item]}
        await asyncio.sleep(0.01)
        return {}


def make(**kwargs: object) -> tuple[HealthSubscriber, list[FakeConsumer]]:
    made: list[FakeConsumer] = []

    def factory(topic: str, **kw: object) -> FakeConsumer:
        made.append(FakeConsumer(topic, **kw))
        return made[-1]

    return HealthSubscriber(SETTINGS, consumer_factory=factory, **kwargs), made


def test_consumer_reads_all_partitions_from_the_start_without_a_group() -> None:
    sub, _ = make()
    kw = sub.consumer_kwargs()
    assert kw["group_id"] is None
    assert kw["enable_auto_commit"] is False
    assert kw["auto_offset_reset"] == "earliest"
    assert kw["bootstrap_servers"] == "localhost:1"
    assert kw["security_protocol"] == "PLAINTEXT"


def test_consumer_takes_sasl_settings() -> None:
    sec = KafkaSecurity(protocol="SASL_PLAINTEXT", sasl_mechanism="SCRAM-SHA-256", sasl_username="router",
                        sasl_password=Secret("pw"))
    sub = HealthSubscriber(SETTINGS.with_overrides(kafka_security=sec), group_id="routers")
    kw = sub.consumer_kwargs()
    assert (kw["sasl_mechanism"], kw["sasl_plain_username"], kw["sasl_plain_password"]) == ("SCRAM-SHA-256", "router", "pw")
    assert (kw["group_id"], kw["enable_auto_commit"]) == ("routers", True)


def test_no_bootstrap_raises() -> None:
    with pytest.raises(ValueError, match="CHANNEL_HEALTH_KAFKA_BOOTSTRAP"):
        HealthSubscriber(SETTINGS.with_overrides(kafka_bootstrap=None))


def test_bad_messages_are_counted_and_the_loop_goes_on(caplog: pytest.LogCaptureFixture) -> None:
    async def main() -> None:
        sub, made = make()
        async with sub:
            consumer = made[0]
            assert consumer.topic == "t1.channel.health"
            consumer.batches += [
                [(b"a", verdict_bytes("a", 1.0, 1)), (b"x", b"not json"), (b"b", b'{"channel": "b"}')],
                KafkaConnectionError("broker went away"),
                [(b"b", verdict_bytes("b", 1.5, 1)), (b"b", verdict_bytes("b", 0.5, 2)),
                 (b"a", verdict_bytes("a", 1.0, 1))],
            ]
            await sub.wait_for(lambda t: t.verdict("b") is not None and sub.messages == 6, timeout_s=5.0)
            assert sub.bad_messages == 3
            assert sub.table.ignored == 1
            assert sub.weights("r").shares == {"a": 2 / 3, "b": 1 / 3}
            assert sub.error is None
        assert consumer.stopped

    with caplog.at_level(logging.WARNING, logger="channel_health.router"):
        asyncio.run(main())
    assert "bad channel.health message (1 so far)" in caplog.text
    assert "retrying" in caplog.text


def test_tombstone_forgets_the_channel() -> None:
    sub, _ = make()
    assert sub.handle(b"a", verdict_bytes("a", 1.0, 1))
    assert sub.handle(b"a", None)
    assert not sub.handle(None, None)
    assert sub.table.routes() == []
    assert sub.bad_messages == 0


def test_wait_for_times_out() -> None:
    with pytest.raises(TimeoutError, match="0.05 s"):
        asyncio.run(wait_for(lambda: False, timeout_s=0.05, poll_s=0.01))


def test_a_dead_loop_is_reported_by_wait_for() -> None:
    async def main() -> None:
        sub, made = make()
        async with sub:
            made[0].batches.append(RuntimeError("boom"))
            with pytest.raises(RuntimeError, match="subscriber stopped"):
                await sub.wait_for(lambda t: False, timeout_s=5.0)
            assert isinstance(sub.error, RuntimeError)

    asyncio.run(main())
