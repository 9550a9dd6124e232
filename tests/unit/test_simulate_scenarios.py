"""Scenarios of the traffic simulator (SPEC §5): contract, determinism, injected truth.

Each scenario is generated once per test session (seed 0, start 2023-11-14
22:13:20 UTC) into compact numpy columns while every event is validated
against ``pipeline.contracts.RequestEvent``; the tests then measure the
realised traffic against the scenario's injected faults.
"""

from __future__ import annotations

import itertools
import json
import time
from dataclasses import dataclass, field
from functools import lru_cache

import msgspec
import numpy as np
import pytest

from pipeline.contracts import FAILURE_STATUSES, RequestEvent
from pipeline.tools.simulate import SCENARIOS, WARMUP_S, get_scenario
from pipeline.tools.simulate.traces import load_llmperf

# The scenarios read ../shared/data when present, else the samples shipped in the package (the same events).

START_MS = 1_700_000_000_000
NAMES = (
    "gradual-degradation",
    "backup-overload",
    "content-hollowing",
    "quality-drift",
    "sparse-consecutive-failures",
    "slow-failure",
    "quota-exhaustion",
    "recovery",
    "clean-day",
    "real-providers",
    # issue #32 part 4 (SPEC §4.1)
    "dead-key",
    "quota-hard",
    "retry-after",
    "caller-storm",
    # issue #33 part 4 (SPEC §4.2 route-wide events)
    "route-wide",
    "peer-creep",
)
STATUSES = ("ok", "error", "timeout", "rate_limited", "cancelled", "filtered")


@dataclass
class Run:
    """Columns of one generated scenario; times in scenario seconds."""

    name: str
    channels: list[str]
    t_s: np.ndarray
    channel: np.ndarray  # index into channels
    status: np.ndarray  # index into STATUSES
    latency_ms: np.ndarray
    http_status: np.ndarray  # 0 = absent
    structured: list[dict] = field(default_factory=list)
    invalid: int = 0
    ids_in_order: bool = True
    seconds: float = 0.0

    def sel(self, channel: str, a: float = -np.inf, b: float = np.inf) -> np.ndarray:
        k = self.channels.index(channel)
        return (self.channel == k) & (self.t_s >= a) & (self.t_s < b)

    def fail(self) -> np.ndarray:
        return np.isin(self.status, [STATUSES.index(s) for s in FAILURE_STATUSES])

    def ok(self) -> np.ndarray:
        return self.status == 0


_one = msgspec.json.Decoder(RequestEvent)
_many = msgspec.json.Decoder(list[RequestEvent])


def _count_invalid(chunk: list[dict]) -> int:
    """Validate a chunk at once; on failure, count the invalid events one by one."""
    try:
        _many.decode(msgspec.json.encode(chunk))
        return 0
    except (msgspec.ValidationError, ValueError):
        bad = 0
        for e in chunk:
            try:
                _one.decode(msgspec.json.encode(e))
            except (msgspec.ValidationError, ValueError):
                bad += 1
        return bad


@lru_cache(maxsize=None)
def run(name: str) -> Run:
    sc = SCENARIOS[name]
    chans = list(sc.channel_names)
    cidx = {c: i for i, c in enumerate(chans)}
    sidx = {s: i for i, s in enumerate(STATUSES)}
    ts, ch, st, lat, http, ids = [], [], [], [], [], []
    structured: list[dict] = []
    invalid = 0
    t0 = time.perf_counter()
    events = sc.events(START_MS, seed=0)
    while True:
        chunk = list(itertools.islice(events, 20_000))
        if not chunk:
            break
        invalid += _count_invalid(chunk)
        ts += [e["ts_ms"] for e in chunk]
        ch += [cidx[e["channel"]] for e in chunk]
        st += [sidx[e["status"]] for e in chunk]
        lat += [e["latency_ms"] for e in chunk]
        http += [e.get("http_status") or 0 for e in chunk]
        ids += [e["event_id"] for e in chunk]
        if name != "clean-day":
            structured += [e for e in chunk if "expected_fields" in e]
    seconds = time.perf_counter() - t0
    prefix = ids[0].rsplit("-", 1)[0]
    ids_ok = ids == [f"{prefix}-{i:08d}" for i in range(len(ids))]
    return Run(
        name=name,
        channels=chans,
        t_s=(np.array(ts, dtype=np.int64) - START_MS) / 1000.0,
        channel=np.array(ch, dtype=np.int16),
        status=np.array(st, dtype=np.int8),
        latency_ms=np.array(lat),
        http_status=np.array(http, dtype=np.int16),
        structured=structured,
        invalid=invalid,
        ids_in_order=ids_ok,
        seconds=seconds,
    )


def realised_missing(e: dict) -> bool:
    """Independent structure check of one structured ``ok`` event."""
    if "missing_fields" in e:
        return bool(e["missing_fields"])
    parsed = json.loads(e["response_text"])
    exp = e["expected_fields"]
    if exp and isinstance(exp[0], str):
        return any(k not in parsed for k in exp)
    calls = [(fn, json.loads(args)) for c in parsed for fn, args in c.items()]
    if len(calls) != len(exp):
        return True
    return any(x["function"] != fn or any(r not in args for r in x["required"]) for x, (fn, args) in zip(exp, calls))


# --------------------------------------------------------------------------- registry


def test_scenario_names_and_lookup():
    assert tuple(SCENARIOS) == NAMES
    assert get_scenario("recovery") is SCENARIOS["recovery"]
    with pytest.raises(ValueError) as err:
        get_scenario("meltdown")
    for name in NAMES:
        assert name in str(err.value)


@pytest.mark.parametrize("name", NAMES)
def test_scenario_shape(name):
    sc = SCENARIOS[name]
    assert sc.name == name and sc.description and sc.expected
    for f in sc.faults:
        assert f.start_s >= WARMUP_S and f.channel in sc.channel_names
    for exp in sc.expected:
        assert exp["channel"] in sc.channel_names
        json.dumps(exp)  # machine-readable, JSON-ready
    tiers = {c.tier for c in sc.channels}
    # the issue #32 scenarios are focused (one fault, paid channels, like the scorecard's issue #19 ones)
    if name not in ("real-providers", "dead-key", "quota-hard", "retry-after", "caller-storm", "route-wide",
                    "peer-creep"):
        assert tiers == {"free", "paid"}
        assert len(sc.routes) >= 2


# --------------------------------------------------------------------------- determinism


@pytest.mark.parametrize("name", NAMES)
def test_same_seed_same_events_other_seed_differs(name):
    sc = SCENARIOS[name]

    def head(seed, n=100):
        out = []
        for e in sc.events(START_MS, seed=seed):
            out.append((e["event_id"], e["ts_ms"], e["channel"], e["status"], e["latency_ms"]))
            if len(out) == n:
                break
        return out

    a, b = head(0), head(0)
    assert len(a) == 100 and a == b
    c = head(1)
    assert [x[0] for x in c] != [x[0] for x in a]  # ids carry the seed
    if name != "real-providers":  # replays are the measured requests, seed-independent
        assert [x[1:] for x in c] != [x[1:] for x in a]


# --------------------------------------------------------------------------- contract


FULL_RUNS = [pytest.param(n, marks=pytest.mark.slow) if n in ("clean-day", "peer-creep") else n for n in NAMES]


@pytest.mark.parametrize("name", FULL_RUNS)
def test_events_validate_are_ordered_and_unique(name):
    r = run(name)
    assert r.invalid == 0
    assert r.ids_in_order  # sim-<hash>-<n> with n = 0, 1, 2, ...: unique
    assert np.all(np.diff(r.t_s) >= 0)
    limits = {"clean-day": 1_500_000, "peer-creep": 600_000}
    assert len(r.t_s) <= limits.get(name, 300_000)
    print(f"{name}: {len(r.t_s)} events in {r.seconds:.2f} s (incl. validation)")


# --------------------------------------------------------------------------- gradual degradation


def test_gradual_degradation_matches_injection():
    sc = SCENARIOS["gradual-degradation"]
    r = run("gradual-degradation")
    ch = "lepton/llama-70b@free"
    t0, ramp = WARMUP_S, 780
    assert sc.duration_s == t0 + ramp + 600
    # >= 10 req/s on the faulty channel around the fault.
    assert r.sel(ch, t0 - 600, t0 + ramp).sum() / (600 + ramp) >= 10.0
    # Healthy before: error rate ~0.2 %, P95 ~180 ms.
    pre = r.sel(ch, t0 - 1800, t0)
    assert r.fail()[pre].mean() == pytest.approx(0.002, abs=0.001)
    assert np.quantile(r.latency_ms[pre & r.ok()], 0.95) == pytest.approx(180.0, rel=0.03)
    # Last 2 min of the ramp (failures grow as progress ** 2): injected mean
    # 0.2 % + 4.4 % x mean(s^2 for s in [660/780, 1)) = 3.95 %, realised within 1 %.
    last = r.sel(ch, t0 + ramp - 120, t0 + ramp)
    injected = float(np.mean(sc.injected_error_rate(ch, np.arange(t0 + ramp - 120, t0 + ramp))))
    assert injected == pytest.approx(0.03953, abs=1e-4)
    assert r.fail()[last].mean() == pytest.approx(injected, abs=0.01)
    # Hold at full strength: 4.6 % and P95 ~800 ms.
    hold = r.sel(ch, t0 + ramp, sc.duration_s)
    assert r.fail()[hold].mean() == pytest.approx(0.046, abs=0.004)
    p95_hold = np.quantile(r.latency_ms[hold & r.ok()], 0.95)
    assert p95_hold == pytest.approx(float(np.mean(sc.injected_p95_ms(ch, np.arange(t0 + ramp, sc.duration_s)))), rel=0.03)
    assert p95_hold == pytest.approx(800.0, rel=0.05)
    # The helpers give the crossing times tests need: errors accelerate late
    # (1.5 % at 780 s x sqrt(1.3 / 4.4)), the P95 climbs linearly.
    assert sc.time_when(ch, "error_rate", 0.015) == t0 + 424
    assert sc.injected_error_rate(ch, t0 + ramp / 2) == pytest.approx(0.002 + 0.044 / 4)
    assert sc.time_when(ch, "p95_ms", 1.8 * 180) == t0 + 181
    assert sc.injected_error_rate(ch, t0 - 1) == pytest.approx(0.002)
    # Siblings stay at their baseline.
    sib = r.sel("fireworks/llama-70b@paid", t0, sc.duration_s)
    assert r.fail()[sib].mean() < 0.006


# --------------------------------------------------------------------------- backup overload


def test_backup_overload_primary_trips_and_backup_degrades_under_double_load():
    sc = SCENARIOS["backup-overload"]
    r = run("backup-overload")
    primary, backup = "fireworks/llama-70b@paid", "together/llama-70b@paid"
    t0, t1 = WARMUP_S, WARMUP_S + 900
    out = r.sel(primary, t0 + 31, t1)  # finished after every pre-outage request (timeout 30 s)
    assert r.fail()[out].all()
    assert set(r.http_status[out].tolist()) == {503}
    before = r.sel(backup, t0 - 600, t0).sum() / 600
    during = r.sel(backup, t0 + 60, t1).sum() / (t1 - t0 - 60)
    assert during / before == pytest.approx(2.3, abs=0.3)  # own load + every failed primary request
    base = r.sel(backup, t0 - 1800, t0)
    hot = r.sel(backup, t0 + 60, t1)
    p95_ratio = np.quantile(r.latency_ms[hot & r.ok()], 0.95) / np.quantile(r.latency_ms[base & r.ok()], 0.95)
    assert p95_ratio >= 1.8  # latency-degraded line of SPEC §4.3
    err = r.fail()[hot].mean()
    injected = float(np.mean(sc.injected_error_rate(backup, np.arange(t0 + 60, t1))))
    assert err == pytest.approx(injected, abs=0.01)
    assert err > 0.03
    # After the outage both are back to normal.
    after = r.sel(backup, t1 + 300, sc.duration_s)
    assert r.fail()[after].mean() < 0.006
    assert sc.injected_error_rate(primary, t1 + 1) == pytest.approx(0.003)


def test_backup_overload_closed_loop_shares_move_the_load():
    sc = SCENARIOS["backup-overload"]
    primary, backup = "fireworks/llama-70b@paid", "together/llama-70b@paid"
    calls = []

    def router(route, ts_ms):
        calls.append((route, ts_ms))
        t = (ts_ms - START_MS) / 1000
        if route == "chat-70b" and WARMUP_S + 30 <= t < WARMUP_S + 900:
            return {primary: 0.0, backup: 1.0}  # the router opened the primary
        return {primary: 0.5, backup: 0.5}

    per = {primary: 0, backup: 0}
    fails = 0
    for e in sc.events(START_MS, seed=0, shares=router):
        t = (e["ts_ms"] - START_MS) / 1000
        if WARMUP_S + 60 <= t < WARMUP_S + 900 and e["channel"] in per:
            per[e["channel"]] += 1
            fails += e["status"] in FAILURE_STATUSES
        if t > WARMUP_S + 900:
            break
    assert per[primary] == 0
    assert per[backup] / 840 > 12.0  # the whole route (~13.5 req/s) lands on the backup
    assert fails / per[backup] > 0.015  # and it suffers above its 10 req/s capacity
    assert calls[0] == ("chat-70b", START_MS) and calls[1] == ("chat-8b", START_MS)


# --------------------------------------------------------------------------- content hollowing


def test_content_hollowing_all_ok_and_missing_fields_rise():
    sc = SCENARIOS["content-hollowing"]
    r = run("content-hollowing")
    ch = "fireworks/mixtral-8x7b@paid"
    t0 = WARMUP_S
    assert np.all(r.status == 0)
    by_window = {"before": [], "hold": []}
    kinds = {"tool": 0, "json": 0, "gateway": 0}
    for e in r.structured:
        if e["channel"] != ch:
            continue
        t = (e["ts_ms"] - START_MS) / 1000
        if "missing_fields" in e:
            kinds["gateway"] += 1
        elif isinstance(e["expected_fields"][0], dict):
            kinds["tool"] += 1
        else:
            kinds["json"] += 1
        if t < t0:
            by_window["before"].append(realised_missing(e))
        elif t >= t0 + 600:
            by_window["hold"].append(realised_missing(e))
    assert sum(by_window["before"]) == 0
    assert np.mean(by_window["hold"]) == pytest.approx(0.04, abs=0.006)
    assert sc.injected_missing_rate(ch, t0 + 300) == pytest.approx(0.02)
    assert min(kinds.values()) > 5000  # tool calls, JSON objects and gateway-checked answers
    # Normal latency: P95 as injected (healthy P95 x the day/night multiplier only).
    p95_hold = np.quantile(r.latency_ms[r.sel(ch, t0 + 600)], 0.95)
    healthy = float(np.mean(sc.injected_p95_ms(ch, np.arange(t0 + 600, sc.duration_s))))
    assert p95_hold == pytest.approx(healthy, rel=0.03)
    assert healthy == pytest.approx(sc.injected_p95_ms(ch, t0 - 1) * 1.0, rel=0.03)
    sibling = [realised_missing(e) for e in r.structured if e["channel"] == "together/mixtral-8x7b@paid"]
    assert sum(sibling) == 0


# --------------------------------------------------------------------------- sparse consecutive failures


def test_sparse_consecutive_failures_seven_in_a_row_with_quiet_gaps():
    sc = SCENARIOS["sparse-consecutive-failures"]
    r = run("sparse-consecutive-failures")
    ch = "replicate/llama-13b@free"
    t0 = WARMUP_S
    mine = r.sel(ch)
    t = r.t_s[mine]
    failed = r.fail()[mine]
    window = (t >= t0) & (t < t0 + 6 * 75 + 1)
    assert window.sum() == 7 and failed[window].all()
    gaps = np.diff(t[window])
    assert np.all(gaps > 60.0)
    assert gaps.min() == pytest.approx(75.0, abs=0.2)
    # The 7 failures are consecutive requests of the channel.
    first = int(np.flatnonzero(window)[0])
    assert failed[first:first + 7].all() and not failed[first - 1] and not failed[first + 7]
    # Low traffic: ~1 request per 30 s before the fault.
    assert 0.02 < r.sel(ch, 0, t0).sum() / t0 < 0.05
    assert sc.injected_error_rate(ch, t0 + 100) == 1.0
    assert sc.expected[1]["by_s"] == t0 + 451


# --------------------------------------------------------------------------- recovery


def test_recovery_outage_then_fully_healthy():
    sc = SCENARIOS["recovery"]
    r = run("recovery")
    ch = "together/llama-8b@paid"
    t0, t1 = WARMUP_S, WARMUP_S + 240
    assert r.fail()[r.sel(ch, t0 + 1, t1)].all()
    after = r.sel(ch, t1 + 60, sc.duration_s)
    assert sc.duration_s - t1 >= 20 * 60
    assert r.fail()[after].mean() < 0.006
    p95_after = np.quantile(r.latency_ms[after & r.ok()], 0.95)
    p95_before = np.quantile(r.latency_ms[r.sel(ch, t0 - 1800, t0) & r.ok()], 0.95)
    assert p95_after / p95_before == pytest.approx(1.0, abs=0.05)
    states = [e.get("state_sequence") for e in sc.expected if "state_sequence" in e]
    assert states == [["open", "half_open", "recovering", "healthy"]]


# --------------------------------------------------------------------------- clean day


@pytest.mark.slow
def test_clean_day_has_no_faults_and_a_day_night_swing():
    sc = SCENARIOS["clean-day"]
    r = run("clean-day")
    assert sc.faults == () and sc.duration_s == 26 * 3600
    assert len(sc.channels) == 6 and len(sc.routes) == 3
    hour = (sc.start_hour + r.t_s / 3600) % 24
    day = r.t_s >= WARMUP_S
    night_rate = ((hour >= 2) & (hour < 6) & day).sum()
    peak_rate = ((hour >= 14) & (hour < 18) & day).sum()
    assert night_rate / peak_rate == pytest.approx(0.38, abs=0.04)
    # Failures only at the baseline (free 0.2 %, paid 0.3 %), no outage codes.
    for name in sc.channel_names:
        m = r.sel(name)
        rate = r.fail()[m].mean()
        base = sc.channel(name).base_error_rate
        assert rate == pytest.approx(base, abs=0.0007), name
    assert 503 not in set(np.unique(r.http_status).tolist())
    # Latency follows the load by about +-15 %.
    ch = "fireworks/llama-70b@paid"
    ok = r.sel(ch) & r.ok()
    p95_peak = np.quantile(r.latency_ms[ok & (hour >= 15) & (hour < 17)], 0.95)
    p95_night = np.quantile(r.latency_ms[ok & (hour >= 3) & (hour < 5)], 0.95)
    assert p95_peak / p95_night == pytest.approx(1.15 / 0.85, rel=0.04)
    for exp in sc.expected:
        assert exp["never_in"] == ["degraded", "open", "half_open", "recovering"]


# --------------------------------------------------------------------------- real providers


def test_real_providers_replay_the_measured_requests():
    sc = SCENARIOS["real-providers"]
    r = run("real-providers")
    assert len(sc.channels) == 19 and sc.faults == ()
    for c in sc.channels:
        m = r.sel(c.name)
        tr = load_llmperf(c.source)
        assert m.sum() == len(tr), c.name
        assert r.fail()[m].mean() == pytest.approx(tr.failure_share), c.name
    for size in ("7b", "13b", "70b"):
        m = r.sel(f"lepton/{size}")
        assert (r.status[m] == STATUSES.index("rate_limited")).mean() >= 0.8
        assert set(r.http_status[m & (r.status == STATUSES.index("rate_limited"))].tolist()) == {429}
    assert r.fail()[r.sel("groq/70b")].sum() == 0
    assert r.fail()[r.sel("bedrock/13b")].sum() == 97
    groq = r.sel("groq/70b")
    assert np.median(r.latency_ms[groq]) == pytest.approx(805.2, abs=0.1)
    assert r.t_s.max() < sc.duration_s
    # Expected verdicts follow the data: failing files open, clean files never do.
    opens = {e["channel"] for e in sc.expected if e.get("state_in") == ["open"]}
    assert opens == {"bedrock/13b", "bedrock/70b", "lepton/13b", "lepton/70b", "lepton/7b"}
    for e in sc.expected:
        tr = load_llmperf(sc.channel(e["channel"]).source)
        assert (tr.failure_share >= 0.3) if "state_in" in e else (tr.failure_share == 0.0)
    assert sc.injected_error_rate("lepton/70b", 300.0) == 1.0
