"""A suspect channel evicted from memory (pipeline/engine/residency.py) while suspect: its suspicion ends with a
verdict that publishes its share again, before its snapshot is taken.

Closed loop: a router following the share sends a suspect nothing, so no fresh success can end its suspicion;
``suspect_max_ms`` (10 s) ends it at its next round verdict. An evicted channel has no more rounds, and with
``evict_idle_ms`` under ``suspect_max_ms`` + a round (``CHANNEL_HEALTH_EVICT_IDLE_S`` >= 0 allows it) the
suspect was evicted with its last verdict at share 0: no verdict ever published its share again, no event came
to restore it: a run of 3 failures took the channel out of its route for good."""

from __future__ import annotations

from pipeline.config import StateLimits
from pipeline.engine import Engine
from pipeline.engine.replay import replay
from pipeline.contracts import SUSPECT_METRIC
from pipeline.state.snapshot import ROUND_STATE, decode_snapshot

from test_suspect_dark_route import _three_quick_failures
from test_suspects import START, WARM_S, _of, _stream


def test_a_suspect_evicted_while_idle_gets_its_share_back():
    """Route r = a, b (5 req/s each); a gets no request after WARM_S but three that fail in 40 ms (suspect at
    +140 ms, as in test_suspects), b its usual traffic for 10 min; evict_idle_ms 5 s. a's round at +10 s
    (9.86 s into the suspicion) is still suspect; the idle scan after it evicts a (idle since +140 ms). Its
    suspicion ends there: a verdict at +10 s with its share (0.4975, the route's last), then nothing more
    (evicted). The engine holds no suspicion at the end, and a's snapshot bytes hold none."""
    events = [e for e in _stream({}, until_s=WARM_S + 600)
              if not (e["channel"] == "a" and e["ts_ms"] - START > WARM_S * 1000)]
    engine, verdicts = replay(_three_quick_failures(events), engine=Engine(limits=StateLimits(evict_idle_ms=5000)))
    mine = [(v.ts_ms - START - WARM_S * 1000, v.state, v.metrics["route_share"], SUSPECT_METRIC in v.metrics)
            for v in _of(verdicts, "a")]
    assert mine == [(140, "healthy", 0.0, True), (10_000, "healthy", 0.0, True),
                    (10_000, "healthy", 0.4975, False)]
    assert (engine.residency.evictions, engine.suspects.since_ms, engine.suspects.began_ms) == (1, {}, {})
    # its snapshot (the eviction's bytes) restores no suspicion, and its seq is the last verdict's
    saved = decode_snapshot(engine.residency.evicted["a"]).extensions.get(ROUND_STATE, {})
    assert "suspect_sent_ms" not in saved and "suspect_at_ms" not in saved
    assert engine.seq[engine.channel_rows["a"]] == [v for v in verdicts if v.channel == "a"][-1].seq


def test_a_suspect_evicted_to_make_room_gets_its_share_back():
    """The other way out of memory: max_channels 2 and evict_horizon_ms 0 (both legal); a is suspect from
    +140 ms and idle; channel c (another route) first sends at +5 s: making room for it evicts a, the
    least-recently-seen channel, before a's round at +10 s. The batch that brings c publishes a's suspicion's
    end with its share (0.5, the route's last) at the admission's event time: the newest event of that batch
    (replay's batches of 500 events: the stream's last, +62.2 s). Before the fix a's last verdict stayed the
    suspect one."""
    events = [e for e in _stream({}, until_s=WARM_S + 60)
              if not (e["channel"] == "a" and e["ts_ms"] - START > WARM_S * 1000)]
    events.append({"event_id": "c0", "ts_ms": START + (WARM_S + 5) * 1000, "channel": "c", "route": "other",
                   "status": "ok", "latency_ms": 100.0, "tier": "paid"})
    engine, verdicts = replay(_three_quick_failures(events),
                              engine=Engine(limits=StateLimits(max_channels=2, evict_horizon_ms=0)))
    mine = [(v.ts_ms - START - WARM_S * 1000, v.metrics["route_share"], SUSPECT_METRIC in v.metrics)
            for v in _of(verdicts, "a")]
    assert mine == [(140, 0.0, True), (62_200, 0.5, False)]
    assert (engine.residency.evictions, list(engine.residency.evicted), engine.suspects.since_ms) == (1, ["a"], {})
