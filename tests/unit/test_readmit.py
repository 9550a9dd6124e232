"""SPEC §4.2 re-admission on evidence (issue #33, :mod:`pipeline.policy.readmit`): an ``open`` channel whose own
traffic answers again while a peer of its route is over its ``max_share`` goes ``half_open`` at the event that
completed a run of ``readmit_success_run`` (10) successes, and the route's shares move at once.

On the code before there was no such transition: the channel waited for the round after its cooldown (the
engine tests below fail there: the primary stayed ``open`` until 1500 s)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from pipeline.engine.replay import replay
from pipeline.policy.defaults import PolicyConfig
from pipeline.policy.readmit import success_run_crossing
from pipeline.policy.state_machine import HALF_OPEN, OPEN, ChannelMachine

from tests.unit.test_error_class_policy import T0, _stream, _t

CFG = PolicyConfig()


@pytest.mark.parametrize(("outcome", "run", "k", "want"), [
    ([0, 1, 0, 0, -1, 0], 0, 3, (5, 3)),    # a neutral event neither breaks nor extends the run
    ([0, 0], 1, 3, (1, 3)),                 # the run carries over from the earlier events
    ([0, 1], 1, 3, (-1, 0)),                # a failure breaks it
    ([1, 1, -1], 4, 3, (-1, 0)),
    ([-1, -1], 2, 3, (-1, 2)),              # only neutral events: the run stays
    ([0] * 12, 0, 10, (9, 12)),
])
def test_success_run_crossing(outcome, run, k, want):
    assert success_run_crossing(np.array(outcome, np.int8), run, k) == want


def test_success_run_crossing_refuses_bad_arguments():
    with pytest.raises(ValueError, match="k >= 1"):
        success_run_crossing(np.array([0]), 0, 0)
    with pytest.raises(ValueError, match="run >= 0"):
        success_run_crossing(np.array([0]), -1, 3)


def test_readmit_opens_the_probe_now_only_for_a_detector_trip():
    m = ChannelMachine()
    m.trip(T0, ["consecutive_failures"], CFG)
    assert m.readmit(T0 + 5_000, CFG) is True
    assert (m.state, m.weight, m.left_open_ms, m.judged_since_ms) == (HALF_OPEN, CFG.half_open_weight, T0 + 5_000,
                                                                      T0 + 5_000)
    assert m.readmit(T0 + 6_000, CFG) is False  # not open
    dead = ChannelMachine()
    dead.trip(T0, ["credential_invalid"], CFG, cause="credential")
    assert dead.readmit(T0 + 5_000, CFG) is False and dead.state == OPEN  # a dead key waits for its probe


def test_readmit_setting_is_validated():
    assert CFG.readmit_success_run == 10
    for bad in (-1, 2.5, True):
        with pytest.raises(ValueError, match="readmit_success_run"):
            PolicyConfig(readmit_success_run=bad)


def _outage(end_s: int) -> list[dict]:
    """Route r, 50/50 at 4 req/s each: the primary answers 503 from 900 s to ``end_s``, so the backup takes
    the whole route; from 960 s the backup sheds three 429s every 30 s (over its capacity)."""
    def fail(ch: str, i: int, t: float) -> dict | None:
        if ch == "p/m@paid" and 900 <= t < end_s:
            return {"http": 503}
        if ch == "b/m@paid" and 960 <= t < end_s and i % 120 in (0, 4, 8):
            return {"http": 429}
        return None
    return _stream({"p/m@paid": {}, "b/m@paid": {}}, 0, 1800, fail)


def test_an_open_channel_that_answers_again_is_readmitted_at_once_while_its_peer_is_over_its_cap():
    # The primary fails 900-1410 s; its last failed probe re-opened it before 1410 s, so its next probe
    # would be the round after its 90 s cooldown. Its own requests answer again from 1410 s: the 10th
    # success in a row (1412.25 s + its fixed offset) makes it half_open, and the backup's excess over its
    # cap goes to it in the same instant (both verdicts at that event time).
    _, verdicts = replay(_outage(1410))
    primary = [v for v in verdicts if v.channel == "p/m@paid"]
    opened = max(_t(v) for v in primary if v.state == "open" and _t(v) < 1410)
    back = next(v for v in primary if _t(v) >= 1410 and v.state != "open")
    offset = (sum(map(ord, "p/m@paid")) % 50) / 1000
    assert back.state == "half_open" and _t(back) == pytest.approx(1410 + 9 * 0.25 + offset)
    assert _t(back) < opened + CFG.open_cooldown_ms / 1000  # before its cooldown would have ended
    cap = [v for v in verdicts if v.channel == "b/m@paid" and v.ts_ms == back.ts_ms]
    assert len(cap) == 1 and cap[0].metrics["route_share"] == pytest.approx(cap[0].metrics["max_share"])
    assert back.metrics["route_share"] == pytest.approx(1 - cap[0].metrics["max_share"])
    # turned off: the primary waits for the round after its cooldown
    off = dataclasses.replace(CFG, readmit_success_run=0)
    _, verdicts = replay(_outage(1410), policy=off)
    later = next(v for v in verdicts if v.channel == "p/m@paid" and _t(v) >= 1410 and v.state != "open")
    assert later.state == "half_open" and _t(later) % 30 == 0 and _t(later) >= opened + 90


def test_no_readmission_without_a_peer_over_its_cap():
    # the same outage with no 429s: the backup carries the route within its capacity (no cap), so the
    # primary keeps its SPEC §4 cooldown: its probes start on round boundaries only
    def fail(ch: str, i: int, t: float) -> dict | None:
        return {"http": 503} if ch == "p/m@paid" and 900 <= t < 1410 else None
    _, verdicts = replay(_stream({"p/m@paid": {}, "b/m@paid": {}}, 0, 1800, fail))
    assert not [v for v in verdicts if "max_share" in v.metrics]
    probes = [_t(v) for v in verdicts if v.channel == "p/m@paid" and v.state == "half_open"]
    assert probes and all(t % 30 == 0 for t in probes)
