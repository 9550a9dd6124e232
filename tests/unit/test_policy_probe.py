"""Issue #18 item 4: the half-open probe fits noisy channels (pipeline.policy.probe + engine).

Unit checks of the probe test and the baseline it learns, then seeded
streams through the :class:`~pipeline.engine.Engine`: a channel that
normally fails 0.5 % recovers after a 30 s outage, one that keeps failing
at 5 % never leaves the open/half-open cycle.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from pipeline.contracts import RequestEvent
from pipeline.stats import z_for
from pipeline.engine import Engine
from pipeline.policy.defaults import PAID_TIER, PolicyConfig
from pipeline.policy.probe import baseline_upper, learn_baseline, probe_passes
from pipeline.policy.state_machine import HALF_OPEN, HEALTHY, OPEN, RECOVERING, ChannelMachine

Z = z_for(0.99)
CFG = PolicyConfig()
H = 3_600_000
T0 = 1_750_032_000_000 // H * H


# --- the test itself -------------------------------------------------------------------------

def test_baseline_upper_is_the_wilson_upper_bound_and_nan_without_enough_requests():
    # scipy.stats.binomtest(36, 7200).proportion_ci(0.98, method="wilson").high
    assert baseline_upper(7200.0, 36.0, Z, 500) == pytest.approx(0.0073403, abs=1e-7)
    assert math.isnan(baseline_upper(499.0, 2.0, Z, 500))
    assert math.isnan(baseline_upper(0.0, 0.0, Z, 1))


@pytest.mark.parametrize("failures,requests,upper,expect", [
    (1, 450, math.nan, True),      # 0.22 % < 0.3 %: the fixed line, no baseline needed
    (2, 450, math.nan, False),     # 0.44 %: no baseline, fixed line fails
    (2, 450, 0.0073, True),        # consistent with a 0.5 % baseline
    (4, 450, 0.0073, True),        # 0.9 %: lower bound 0.33 % <= 0.73 %
    (9, 450, 0.0073, False),       # 2 %: lower bound 0.98 % > 0.73 %
    (22, 450, 0.0073, False),      # 5 %: still failing
    (0, 0, 0.0073, False),         # no probe traffic: no decision to pass
])
def test_probe_passes(failures, requests, upper, expect):
    assert probe_passes(failures, requests, 0.003, upper, Z) is expect


def test_learn_baseline_decays_with_the_time_constant():
    assert learn_baseline(0.0, 0.0, 0, T0, 300.0, 2.0, H) == (300.0, 2.0)
    req, fail = learn_baseline(1000.0, 10.0, T0, T0 + H, 0.0, 0.0, H)
    assert (req, fail) == pytest.approx((1000 / math.e, 10 / math.e))
    with pytest.raises(ValueError, match="tau_ms"):
        learn_baseline(1.0, 0.0, 0, 1, 1.0, 0.0, 0)


def test_probe_confidence_is_checked_when_the_policy_is_built():
    with pytest.raises(ValueError, match="probe_confidence"):
        PolicyConfig(probe_confidence=1.0)


# --- the state machine ------------------------------------------------------------------------

def _half_open_with_baseline(requests: float, failures: float) -> ChannelMachine:
    m = ChannelMachine()
    m.step(T0, [], [], 0, 0, T0, CFG, PAID_TIER)
    m.learn(T0, requests, failures, CFG)
    m.trip(T0 + 1_000, ["consecutive_failures"])
    m.learn(T0 + 30_000, 500.0, 500.0, CFG)  # open: frozen, the outage is not learned
    assert (m.base_requests, m.base_failures) == (requests, failures)
    m.step(T0 + 91_000, [], [], 0, 0, T0 + 91_000, CFG, PAID_TIER)
    assert m.state == HALF_OPEN and m.left_open_ms == T0 + 91_000 == m.judged_since_ms
    return m


def test_noisy_channel_recovers_on_its_own_baseline():
    m = _half_open_with_baseline(7200.0, 36.0)  # 0.5 % before the incident
    assert m.step(T0 + 181_000, [], [], 450, 3, T0 + 181_000, CFG, PAID_TIER) is True
    assert m.state == RECOVERING and m.judged_since_ms == T0 + 91_000


def test_still_failing_channel_stays_open():
    m = _half_open_with_baseline(7200.0, 36.0)
    assert m.step(T0 + 181_000, [], [], 450, 22, T0 + 181_000, CFG, PAID_TIER) is True
    assert (m.state, m.reasons, m.judged_since_ms) == (OPEN, ["error_rate"], None)


def test_without_a_baseline_the_fixed_line_still_decides():
    m = _half_open_with_baseline(0.0, 0.0)
    m.step(T0 + 181_000, [], [], 450, 3, T0 + 181_000, CFG, PAID_TIER)
    assert m.state == OPEN


# --- seeded streams through the engine --------------------------------------------------------

T_OUT = T0 + H + 120_000  # a 30 s outage, 62 min after the start


def _stream(seed: int, rate_after: float, end_ms: int) -> list[RequestEvent]:
    """One paid channel: 1 req/s for the first hour, then 5 req/s; 0.5 % failures before the
    outage, all failing for 30 s from ``T_OUT``, ``rate_after`` failing afterwards."""
    rng = np.random.default_rng(seed)
    ts = np.concatenate([np.sort(rng.integers(T0, T0 + H, H // 1000)),
                         np.sort(rng.integers(T0 + H, end_ms, (end_ms - T0 - H) // 200))])
    p = np.where(ts < T_OUT, 0.005, np.where(ts < T_OUT + 30_000, 1.0, rate_after))
    fail = rng.random(ts.shape[0]) < p
    lat = rng.lognormal(np.log(300.0), 0.3, ts.shape[0])
    return [RequestEvent(event_id=f"{seed}-{k}", ts_ms=t, channel="noisy", route="chat",
                         status="error" if f else "ok", latency_ms=x, tier="paid")
            for k, (t, f, x) in enumerate(zip(ts.tolist(), fail.tolist(), lat.tolist()))]


def _states(seed: int, rate_after: float, end_ms: int) -> list[tuple[int, str]]:
    eng = Engine()
    ev = _stream(seed, rate_after, end_ms)
    out = []
    for k in range(0, len(ev), 500):
        out.extend(eng.process(ev[k:k + 500], fields=eng.read_fields(ev[k:k + 500])).verdicts)
    seq, prev = [], None
    for v in out:
        if v.channel == "noisy" and v.state != prev:
            seq.append((v.ts_ms, v.state))
            prev = v.state
    return seq


@pytest.mark.parametrize("seeds", [pytest.param(6, id="6-seeds"),
                                   pytest.param(20, id="20-seeds", marks=pytest.mark.slow)])
def test_noisy_channel_recovers_after_an_outage_with_at_most_one_retrip(seeds):
    """Issue #18 acceptance: at most one re-trip across 20 seeds (measured: 0; 36 with the fixed
    0.3 % line alone). The default run takes 6 of them (~0.45 s each)."""
    retrips = 0
    for seed in range(seeds):
        seq = _states(seed, 0.005, T_OUT + 17 * 60_000)
        opens = [t for t, s in seq if s == OPEN]
        assert opens and opens[0] >= T_OUT and all(t >= T_OUT for t, s in seq if s != HEALTHY), (seed, seq)
        retrips += len(opens) - 1
        assert seq[-1][1] == HEALTHY, (seed, seq)
    assert retrips <= 1


@pytest.mark.parametrize("seed", range(3))
def test_channel_still_failing_at_5_percent_never_recovers(seed):
    seq = _states(seed, 0.05, T_OUT + 12 * 60_000)
    after = [s for t, s in seq if t >= T_OUT]
    assert after[0] == OPEN and HALF_OPEN in after, (seed, seq)
    assert set(after) <= {OPEN, HALF_OPEN}, (seed, seq)
