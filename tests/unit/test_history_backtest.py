"""Backtest acceptance (issue #22 item 1): a stored scenario replays to the recorded verdicts exactly,
and a stricter policy shows its extra transitions. Small: 3 h of two paid channels at 2 req/s (43 k events)
with stored quality scores (a 20 min quality drop on b), a sub-threshold latency rise and an error burst."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Iterator

import numpy as np
import pytest

from pipeline.config import Settings
from pipeline.policy.defaults import PAID_TIER, PolicyConfig
from pipeline.tools.history.backtest import BacktestError, run_backtest
from pipeline.tools.history.incidents import mark_incident
from pipeline.tools.history.synthetic import Fault, record, synthetic_events

H = 3_600_000
T0 = 1_767_225_600_000  # 2026-01-01T00:00:00Z: older than the live age bound (7 d) when this runs
END = T0 + 3 * H
# b: 20 min of latency x1.5 (below the 1.8 trip line) at 2 h, then 10 min at 25 % errors at 2 h 40 min
SOFT = Fault("b", T0 + 2 * H, T0 + 2 * H + 1_200_000, latency_factor=1.5)
HARD = Fault("b", T0 + 2 * H + 2_400_000, T0 + 2 * H + 3_000_000, error_rate=0.25)


QUALITY_DROP = (T0 + H + 1_200_000, T0 + H + 2_400_000)  # b's answers get worse for 20 min


def _quality_scores() -> list[tuple[str, int, float]]:
    """One score per channel every 2 s (the default sampling), ~0.8; 0.45 on b during QUALITY_DROP."""
    rng = np.random.default_rng(11)
    out = []
    for c in ("a", "b"):
        for t in range(T0 + 1_000, END, 2_000):
            low = c == "b" and QUALITY_DROP[0] <= t < QUALITY_DROP[1]
            out.append((c, t, float(np.clip(rng.normal(0.45 if low else 0.8, 0.08), 0.0, 1.0))))
    return out


@pytest.fixture(scope="module")
def stored(tmp_path_factory) -> Iterator[object]:
    """chDB holding what a worker with the default policy stored for the scenario."""
    from pipeline.storage.client import close_clients, open_client
    from pipeline.storage.schema import apply_ddl

    close_clients()
    path = tmp_path_factory.mktemp("bt") / "chdb"
    client = open_client(Settings(kafka_bootstrap=None, clickhouse_url=f"chdb://{path}"))
    apply_ddl(client)
    events = synthetic_events(["a", "b"], T0, END, 2.0, faults=[SOFT, HARD], seed=3)
    verdicts = record(client, events, quality=_quality_scores())
    assert any(v.state == "open" for v in verdicts)  # the error fault trips the default policy
    assert any("quality" in v.reasons for v in verdicts if v.channel == "b")  # the quality drop degrades b
    mark_incident(client, "b", HARD.from_ms, HARD.to_ms, "errors", source="manual")
    mark_incident(client, "a", T0 + H, END, "clean")
    yield client
    close_clients()


def test_same_policy_reproduces_recorded_verdicts_exactly(stored) -> None:
    report = run_backtest(stored, PolicyConfig(), T0, END)
    assert report["transitions_recorded"] > 0
    assert report["transitions_replayed"] == report["transitions_recorded"] == report["transitions_matching"]
    for ch in report["channels"].values():
        assert ch["gained"] == [] and ch["lost"] == []
        assert ch["time_in_state_ms_recorded"] == ch["time_in_state_ms_replayed"]
    (inc,) = report["incidents"]
    assert inc["detected_recorded_ms"] == inc["detected_replayed_ms"] is not None
    assert 0 <= inc["delay_replayed_ms"] < 120_000
    (clean,) = report["clean_periods"]
    assert clean["non_healthy_verdicts_recorded"] == clean["non_healthy_verdicts_replayed"] == 0
    assert report["events"] == 43_200


def test_window_inside_the_data_with_warmup_still_matches(stored) -> None:
    report = run_backtest(stored, PolicyConfig(), T0 + 2 * H, END)
    assert T0 <= report["replay_from_ms"] < T0 + 1_000  # warm-up (24 h) clipped to the first stored event
    assert report["transitions_replayed"] == report["transitions_recorded"] == report["transitions_matching"] > 0


def test_stricter_latency_policy_reports_extra_transitions(stored) -> None:
    strict = dataclasses.replace(PolicyConfig(), tiers={"paid": dataclasses.replace(PAID_TIER, latency_ratio_trip=1.3),
                                                        "free": PolicyConfig().tiers["free"]})
    report = run_backtest(stored, strict, T0, END)
    b = report["channels"]["b"]
    assert report["transitions_replayed"] > report["transitions_recorded"]
    assert b["lost"] == []
    # the latency fault (x1.5) now degrades b inside its span; the default policy stayed healthy there
    assert [g[2] for g in b["gained"]][:1] == ["degraded"]
    assert SOFT.from_ms <= b["gained"][0][0] < SOFT.to_ms
    assert report["channels"]["a"]["gained"] == []


def test_bad_spans_are_clear_errors(stored) -> None:
    with pytest.raises(BacktestError, match="before --to"):
        run_backtest(stored, PolicyConfig(), END, T0)
    with pytest.raises(BacktestError, match="no stored request events"):
        run_backtest(stored, PolicyConfig(), END + 48 * H, END + 49 * H)
