"""Suspicion (pipeline/engine/suspects.py): a run of ``suspect_run`` failures moves a channel's route share to
its peers at once, state and weight kept; a success sent after it ends it; stale successes do not."""

from __future__ import annotations

import numpy as np
import pytest

from pipeline.engine.replay import replay
from pipeline.contracts import SUSPECT_METRIC
from pipeline.policy.defaults import PolicyConfig
from pipeline.router.table import route_shares

START = 1_700_000_000_000
WARM_S = 1200  # 20 min of healthy traffic: routes have had rounds, shares are 0.5 / 0.5


def _stream(down: dict[str, list[tuple[float, float]]], channels=("a", "b"), until_s: float = WARM_S + 120,
            ok_ms: float = 2400.0, fail_ms: float = 40.0, every_ms: int = 200) -> list[dict]:
    """Each channel sends a request every ``every_ms``; it fails (HTTP 503 in ``fail_ms``) when sent inside one
    of its ``down`` intervals (scenario seconds), else succeeds in ``ok_ms``. Events in completion order."""
    out = []
    for ch in channels:
        for k in range(int(until_s * 1000 / every_ms)):
            sent = START + k * every_ms
            t = k * every_ms / 1000
            bad = any(a <= t < b for a, b in down.get(ch, []))
            lat = fail_ms if bad else ok_ms
            out.append({"event_id": f"{ch}{k}", "ts_ms": int(sent + lat), "channel": ch, "route": "r",
                        "status": "error" if bad else "ok", "latency_ms": lat, "tier": "paid",
                        **({"http_status": 503, "error_type": "upstream_unavailable"} if bad else {})})
    out.sort(key=lambda e: e["ts_ms"])
    return out


def _of(verdicts, ch):
    return [v for v in verdicts if v.channel == ch and v.ts_ms > START + WARM_S * 1000]


def test_a_hard_fault_moves_the_share_at_its_third_failure_in_a_row():
    """From WARM_S, channel a answers 503 in 40 ms; its requests sent before (every 200 ms) still complete OK
    for 2.2 s, one between each two failures, so no run forms until they have drained (the last one, sent at
    WARM_S - 0.2 s, completes at WARM_S + 2.2 s). Then: failures done at +2.24, +2.44, +2.64 make it suspect
    (a healthy verdict at its weight, route_share 0), two more at +2.84 and +3.04 trip it (run of 5), and the
    trip verdict ends the suspicion."""
    _, verdicts = replay(_stream({"a": [(WARM_S, WARM_S + 60)]}))
    first, trip = _of(verdicts, "a")[:2]
    assert (first.ts_ms - START - WARM_S * 1000, first.state, first.metrics["route_share"],
            first.metrics[SUSPECT_METRIC]) == (2640, "healthy", 0.0, 3)
    assert first.weight > 0.9
    assert (trip.ts_ms - START - WARM_S * 1000, trip.state) == (3040, "open")
    assert SUSPECT_METRIC not in trip.metrics
    # a router following the verdicts sends b everything from the suspicion on
    b_last = [v for v in verdicts if v.channel == "b" and v.ts_ms <= first.ts_ms][-1]
    assert route_shares([first, b_last])[0] == {"a": 0.0, "b": 1.0}
    assert not suspects_left(verdicts)


def suspects_left(verdicts) -> list[str]:
    """Channels whose latest verdict is a suspect one."""
    last = {}
    for v in verdicts:
        last[v.channel] = v
    return sorted(c for c, v in last.items() if SUSPECT_METRIC in v.metrics)


def test_stale_successes_do_not_end_it_a_fresh_one_does():
    """Three extra requests to a, sent at WARM_S + 10, 50 and 100 ms, fail in 40 ms: they complete in a row
    (+50, +90, +140 ms) between two of a's regular successes (+0, +200 ms): a is suspect at +140 ms. The
    successes completing from +200 ms to +2.4 s were sent before +100 ms (stale): the suspicion holds. The
    request sent at +200 ms completes at +2.6 s: sent after the third failure, it ends the suspicion (share
    0.5 again). The failure run (completion order) was reset at +200 ms: no trip, no state change."""
    events = _stream({})
    for k, sent in enumerate((10, 50, 100)):
        events.append({"event_id": f"x{k}", "ts_ms": START + WARM_S * 1000 + sent + 40, "channel": "a", "route": "r",
                       "status": "error", "latency_ms": 40.0, "tier": "paid", "http_status": 503})
    events.sort(key=lambda e: e["ts_ms"])
    _, verdicts = replay(events)
    mine = [v for v in _of(verdicts, "a") if v.ts_ms < START + (WARM_S + 5) * 1000]
    assert [(v.ts_ms - START - WARM_S * 1000, v.state, v.metrics["route_share"], SUSPECT_METRIC in v.metrics)
            for v in mine] == [(140, "healthy", 0.0, True), (2600, "healthy", 0.5, False)]
    assert {v.state for v in verdicts} == {"healthy"}


def test_no_suspicion_without_a_peer_in_service():
    """One channel on its route: nothing to move its share to, no suspect verdict (the trip still comes).
    Two channels with b open: same."""
    _, alone = replay(_stream({"a": [(WARM_S, WARM_S + 60)]}, channels=("a",)))
    assert not any(SUSPECT_METRIC in v.metrics for v in alone)
    assert any(v.state == "open" for v in alone)
    _, both = replay(_stream({"b": [(WARM_S - 300, WARM_S + 120)], "a": [(WARM_S, WARM_S + 60)]}))
    assert not any(SUSPECT_METRIC in v.metrics for v in both if v.channel == "a")


def test_a_suspicion_ends_when_the_last_peer_trips():
    """a becomes suspect at +140 ms (three quick failures, as above; its successes take 9 s, so no fresh one
    for 9 s); b has been failing since WARM_S - 8 s and trips once its in-flight successes have drained
    (+1.64 s). a must not stay at share 0 beside an open b (a dark route by inference): its suspicion ends
    at b's trip, with its share published again."""
    events = _stream({"b": [(WARM_S - 8, WARM_S + 60)]}, ok_ms=9000.0)
    for k, sent in enumerate((10, 50, 100)):
        events.append({"event_id": f"x{k}", "ts_ms": START + WARM_S * 1000 + sent + 40, "channel": "a", "route": "r",
                       "status": "error", "latency_ms": 40.0, "tier": "paid", "http_status": 503})
    events.sort(key=lambda e: e["ts_ms"])
    _, verdicts = replay(events)
    a = _of(verdicts, "a")
    assert (a[0].ts_ms - START - WARM_S * 1000, a[0].metrics[SUSPECT_METRIC]) == (140, 3)
    b_trip = next(v for v in _of(verdicts, "b") if v.state == "open")
    assert b_trip.ts_ms - START - WARM_S * 1000 == 1640
    assert (a[1].ts_ms, a[1].state, SUSPECT_METRIC in a[1].metrics) == (b_trip.ts_ms, "healthy", False)
    assert a[1].metrics["route_share"] > 0


def test_off_and_bad_settings():
    _, verdicts = replay(_stream({"a": [(WARM_S, WARM_S + 60)]}), policy=PolicyConfig(suspect_run=0))
    assert not any(SUSPECT_METRIC in v.metrics for v in verdicts)
    for bad in (-1, True, 2.5):
        with pytest.raises(ValueError, match="suspect_run must be an integer >= 0"):
            PolicyConfig(suspect_run=bad)


def _reference(events, k=3):
    """Brute force of the rule on one channel's events (completion order): (start ms, end ms or None) of each
    suspicion; a run of ``k`` in a row starts one unless one holds; the first success sent at or after the
    starting request's send ends it."""
    out, run, since = [], 0, None
    for e in events:
        sent, failed = e["ts_ms"] - e["latency_ms"], e["status"] != "ok"
        if since is not None and not failed and sent >= since:
            out[-1] = (out[-1][0], e["ts_ms"])
            since = None
        run = run + 1 if failed else 0
        if run == k and since is None:
            out.append((e["ts_ms"], None))
            since = sent
    return out


def test_suspicions_match_the_rule_on_noisy_traffic():
    """Channel a fails 8 % of its requests (503 in 40 ms; successes 2.4 s x lognormal(0, 0.3); Poisson sends
    at 5 req/s), b none, for 50 min (2 seeded streams): every suspicion of a begins and ends exactly where the brute force of the rule says. Runs of 3
    in completion order begin at a request with probability q p^3 (Feller, An Introduction to Probability
    Theory and Its Applications, vol. 1, XIII.7): 0.92 x 0.08**3 x 15,000 requests = 7.1 per stream; the 2
    streams hold 14. The engine runs without
    the error-rate signal and with a trip run of 20 so that a stays healthy at 8 % (the rule is the subject)."""
    import tempfile
    from pathlib import Path

    from pipeline.engine import Engine
    from pipeline.policy.defaults import load_policy
    from pipeline.signals import SIGNALS

    with tempfile.TemporaryDirectory() as d:
        (Path(d) / "p.toml").write_text("[tier.paid.consecutive_failures]\nconsecutive_failures = 20\n")
        policy = load_policy(Path(d) / "p.toml")
    total = 0
    for seed in range(2):
        rng = np.random.default_rng(300 + seed)
        events = []
        for ch in ("a", "b"):  # Poisson sends at 5 req/s, successes 2.4 s x lognormal(0, 0.3)
            sent = START + np.cumsum(rng.exponential(200.0, 15_000))
            bad = (rng.random(sent.size) < 0.08) & (ch == "a")
            lat = np.where(bad, 40.0, np.round(2400.0 * rng.lognormal(0.0, 0.3, sent.size)))
            for k, (t, b, x) in enumerate(zip(sent.tolist(), bad.tolist(), lat.tolist())):
                events.append({"event_id": f"{ch}{k}", "ts_ms": int(t + x), "channel": ch, "route": "r",
                               "status": "error" if b else "ok", "latency_ms": x, "tier": "paid",
                               **({"http_status": 503} if b else {})})
        events.sort(key=lambda e: e["ts_ms"])
        engine = Engine(policy, signals=tuple(s for s in SIGNALS if s.name != "error_rate"))
        _, verdicts = replay(events, engine=engine)
        mine = [v for v in verdicts if v.channel == "a"]
        assert {v.state for v in mine} == {"healthy"}
        got, start = [], None
        for v in mine:
            if SUSPECT_METRIC in v.metrics and start is None:
                start = v.ts_ms
            elif SUSPECT_METRIC not in v.metrics and start is not None:
                got.append((start, v.ts_ms))
                start = None
        assert got == _reference([e for e in events if e["channel"] == "a"])
        total += len(got)
    assert total == 14


def test_a_suspicion_without_traffic_ends_at_a_round_after_suspect_max_ms():
    """Closed loop: a router following the share sends the suspect nothing, so no fresh success comes. a is
    suspect from +140 ms (three quick failures, as above) and then gets no requests for a minute: its round
    verdict at +10 s (9.86 s after the suspicion began, under ``suspect_max_ms`` = 10 s) is still suspect;
    the one at +40 s ends it with its share published again."""
    events = [e for e in _stream({}) if not (e["channel"] == "a" and WARM_S * 1000 < e["ts_ms"] - START
                                             < (WARM_S + 60) * 1000)]
    for k, sent in enumerate((10, 50, 100)):
        events.append({"event_id": f"x{k}", "ts_ms": START + WARM_S * 1000 + sent + 40, "channel": "a", "route": "r",
                       "status": "error", "latency_ms": 40.0, "tier": "paid", "http_status": 503})
    events.sort(key=lambda e: e["ts_ms"])
    _, verdicts = replay(events)
    mine = [(v.ts_ms - START - WARM_S * 1000, SUSPECT_METRIC in v.metrics, v.metrics["route_share"])
            for v in _of(verdicts, "a") if v.ts_ms < START + (WARM_S + 45) * 1000]
    assert mine == [(140, True, 0.0), (10_000, True, 0.0), (40_000, False, mine[-1][2])]
    assert mine[-1][2] > 0.4


def test_many_suspects_at_once_are_read_like_a_few():
    """Twelve routes of two channels, every 'a' channel with three quick failures at the same time: more than
    8 candidates in a chunk take the sorted path; each is suspect at +140 ms and ends at +2.6 s, as one alone."""
    events = []
    for r in range(12):
        for e in _stream({}):
            e = {**e, "channel": f"{e['channel']}{r}", "route": f"r{r}", "event_id": f"{e['event_id']}-{r}"}
            events.append(e)
        for k, sent in enumerate((10, 50, 100)):
            events.append({"event_id": f"x{k}-{r}", "ts_ms": START + WARM_S * 1000 + sent + 40, "channel": f"a{r}",
                           "route": f"r{r}", "status": "error", "latency_ms": 40.0, "tier": "paid",
                           "http_status": 503})
    events.sort(key=lambda e: e["ts_ms"])
    _, verdicts = replay(events)
    for r in range(12):
        mine = [(v.ts_ms - START - WARM_S * 1000, SUSPECT_METRIC in v.metrics)
                for v in _of(verdicts, f"a{r}") if v.ts_ms < START + (WARM_S + 5) * 1000]
        assert mine == [(140, True), (2600, False)], r


def test_a_run_of_timeouts_is_suspect_until_a_success_sent_after_them():
    """Three requests to a, sent at WARM_S + 10, 50 and 100 ms, time out after 30 s: they complete in a row
    at +30.01, +30.05, +30.1 s (between two of a's regular successes): a is suspect at +30.1 s (its
    suspect_max_ms counts from there, not from the send 30 s earlier), and the regular success completing at
    +30.2 s was sent at +27.8 s, after the timeouts were sent: it ends the suspicion at once."""
    events = _stream({}, until_s=WARM_S + 60)
    for k, sent in enumerate((10, 50, 100)):
        events.append({"event_id": f"t{k}", "ts_ms": START + WARM_S * 1000 + sent + 30_000, "channel": "a",
                       "route": "r", "status": "timeout", "latency_ms": 30_000.0, "tier": "paid"})
    events.sort(key=lambda e: e["ts_ms"])
    _, verdicts = replay(events)
    mine = [(v.ts_ms - START - WARM_S * 1000, SUSPECT_METRIC in v.metrics)
            for v in _of(verdicts, "a") if START + (WARM_S + 30) * 1000 < v.ts_ms < START + (WARM_S + 35) * 1000]
    assert mine == [(30_100, True), (30_200, False)]


def test_two_channels_of_a_route_in_one_chunk_are_read_in_arrival_order():
    """Both channels of route r reach a run of 3 in the same chunk: b's third failure completes at +120 ms, a's
    at +140 ms. b, first in time, becomes suspect; a then has no peer in service and stays in the route (a
    dark route by inference is never made). Read by channel row instead (a before b), a would have won, and
    b's suspect verdict (if any) would come after a later one."""
    events = _stream({})
    for ch, sends in (("a", (10, 50, 100)), ("b", (0, 30, 80))):
        for k, sent in enumerate(sends):
            events.append({"event_id": f"{ch}x{k}", "ts_ms": START + WARM_S * 1000 + sent + 40, "channel": ch,
                           "route": "r", "status": "error", "latency_ms": 40.0, "tier": "paid", "http_status": 503})
    events.sort(key=lambda e: e["ts_ms"])
    _, verdicts = replay(events)
    sus = [(v.channel, v.ts_ms - START - WARM_S * 1000) for v in verdicts if SUSPECT_METRIC in v.metrics]
    assert sus == [("b", 120)]


def test_after_its_suspicion_runs_out_a_failing_channel_trips_instead_of_being_suspected_again():
    """Closed loop: a is suspect from +140 ms (three quick failures) and a router following its share sends it
    nothing; at the +40 s round (10 s or more after) the suspicion runs out and its share is back. The fault is
    still on: its requests from +40 s fail in 40 ms. Their run reaches 3 at +40.44 s: a is not suspected again
    (that would starve it of the requests that complete the run, and it would never open); the 5th failure
    trips it at +40.84 s. Before: suspected again at +40.44 s, and open only after further rounds."""
    base = START + WARM_S * 1000
    _, verdicts = replay(starved_then_failing())
    mine = [(v.ts_ms - base, v.state, SUSPECT_METRIC in v.metrics) for v in _of(verdicts, "a") if v.ts_ms < base + 45_000]
    assert mine == [(140, "healthy", True), (10_000, "healthy", True), (40_000, "healthy", False),
                    (40_840, "open", False)]


def starved_then_failing() -> list[dict]:
    """The stream of the test above: a suspect at +140 ms, no requests sent to it for 40 s, then failing."""
    base = START + WARM_S * 1000
    events = [e for e in _stream({"a": [(WARM_S + 40, WARM_S + 120)]}, until_s=WARM_S + 60)
              if not (e["channel"] == "a" and base < e["ts_ms"] - e["latency_ms"] < base + 40_000)]
    for k, sent in enumerate((10, 50, 100)):
        events.append({"event_id": f"x{k}", "ts_ms": base + sent + 40, "channel": "a", "route": "r",
                       "status": "error", "latency_ms": 40.0, "tier": "paid", "http_status": 503})
    return sorted(events, key=lambda e: e["ts_ms"])


def with_quick_failures(events: list[dict], channel: str, at_ms: int, http: int = 503) -> list[dict]:
    """``events`` plus three requests to ``channel`` sent at ``at_ms`` + 10, 50 and 100 ms that fail with HTTP
    ``http`` in 40 ms (a run of 3 in completion order, between two of a channel's regular successes), sorted."""
    extra = [{"event_id": f"x{k}", "ts_ms": at_ms + sent + 40, "channel": channel, "route": "r", "status": "error",
              "latency_ms": 40.0, "tier": "paid", "http_status": http} for k, sent in enumerate((10, 50, 100))]
    return sorted(events + extra, key=lambda e: e["ts_ms"])


def router_shares_until(verdicts, until_ms: int) -> dict[str, float]:
    """Route r's shares in a router table fed every verdict up to event time ``until_ms``."""
    from pipeline.router.table import HealthTable

    table = HealthTable()
    for v in verdicts:
        if v.ts_ms <= until_ms:
            table.update(v)
    return table.weights("r").shares
