"""Capacity, not breakage (SPEC §4.2, issue #33 part 2): :mod:`pipeline.policy.capacity`.

Guarantees checked over seeded binomial streams (200 seeds each). The attribution test is the
Clopper-Pearson bound (Clopper & Pearson 1934) at one-sided alpha = 0.01: a channel that truly fails
half its requests has its upper bound under ``BREAKAGE_RATE`` = 0.25 with probability <= 0.01 per
round (at n = 800 it is < 1e-100), and an overload failing 3 % reaches it with probability < 1e-60;
so 0 of 200 seeds may go the wrong way in either case (exact: 1.3e-62 and 1.5e-91 at n = 800). A
capped channel that truly fails at its usual rate (0.5 %) at its cap is judged "failing more" (lower
bound above the line, about 1 %) with probability <= 0.01 (exact at n = 800, line 1 %: 4.5e-6, >= 16 failures); one that
truly fails 5 % at its cap passes as fine with probability 3.6e-6 at n = 800 (<= 15 failures).
"""

from __future__ import annotations

import numpy as np
import pytest

from pipeline.policy.capacity import (
    BREAKAGE_RATE, INCREASE, LOAD_ROUNDS, RELAX_HALF_LIFE_ROUNDS, USUAL_ALPHA, CapacityModel, cap_shares,
)

SEEDS = range(200)


def _learned(usual_share: float = 0.5, usual_rate: float = 0.005, rng: np.random.Generator | None = None,
             rounds: int = 60) -> CapacityModel:
    """A model that saw channel 0 healthy at ``usual_share`` for ``rounds`` rounds (800 requests a minute)."""
    m = CapacityModel()
    rng = rng or np.random.default_rng(0)
    for _ in range(rounds):
        m.note_share(0, usual_share)
        m.learn(0, True, True, 800.0, float(rng.binomial(800, usual_rate)))
    return m


def test_usual_share_and_rate_are_learned_from_healthy_rounds_only():
    m = _learned()
    assert m.usual[0] == pytest.approx(0.5)
    m.note_share(0, 1.0)
    m.learn(0, True, False)   # degraded: no news on the usual share
    m.learn(0, False, True)   # a failure detector fired: no news either
    assert m.usual[0] == pytest.approx(0.5)
    n, f = m.usual_counts[0]
    assert f / n == pytest.approx(0.005, abs=0.002)


@pytest.mark.parametrize("seed", SEEDS)
def test_overload_after_a_share_rise_is_capped_and_breakage_still_opens(seed):
    rng = np.random.default_rng(seed)
    over = _learned(rng=rng)
    broken = _learned(rng=rng)
    for m in (over, broken):
        for _ in range(3):
            m.note_share(0, 1.0)  # the primary failed: the backup took the whole route
    # overload: ~3 % failures at the doubled share -> a cap at the usual share, not open
    assert over.overloaded(0, 800.0, float(rng.binomial(800, 0.03)), 1_000) == pytest.approx(0.5)
    assert over.max_share[0] == pytest.approx(0.5) and over.judged_since_ms[0] == 1_000
    # breakage: half its requests fail -> the trip stands
    assert broken.overloaded(0, 800.0, float(rng.binomial(800, 0.5)), 1_000) is None
    assert 0 not in broken.max_share


@pytest.mark.parametrize("seed", SEEDS[:50])
def test_failures_without_a_share_rise_are_never_attributed_to_load(seed):
    rng = np.random.default_rng(seed)
    m = _learned(rng=rng)
    for share in (0.5, 0.55, 0.6, 0.64):  # < 1.4 x 0.5 and < 0.5 + 0.15: no rise
        m.note_share(0, share)
        assert m.overloaded(0, 800.0, float(rng.binomial(800, 0.03))) is None
    assert BREAKAGE_RATE == 0.25


def test_a_share_just_taken_enters_the_usual_share_only_once_the_detector_window_has_seen_it():
    """The usual share learns the smallest share held over the last LOAD_ROUNDS rounds (the error-rate
    detector's 5 min window): 3 clean rounds at 1.0 right after a peer opened leave it at 0.5 (on the code
    before: 0.5 + 0.5 x (1 - 0.95**3) = 0.571, the backup-overload backup's cap on seed 1, over its capacity);
    held for the whole window, 1.0 is its usual share from then on (EWMA, alpha USUAL_ALPHA)."""
    m = _learned(usual_share=0.5)
    for _ in range(3):
        m.note_share(0, 1.0)
        m.learn(0, True, True)
    assert m.usual[0] == pytest.approx(0.5)
    for _ in range(LOAD_ROUNDS - 3):
        m.note_share(0, 1.0)
        m.learn(0, True, True)
    assert m.usual[0] == pytest.approx(0.5 + USUAL_ALPHA * 0.5)  # the 10th round: all 10 held at 1.0
    m.note_share(0, 0.3)  # a share that fell is judged at once (the smallest)
    m.learn(0, True, True)
    assert m.usual[0] == pytest.approx(0.525 + USUAL_ALPHA * (0.3 - 0.525))


@pytest.mark.parametrize("seed", SEEDS)
def test_a_capped_channel_keeps_its_cap_at_its_usual_rate_and_opens_when_failing_more(seed):
    rng = np.random.default_rng(seed)
    m = _learned(rng=np.random.default_rng(1000 + seed))
    for _ in range(3):
        m.note_share(0, 1.0)
    assert m.overloaded(0, 800.0, 24.0) is not None
    for _ in range(LOAD_ROUNDS):  # back at its cap long enough: the rise left the window
        m.note_share(0, 0.5)
    fine = m.overloaded(0, 800.0, float(rng.binomial(800, 0.005)))
    broken = m.overloaded(0, 800.0, float(rng.binomial(800, 0.05)))
    assert (fine, broken) == (pytest.approx(0.5), None)


def test_cap_grows_at_its_cap_relaxes_under_it_and_not_while_over_it():
    m = _learned()
    for _ in range(3):
        m.note_share(0, 1.0)
    m.overloaded(0, 800.0, 24.0)
    m.note_share(0, 1.0)
    m.learn(0, True, False)              # carried the whole route: no news on the cap
    assert m.max_share[0] == pytest.approx(0.5)
    m.note_share(0, 0.5)
    m.learn(0, True, False)              # clean at its cap: + INCREASE
    assert m.max_share[0] == pytest.approx(0.5 + INCREASE)
    m.note_share(0, 0.3)
    m.learn(0, True, False)              # degraded under its cap: stays
    assert m.max_share[0] == pytest.approx(0.5 + INCREASE)
    for _ in range(RELAX_HALF_LIFE_ROUNDS):
        m.note_share(0, 0.3)
        m.learn(0, True, True)           # healthy under its cap: the gap to 1 halves in 20 rounds
    assert m.max_share[0] == pytest.approx(1 - (0.5 - INCREASE) / 2)
    for _ in range(200):
        m.note_share(0, 0.3)
        m.learn(0, True, True)
    assert 0 not in m.max_share and 0 not in m.judged_since_ms


def test_repeat_overload_decreases_the_cap_multiplicatively_never_under_the_usual_share():
    m = _learned(usual_share=0.3)
    for _ in range(3):
        m.note_share(0, 0.9)
    assert m.overloaded(0, 800.0, 24.0) == pytest.approx(0.3)
    m.max_share[0] = 0.9  # relaxed meanwhile
    assert m.overloaded(0, 800.0, 24.0) == pytest.approx(0.8 * 0.9)


def test_cap_shares_moves_the_excess_to_receivers_within_their_caps():
    s = cap_shares(np.array([0.9, 0.05, 0.05]), np.array([0.5, 1.0, 0.52]), np.array([False, True, True]))
    # excess 0.4 over rooms 0.95 and 0.47 (total 1.42), in proportion
    assert s.tolist() == pytest.approx([0.5, 0.05 + 0.95 * 0.4 / 1.42, 0.05 + 0.47 * 0.4 / 1.42])
    # nobody may take it: the traffic has to go somewhere
    assert cap_shares(np.array([1.0, 0.0]), np.array([0.5, 1.0]), np.array([False, False])).tolist() == [1.0, 0.0]


def test_over_capacity_is_kept_while_the_channel_carries_more_than_its_cap():
    """While nobody can take its excess (the primary is out) the capped backup stays over_capacity even on
    a round its restarted detectors are quiet; at or under its cap it is not (seed-free: pure bookkeeping)."""
    m = _learned()
    for _ in range(3):
        m.note_share(0, 1.0)
    m.overloaded(0, 800.0, 24.0)
    assert m.over_cap(0)
    m.note_share(0, 0.5)
    assert not m.over_cap(0) and not m.over_cap(1)


def test_a_capped_channel_holds_its_cap_while_a_peer_comes_back():
    # SPEC §4.2 (issue #33 goodput): clean at its cap, a capped channel's cap grows +0.05 per round
    # (additive increase), except while another channel of its route is half_open / recovering and takes
    # the excess: then it holds (on backup-overload the cap grew 0.55 -> 0.75 in 4 rounds of the primary's
    # ramp and the backup went over its real capacity: ~10 requests lost per seed). On the code before
    # ``learn`` had no ``peer_returning`` and the cap grew.
    from pipeline.policy.capacity import INCREASE, CapacityModel

    m = CapacityModel()
    for _ in range(20):
        m.note_share(0, 0.5)
        m.learn(0, True, True)
    for _ in range(3):
        m.note_share(0, 1.0)
    assert m.overloaded(0, 800.0, 20.0) == 0.5
    m.note_share(0, 0.5)
    m.learn(0, True, False, peer_returning=True)
    assert m.max_share[0] == 0.5
    m.learn(0, True, False)
    assert m.max_share[0] == pytest.approx(0.5 + INCREASE)
