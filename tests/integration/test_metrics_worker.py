"""The worker's Prometheus endpoint (issue #21): ``CHANNEL_HEALTH_METRICS_PORT`` serves counts that equal
what was sent: events in, dead letters by reason, verdicts, per-channel weight, consumer lag, sink writes."""

from __future__ import annotations

import asyncio
import socket
import time
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from workers import Stack, publish, steady_events

pytestmark = pytest.mark.integration
CHANNELS = {"prov0/model@paid": "chat", "prov1/model@free": "chat"}


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _scrape(port: int) -> dict[tuple[str, tuple], float]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


async def _send_raw(settings, value: bytes) -> None:
    from aiokafka import AIOKafkaProducer

    p = AIOKafkaProducer(bootstrap_servers=settings.kafka_bootstrap, acks="all")
    await p.start()
    try:
        await p.send_and_wait(settings.topics.requests, value, key=b"prov0/model@paid")
    finally:
        await p.stop()


def test_worker_metrics_count_what_was_sent(tmp_path):
    stack = Stack(tmp_path, partitions=2).start()
    try:
        port = _free_port()
        w = stack.worker("w1", CHANNEL_HEALTH_METRICS_PORT=str(port)).start()
        now = int(time.time() * 1000)
        events = steady_events(CHANNELS, now - now % 30_000 - 3_600_000, 300, per_s=1, seed=5)  # 600 events, 5 min
        publish(stack.settings, events)
        asyncio.run(_send_raw(stack.settings, b"{not json"))
        w.wait_drained(max(e["ts_ms"] for e in events), 120)
        m = _scrape(port)
        assert m[("channel_health_events_in_total", ())] == 600
        assert m[("channel_health_dead_letters_total", (("reason", "invalid_json"),))] == 1
        assert m[("channel_health_channel_weight", (("channel", "prov0/model@paid"),))] == 1.0
        assert m[("channel_health_channel_state", (("channel", "prov1/model@free"), ("state", "healthy")))] == 1.0
        verdicts = sum(v for (n, _), v in m.items() if n == "channel_health_verdicts_total")
        assert verdicts >= 2 * 9  # a verdict per channel per 30 s round over 5 min (first round may be missing)
        assert m[("channel_health_verdict_latency_seconds_count", ())] >= 1
        lags = {k: v for k, v in m.items() if k[0] == "channel_health_consumer_lag_messages"}
        assert lags and set(lags.values()) == {0.0}  # drained: nothing behind on any partition
        assert m[("channel_health_sink_rows_written_total", ())] >= 600
        assert m[("channel_health_sink_backlog_rows", ())] == 0
        w.stop()
    finally:
        stack.close()
