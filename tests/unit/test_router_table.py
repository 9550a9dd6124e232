"""pipeline.router.table: latest verdict per channel -> per-route shares (SPEC §1, §4)."""

from __future__ import annotations

import msgspec
import pytest

from pipeline.contracts import Verdict
from pipeline.router.table import HealthTable, RouteWeights

T0_MS = 1_750_000_000_000


class FakeClock:
    """Seconds, advanced by hand."""

    def __init__(self, now_s: float = 1000.0):
        self.now_s = now_s

    def __call__(self) -> float:
        return self.now_s


def verdict(channel: str, weight: float, seq: int, *, route: str = "chat-70b", state: str = "healthy",
            ts_ms: int | None = None) -> Verdict:
    return Verdict(channel=channel, route=route, state=state, weight=weight, reasons=[], metrics={},
                   ts_ms=T0_MS + 30_000 * seq if ts_ms is None else ts_ms, seq=seq)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def table(clock: FakeClock) -> HealthTable:
    return HealthTable(stale_after_s=90.0, clock=clock)


def test_without_route_share_weights_are_normalised_within_the_route(table: HealthTable) -> None:
    assert table.update(verdict("a", 1.0, 1))
    assert table.update(verdict("b", 0.5, 1, state="degraded"))
    assert table.update(verdict("c", 0.0, 1, state="open"))
    assert table.update(verdict("x", 0.3, 1, route="other"))

    rw = table.weights("chat-70b")
    assert rw == RouteWeights(
        route="chat-70b",
        shares={"a": 2 / 3, "b": 1 / 3, "c": 0.0},
        weights={"a": 1.0, "b": 0.5, "c": 0.0},
        states={"a": "healthy", "b": "degraded", "c": "open"},
        stale=False,
        age_s=0.0,
        all_open=False,
        source="weights",
    )
    assert list(rw.shares) == ["a", "b", "c"]
    assert table.weights("other").shares == {"x": 1.0}
    assert table.routes() == ["chat-70b", "other"]


def test_all_zero_weights_give_zero_shares_and_all_open(table: HealthTable) -> None:
    table.update(verdict("a", 0.0, 1, state="open"))
    table.update(verdict("b", 0.0, 1, state="open"))

    rw = table.weights("chat-70b")
    assert rw.shares == {"a": 0.0, "b": 0.0}
    assert rw.all_open is True
    assert rw.states == {"a": "open", "b": "open"}

    table.update(verdict("b", 0.05, 2, state="half_open"))
    rw = table.weights("chat-70b")
    assert rw.all_open is False
    assert rw.shares == {"a": 0.0, "b": 1.0}


def test_stale_after_the_bound_keeps_last_weights(table: HealthTable, clock: FakeClock) -> None:
    table.update(verdict("a", 1.0, 1))
    clock.now_s += 30.0
    table.update(verdict("b", 0.25, 1))  # newest verdict of the route: received at 1030 s
    fresh = table.weights("chat-70b")

    clock.now_s = 1030.0 + 90.0  # exactly at the bound: not yet stale
    at_bound = table.weights("chat-70b")
    assert at_bound.age_s == 90.0
    assert at_bound.stale is False

    clock.now_s = 1030.0 + 90.5
    stale = table.weights("chat-70b")
    assert stale.age_s == 90.5
    assert stale.stale is True
    assert stale.shares == fresh.shares == {"a": 0.8, "b": 0.2}
    assert stale.states == fresh.states

    clock.now_s = 1030.0 + 3600.0  # pipeline down for an hour: still the last known weights
    assert table.weights("chat-70b").shares == {"a": 0.8, "b": 0.2}
    assert table.weights("chat-70b").age_s == 3600.0


def test_fresh_verdict_clears_stale(table: HealthTable, clock: FakeClock) -> None:
    table.update(verdict("a", 1.0, 1))
    table.update(verdict("b", 1.0, 1))
    clock.now_s += 200.0
    assert table.weights("chat-70b").stale is True

    table.update(verdict("a", 0.5, 2, state="degraded"))
    rw = table.weights("chat-70b")
    assert rw.stale is False
    assert rw.age_s == 0.0
    assert rw.shares == {"a": 1 / 3, "b": 2 / 3}

    clock.now_s += 12.5
    assert table.weights("chat-70b").age_s == 12.5


def test_staleness_is_per_route(table: HealthTable, clock: FakeClock) -> None:
    table.update(verdict("a", 1.0, 1))
    clock.now_s += 100.0
    table.update(verdict("x", 1.0, 1, route="other"))
    assert table.weights("chat-70b").stale is True
    assert table.weights("other").stale is False


def test_duplicate_and_out_of_order_seq_are_ignored(table: HealthTable, clock: FakeClock) -> None:
    assert table.update(verdict("a", 1.0, 5))
    assert table.update(verdict("b", 1.0, 5))
    clock.now_s += 10.0
    assert not table.update(verdict("a", 1.0, 5))  # redelivered duplicate
    assert not table.update(verdict("a", 0.0, 3, state="open"))  # older, arrives late
    assert table.accepted == 2
    assert table.ignored == 2

    rw = table.weights("chat-70b")
    assert rw.shares == {"a": 0.5, "b": 0.5}
    assert rw.states["a"] == "healthy"
    assert rw.age_s == 10.0  # an ignored verdict does not refresh the receive time
    assert table.verdict("a").seq == 5


def test_lower_seq_with_newer_ts_is_a_restart_and_accepted(table: HealthTable) -> None:
    table.update(verdict("a", 1.0, 40, ts_ms=T0_MS))
    table.update(verdict("b", 1.0, 40, ts_ms=T0_MS))
    assert table.update(verdict("a", 0.25, 1, ts_ms=T0_MS + 60_000, state="degraded"))
    assert table.verdict("a").seq == 1
    assert table.weights("chat-70b").shares == {"a": 0.2, "b": 0.8}
    assert not table.update(verdict("a", 1.0, 1, ts_ms=T0_MS + 60_000))  # replay of the new one


def test_route_membership_follows_the_latest_verdict(table: HealthTable) -> None:
    table.update(verdict("a", 1.0, 1))
    table.update(verdict("b", 0.5, 1))
    table.update(verdict("x", 1.0, 1, route="other"))

    assert table.update(verdict("b", 0.5, 2, route="other"))
    assert table.channels("chat-70b") == ["a"]
    assert table.weights("chat-70b").shares == {"a": 1.0}
    assert table.weights("other").shares == {"b": 1 / 3, "x": 2 / 3}

    assert table.update(verdict("a", 1.0, 2, route="other"))
    assert table.routes() == ["other"]
    with pytest.raises(KeyError, match="chat-70b"):
        table.weights("chat-70b")
    assert table.weights("other").shares == {"a": 0.4, "b": 0.2, "x": 0.4}


def test_forget_removes_a_channel(table: HealthTable) -> None:
    table.update(verdict("a", 1.0, 1))
    table.update(verdict("b", 1.0, 1))
    assert table.forget("a")
    assert not table.forget("a")
    assert table.weights("chat-70b").shares == {"b": 1.0}
    assert table.forget("b")
    assert table.routes() == []


def test_unknown_route_raises(table: HealthTable) -> None:
    with pytest.raises(KeyError, match="no verdicts for route 'nope'"):
        table.weights("nope")


@pytest.mark.parametrize("weight", [-0.1, 1.5, float("nan"), float("inf")])
def test_invalid_weight_raises_and_changes_nothing(table: HealthTable, weight: float) -> None:
    table.update(verdict("a", 1.0, 1))
    with pytest.raises(ValueError, match="weight must be in"):
        table.update(verdict("a", weight, 2))
    assert table.verdict("a").seq == 1


@pytest.mark.parametrize("bound", [0.0, -1.0, float("nan"), float("inf")])
def test_invalid_stale_bound_raises(bound: float) -> None:
    with pytest.raises(ValueError, match="stale_after_s"):
        HealthTable(stale_after_s=bound)


def test_snapshot(table: HealthTable, clock: FakeClock) -> None:
    table.update(Verdict(channel="a", route="r", state="degraded", weight=0.75, reasons=["latency_p95_ratio"],
                         metrics={"p95_ratio": 1.9}, ts_ms=T0_MS, seq=3))
    clock.now_s += 5.0
    table.update(verdict("b", 0.25, 1, route="r", ts_ms=T0_MS + 1))
    clock.now_s += 1.0
    assert table.snapshot() == {
        "r": {
            "stale": False,
            "age_s": 1.0,
            "all_open": False,
            "channels": {
                "a": {"state": "degraded", "weight": 0.75, "share": 0.75, "reasons": ["latency_p95_ratio"],
                      "seq": 3, "ts_ms": T0_MS, "age_s": 6.0},
                "b": {"state": "healthy", "weight": 0.25, "share": 0.25, "reasons": [],
                      "seq": 1, "ts_ms": T0_MS + 1, "age_s": 1.0},
            },
        }
    }


# -- issue #20 item 3: the engine's bounded shares reach the router --------------------------------------

def share_verdict(channel: str, weight: float, share: float, seq: int, override: dict | None = None) -> Verdict:
    v = Verdict(channel=channel, route="chat-70b", state="healthy", weight=weight, reasons=[],
                metrics={"route_share": share}, ts_ms=T0_MS + 30_000 * seq, seq=seq)
    return v if override is None else msgspec.structs.replace(v, override=override)


def test_route_share_is_used_as_published_not_renormalised_weights(table: HealthTable) -> None:
    table.update(share_verdict("a", 0.4, 0.1, 1))  # recovering: the engine ramps its share slowly
    table.update(share_verdict("b", 1.0, 0.9, 1))
    rw = table.weights("chat-70b")
    assert rw.shares == pytest.approx({"a": 0.1, "b": 0.9})  # raw weights would give 0.286 / 0.714
    assert (rw.source, rw.overridden) == ("route_share", ())


def test_channel_override_counts_with_its_forced_weight(table: HealthTable) -> None:
    table.update(share_verdict("a", 1.0, 0.5, 1))
    table.update(share_verdict("b", 0.5, 0.5, 1, override={"kind": "weight", "weight": 0.5}))
    rw = table.weights("chat-70b")
    assert rw.shares == pytest.approx({"a": 2 / 3, "b": 1 / 3})
    assert rw.overridden == ("b",)
    table.update(share_verdict("b", 0.0, 0.0, 2, override={"kind": "open", "weight": 0.0, "state": "open"}))
    assert table.weights("chat-70b").shares == pytest.approx({"a": 1.0, "b": 0.0})


def test_router_shares_grow_within_the_engine_bound_when_the_primary_flips(clock: FakeClock) -> None:
    """Primary open for 4 min (backup takes the load), then recovers: per round, the router's shares
    grow at most by the engine's bound (x1.5 or +0.05), while raw weights would jump."""
    from pipeline.engine.replay import replay
    from pipeline.contracts import SUSPECT_METRIC
    from pipeline.policy.defaults import PolicyConfig
    from pipeline.policy.routes import MIN_GROWTH_ABS

    start, warm_s, outage_s, after_s = 1_700_000_040_000, 1200, 240, 1500
    events = []
    for k in range((warm_s + outage_s + after_s) * 5):
        ts = start + k * 200
        t_s = k / 5
        for ch in ("primary", "backup"):
            down = ch == "primary" and warm_s <= t_s < warm_s + outage_s
            events.append({"event_id": f"{ch}{k}", "ts_ms": ts, "channel": ch, "route": "chat-70b",
                           "status": "error" if down else "ok", "latency_ms": 200.0 + (k * 37 % 50), "tier": "paid"})
    growth = PolicyConfig().max_share_growth
    _, verdicts = replay(events)
    table = HealthTable(stale_after_s=90.0, clock=clock)
    prev: dict[str, float] | None = None
    raw_jumps, rounds, states = 0, 0, set()
    # a suspect channel's share (pipeline/engine/suspects.py) leaves at once and comes back at once, as a
    # trip's does: the bound is checked at the other verdict times
    suspect: dict[str, bool] = {}
    for ts in sorted({v.ts_ms for v in verdicts}):
        moved = False
        for v in (v for v in verdicts if v.ts_ms == ts):
            table.update(v)
            states.add(v.state)
            now = SUSPECT_METRIC in v.metrics
            moved |= now != suspect.get(v.channel, False)
            suspect[v.channel] = now
        if len(table.channels("chat-70b")) < 2:
            continue
        rw = table.weights("chat-70b")
        assert rw.source == "route_share"
        if prev is not None and sum(prev.values()) > 0 and not moved:
            cap = {c: max(prev[c] * growth, prev[c] + MIN_GROWTH_ABS) for c in prev}
            if sum(cap[c] for c in cap if rw.weights[c] > 0) >= 1.0:  # the bound can hold (see bounded_shares)
                for c, s in rw.shares.items():
                    assert s <= cap[c] + 1e-9, (ts, c, prev, rw.shares)
                total = sum(rw.weights.values())
                raw_jumps += any(w / total > cap[c] + 1e-9 for c, w in rw.weights.items())
            rounds += 1
        prev = dict(rw.shares)
    assert {"open", "half_open", "recovering"} <= states
    assert rounds > 80
    assert raw_jumps >= 1  # raw weights normalised by the router would have broken the bound


# -- issue #33 part 2: a learned capacity cap (metrics.max_share) survives the table's own normalising ------

def test_capacity_cap_is_kept_when_the_table_renormalises(table: HealthTable) -> None:
    """The engine's route_share respects max_share already (used as published); an override or the
    weights fallback re-normalises in the table, and then the cap is applied here (before: forcing the
    third channel open gave the capped channel 0.375, the weights fallback 1/3; and no max_shares)."""
    capped = Verdict(channel="b", route="chat-70b", state="degraded", weight=0.5, reasons=["over_capacity"],
                     metrics={"route_share": 0.3, "max_share": 0.3}, ts_ms=T0_MS + 30_000, seq=1)
    table.update(share_verdict("a", 1.0, 0.5, 1))
    table.update(capped)
    table.update(share_verdict("c", 1.0, 0.2, 1))
    rw = table.weights("chat-70b")
    assert rw.shares == pytest.approx({"a": 0.5, "b": 0.3, "c": 0.2})  # as published
    assert rw.max_shares == {"b": 0.3}
    # operator forces c open: a = 0.5 x 3, b = 0.3 x 3 -> b 0.375 over its cap 0.3: the 0.075 goes to a
    table.update(share_verdict("c", 0.0, 0.0, 2, override={"kind": "open", "weight": 0.0, "state": "open"}))
    assert table.weights("chat-70b").shares == pytest.approx({"a": 0.7, "b": 0.3, "c": 0.0})
    # an older worker without route_share: weights 1.0 / 0.5 -> 2/3 / 1/3, b held to 0.3
    t2 = HealthTable(stale_after_s=90.0)
    t2.update(verdict("a", 1.0, 1))
    t2.update(msgspec.structs.replace(capped, metrics={"max_share": 0.3}))
    assert t2.weights("chat-70b").shares == pytest.approx({"a": 0.7, "b": 0.3})
