"""``channel-health alert`` as a real process on loopback: embedded broker, webhook server, verdicts on channel.health.

No worker and no ClickHouse: verdict JSON is published straight to
``channel.health`` (the alert process must not depend on the business path).
The primary webhook answers 500, so every alert must reach the backup (a
PagerDuty-format route); 20 channels of one route opening within a second give
at most 2 alerts, then one resolve; verdicts stopping give the heartbeat alert
within its configured time, and resuming them its resolve.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from pipeline.contracts import Verdict, encode
from workers import REPO, PacedTraffic, Stack, make_settings, start_broker, steady_events

pytestmark = pytest.mark.integration

SILENT_AFTER_S = 2.0


class Hooks:
    """Loopback HTTP server: ``/fail...`` answers 500, anything else 202; records (arrival, path, JSON body)."""

    def __init__(self) -> None:
        self.received: list[tuple[float, str, dict]] = []
        self.cond = threading.Condition()
        hooks = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's name)
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with hooks.cond:
                    hooks.received.append((time.monotonic(), self.path, body))
                    hooks.cond.notify_all()
                self.send_response(500 if self.path.startswith("/fail") else 202)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def backup(self, key: str, action: str) -> list[tuple[float, dict]]:
        """PagerDuty events received by the backup route for ``key`` with ``event_action == action``."""
        with self.cond:
            return [(t, b) for t, p, b in self.received
                    if p == "/pager" and b.get("dedup_key") == key and b.get("event_action") == action]

    def backup_or_primary(self, action: str) -> list[tuple[float, dict]]:
        """Heartbeat events with ``event_action == action`` received on ``/pager``."""
        return self.backup("channel-health/heartbeat", action)

    def wait(self, predicate, timeout_s: float) -> None:
        """Block until ``predicate()`` is true (re-checked on every request), or fail after ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        with self.cond:
            while not predicate():
                left = deadline - time.monotonic()
                if left <= 0:
                    pytest.fail(f"webhooks did not receive the expected alerts in {timeout_s} s: "
                                f"{[(p, b.get('event_action')) for _, p, b in self.received]}")
                self.cond.wait(left)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class VerdictFeed:
    """Publishes one verdict per channel every ``period_s`` on a thread; ``state`` is switched by the test."""

    def __init__(self, settings, channels: list[str], period_s: float = 0.2) -> None:
        self.settings, self.channels, self.period_s = settings, channels, period_s
        self.state = "healthy"
        self.running = threading.Event()
        self.running.set()
        self.last_sent = time.monotonic()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._run()), daemon=True)
        self._thread.start()

    async def _run(self) -> None:
        from aiokafka import AIOKafkaProducer

        producer = AIOKafkaProducer(bootstrap_servers=self.settings.kafka_bootstrap)
        await producer.start()
        try:
            seq = 0
            while not self._stop.is_set():
                if self.running.is_set():
                    seq += 1
                    for ch in self.channels:
                        state = self.state
                        v = Verdict(channel=ch, route="chat", state=state, weight=0.0 if state == "open" else 1.0,
                                    reasons=["error_rate"] if state == "open" else [],
                                    metrics={"error_rate_1m": 0.2 if state == "open" else 0.0, "requests_1m": 120},
                                    ts_ms=1_750_000_000_000 + seq * 1000, seq=seq)
                        await producer.send(self.settings.topics.health, encode(v), key=ch.encode())
                    await producer.flush()
                    self.last_sent = time.monotonic()
                await asyncio.sleep(self.period_s)
        finally:
            await producer.stop()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(15)


def test_alert_process_backup_grouping_heartbeat_and_clean_stop(tmp_path: Path) -> None:
    broker = start_broker()
    hooks = Hooks()
    feed = proc = None
    try:
        settings = make_settings(broker.bootstrap, partitions=2)
        config = tmp_path / "alerts.toml"
        config.write_text(f'''
[[route]]
name = "im"
url = "http://127.0.0.1:{hooks.port}/fail?token=${{HOOK_TOKEN}}"
format = "slack"
min_severity = "warning"
backup = "pager2"
attempts = 2
backoff_s = 0.05

[[route]]
name = "pager2"
url = "http://127.0.0.1:{hooks.port}/pager"
format = "pagerduty"
routing_key = "${{PD_KEY}}"
backup_only = true

[grouping]
group_wait_s = 1.0
group_interval_s = 3.0

[heartbeat]
silent_after_s = {SILENT_AFTER_S}
''')
        env = {k: v for k, v in os.environ.items() if not k.startswith("CHANNEL_HEALTH_")}
        env.update(CHANNEL_HEALTH_KAFKA_BOOTSTRAP=settings.kafka_bootstrap, CHANNEL_HEALTH_TOPIC_PREFIX=settings.topic_prefix,
                   HOOK_TOKEN="hook-token-0123456789", PD_KEY="pd-routing-key-abcdef", PYTHONUNBUFFERED="1",
                   PYTHONPATH=str(REPO))
        log_path = tmp_path / "alert.log"
        channels = [f"prov{i:02d}/model@paid" for i in range(20)]
        feed = VerdictFeed(settings, channels)
        with log_path.open("w") as log_file:
            proc = subprocess.Popen([sys.executable, "-m", "pipeline.cli", "alert", "--config", str(config)],
                                    cwd=REPO, env=env, stdout=log_file, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 60
        while "assigned" not in log_path.read_text():
            assert proc.poll() is None, log_path.read_text()
            assert time.monotonic() < deadline, "alert process did not join its group"
            time.sleep(0.1)

        # 20 channels of route "chat" open within one second -> at most 2 alerts, all through the backup.
        feed.state = "open"
        hooks.wait(lambda: any(len(b["payload"]["custom_details"]["firing"]) == 20
                               for _, b in hooks.backup("channel-health/chat", "trigger")), 30)
        feed.state = "healthy"
        hooks.wait(lambda: hooks.backup("channel-health/chat", "resolve"), 30)
        triggers = hooks.backup("channel-health/chat", "trigger")
        assert 1 <= len(triggers) <= 2
        event = triggers[-1][1]
        assert set(event) == {"routing_key", "event_action", "dedup_key", "payload"}
        assert event["routing_key"] == "pd-routing-key-abcdef"
        assert {"summary", "source", "severity", "custom_details"} <= set(event["payload"])
        assert event["payload"]["severity"] == "critical"
        first = event["payload"]["custom_details"]["firing"][0]
        assert (first["channel"], first["state"], first["reasons"], first["metrics"]["error_rate_1m"]) == \
            ("prov00/model@paid", "open", ["error_rate"], 0.2)
        primary = [b for _, p, b in hooks.received if p.startswith("/fail")]
        assert primary and set(primary[0]) == {"text", "blocks"}  # the Slack-format attempt that got a 500

        # Verdicts stop -> heartbeat alert within silent_after_s (plus the process's 0.25 s tick and delivery).
        feed.running.clear()
        stopped_at = feed.last_sent
        before = len(hooks.backup("channel-health/heartbeat", "trigger"))
        hooks.wait(lambda: len(hooks.backup("channel-health/heartbeat", "trigger")) > before, SILENT_AFTER_S + 10)
        arrived, alert = hooks.backup("channel-health/heartbeat", "trigger")[-1]
        assert alert["payload"]["severity"] == "critical" and "pipeline silent" in alert["payload"]["summary"]
        assert SILENT_AFTER_S <= arrived - stopped_at + 0.3 <= SILENT_AFTER_S + 3.0
        feed.running.set()
        hooks.wait(lambda: hooks.backup("channel-health/heartbeat", "resolve"), 15)
        assert len(hooks.backup("channel-health/chat", "resolve")) == 1  # still exactly one resolve

        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 0
        log_text = log_path.read_text()
        assert "hook-token-0123456789" not in log_text and "pd-routing-key-abcdef" not in log_text
        assert "alert route im failed" in log_text and "trying backup pager2" in log_text
    finally:
        if feed is not None:
            feed.close()
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait(10)
        hooks.close()
        broker.stop()


@pytest.mark.slow
def test_real_worker_stopping_raises_the_heartbeat_and_its_restart_resolves_it(tmp_path: Path) -> None:
    """Issue #20 acceptance with a real worker: SIGTERM it -> "pipeline silent" within silent_after_s; start it
    again -> the resolve. Traffic keeps flowing meanwhile (the gateways do not stop with the worker)."""
    silent_after_s = 4.0
    stack = Stack(tmp_path, partitions=1).start()
    hooks = Hooks()
    traffic = proc = None
    try:
        w = stack.worker("w").start()
        w.wait_for_log(r"status: generation", timeout_s=120)
        # 30 s of event time per wall second: one evaluation round (30 s) per second, a verdict each.
        events = steady_events({"a/m@paid": "chat", "b/m@paid": "chat"}, int(time.time() * 1000) - 3_600_000, 3000)
        traffic = PacedTraffic(stack.settings, events, speed=30.0)
        w.wait_status(lambda st: st["verdicts_out"] > 0, 60, "verdicts out")
        config = tmp_path / "alerts.toml"
        config.write_text(f'''
[[route]]
name = "im"
url = "http://127.0.0.1:{hooks.port}/pager"
format = "pagerduty"
routing_key = "rk-0123456789"
min_severity = "warning"

[heartbeat]
silent_after_s = {silent_after_s}
''')
        env = {k: v for k, v in os.environ.items() if not k.startswith("CHANNEL_HEALTH_")}
        env.update(CHANNEL_HEALTH_KAFKA_BOOTSTRAP=stack.settings.kafka_bootstrap,
                   CHANNEL_HEALTH_TOPIC_PREFIX=stack.settings.topic_prefix, PYTHONUNBUFFERED="1")
        log_path = tmp_path / "alert.log"
        with log_path.open("w") as log_file:
            proc = subprocess.Popen([sys.executable, "-m", "pipeline.cli", "alert", "--config", str(config)],
                                    cwd=REPO, env=env, stdout=log_file, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 60
        while "assigned" not in log_path.read_text():
            assert proc.poll() is None and time.monotonic() < deadline, log_path.read_text()
            time.sleep(0.1)
        before = len(hooks.backup_or_primary("trigger"))
        w.stop()
        stopped_at = time.monotonic()
        hooks.wait(lambda: len(hooks.backup_or_primary("trigger")) > before, silent_after_s + 15)
        arrived, alert = hooks.backup_or_primary("trigger")[-1]
        assert alert["payload"]["severity"] == "critical"
        # Verdicts the worker published up to its stop may still be read for a moment after it (consumer lag on
        # a loaded machine), so the bound from the stop has slack; the silence the alert reports is exact.
        silent = float(re.search(r"No channel.health verdict for (\d+) s", alert["payload"]["custom_details"]
                                 ["detail"]).group(1))
        assert silent_after_s <= silent <= silent_after_s + 1, alert
        assert arrived - stopped_at <= silent_after_s + 8.0
        w.start()
        hooks.wait(lambda: hooks.backup_or_primary("resolve"), 120)
    finally:
        if traffic is not None:
            traffic.stop()
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            proc.wait(20)
        hooks.close()
        stack.close()
