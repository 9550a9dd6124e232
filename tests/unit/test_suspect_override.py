"""Operators' overrides over a suspect channel (pipeline/engine/suspects.py, pipeline/policy/override.py): the
override wins, and a route freeze does not pin a suspicion's transient share 0 for the freeze's TTL."""

from __future__ import annotations

from pipeline.engine.replay import replay
from pipeline.contracts import SUSPECT_METRIC
from pipeline.policy.override import Override, OverrideTable
from pipeline.router.table import HealthTable

from test_suspect_dark_route import WALL, _three_quick_failures
from test_suspects import START, WARM_S, _stream


def test_a_freeze_set_during_a_suspicion_holds_the_share_under_it():
    """a is suspect from +140 ms to +2.6 s (three quick failures; its share 0.5 before). An operator freezes route
    r at +1 s: the freeze holds each channel's last share, and a's last verdict carries the suspicion's 0, which
    lasts about one request latency (at most suspect_max_ms, 10 s); held, it moved all of a's traffic to b for
    the freeze's TTL (up to 24 h) while a is healthy. The freeze holds a's share under the suspicion (0.5), as
    it was before it and after it, to the end (+100 s); engine_route_share still shows the engine's 0 meanwhile.
    A suspicion that begins during a freeze does not move a's frozen share either."""
    _, verdicts = replay(_three_quick_failures(_stream({})))
    suspect = next(v for v in verdicts if SUSPECT_METRIC in v.metrics)
    assert (suspect.channel, suspect.ts_ms - START - WARM_S * 1000) == ("a", 140)
    t0 = START + WARM_S * 1000
    overrides, table = OverrideTable(), HealthTable()
    frozen = []
    for v in verdicts:
        if v.ts_ms > t0 + 100_000:
            break
        if v.ts_ms > t0 + 1000 and not frozen:
            assert table.weights("r").shares == {"a": 0.0, "b": 1.0}  # the suspicion, before the freeze
            overrides.put(Override(kind="freeze", by="op", reason="hold", set_ts_ms=WALL,
                                   expires_ts_ms=WALL + 3_600_000, route="r"), WALL)
            frozen.append(v.ts_ms)
        out = overrides.apply(v)
        table.update(out)
        if frozen and v.channel == "a":
            assert (out.metrics["route_share"], out.override["kind"]) == (0.5, "freeze")
    assert table.weights("r").shares == {"a": 0.5, "b": 0.5}
    # a suspicion beginning during the freeze: its verdict keeps the held share
    later = overrides.apply(suspect)
    assert (later.metrics["route_share"], later.metrics["engine_route_share"]) == (0.5, 0.0)


def test_a_channel_override_on_a_suspect_wins():
    """a forced to weight 0.8 by an operator: its suspicion (engine share 0) does not move its share at the
    router: 0.8 against b's 2 x 0.5 (k channels x route_share, pipeline/router/table.py), i.e. 0.8 / 1.8."""
    _, verdicts = replay(_three_quick_failures(_stream({})))
    suspect = next(v for v in verdicts if SUSPECT_METRIC in v.metrics)
    overrides = OverrideTable()
    overrides.put(Override(kind="weight", by="op", reason="r", set_ts_ms=WALL, expires_ts_ms=WALL + 3_600_000,
                           channel="a", weight=0.8), WALL)
    table = HealthTable()
    for v in verdicts:
        if v.ts_ms <= suspect.ts_ms:
            table.update(overrides.apply(v))
    assert table.weights("r").shares == {"a": 0.8 / 1.8, "b": 1.0 / 1.8}


def test_the_override_table_names_the_engine_metric():
    """pipeline.policy.override keeps no import of the engine: its copy of the metric's name is the engine's."""
    from pipeline.policy import override

    assert override.SUSPECT_METRIC == SUSPECT_METRIC


def test_watch_does_not_say_an_overridden_suspect_loses_its_share():
    """``channel-health watch`` said "its share goes to its peers" of a suspect under an operator's override,
    which the override (and the router table) hold against the suspicion: it says so instead."""
    from pipeline.cli.watch import state_text

    row = {"state": "healthy", "in_state_s": 4.0, "next": None, "suspect_run": 3,
           "override": {"kind": "freeze", "by": "ana", "reason": "hold", "route": "r", "key_id": "k1"}}
    assert state_text(row) == ("healthy · 4 s; route r frozen by ana (key k1): hold; suspect (3 failures in a row):"
                               " the override holds its share")
    assert state_text(dict(row, override=None)).endswith("suspect (3 failures in a row): its share goes to its peers")
