"""pipeline.policy.state_machine.ChannelMachine: every transition, exact timings and weights."""

from __future__ import annotations

import pytest

from pipeline.policy.defaults import PAID_TIER, PolicyConfig
from pipeline.policy.state_machine import (DEGRADED, HALF_OPEN, HEALTHY, NO_DATA, OPEN, RECOVERING,
                                           ChannelMachine)

CFG = PolicyConfig()
TH = PAID_TIER
T = 1_750_000_000_000


def step(m: ChannelMachine, now, hard=(), soft=(), probe=(0.0, 0.0), last=None):
    return m.step(now, list(hard), list(soft), probe[0], probe[1], now if last is None else last, CFG, TH)


def healthy(now=T) -> ChannelMachine:
    m = ChannelMachine()
    assert step(m, now) is True
    return m


def test_defaults():
    assert CFG.open_cooldown_ms == 90_000 and CFG.half_open_observe_ms == 90_000
    assert CFG.half_open_weight == 0.05 and CFG.ramp_interval_ms == 120_000
    assert CFG.max_weight_cut_per_round == 0.15 and CFG.degraded_floor_weight == 0.5
    assert CFG.no_data_after_ms == 300_000 and TH.half_open_max_error_rate == 0.003


def test_no_data_to_healthy_on_events():
    m = ChannelMachine()
    assert m.state == NO_DATA
    assert step(m, T, last=None) is True  # last=None -> now: an event just arrived
    assert (m.state, m.weight, m.reasons, m.entered_ms) == (HEALTHY, 1.0, [], T)
    assert step(m, T + 30_000) is False


def test_no_data_stays_without_events():
    m = ChannelMachine()
    assert m.step(T, [], [], 0, 0, None, CFG, TH) is False
    assert m.state == NO_DATA and m.reasons == ["no_data"]
    assert m.step(T + 30_000, [], [], 0, 0, T - 300_000, CFG, TH) is False
    assert m.state == NO_DATA


def test_healthy_to_degraded_weight_steps_to_floor():
    m = healthy()
    weights, states, changed = [], [], []
    for k in range(1, 7):
        changed.append(step(m, T + k * 30_000, soft=["latency_p95_ratio"]))
        weights.append(m.weight)
        states.append(m.state)
    assert weights == [0.85, 0.70, 0.55, 0.5, 0.5, 0.5]
    assert states == [DEGRADED] * 6
    assert changed == [True, False, False, False, False, False]
    assert m.reasons == ["latency_p95_ratio"] and m.entered_ms == T + 30_000


def test_weight_cut_at_most_015_per_round():
    m = healthy()
    prev = m.weight
    for k in range(1, 10):
        step(m, T + k * 30_000, soft=["missing_fields", "latency_p95_ratio"])
        assert prev - m.weight <= 0.15 + 1e-9
        assert m.weight >= 0.5
        prev = m.weight


def test_degraded_to_healthy_when_soft_clears():
    m = healthy()
    for k in range(1, 5):
        step(m, T + k * 30_000, soft=["missing_fields"])
    assert m.weight == 0.5
    weights, states = [], []
    for k in range(5, 10):
        step(m, T + k * 30_000)
        weights.append(m.weight)
        states.append(m.state)
    assert weights == [0.65, 0.8, 0.95, 1.0, 1.0]
    assert states == [DEGRADED, DEGRADED, DEGRADED, HEALTHY, HEALTHY]
    assert m.reasons == [] and m.entered_ms == T + 8 * 30_000


def test_degraded_partial_then_soft_again():
    m = healthy()
    step(m, T + 30_000, soft=["latency_p95_ratio"])  # 0.85
    step(m, T + 60_000, soft=["latency_p95_ratio"])  # 0.70
    step(m, T + 90_000)  # 0.85
    assert (m.state, m.weight) == (DEGRADED, 0.85)
    step(m, T + 120_000, soft=["missing_fields"])
    assert (m.state, m.weight, m.reasons) == (DEGRADED, 0.7, ["missing_fields"])


@pytest.mark.parametrize("start", [NO_DATA, HEALTHY, DEGRADED, HALF_OPEN, RECOVERING])
@pytest.mark.parametrize("reason", ["error_rate", "consecutive_failures"])
def test_any_to_open_on_hard(start, reason):
    m = ChannelMachine(state=start, weight=0.6, entered_ms=T - 1_000, last_step_ms=T - 1_000)
    assert step(m, T, hard=[reason], soft=["latency_p95_ratio"]) is True
    assert (m.state, m.weight, m.entered_ms, m.reasons) == (OPEN, 0.0, T, [reason])


def test_trip_directly_and_in_open():
    m = healthy()
    assert m.trip(T + 5, ["consecutive_failures"]) is True
    assert (m.state, m.weight, m.entered_ms) == (OPEN, 0.0, T + 5)
    # a second trip while open keeps the first cooldown start, merges reasons
    assert m.trip(T + 60_000, ["error_rate"]) is False
    assert m.entered_ms == T + 5 and m.reasons == ["consecutive_failures", "error_rate"]


def _open(at=T) -> ChannelMachine:
    m = healthy(at - 600_000)
    m.trip(at, ["error_rate"])
    return m


def test_open_cooldown_exact():
    m = _open()
    for dt in (0, 30_000, 60_000, 89_999):
        assert step(m, T + dt) is False
        assert (m.state, m.weight) == (OPEN, 0.0)
    assert step(m, T + 90_000) is True
    assert (m.state, m.weight, m.entered_ms) == (HALF_OPEN, 0.05, T + 90_000)


def _half_open(at=T) -> ChannelMachine:
    m = _open(at - 90_000)
    step(m, at)
    assert m.state == HALF_OPEN and m.entered_ms == at
    return m


def test_half_open_to_recovering_after_observation_with_clean_probe():
    m = _half_open()
    for dt in (30_000, 60_000, 89_999):
        assert step(m, T + dt, probe=(100, 0)) is False
        assert (m.state, m.weight) == (HALF_OPEN, 0.05)
    assert step(m, T + 90_000, probe=(100, 0)) is True
    assert (m.state, m.weight, m.entered_ms, m.reasons) == (RECOVERING, 0.10, T + 90_000, [])


def test_half_open_waits_for_probes():
    m = _half_open()
    assert step(m, T + 90_000, probe=(0, 0)) is False
    assert m.state == HALF_OPEN
    assert step(m, T + 120_000, probe=(40, 0)) is True
    assert m.state == RECOVERING


@pytest.mark.parametrize("req,fail,state", [(1_000, 3, OPEN), (1_000, 10, OPEN), (1_000, 2, RECOVERING),
                                            (10_000, 29, RECOVERING), (10_000, 30, OPEN), (1, 1, OPEN)])
def test_half_open_probe_error_rate_line(req, fail, state):
    m = _half_open()
    assert step(m, T + 90_000, probe=(req, fail)) is True
    assert m.state == state
    if state == OPEN:
        assert (m.weight, m.entered_ms, m.reasons) == (0.0, T + 90_000, ["error_rate"])
        # and a new, backed-off cooldown starts (issue #33 part 3: the second open of the series lasts
        # 180 s lengthened by a jitter of at most 10 %; was a plain 90 s before the backoff)
        cooldown = CFG.backoff("").delay_ms(1, seed=T + 90_000)
        assert 180_000 <= cooldown <= 198_000 and m.cooldown_ms == cooldown and m.reopens == 1
        step(m, T + 90_000 + cooldown - 1)
        assert m.state == OPEN
        step(m, T + 90_000 + cooldown)
        assert m.state == HALF_OPEN


def test_half_open_failure_run_reopens():
    m = _half_open()
    assert step(m, T + 10_000, hard=["consecutive_failures"]) is True
    assert (m.state, m.weight) == (OPEN, 0.0)


def test_recovering_ramp_exact():
    m = _half_open(T - 90_000)
    step(m, T, probe=(500, 0))
    assert (m.state, m.weight, m.entered_ms) == (RECOVERING, 0.1, T)
    seen = {}
    for k in range(1, 26):  # rounds every 30 s for 12.5 min
        now = T + k * 30_000
        step(m, now)
        seen[now - T] = (m.state, m.weight)
    expect = {120_000: 0.2, 240_000: 0.3, 360_000: 0.4, 480_000: 0.6, 600_000: 0.8}
    weight = 0.1
    for dt, (state, w) in sorted(seen.items()):
        if dt in expect:
            weight = expect[dt]
        if dt >= 720_000:
            assert (state, w) == (HEALTHY, 1.0), dt
        else:
            assert (state, w) == (RECOVERING, weight), dt
    assert m.entered_ms == T + 720_000 and m.penalty == 0.0


def test_recovering_ramp_paused_by_soft_signal():
    m = _half_open(T - 90_000)
    step(m, T, probe=(500, 0))
    step(m, T + 120_000, soft=["latency_p95_ratio"])
    assert (m.state, m.weight, m.reasons) == (RECOVERING, 0.1, ["latency_p95_ratio"])
    step(m, T + 150_000)
    assert m.weight == 0.2 and m.reasons == []


def test_hard_during_recovering_reopens():
    m = _half_open(T - 90_000)
    step(m, T, probe=(500, 0))
    step(m, T + 120_000)
    step(m, T + 240_000)
    assert m.weight == 0.3
    assert step(m, T + 250_000, hard=["error_rate"]) is True
    assert (m.state, m.weight, m.entered_ms) == (OPEN, 0.0, T + 250_000)


@pytest.mark.parametrize("start", [HEALTHY, DEGRADED])
def test_idle_to_no_data_after_300s(start):
    m = healthy()
    soft = ["missing_fields"] if start == DEGRADED else []
    if start == DEGRADED:
        step(m, T + 1, soft=soft)
    last = T + 1
    assert step(m, last + 299_999, soft=soft, last=last) is False
    assert m.state == start
    w = m.weight
    assert step(m, last + 300_000, soft=soft, last=last) is True
    assert (m.state, m.reasons, m.weight, m.entered_ms) == (NO_DATA, ["no_data"], w, last + 300_000)
    # events again -> healthy
    assert step(m, last + 330_000, last=last + 329_000) is True
    assert m.state == HEALTHY


def test_open_does_not_go_no_data():
    m = _open()
    step(m, T + 60_000, last=T - 10**7)
    assert m.state == OPEN


def test_penalty_decays_with_half_life():
    m = healthy()
    m.add_penalty(0.2, T, CFG)
    step(m, T)
    assert m.weight == 0.8
    step(m, T + CFG.penalty_half_life_ms)
    assert m.penalty == pytest.approx(0.1)
    assert m.weight == 0.9
    m.add_penalty(5.0, T + CFG.penalty_half_life_ms, CFG)
    assert m.penalty == CFG.max_penalty
