"""No suspicion on a route whose load just rose (pipeline/engine/suspects.py; SPEC §4.2 "overload is not
breakage", §4 "must not push all traffic onto one backup that then fails under double load").

A suspicion's share goes to the route's other channels at once. The engine already kept routes with a learned
capacity cap (``max_share``) out of it, but a cap is learned only after an overload has been judged; in the
rounds before, a channel whose share just rose (:meth:`CapacityModel.share_rose`) answers its extra load with
429s that the engine, by its own rule, treats as overload (no rate-limit cooldown: the round's capacity test
decides), and three of them in a row made it suspect: its whole share went to its peer, one more step of the
pile-up onto one backup."""

from __future__ import annotations

from pipeline.engine.replay import replay
from pipeline.contracts import SUSPECT_METRIC

from test_suspects import START, WARM_S, _stream, router_shares_until, with_quick_failures


def test_429s_of_a_channel_whose_share_rose_make_no_suspect():
    """Route r = a, b, c at 1/3 each (usual share 0.333). a fails hard from WARM_S (opens at +3.04 s): b and c
    hold 0.5, 1.5 x their usual share and 0.167 above it (share_rose: RISE_FACTOR 1.4, RISE_MIN_ABS 0.15).
    At +65 s b answers three requests with 429 (no Retry-After) in a row. Before: b suspect at +65.14 s and c
    alone carried the route (1.0, 3 x its usual share). Now: no suspicion of b; the router keeps 0.5 / 0.5."""
    events = _stream({"a": [(WARM_S, WARM_S + 600)]}, channels=("a", "b", "c"), until_s=WARM_S + 120)
    t = START + (WARM_S + 65) * 1000
    events = with_quick_failures(events, "b", t, 429)
    engine, verdicts = replay(events)
    assert not any(SUSPECT_METRIC in v.metrics for v in verdicts if v.channel == "b")
    assert engine.routes.capacity.share_rose(engine.channel_rows["b"])
    assert router_shares_until(verdicts, t + 3000) == {"a": 0.0, "b": 0.5, "c": 0.5}
