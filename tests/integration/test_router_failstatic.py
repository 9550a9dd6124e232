"""Fail-static routers against the real embedded broker (Tansu, Kafka protocol).

When the pipeline stops publishing ``channel.health`` verdicts, a router's
:class:`~pipeline.router.HealthSubscriber` must notice within its staleness
bound, keep routing by the last weights (never drop to "no data" or to equal
shares), and report the staleness; when verdicts flow again it must resume
with them and clear the flag. Verdicts are published the way a worker does
(key = channel, JSON value, ``acks=all``).

Two outages: the worker stops while the broker stays up; and the broker
itself goes down (the embedded memory broker loses everything) and comes back
on the same address, where a restarted pipeline publishes again with ``seq``
starting at 1.
"""

from __future__ import annotations

import asyncio
import time
import uuid

import pytest

from pipeline.config import Settings
from pipeline.contracts import Verdict, encode

pytestmark = pytest.mark.integration

STALE_AFTER_S = 1.5
#: Slack for the subscriber's fetch loop (500 ms polls) and the test's own polling.
SLACK_S = 1.0
T0_MS = 1_780_000_000_000


def _broker(port: int | None = None):
    broker_mod = pytest.importorskip("pipeline.tools.embedded.broker")
    try:
        return broker_mod.EmbeddedBroker(port=port).start()
    except broker_mod.BrokerStartError as exc:
        pytest.skip(f"embedded broker unavailable: {exc}")


def _settings(bootstrap: str) -> Settings:
    return Settings(kafka_bootstrap=bootstrap, clickhouse_url="chdb:///tmp/unused",
                    topic_prefix=f"fs{uuid.uuid4().hex[:8]}.")


def _verdict(channel: str, weight: float, seq: int, state: str = "healthy", ts_ms: int | None = None) -> Verdict:
    return Verdict(channel=channel, route="chat", state=state, weight=weight,
                   reasons=[] if state == "healthy" else ["latency_p95_ratio"], metrics={"p95_ms": 180.0},
                   ts_ms=T0_MS + 30_000 * seq if ts_ms is None else ts_ms, seq=seq)


class Publisher:
    """Publishes verdicts like the worker: one message per verdict, key = channel."""

    def __init__(self, settings: Settings):
        self.settings = settings
        self.producer = None

    async def start(self) -> None:
        from aiokafka import AIOKafkaProducer

        from pipeline.kafka.admin import ensure_topics

        await ensure_topics(self.settings.kafka_bootstrap or "", [self.settings.topics.health], 2)
        self.producer = AIOKafkaProducer(bootstrap_servers=self.settings.kafka_bootstrap, acks="all")
        await self.producer.start()

    async def publish(self, *verdicts: Verdict) -> None:
        for v in verdicts:
            await self.producer.send_and_wait(self.settings.topics.health, encode(v), key=v.channel.encode())

    async def stop(self) -> None:
        if self.producer is not None:
            await self.producer.stop()
            self.producer = None


async def _topics(bootstrap: str) -> set[str]:
    from aiokafka.admin import AIOKafkaAdminClient

    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        return set(await admin.list_topics())
    finally:
        await admin.close()


async def _wait_stale(sub, route: str, last_received_s: float) -> float:
    """Wait until ``route`` is flagged stale; return seconds since the last verdict was received."""
    await sub.wait_for(lambda t: t.weights(route).stale, STALE_AFTER_S + SLACK_S + 5.0)
    return time.monotonic() - last_received_s


def test_worker_stops_router_keeps_last_weights_reports_stale_then_resumes() -> None:
    from pipeline.router import HealthSubscriber

    broker = _broker()
    try:
        settings = _settings(broker.bootstrap)

        async def main() -> None:
            pub = Publisher(settings)
            await pub.start()
            received: list[float] = []
            try:
                async with HealthSubscriber(settings, stale_after_s=STALE_AFTER_S,
                                            on_verdict=lambda v: received.append(time.monotonic())) as sub:
                    # The pipeline is running: a verdict per channel per round.
                    for seq in (1, 2, 3):
                        await pub.publish(_verdict("a", 1.0, seq), _verdict("b", 0.5, seq, "degraded"))
                        await asyncio.sleep(0.2)
                    await sub.wait_for(lambda t: t.verdict("a") is not None and t.verdict("a").seq == 3
                                       and t.verdict("b") is not None and t.verdict("b").seq == 3, 30.0)
                    before = sub.weights("chat")
                    assert before.stale is False
                    assert before.shares == pytest.approx({"a": 2 / 3, "b": 1 / 3})

                    # The pipeline stops: no more verdicts.
                    await asyncio.sleep(STALE_AFTER_S / 3)
                    assert sub.weights("chat").stale is False  # not before the bound
                    noticed_after = await _wait_stale(sub, "chat", received[-1])
                    assert STALE_AFTER_S < noticed_after <= STALE_AFTER_S + SLACK_S, noticed_after
                    during = sub.weights("chat")
                    assert during.stale is True and during.age_s > STALE_AFTER_S
                    assert during.shares == before.shares and during.weights == before.weights
                    assert during.states == {"a": "healthy", "b": "degraded"}
                    snap = sub.table.snapshot()["chat"]
                    assert snap["stale"] is True and snap["channels"]["b"]["share"] == pytest.approx(1 / 3)
                    await asyncio.sleep(1.0)  # still the last weights a while later; the loop is alive
                    assert sub.weights("chat").shares == before.shares
                    assert sub.error is None

                    # The pipeline comes back: the next round's verdicts clear the flag.
                    await pub.publish(_verdict("a", 0.25, 4, "degraded"), _verdict("b", 1.0, 4))
                    await sub.wait_for(lambda t: not t.weights("chat").stale and t.verdict("a").seq == 4
                                       and t.verdict("b").seq == 4, 30.0)
                    after = sub.weights("chat")
                    assert after.shares == pytest.approx({"a": 0.2, "b": 0.8})
                    assert after.age_s < STALE_AFTER_S
                    assert sub.error is None and sub.bad_messages == 0
            finally:
                await pub.stop()

        asyncio.run(main())
    finally:
        broker.stop()


def test_broker_outage_router_keeps_last_weights_then_resumes_after_restart() -> None:
    """The whole embedded stack goes down (memory broker: every message is lost) and comes back on the
    same address; a restarted pipeline publishes again from ``seq`` 1 with newer event times."""
    from pipeline.router import HealthSubscriber

    broker = _broker()
    port = broker.port
    settings = _settings(broker.bootstrap)

    async def main() -> None:
        nonlocal broker
        pub = Publisher(settings)
        await pub.start()
        received: list[float] = []
        try:
            async with HealthSubscriber(settings, stale_after_s=STALE_AFTER_S,
                                        on_verdict=lambda v: received.append(time.monotonic())) as sub:
                await pub.publish(_verdict("a", 1.0, 7), _verdict("b", 0.0, 7, "open"))
                await sub.wait_for(lambda t: t.verdict("b") is not None and t.verdict("a") is not None, 30.0)
                before = sub.weights("chat")
                assert before.shares == {"a": 1.0, "b": 0.0} and not before.stale
                await pub.stop()

                # The broker and the pipeline go away (Tansu may take a few seconds to exit with
                # clients connected; the router must notice within its bound meanwhile).
                stopping = asyncio.ensure_future(asyncio.to_thread(broker.stop))
                noticed_after = await _wait_stale(sub, "chat", received[-1])
                assert noticed_after <= STALE_AFTER_S + SLACK_S, noticed_after
                await stopping
                await asyncio.sleep(2.0)  # the subscriber retries quietly; the table stays readable
                during = sub.weights("chat")
                assert during.stale and during.shares == before.shares
                assert during.states == {"a": "healthy", "b": "open"}
                assert sub.error is None

                # Back on the same address, empty. The restarted pipeline recreates its topic and publishes
                # a verdict every round (seq from 1 again, newer event time) until routers have it.
                broker = await asyncio.to_thread(_broker, port)
                assert settings.topics.health not in await _topics(broker.bootstrap)  # memory storage: all gone
                pub2 = Publisher(settings)
                await pub2.start()
                try:
                    deadline = time.monotonic() + 60.0
                    seq = 0
                    while True:
                        seq += 1
                        ts = T0_MS + 3_600_000 + 30_000 * seq
                        await pub2.publish(_verdict("a", 0.5, seq, "degraded", ts), _verdict("b", 0.05, seq,
                                                                                           "half_open", ts))
                        try:
                            await sub.wait_for(lambda t: not t.weights("chat").stale
                                               and t.verdict("b").state == "half_open", 0.5)
                            break
                        except TimeoutError:
                            assert time.monotonic() < deadline, "router did not resume after the broker restart"
                    after = sub.weights("chat")
                    assert after.states == {"a": "degraded", "b": "half_open"}
                    assert after.shares == pytest.approx({"a": 0.5 / 0.55, "b": 0.05 / 0.55})
                    assert sub.error is None
                finally:
                    await pub2.stop()
        finally:
            await pub.stop()

    try:
        asyncio.run(main())
    finally:
        broker.stop()
