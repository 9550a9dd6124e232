"""SPEC §4.2 route protection (issue #33 part 1): the panic floor, the probe cap, hard faults and
``route_down``, on hand-built weights and on an engine whose channels' states are set by hand.

Right values follow from the rules in :mod:`pipeline.policy.routes` (threshold 0.5 of the route's
normal weight, floor 0.5, a channel counting whole from weight 1 - max_penalty = 0.7)."""

from __future__ import annotations

import numpy as np
import pytest

from pipeline.contracts import RequestEvent
from pipeline.engine import Engine
from pipeline.ingest.structure import resolve_onto
from pipeline.policy.defaults import PolicyConfig, load_policy
from pipeline.policy.routes import (HARD_FAULT_REASONS, ROUTE_DOWN, ROUTE_PANIC, has_hard_fault, panic_floor,
                                    probe_capped)
from pipeline.policy.state_machine import HALF_OPEN, OPEN

HOUR = 3_600_000
T0 = 1_750_000_000_000 - 1_750_000_000_000 % HOUR


def pf(w, ratio, eligible=None, probing=None, threshold=0.5, floor=0.5):
    k = len(w)
    return panic_floor(np.array(w, float), np.array(ratio, float),
                       np.ones(k, bool) if eligible is None else np.array(eligible),
                       np.zeros(k, bool) if probing is None else np.array(probing), threshold, floor, 0.7)


def test_hard_fault_predicate_reads_the_reason_codes():
    assert HARD_FAULT_REASONS == {"credential_invalid", "quota_exhausted"}
    assert has_hard_fault(["consecutive_failures", "credential_invalid"])
    assert has_hard_fault(("quota_exhausted",))
    assert not has_hard_fault(["error_rate", "consecutive_failures", "quota"])  # quota: the soft forecast
    assert not has_hard_fault([])


def test_a_dark_route_keeps_its_least_bad_channel():
    w, p = pf([0.0, 0.0], [0.95, 0.03])
    assert w.tolist() == [0.0, 0.5] and p.tolist() == [False, True]
    # every channel failing most requests: still the least bad one (never dark by inference)
    w, p = pf([0.0, 0.0, 0.0], [0.9, 0.8, 0.99])
    assert w.tolist() == [0.0, 0.5, 0.0]


def test_no_panic_while_half_the_route_is_in_service():
    # one healthy channel of two, even with a penalty (0.72 >= 0.7 counts whole)
    assert not pf([0.72, 0.0], [0.0, 0.02])[1].any()
    # two degraded channels at their floor 0.5: 2 x 0.5 / 0.7 = 1.43 >= 1; beside a third, open one
    # 1.43 < 1.5: the open one (failing 2 %) is raised
    assert not pf([0.5, 0.5], [0.0, 0.0])[1].any()
    assert pf([0.5, 0.5, 0.0], [0.0, 0.0, 0.02])[1].tolist() == [False, False, True]


def test_a_partial_panic_raises_only_channels_that_mostly_work():
    # degraded (0.5 -> 0.71 of 1 needed): the open channel failing 3 % is raised, one failing 60 % is not
    assert pf([0.5, 0.0], [0.01, 0.03])[0].tolist() == [0.5, 0.5]
    assert pf([0.5, 0.0], [0.01, 0.6])[0].tolist() == [0.5, 0.0]
    # raised least bad first, until the threshold: 3 channels need 1.5; one raise (0.71 + 0.71) is short
    w, p = pf([0.5, 0.0, 0.0, 0.0], [0.0, 0.2, 0.1, 0.3])
    assert w.tolist() == [0.5, 0.5, 0.5, 0.0] and p.tolist() == [False, True, True, False]


def test_hard_faults_and_the_threshold_0_are_never_raised():
    assert pf([0.0, 0.0], [0.0, 0.01], eligible=[False, False])[1].tolist() == [False, False]
    assert pf([0.0, 0.0], [0.9, 0.01], eligible=[True, False])[0].tolist() == [0.5, 0.0]
    assert pf([0.0, 0.0], [0.0, 0.0], threshold=0.0)[1].tolist() == [False, False]


def test_a_probing_channel_does_not_count_as_in_service_and_is_kept_only_if_it_works():
    # half_open (0.05) beside an open channel failing 100 %: the route is dark but for the probe;
    # the probing channel, working, is the one kept
    w, p = pf([0.0, 0.05], [1.0, 0.02], probing=[False, True])
    assert w.tolist() == [0.0, 0.5] and p.tolist() == [False, True]
    # a working non-probing channel goes first
    w, p = pf([0.0, 0.05], [0.02, 0.02], probing=[False, True])
    assert p.tolist() == [True, True]  # 0.71 < 1: the probe is raised too
    w, p = pf([0.0, 0.05], [0.02, 0.9], probing=[False, True])
    assert p.tolist() == [True, False]


def test_half_open_gets_its_probe_share_never_the_whole_route():
    # the old rule: weights [0.05, 0.5] normalised give the half_open channel 0.09; [0.05, 0] gave it 1.0;
    # the cap counts the other channel at least at 0.7: 0.05 / 0.75
    s = probe_capped(np.array([0.0909, 0.9091]), np.array([0.05, 0.5]), np.array([True, False]), 0.7)
    assert s.tolist() == pytest.approx([0.05 / 0.75, 1 - 0.05 / 0.75])
    # beside a healthy channel at 0.97 the normalised share is the probe share: unchanged
    s = probe_capped(np.array([0.05 / 1.02, 0.97 / 1.02]), np.array([0.05, 0.97]), np.array([True, False]), 0.7)
    assert s.tolist() == [0.05 / 1.02, 0.97 / 1.02]
    # three channels: the cap is 0.05 / 2.05, the excess split by the others' shares
    s = probe_capped(np.array([0.2, 0.4, 0.4]), np.array([0.05, 1.0, 1.0]), np.array([True, False, False]), 0.7)
    assert s.tolist() == pytest.approx([0.05 / 2.05, 0.5 - 0.025 / 2.05, 0.5 - 0.025 / 2.05])
    # nobody else has weight: the shares stay (the traffic has to go somewhere)
    assert probe_capped(np.array([1.0, 0.0]), np.array([0.05, 0.0]), np.array([True, False]), 0.7).tolist() == [1.0, 0.0]


# --- the engine: states set by hand on a registered route --------------------------------------------

def _engine(policy: PolicyConfig | None = None) -> Engine:
    eng = Engine(policy)
    events = [RequestEvent(event_id=f"{ch}{k}", ts_ms=T0 + k * 1000, channel=ch, route="r", status="ok",
                           latency_ms=100.0, tier="paid") for k in range(20) for ch in ("x", "y")]
    resolve_onto(events)
    eng.process(events, low_watermark_ms=0, fields=eng.read_fields(events))
    return eng


def _set(eng: Engine, name: str, state: str, weight: float, reasons: list[str], since_ms: int) -> None:
    m = eng.machines[eng.channel_rows[name]]
    m.state, m.weight, m.reasons, m.entered_ms, m.last_step_ms = state, weight, reasons, since_ms, since_ms


def test_both_channels_open_the_least_bad_is_kept_with_route_panic():
    eng = _engine()
    now = T0 + 60_000
    _set(eng, "x", OPEN, 0.0, ["consecutive_failures"], now)
    _set(eng, "y", OPEN, 0.0, ["error_rate"], now)
    x, y = eng.channel_rows["x"], eng.channel_rows["y"]
    eng.routes.note_outcomes(np.array([x, y]), np.array([100.0, 100.0]), np.array([100.0, 3.0]))
    shares = eng.routes.after_round(np.array([x, y]), now)
    assert eng.routes.panic_weight == {y: 0.5}
    assert shares == {x: 0.0, y: 1.0}
    assert "r" not in eng.routes.down_routes
    # the published verdicts after a round whose last minute has x failing and y answering:
    # y at the floor with route_panic, x at 0
    events = [RequestEvent(event_id=f"{ch}n{k}", ts_ms=now + k * 1000, channel=ch, route="r",
                           status="error" if ch == "x" else "ok", latency_ms=100.0, tier="paid")
              for k in range(25) for ch in ("x", "y")]
    resolve_onto(events)
    eng.process(events, low_watermark_ms=0, fields=eng.read_fields(events))
    vs = {v.channel: v for v in eng.evaluate(now + 30_000)}
    assert (vs["y"].state, vs["y"].weight, vs["y"].reasons[-1]) == ("open", 0.5, ROUTE_PANIC)
    assert vs["y"].metrics["route_share"] == 1.0
    assert vs["x"].weight == 0.0 and ROUTE_PANIC not in vs["x"].reasons


def test_every_channel_with_a_hard_fault_is_route_down_and_nothing_is_kept():
    eng = _engine()
    now = T0 + 60_000
    _set(eng, "x", OPEN, 0.0, ["credential_invalid"], now)
    _set(eng, "y", OPEN, 0.0, ["quota_exhausted"], now)
    vs = {v.channel: v for v in eng.evaluate(now + 30_000)}
    assert eng.routes.down_routes == {"r"} and eng.routes.panic_weight == {}
    for v in vs.values():
        assert v.weight == 0.0 and v.reasons[-1] == ROUTE_DOWN and ROUTE_PANIC not in v.reasons
    # one channel without a hard fault: not route_down, and that one is kept
    _set(eng, "y", OPEN, 0.0, ["error_rate"], now)
    vs = {v.channel: v for v in eng.evaluate(now + 60_000)}
    assert eng.routes.down_routes == set()
    assert vs["y"].weight == 0.5 and vs["y"].reasons[-1] == ROUTE_PANIC and vs["x"].weight == 0.0


def test_a_half_open_channel_beside_a_healthy_one_gets_its_probe_share():
    eng = _engine()
    now = T0 + 60_000
    _set(eng, "x", HALF_OPEN, 0.05, ["consecutive_failures"], now)
    x, y = eng.channel_rows["x"], eng.channel_rows["y"]
    shares = eng.routes.after_round(np.array([x, y]), now)
    assert shares[x] == pytest.approx(0.05 / 1.05) and shares[y] == pytest.approx(1 - 0.05 / 1.05)
    assert eng.routes.panic_weight == {}


def test_the_panic_threshold_is_per_route_and_validated(tmp_path):
    p = tmp_path / "policy.toml"
    p.write_text('[policy]\nroute_panic_weight = 0.3\n[route."r"]\npanic_threshold = 0.0\n')
    pol = load_policy(p)
    assert pol.panic_threshold("r") == 0.0 and pol.panic_threshold("other") == 0.5
    assert pol.route_panic_weight == 0.3
    eng = _engine(pol)
    now = T0 + 60_000
    _set(eng, "x", OPEN, 0.0, ["consecutive_failures"], now)
    _set(eng, "y", OPEN, 0.0, ["error_rate"], now)
    x, y = eng.channel_rows["x"], eng.channel_rows["y"]
    assert eng.routes.after_round(np.array([x, y]), now) == {x: 0.0, y: 0.0}  # off on this route
    for text, message in [('[route."r"]\npanic_threshold = 1.5\n', 'panic_threshold must be a number in [0, 1]'),
                          ('[route."r"]\npanic_threshold = "half"\n', "must be a number in [0, 1]"),
                          ('[route."r"]\npanic = 0.5\n', "unknown keys ['panic']"),
                          ('[policy]\nroute_panic_weight = 0.0\n', "route_panic_weight must be a number in (0, 1]")]:
        p.write_text(text)
        with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("(", r"\(").replace("]", r"\]")):
            load_policy(p)



@pytest.mark.parametrize("status,http,x_reason", [("rate_limited", 429, "consecutive_failures"),
                                                  ("rate_limited", 429, "credential_invalid"),
                                                  ("error", 401, "consecutive_failures")])
def test_an_error_class_trip_of_the_routes_last_channel_keeps_the_floor_unless_hard(status, http, x_reason):
    """SPEC §4.2 on the error-class trip path (SPEC §4.1): x is open; three 429s on y within 10 s open y
    with ``rate_limited`` (no hard fault: kept at the floor with ``route_panic`` at the event); a 401
    opens y with ``credential_invalid`` (a hard fault: weight 0). At the next round the floor keeps the
    least bad channel without a hard fault: x when it has none (it answered its last requests, y failed
    its last 3 of 3), else the rate-limited y. Before the shared trip helper the 429 trip was published
    at weight 0 (backup-overload blacked its route out)."""
    eng = _engine()
    now = T0 + 60_000
    _set(eng, "x", OPEN, 0.0, [x_reason], now)
    events = [RequestEvent(event_id=f"y429-{k}", ts_ms=now + k * 1000, channel="y", route="r", status=status,
                           http_status=http, latency_ms=30.0, tier="paid") for k in range(3)]
    resolve_onto(events)
    trip = [v for v in eng.process(events, low_watermark_ms=0, fields=eng.read_fields(events)).verdicts
            if v.channel == "y" and v.state == OPEN]
    assert len(trip) == 1
    hard = status == "error"
    reason = "credential_invalid" if hard else "rate_limited"
    assert trip[0].reasons[0] == reason
    if hard:
        assert trip[0].weight == 0.0 and ROUTE_PANIC not in trip[0].reasons
    else:
        assert (trip[0].weight, trip[0].reasons[-1]) == (0.5, ROUTE_PANIC)
    vs = {v.channel: v for v in eng.evaluate(now + 30_000)}
    assert vs["y"].state == OPEN and vs["y"].reasons[0] == reason
    kept = "y" if x_reason == "credential_invalid" else "x"
    assert (vs[kept].weight, vs[kept].reasons[-1]) == (0.5, ROUTE_PANIC)
    other = "x" if kept == "y" else "y"
    assert vs[other].weight == 0.0 and ROUTE_PANIC not in vs[other].reasons
