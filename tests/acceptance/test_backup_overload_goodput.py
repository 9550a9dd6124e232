"""Issue #33 must-hold on backup-overload, as the scorecard scores it (docs/SCORECARD.md "Goodput"): the route
is never dark, and the requests a router following each policy serves, per phase of the scenario.

Open loop (:func:`pipeline.tools.scorecard.runner.run_seed`, seeds 0 and 1; the router model of
:mod:`pipeline.tools.scorecard.goodput`); requests of route ``chat-70b`` lost against the oracle per phase
(:func:`pipeline.tools.scorecard.timeline.lost_by_bin`). Measured (seed 0 / 1), before -> now:

=================================  ===========  ===========  ===========  ==========  =========
phase (scenario s from the outage)  s10-route    s11          s12 probes   now         Higress
=================================  ===========  ===========  ===========  ==========  =========
onset +0..+60                       25.1 / 18.9  25.1 / 18.9  25.1 / 18.9  6.3 / 12.6  6.3 / 12.6
outage probes +60..+900             4.6 / 4.6    1.9 / 1.9    0 / 0        0 / 0       0 / 0
probe wait +900..+960               49.5 / 49.5  3.3 / 3.5    3.0 / 3.0    3.0 / 3.0   4.6 / 4.6
back +960..+1080                    0 / 0        0 / 0        0 / 0        0 / 0       0 / 0
ramp +1080..end                     ~13 / ~16    0.1 / 0.5    0 / 0        0 / 0       0 / 0
=================================  ===========  ===========  ===========  ==========  =========

s12 (issue #33, docs/ROUTE_PROTECTION.md "Session 12"): the onset is Higress's (a run of 3 failures makes the
primary suspect: its route_share goes to the backup at once, state kept; the trip stays at a run of 5,
pipeline/engine/suspects.py); the outage probes are gone (SPEC §4.2 probe on evidence: the open primary's own
503s answer each probe at its cooldown's end, so it stays open and backs off without a half_open; before,
three probes at +120, +330, +720 s each kept share 0.05 for a 1 s grid step), and the backup's cap is its
usual share 0.5 (the usual share no longer takes the rounds at share 1.0 before its detector's window saw
them: 0.55 / 0.57 before, over its capacity at the route's peaks: the ramp loss).

Goodput (both routes) 98.732 / 98.739 % (s10) -> 98.855 / 98.866 % (s11) -> 98.896 / 98.884 %; Higress
98.893 / 98.881 %, Linkerd 98.850 / 98.847 %, pybreaker 98.842 / 98.841 %: the must-hold (goodput >= every
peer's, blackout 0) holds on both seeds, by about 1.5 requests over Higress.
"""

from __future__ import annotations

import pytest

from pipeline.tools.scorecard.goodput import Truth
from pipeline.tools.scorecard.runner import BASELINES, CHANNEL_HEALTH, run_seed
from pipeline.tools.scorecard.timeline import lost_by_bin
from pipeline.tools.simulate.scenarios import SCENARIOS

ROUTE = "chat-70b"
#: (name, from, to) in seconds after the outage starts; the last runs to the end of the scenario.
PHASES = (("onset", 0, 60), ("outage probes", 60, 900), ("probe wait", 900, 960), ("back", 960, 1080),
          ("ramp", 1080, None))
#: The most each phase may lose (requests of chat-70b against the oracle, both seeds): the measured values
#: of the module text plus a margin of 0.2 (rounding of the expected values).
MOST_LOST = {"onset": 12.9, "outage probes": 0.2, "probe wait": 3.2, "back": 0.2, "ramp": 0.2}


@pytest.fixture(scope="module")
def card():
    sc = SCENARIOS["backup-overload"]
    truth = Truth(sc)
    t0 = sc.warmup_s
    bins = [(t0 + a, t0 + b if b is not None else sc.duration_s) for _, a, b in PHASES]
    out = {}
    for seed in (0, 1):
        shares: dict = {}
        runs = run_seed(sc, seed, truth=truth, shares_out=shares)
        out[seed] = (runs, lost_by_bin(truth, ROUTE, shares, bins))
    return out


@pytest.mark.parametrize("seed", [0, 1])
def test_no_blackout_and_goodput_at_least_every_peer(card, seed):
    """Issue #33 must-hold: route_blackout_s 0 and goodput >= every peer's (Higress, Linkerd, Helicone, ...)."""
    runs, _ = card[seed]
    ours = runs[CHANNEL_HEALTH]
    assert ours.route_blackout_s == 0
    behind = {p: runs[p].goodput for p in BASELINES if runs[p].goodput > ours.goodput}
    assert not behind, (ours.goodput, behind)
    assert "higress" in BASELINES and ours.goodput >= runs["higress"].goodput + 0.00002  # ~1 request


@pytest.mark.parametrize("seed", [0, 1])
def test_the_route_is_served_in_every_phase(card, seed):
    _, lost = card[seed]
    ours = dict(zip((name for name, _, _ in PHASES), lost[CHANNEL_HEALTH]))
    over = {k: round(v, 2) for k, v in ours.items() if v > MOST_LOST[k]}
    assert not over, ours
    # the probe wait (the outage is over, the primary is out) is shorter than Higress's 5 s health check
    higress = dict(zip((n for n, _, _ in PHASES), lost["higress"]))
    assert ours["probe wait"] < higress["probe wait"]
    # the onset: the suspicion moves the primary's share at its 3rd failure in a row, the grid step Higress
    # removes its key in (before: 25.1 / 18.9, the run of 5 waiting for the in-flight successes to drain)
    assert ours["onset"] <= higress["onset"] + 0.01
    # every phase but the onset together loses less than Higress's (3.0 vs 4.6 requests, both seeds; before
    # probe on evidence and the judged usual share: 5.3 / 5.9 vs 4.6)
    rest = [k for k, _, _ in PHASES if k != "onset"]
    assert sum(ours[k] for k in rest) < sum(higress[k] for k in rest) - 1.0, (ours, higress)
