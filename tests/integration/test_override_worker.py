"""Manual override end to end (issue #20 item 2): CLI -> channel.control -> worker -> channel.health + audit.

Embedded broker, one real worker process (chDB). Acceptance: override set ->
the next verdict carries it within 1 s; TTL passes -> it is gone (a verdict
without it is re-published at once) and the set and the expiry are audited
in ``channel_overrides``.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import msgspec
import pytest

from tests.integration.workers import REPO, Stack, VerdictTap, publish, steady_events

pytestmark = pytest.mark.integration



def _cli(stack: Stack, *args: str, **extra_env: str) -> subprocess.CompletedProcess:
    s = stack.settings
    env = {k: v for k, v in os.environ.items() if not k.startswith("CHANNEL_HEALTH_")}
    env.update({"CHANNEL_HEALTH_KAFKA_BOOTSTRAP": s.kafka_bootstrap, "CHANNEL_HEALTH_TOPIC_PREFIX": s.topic_prefix})
    env.update(extra_env)
    return subprocess.run([sys.executable, "-m", "pipeline.cli", "override", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=60)


def test_override_reaches_verdicts_within_a_second_and_expiry_is_audited(tmp_path: Path) -> None:
    stack = Stack(tmp_path, partitions=1).start()
    tap = None
    try:
        worker = stack.worker("w1").start()
        tap = VerdictTap(stack.settings)
        start_ms = (int(time.time() * 1000) - 70_000) // 1000 * 1000  # recent: older events are dead-lettered
        publish(stack.settings, steady_events({"c1": "chat", "c2": "chat"}, start_ms, 65, per_s=2))
        tap.wait_for(lambda got: any(v.channel == "c1" for _, v in got), 90, "a first verdict of c1",
                     worker.log_tail)

        bad = _cli(stack, "set", "nope", "--open", "--ttl", "5s", "--reason", "x")
        assert bad.returncode == 2 and "unknown channel 'nope'" in bad.stderr
        missing = _cli(stack, "set", "c1", "--open", "--reason", "x")
        assert missing.returncode == 2 and "--ttl is required" in missing.stderr

        ok = _cli(stack, "set", "c1", "--open", "--ttl", "4s", "--reason", "vendor incident", "--by", "ana")
        assert ok.returncode == 0, ok.stderr
        sent = time.monotonic()  # the record is acknowledged when the CLI exits
        tap.wait_for(lambda got: any(v.override is not msgspec.UNSET for _, v in got), 10,
                     "a verdict with the override", worker.log_tail)
        at, v = next((t, v) for t, v in tap.snapshot() if v.override is not msgspec.UNSET)
        print(f"override visible {at - sent:.2f} s after the CLI returned")
        assert at - sent <= 1.0
        assert (v.channel, v.state, v.weight, v.metrics["route_share"]) == ("c1", "open", 0.0, 0.0)
        assert (v.override["by"], v.override["reason"], v.override["kind"]) == ("ana", "vendor incident", "open")
        assert v.metrics["engine_state"] == "healthy"
        listed = _cli(stack, "list", "--json")
        assert '"channel:c1"' in listed.stdout

        # the TTL (wall time) passes: a verdict without the override follows, with a larger seq
        tap.wait_for(lambda got: any(x.channel == "c1" and x.override is msgspec.UNSET and x.seq > v.seq
                                     for _, x in got), 15, "the override's expiry", worker.log_tail)
        after = [x for _, x in tap.snapshot() if x.channel == "c1" and x.seq > v.seq][-1]
        assert (after.state, after.weight) == ("healthy", 1.0)
        assert worker.stop() == 0
        from pipeline.config import Settings
        from pipeline.storage.client import close_clients, open_client

        close_clients()  # chDB: one directory per process; an earlier test's client may still be cached
        client = open_client(Settings(kafka_bootstrap=None, clickhouse_url=f"chdb://{worker.chdb_dir}"))
        rows = client.query("SELECT action, kind, channel, by, reason FROM channel_health.channel_overrides FINAL "
                            "ORDER BY action").result_rows
        assert [tuple(r) for r in rows] == [("expire", "open", "c1", "ana", "vendor incident"),
                                            ("set", "open", "c1", "ana", "vendor incident")]
    finally:
        if tap is not None:
            tap.close()
        stack.close()


KEYS = "ana:ana-secret-0123456789abcdef"


def _send_control(stack: Stack, records: list[tuple[bytes, bytes]]) -> None:
    from aiokafka import AIOKafkaProducer

    async def send() -> None:
        producer = AIOKafkaProducer(bootstrap_servers=stack.settings.kafka_bootstrap, acks="all",
                                    max_request_size=2_000_000)
        await producer.start()
        try:
            for key, value in records:
                await producer.send_and_wait(stack.settings.topics.control, value, key=key)
        finally:
            await producer.stop()

    asyncio.run(send())


def test_hostile_control_records_are_refused_and_a_signed_override_is_audited_with_its_key_id(
        tmp_path: Path) -> None:
    """Issue #30 items 2 and 4 with the real worker: a ~1 MB reason, an expiry of 2**64-1 and an unsigned record
    are refused (one log line each, the worker keeps publishing); the CLI's signed override is applied and its
    key id is in the verdict and the audit."""
    stack = Stack(tmp_path, partitions=1).start()
    tap = None
    try:
        worker = stack.worker("w1", CHANNEL_HEALTH_CONTROL_KEYS=KEYS).start()
        tap = VerdictTap(stack.settings)
        start_ms = (int(time.time() * 1000) - 140_000) // 1000 * 1000
        publish(stack.settings, steady_events({"c1": "chat", "c2": "chat"}, start_ms, 65, per_s=2))
        tap.wait_for(lambda got: {"c1", "c2"} <= {v.channel for _, v in got}, 90, "first verdicts", worker.log_tail)
        now = int(time.time() * 1000)

        def rec(channel: str, **changes: object) -> tuple[bytes, bytes]:
            o = {"kind": "healthy", "channel": channel, "by": "mallory", "reason": "r", "set_ts_ms": now,
                 "expires_ts_ms": now + 3_600_000, **changes}
            return f"channel:{channel}".encode(), json.dumps({"action": "set", "override": o}).encode()

        def signed(key: bytes, value: bytes) -> tuple[bytes, bytes]:
            from pipeline.stream.control import signature

            kid, secret = KEYS.split(":")
            return key, json.dumps({"action": "signed", "kid": kid, "record": value.decode(),
                                    "hmac": signature(secret.encode(), key, value)}).encode()

        _send_control(stack, [rec("c2", reason="x" * 900_000), signed(*rec("c2", expires_ts_ms=2**64 - 1)),
                              rec("c2")])
        ok = _cli(stack, "set", "c1", "--weight", "0.5", "--ttl", "1h", "--reason", "ticket 7", "--by", "ana",
                  CHANNEL_HEALTH_CONTROL_KEYS=KEYS)
        assert ok.returncode == 0, ok.stderr
        assert "unsigned" not in ok.stderr
        tap.wait_for(lambda got: any(v.override is not msgspec.UNSET for _, v in got), 15,
                     "a verdict with the signed override", worker.log_tail)
        v = next(v for _, v in tap.snapshot() if v.override is not msgspec.UNSET)
        assert (v.channel, v.weight, v.override["key_id"], v.override["by"]) == ("c1", 0.5, "ana", "ana")
        listed = _cli(stack, "list", "--json", CHANNEL_HEALTH_CONTROL_KEYS=KEYS)  # verifies as the worker does
        assert listed.returncode == 0, listed.stderr
        assert [(r["key"], r["key_id"], r["weight"]) for r in json.loads(listed.stdout)] == [("channel:c1", "ana", 0.5)]
        # the worker is up and keeps publishing both channels; c2 never carries an override
        c2_seq = max(x.seq for x in tap.verdicts() if x.channel == "c2")
        publish(stack.settings, steady_events({"c1": "chat", "c2": "chat"}, start_ms + 65_000, 40, per_s=2, seed=1))
        tap.wait_for(lambda got: any(x.channel == "c2" and x.seq > c2_seq for _, x in got), 90,
                     "a later verdict of c2", worker.log_tail)
        assert worker.alive
        assert all(x.override is msgspec.UNSET for x in tap.verdicts() if x.channel == "c2")
        log_text = worker.log()
        for code in ("too_large", "malformed", "unsigned"):
            assert log_text.count(f"channel.control record refused ({code}") == 1, (code, worker.log_tail())
        assert "x" * 1000 not in log_text
        assert worker.stop() == 0
        from pipeline.config import Settings
        from pipeline.storage.client import close_clients, open_client

        close_clients()
        client = open_client(Settings(kafka_bootstrap=None, clickhouse_url=f"chdb://{worker.chdb_dir}"))
        rows = client.query("SELECT action, channel, by, key_id FROM channel_health.channel_overrides FINAL "
                            "ORDER BY action").result_rows
        assert [tuple(r) for r in rows] == [("set", "c1", "ana", "ana")]
    finally:
        if tap is not None:
            tap.close()
        stack.close()
