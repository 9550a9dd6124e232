"""The scorecard's router model (issue #33 part 6, docs/SCORECARD.md "Goodput") on backup-overload:
right values follow from the scenario's injected truth (outage: every request fails; the backup's
capacity 10 req/s, failures + 0.06 x excess above it)."""

from __future__ import annotations

import numpy as np
import pytest

from pipeline.tools.scorecard.goodput import Truth, oracle_shares, outcome, peer_shares, step_shares
from pipeline.tools.simulate.scenarios import SCENARIOS

PRIMARY, BACKUP = "fireworks/llama-70b@paid", "together/llama-70b@paid"


@pytest.fixture(scope="module")
def truth() -> Truth:
    return Truth(SCENARIOS["backup-overload"])


def test_a_dark_route_serves_nothing_and_counts_its_seconds(truth):
    rt = truth.routes["chat-70b"]
    t0 = float(rt.t_s[0])
    # all shares 0 from 600 s after the warm-up for 300 s, then the static shares again
    shares = step_shares(rt, [(t0 + 600, {PRIMARY: 0.0, BACKUP: 0.0}), (t0 + 900, {PRIMARY: 0.5, BACKUP: 0.5})])
    served, demand, dark = outcome(truth, "chat-70b", shares)
    assert dark == 300.0
    assert demand == pytest.approx(float(rt.demand_rps.sum()))
    static_served, _, static_dark = outcome(truth, "chat-70b", rt.static)
    assert static_dark == 0.0
    window = (rt.t_s >= t0 + 600) & (rt.t_s < t0 + 900)
    lost = sum(float(np.sum(rt.static[j, window] * rt.demand_rps[window]
                            * truth.success(c, rt.static[j] * rt.demand_rps)[window]))
               for j, c in enumerate(rt.channels))
    assert static_served - served == pytest.approx(lost, rel=1e-9)


def test_in_the_outage_the_primary_serves_nothing_and_the_oracle_sends_all_to_the_backup(truth):
    sc = SCENARIOS["backup-overload"]
    rt = truth.routes["chat-70b"]
    outage = (rt.t_s >= sc.warmup_s) & (rt.t_s < sc.warmup_s + 900)
    j_p, j_b = rt.channels.index(PRIMARY), rt.channels.index(BACKUP)
    assert np.all(truth.success(PRIMARY, rt.demand_rps)[outage] == 0.0)
    oracle = oracle_shares(truth, "chat-70b")
    assert np.all(oracle[j_b, outage] == pytest.approx(1.0)) and np.all(oracle[j_p, outage] == 0.0)
    # the backup at the whole route's load: capacity 10 req/s, + 0.06 x (load / 10 - 1) failures
    load = rt.demand_rps[outage]
    base = 1.0 - truth.success(BACKUP, np.zeros_like(rt.demand_rps))[outage]
    expect = 1.0 - np.clip(base + 0.06 * np.maximum(0.0, load / 10.0 - 1.0), 0, 1)
    assert truth.success(BACKUP, rt.demand_rps)[outage] == pytest.approx(expect)


def test_peer_shares_split_the_static_shares_among_the_channels_in_service(truth):
    rt = truth.routes["chat-70b"]
    n = len(rt.t_s)
    ins = np.ones((2, n), bool)
    ins[0, :10] = False
    ins[:, 10:20] = False
    s = peer_shares(rt, ins)
    assert np.all(s[0, :10] == 0.0) and np.all(s[1, :10] == 1.0)
    assert np.all(s[:, 10:20] == 0.0)
    assert np.allclose(s[:, 20:], rt.static[:, 20:])


def test_the_oracle_is_the_ceiling(truth):
    rt = truth.routes["chat-70b"]
    best, demand, _ = outcome(truth, "chat-70b", oracle_shares(truth, "chat-70b"))
    for shares in (rt.static, peer_shares(rt, np.vstack([np.zeros(len(rt.t_s), bool), np.ones(len(rt.t_s), bool)]))):
        assert outcome(truth, "chat-70b", shares)[0] <= best + 1e-6
    assert 0.98 < best / demand < 1.0
