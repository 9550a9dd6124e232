"""A recovering peer does not take a suspect's share (pipeline/engine/suspects.py; SPEC §4: ``recovering`` ramps
+10 % weight every 120 s, shifts are bounded per round, no pushing all traffic onto one backup).

A suspicion's share goes to the route's other channels in service, normalised by the router
(pipeline/router/table.py). On a route of two whose other channel is ``recovering`` at its first ramp step
(weight 0.1, share 0.09), that channel took the whole route at once, for a request latency (2.46 s here) or
up to ``suspect_max_ms``: the jump the ramp exists to prevent, onto a channel just out of a fault."""

from __future__ import annotations

from pipeline.engine.replay import replay
from pipeline.contracts import SUSPECT_METRIC

from test_suspects import START, WARM_S, _stream, router_shares_until, with_quick_failures


def test_a_run_of_3_beside_a_recovering_peer_moves_no_share():
    """b fails from WARM_S - 400 s to - 300 s (opens, probes, recovering at weight 0.1 from -200 s); a, healthy,
    gets three quick 503s 1 s after b's first recovering verdict. a is not suspect (no verdict, its share stays
    0.909 at the router, b's 0.091); its run is reset by its next success; no verdict in the 3 s after. (b
    itself was suspect at its fault's onset, beside a healthy a: that one stays.)"""
    events = _stream({"b": [(WARM_S - 400, WARM_S - 300)]}, until_s=WARM_S + 60)
    _, before = replay(events)
    first = next(v for v in before if v.channel == "b" and v.state == "recovering")
    assert (first.ts_ms - START - WARM_S * 1000, first.weight) == (-200_000, 0.1)
    t = first.ts_ms + 1000
    events = with_quick_failures(events, "a", t)
    _, verdicts = replay(events)
    assert not any(SUSPECT_METRIC in v.metrics for v in verdicts if v.channel == "a")
    assert {c: round(s, 3) for c, s in router_shares_until(verdicts, t + 3000).items()} == {"a": 0.909, "b": 0.091}
    assert [(v.channel, v.state) for v in verdicts if t <= v.ts_ms <= t + 3000] == []
