"""Prometheus metrics (issue #21): names, bounded per-channel series, scrape-time callbacks, the endpoint."""

from __future__ import annotations

import logging
import socket
import urllib.request
from collections import Counter
from types import SimpleNamespace

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from pipeline.config import ConfigError, MetricsSettings, Settings, load_settings
from pipeline.contracts import Verdict
from pipeline.metrics import PipelineMetrics, start_metrics_server


def _v(channel: str, state: str, reasons: list[str], weight: float) -> Verdict:
    return Verdict(channel=channel, route="r", state=state, weight=weight, reasons=reasons, metrics={},
                   ts_ms=1, seq=1, schema_version=1)


def _value(m: PipelineMetrics, name: str, **labels: str) -> float | None:
    return m.registry.get_sample_value(name, labels or None)


def test_verdicts_by_state_and_reason_and_bounded_channel_series() -> None:
    m = PipelineMetrics(max_channels=2)
    m.observe_verdicts([_v("a", "healthy", [], 1.0), _v("b", "open", ["error_rate", "latency_p95"], 0.0),
                        _v("c", "open", ["error_rate"], 0.0), _v("a", "degraded", ["latency_p95"], 0.4)])
    assert _value(m, "channel_health_verdicts_total", state="open", reason="error_rate") == 2
    assert _value(m, "channel_health_verdicts_total", state="healthy", reason="none") == 1
    assert _value(m, "channel_health_channel_state", channel="a", state="degraded") == 1
    assert _value(m, "channel_health_channel_state", channel="a", state="healthy") == 0
    assert _value(m, "channel_health_channel_weight", channel="a") == 0.4
    assert _value(m, "channel_health_channel_weight", channel="c") is None  # beyond max_channels: not exported
    assert _value(m, "channel_health_metrics_dropped_channels_total") == 1


def test_processor_counts_are_read_at_scrape_time() -> None:
    proc = SimpleNamespace(events_in=0, counters=SimpleNamespace(by_reason=Counter()))
    m = PipelineMetrics()
    m.track_worker(lambda: proc, lambda: {("requests", 0): 7, ("requests", 3): 0}, lambda: None, lambda: None)
    proc.events_in = 1234
    proc.counters.by_reason.update({"bad_json": 2, "ts_too_old": 5})
    assert _value(m, "channel_health_events_in_total") == 1234
    assert _value(m, "channel_health_dead_letters_total", reason="ts_too_old") == 5
    assert _value(m, "channel_health_consumer_lag_messages", topic="requests", partition="0") == 7
    assert _value(m, "channel_health_sink_backlog_rows") is None  # no sink: no sample
    text = generate_latest(m.registry).decode()
    assert "# TYPE channel_health_sink_backlog_rows gauge" in text


def test_batch_latencies_and_flushes() -> None:
    m = PipelineMetrics()
    m.observe_batch(0.02, 0.3, [_v("a", "healthy", [], 1.0)])
    m.observe_batch(0.01, None, [])
    m.observe_flush(0.5, 1000)
    assert _value(m, "channel_health_batch_processing_seconds_count") == 2
    assert _value(m, "channel_health_verdict_latency_seconds_count") == 1
    assert _value(m, "channel_health_verdict_latency_seconds_bucket", le="0.25") == 0
    assert _value(m, "channel_health_verdict_latency_seconds_bucket", le="0.5") == 1
    assert _value(m, "channel_health_sink_rows_written_total") == 1000


def test_a_counter_name_must_end_in_total() -> None:
    with pytest.raises(ValueError, match="_total"):
        PipelineMetrics().track("channel_health_things", "doc", lambda: 1, kind="counter")


def test_settings_read_the_port_and_refuse_bad_values() -> None:
    assert load_settings({}).metrics == MetricsSettings(port=None, max_channels=500)
    s = load_settings({"CHANNEL_HEALTH_METRICS_PORT": "9464", "CHANNEL_HEALTH_METRICS_MAX_CHANNELS": "20"})
    assert s.metrics == MetricsSettings(port=9464, max_channels=20)
    with pytest.raises(ConfigError, match="CHANNEL_HEALTH_METRICS_PORT must be an integer 1..65535"):
        load_settings({"CHANNEL_HEALTH_METRICS_PORT": "http"})
    with pytest.raises(ConfigError, match="METRICS_MAX_CHANNELS"):
        load_settings({"CHANNEL_HEALTH_METRICS_MAX_CHANNELS": "0"})


def test_the_endpoint_serves_the_registry() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    settings = Settings(kafka_bootstrap=None, clickhouse_url="chdb://./x", metrics=MetricsSettings(port=port))
    m = start_metrics_server(settings, CollectorRegistry())
    m.observe_verdicts([_v("a", "open", ["error_rate"], 0.0)])
    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    assert 'channel_health_verdicts_total{reason="error_rate",state="open"} 1.0' in body
    try:
        with pytest.raises(OSError):  # the port is taken now: a configured endpoint that cannot start is an error
            start_metrics_server(settings, CollectorRegistry())
    finally:
        m.close()
    assert m.server is None


def _free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def test_the_endpoint_binds_loopback_unless_a_host_is_configured(caplog) -> None:
    """Issue #30: /metrics listened on 0.0.0.0; now on CHANNEL_HEALTH_METRICS_HOST, default 127.0.0.1."""
    port = _free_port()
    with caplog.at_level(logging.INFO, "pipeline.metrics"):
        m = start_metrics_server(load_settings({"CHANNEL_HEALTH_METRICS_PORT": str(port)}), CollectorRegistry())
    try:
        assert m.server.socket.getsockname() == ("127.0.0.1", port)
        assert f"metrics: http://127.0.0.1:{port}/metrics" in caplog.text and "0.0.0.0" not in caplog.text
    finally:
        m.close()
    port = _free_port("127.0.0.2")
    settings = load_settings({"CHANNEL_HEALTH_METRICS_PORT": str(port), "CHANNEL_HEALTH_METRICS_HOST": "127.0.0.2"})
    assert settings.metrics.host == "127.0.0.2"
    m = start_metrics_server(settings, CollectorRegistry())
    try:
        assert m.server.socket.getsockname() == ("127.0.0.2", port)
        body = urllib.request.urlopen(f"http://127.0.0.2:{port}/metrics", timeout=10).read().decode()
        assert "# TYPE channel_health_verdicts_total counter" in body
        with pytest.raises(ConnectionRefusedError):  # not on every interface: 127.0.0.1 has no listener there
            socket.create_connection(("127.0.0.1", port), timeout=10).close()
    finally:
        m.close()


@pytest.mark.parametrize("host", ["0.0.0.0", "::1", "localhost", "metrics.internal.example", "host-1."])
def test_a_host_is_an_ip_address_or_a_host_name(host: str) -> None:
    assert load_settings({"CHANNEL_HEALTH_METRICS_HOST": host}).metrics.host == host


@pytest.mark.parametrize("host", ["not a host", "300.1.1.1", "[::1]", "-x", "a..b", "h:9464", "http://h", "x" * 64,
                                  " 127.0.0.1", "h\n"])
def test_a_bad_metrics_host_is_refused_naming_the_variable(host: str) -> None:
    with pytest.raises(ConfigError, match="CHANNEL_HEALTH_METRICS_HOST must be an IP address or a host name"):
        load_settings({"CHANNEL_HEALTH_METRICS_HOST": host})
    assert load_settings({"CHANNEL_HEALTH_METRICS_HOST": ""}).metrics.host == "127.0.0.1"  # empty: the default


def test_alert_sender_counts_deliveries_per_route() -> None:
    import asyncio

    from pipeline.alert.runner import Sender

    class Dispatcher:
        async def dispatch(self, n):
            if n.key == "boom":
                raise RuntimeError("formatter bug")
            return ["im", "pager"]

    m = PipelineMetrics()

    async def main() -> None:
        sender = Sender(Dispatcher(), m)
        for key in ("a", "b", "boom"):
            sender.submit(SimpleNamespace(key=key, kind="alert", severity="critical"))
        await sender.drain(5)

    asyncio.run(main())
    assert _value(m, "channel_health_alerts_sent_total", route="pager", outcome="sent") == 2
    assert _value(m, "channel_health_alerts_sent_total", route="none", outcome="failed") == 1


def test_events_ahead_of_the_clock_and_refused_control_records_are_exported() -> None:
    """Issue #30: what the worker refuses or holds back is visible in /metrics, not only in one log line."""
    import msgspec

    from pipeline.engine.batch import BatchProcessor

    now = 1_780_000_000_000
    proc = BatchProcessor(clock_ms=lambda: now)  # the default skew: 5 s
    events = [{"event_id": f"e{i}", "ts_ms": now + ahead, "channel": "a/x", "route": "r", "status": "ok",
               "latency_ms": 100.0} for i, ahead in enumerate((0, 1_000, 3_540_000, 600_000))]
    proc.process([msgspec.json.encode(e) for e in events], partitions=[0] * 4, offsets=list(range(4)))
    refused: Counter[str] = Counter()
    m = PipelineMetrics()
    m.track_processor(lambda: proc)
    m.track_control(lambda: refused)
    refused.update({"unsigned": 3, "too_large": 1})
    assert _value(m, "channel_health_events_ahead_of_clock_total") == 2  # +59 min and +10 min; +1 s is within skew
    assert _value(m, "channel_health_control_refused_total", reason="unsigned") == 3
    assert _value(m, "channel_health_control_refused_total", reason="too_large") == 1


def test_route_series_and_the_override_gauge() -> None:
    """Issue #35: the failed primary route shows in /metrics (channels by state and weight per route), and a
    forced channel is visible with its override kind; clearing the override removes the series."""
    import msgspec

    m = PipelineMetrics(max_channels=3)
    a = Verdict(channel="a", route="primary", state="open", weight=0.0, reasons=["error_rate"], metrics={},
                ts_ms=1, seq=1, schema_version=1)
    b = msgspec.structs.replace(a, channel="b", state="healthy", weight=0.97, reasons=[])
    c = msgspec.structs.replace(a, channel="c", route="backup", state="healthy", weight=1.0, reasons=[],
                                override={"kind": "healthy", "by": "ana", "reason": "x"})
    m.observe_verdicts([a, b, c])
    assert _value(m, "channel_health_route_channels", route="primary", state="open") == 1
    assert _value(m, "channel_health_route_channels", route="primary", state="healthy") == 1
    assert _value(m, "channel_health_route_channels", route="primary", state="degraded") == 0
    assert _value(m, "channel_health_route_weight_sum", route="primary") == pytest.approx(0.97)
    assert _value(m, "channel_health_channel_route", channel="a", route="primary") == 1
    assert _value(m, "channel_health_channel_override", channel="c", route="backup", kind="healthy") == 1
    assert _value(m, "channel_health_channel_override", channel="a", route="primary", kind="open") is None
    m.observe_verdicts([msgspec.structs.replace(c, override=msgspec.UNSET)])
    assert _value(m, "channel_health_channel_override", channel="c", route="backup", kind="healthy") is None
    m.observe_verdicts([msgspec.structs.replace(c, channel="d", route="x\"y{}")])  # beyond max_channels
    assert _value(m, "channel_health_route_weight_sum", route='x"y{}') is None
    assert b'route="primary"' in generate_latest(m.registry)
