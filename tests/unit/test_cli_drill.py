"""``channel-health drill``: bad input gets a clear error; an offline drill prints its table and JSON;
a run is stored with its incident."""

from __future__ import annotations

import json
import sys
import types
from pathlib import Path

import pytest
from typer.testing import CliRunner

from pipeline.cli.main import app
from pipeline.config import Settings
from pipeline.policy.defaults import PolicyConfig

runner = CliRunner()


@pytest.fixture(autouse=True)
def _env(monkeypatch, tmp_path):
    for name in ("CHANNEL_HEALTH_KAFKA_BOOTSTRAP", "CHANNEL_HEALTH_TOPIC_PREFIX"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("CHANNEL_HEALTH_CLICKHOUSE_URL", f"chdb://{tmp_path / 'chdb'}")


def test_unknown_kind_lists_the_kinds():
    res = runner.invoke(app, ["drill", "--fault", "smoke", "--channel", "drill/a", "--shadow"])
    assert res.exit_code == 2
    assert "unknown fault kind 'smoke'; valid kinds: errors, latency, hollow, stream_stall, quota_drain, " \
           "quality_drift" in res.output


def test_live_drill_on_a_production_looking_channel_is_refused():
    res = runner.invoke(app, ["drill", "--fault", "errors", "--channel", "openai/gpt-4o@paid", "--yes-production"])
    assert res.exit_code == 2
    assert "refusing a live drill on 'openai/gpt-4o@paid'" in res.output and "--shadow" in res.output


def test_live_drill_needs_the_production_confirmation():
    res = runner.invoke(app, ["drill", "--fault", "errors", "--channel", "drill/a"])
    assert res.exit_code == 2
    assert "production topic gateway.requests; confirm with --yes-production" in res.output


def test_live_drill_on_an_unknown_channel(monkeypatch, tmp_path):
    from pipeline.storage.client import close_clients, open_client
    from pipeline.storage.schema import apply_ddl

    monkeypatch.setenv("CHANNEL_HEALTH_KAFKA_BOOTSTRAP", "127.0.0.1:1")
    close_clients()
    apply_ddl(open_client(Settings(kafka_bootstrap=None, clickhouse_url=f"chdb://{tmp_path / 'chdb'}")))
    try:
        res = runner.invoke(app, ["drill", "--fault", "errors", "--channel", "drill/nobody", "--yes-production"])
    finally:
        close_clients()
    assert res.exit_code == 2
    assert "unknown channel 'drill/nobody': no request events of it" in res.output


@pytest.mark.parametrize("duration, msg", [("0s", "--duration must be a positive duration"),
                                           ("soon", "configuration error")])
def test_bad_duration(duration, msg):
    res = runner.invoke(app, ["drill", "--fault", "errors", "--channel", "drill/a", "--shadow", "--duration", duration])
    assert res.exit_code == 2 and msg in res.output


#: The errors drill's timeline on its lone-channel route "drill": ramp weights 0.1-0.3 are under the route's
#: panic line (w / 0.7 < 0.5) and published at the floor 0.5 with route_panic (SPEC §4.2, issue #33), one
#: transition for the three steps; 0.4 (0.57 of full) and up are the plain ramp.
ERRORS_DRILL = ["open", "half_open", "recovering 0.50", "recovering 0.40", "recovering 0.60", "recovering 0.80",
                "healthy"]


def test_offline_errors_drill_prints_the_table_and_json():
    res = runner.invoke(app, ["drill", "--fault", "errors", "--channel", "drill/a", "--offline", "--json"])
    assert res.exit_code == 0, res.output
    assert "transition" in res.output and "recovering 0.50" in res.output and "PASSED: 7 of 7" in res.output
    last = json.loads(res.output.strip().splitlines()[-1])
    assert last["passed"] is True and last["kind"] == "errors"
    assert [r["transition"] for r in last["rows"]] == ERRORS_DRILL
    # every step after the open (a bound) is predicted to the millisecond: the half_open in the first round
    # after the published cooldown end, the rest on the 30 s round grid from it
    assert [r["diff_ms"] for r in last["rows"][1:]] == [0] * 6, res.output


def test_store_run_writes_the_run_and_marks_its_incident(monkeypatch, tmp_path):
    from pipeline.storage.client import close_clients, open_client
    from pipeline.storage.schema import apply_ddl
    from pipeline.tools.drill.runner import judge, plan_drill
    from pipeline.tools.drill.store import store_run

    marked = []
    stub = types.ModuleType("pipeline.tools.history.incidents")
    stub.mark_incident = lambda client, channel, from_ms, to_ms, kind, source="manual", note="": (
        marked.append((channel, from_ms, to_ms, kind, source)) or types.SimpleNamespace(incident_id="inc-1"))
    monkeypatch.setitem(sys.modules, "pipeline.tools.history.incidents", stub)
    plan = plan_drill("errors", "drill/a", PolicyConfig(), end_ms=1_750_032_000_000, run_id="run-1")
    result = judge(plan, [], shadow=True, topic_prefix="drill.run-1.")
    close_clients()
    client = open_client(Settings(kafka_bootstrap=None, clickhouse_url=f"chdb://{tmp_path / 'chdb'}"))
    try:
        apply_ddl(client)
        assert store_run(client, result, 1_750_032_100_000) == "inc-1"
        rows = client.query("SELECT run_id, channel, kind, shadow, passed, toUnixTimestamp64Milli(fault_from_ts), "
                            "JSONLength(comparison) FROM channel_health.drill_runs").result_rows
    finally:
        close_clients()
    assert rows == [("run-1", "drill/a", "errors", 1, 0, plan.fault_start_ms, len(ERRORS_DRILL))]
    assert marked == [("drill/a", plan.fault_start_ms, plan.fault_end_ms, "errors", "drill")]


def test_route_channels_counts_the_channels_of_the_route_in_its_last_hour(tmp_path):
    """A live drill on drill/b expects the route's panic floor only when drill/b is its route's only channel
    (pipeline.cli.drill.route_channels feeds plan_drill's ``alone``): route r2 has drill/b and a channel that
    sent 2 h before r2's newest event (gone), route r1 has two live channels."""
    import msgspec

    from pipeline.cli.drill import route_channels
    from pipeline.contracts import RequestEvent
    from pipeline.sinks.clickhouse import ClickHouseSink
    from pipeline.storage.client import close_clients

    t = 1_750_032_000_000
    rows = [("drill/a", "r1", t), ("prod/x", "r1", t - 60_000), ("drill/b", "r2", t), ("prod/old", "r2", t - 7_200_000)]
    settings = Settings(kafka_bootstrap=None, clickhouse_url=f"chdb://{tmp_path / 'routes'}")
    close_clients()
    try:
        sink = ClickHouseSink.from_settings(settings)
        sink.add_events([(msgspec.convert({"event_id": f"e{i}", "ts_ms": ts, "channel": ch, "route": r, "tier": "paid",
                                           "status": "ok", "latency_ms": 100.0}, RequestEvent), None, None)
                         for i, (ch, r, ts) in enumerate(rows)])
        sink.flush()
        assert (route_channels(settings, "r1"), route_channels(settings, "r2"), route_channels(settings, "r3")) == (2, 1, 0)
    finally:
        close_clients()
