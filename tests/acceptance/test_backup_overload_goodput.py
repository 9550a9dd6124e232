"""Issue #33 must-hold on backup-overload, as the scorecard scores it (docs/SCORECARD.md "Goodput"): the route
is never dark, and the requests a router following each policy serves, per phase of the scenario.

Open loop (:func:`pipeline.tools.scorecard.runner.run_seed`, seeds 0 and 1; the router model of
:mod:`pipeline.tools.scorecard.goodput`); requests of route ``chat-70b`` lost against the oracle per phase
(:func:`pipeline.tools.scorecard.timeline.lost_by_bin`). Measured (seed 0 / 1), before -> now:

=================================  ==================  =============  =========
phase (scenario s from the outage)  s10-route           now            Higress
=================================  ==================  =============  =========
onset +0..+60                       25.1 / 18.9         25.1 / 18.9    6.3 / 12.6
outage probes +60..+900             4.6 / 4.6           1.9 / 1.9      0 / 0
probe wait +900..+960               49.5 / 49.5         3.3 / 3.5      4.6 / 4.6
ramp +1080..end                     ~13 / ~16           0.1 / 0.5      0 / 0
=================================  ==================  =============  =========

Goodput (both routes) 98.732 / 98.739 % -> 98.855 / 98.866 %; Linkerd 98.850 / 98.847 %, pybreaker
98.842 / 98.841 %, Higress 98.893 / 98.881 %. Higress is still ahead by its onset (it removes a key after
3 failures, we trip after a run of 5): that must-hold is marked xfail (strict) until it holds.
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
MOST_LOST = {"onset": 25.3, "outage probes": 2.1, "probe wait": 3.7, "back": 0.2, "ramp": 0.7}


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
def test_no_blackout_and_goodput_at_least_every_peer_but_higress(card, seed):
    runs, _ = card[seed]
    ours = runs[CHANNEL_HEALTH]
    assert ours.route_blackout_s == 0
    behind = {p: runs[p].goodput for p in BASELINES if p != "higress" and runs[p].goodput > ours.goodput}
    assert not behind, (ours.goodput, behind)


@pytest.mark.parametrize("seed", [0, 1])
def test_the_route_is_served_in_every_phase(card, seed):
    _, lost = card[seed]
    ours = dict(zip((name for name, _, _ in PHASES), lost[CHANNEL_HEALTH]))
    over = {k: round(v, 2) for k, v in ours.items() if v > MOST_LOST[k]}
    assert not over, ours
    # the probe wait (the outage is over, the primary is out) is shorter than Higress's 5 s health check
    assert ours["probe wait"] < dict(zip((n for n, _, _ in PHASES), lost["higress"]))["probe wait"]


@pytest.mark.xfail(strict=True, reason="issue #33 must-hold not met yet: Higress trips a key after 3 failures, "
                                       "our failure run is 5 (onset 25.1 vs 6.3 requests, seed 0)")
@pytest.mark.parametrize("seed", [0, 1])
def test_goodput_at_least_higress(card, seed):
    runs, _ = card[seed]
    assert runs[CHANNEL_HEALTH].goodput >= runs["higress"].goodput
