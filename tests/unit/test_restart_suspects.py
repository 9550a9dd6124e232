"""A restart while a channel is suspect (pipeline/engine/suspects.py) continues its suspicion exactly.

Stream (tests/unit/test_suspects.py, "stale successes do not end it"): route r, channels a and b at 5 req/s,
successes in 2.4 s; three extra requests to a fail in 40 ms and complete in a row at WARM_S + 50, 90, 140 ms,
so a is suspect from +140 ms (route_share 0) until the success sent at +200 ms completes at +2.6 s.

Guarantee checked: an engine restored from every channel's snapshot at a cut inside the suspicion (+0.5 s,
+1.5 s, +2.5 s) and fed the rest publishes byte-identical verdicts to the engine that never stopped (the
suspicion ends at +2.6 s with a's share published again) and ends with the same machines. Without the
suspicion in the record (``suspect_sent_ms`` of the ``engine:round`` entry) the restored engine has nothing
to end: the verdict at +2.6 s is missing and each cut fails.
"""

from __future__ import annotations

import msgspec
import numpy as np
import pytest

from pipeline.engine import Engine
from pipeline.engine.replay import replay
from pipeline.engine.state_io import machine_dict
from pipeline.contracts import SUSPECT_METRIC
from pipeline.policy.defaults import PolicyConfig
from pipeline.state.snapshot import ROUND_STATE, SnapshotError, decode_snapshot, export_channel, import_channel

from tests.unit.test_suspects import START, WARM_S, _stream, starved_then_failing

_enc = msgspec.json.Encoder()
SENT_MS = START + WARM_S * 1000 + 100  # the third extra failure's send time


def _events() -> list[dict]:
    events = _stream({})
    for k, sent in enumerate((10, 50, 100)):
        events.append({"event_id": f"x{k}", "ts_ms": START + WARM_S * 1000 + sent + 40, "channel": "a",
                       "route": "r", "status": "error", "latency_ms": 40.0, "tier": "paid", "http_status": 503})
    events.sort(key=lambda e: e["ts_ms"])
    return events


@pytest.fixture(scope="module", params=[500, 1500, 2500], ids=["cut0.5s", "cut1.5s", "cut2.5s"])
def cut(request):
    events = _events()
    at = START + WARM_S * 1000 + request.param
    before, after = [e for e in events if e["ts_ms"] < at], [e for e in events if e["ts_ms"] >= at]
    eng, _ = replay(before)
    _, rest = replay(after, engine=eng)
    at_cut, _ = replay(before)
    records = [export_channel(at_cut, i) for i in range(at_cut.store.n_channels)]
    final = {n: (machine_dict(eng.machines[i]), eng.seq[i]) for n, i in eng.channel_rows.items()}
    return records, after, [_enc.encode(v) for v in rest], final


def test_the_record_carries_the_suspicion(cut):
    records = cut[0]
    saved = {(s := decode_snapshot(b)).channel: s.extensions.get(ROUND_STATE, {}) for b in records}
    assert np.frombuffer(saved["a"]["suspect_sent_ms"][2], np.float64).tolist() == [float(SENT_MS)]
    assert "suspect_sent_ms" not in saved["b"]


def test_a_restart_while_suspect_changes_no_verdict(cut):
    records, after, want, final = cut
    restored = Engine()
    for blob in records:
        import_channel(restored, decode_snapshot(blob))
    _, got = replay(after, engine=restored)
    assert [_enc.encode(v) for v in got] == want
    end = next(v for v in got if v.channel == "a")
    assert (end.ts_ms, SUSPECT_METRIC in end.metrics, end.metrics["route_share"]) == (
        START + WARM_S * 1000 + 2600, False, 0.5)
    assert {n: (machine_dict(restored.machines[i]), restored.seq[i])
            for n, i in restored.channel_rows.items()} == final


@pytest.mark.parametrize(("dtype", "value"), [
    ("<f8", np.array([np.nan])), ("<f8", np.array([np.inf])), ("<f8", np.array([2.0 ** 60])),
    ("<f8", np.array([1.0, 2.0])), ("<i8", np.array([5], np.int64)),
])
def test_a_hostile_suspicion_is_refused(cut, dtype, value):
    snap = next(s for b in cut[0] if (s := decode_snapshot(b)).channel == "a")
    packed = snap.extensions[ROUND_STATE]
    bad = {**snap.extensions, ROUND_STATE: {**packed, "suspect_sent_ms": (dtype, list(value.shape), value.tobytes())}}
    eng = Engine()
    with pytest.raises(SnapshotError, match="suspect_sent_ms|NaN or infinity"):
        import_channel(eng, msgspec.structs.replace(snap, extensions=bad))
    assert eng.suspects.since_ms == {}


def test_a_hostile_latency_cannot_make_an_unsaveable_suspicion():
    """The third failure claims a latency of 1e300 ms (valid JSON, >= 0): its send time is taken as 0, not
    -1e300, so the suspicion's record restores (a time of -1e300 would be refused and the channel's state
    with it); any success after it then counts as fresh and ends it (+200 ms)."""
    events = _events()
    third = next(e for e in events if e["event_id"] == "x2")
    third["latency_ms"] = 1e300
    at = START + WARM_S * 1000 + 150
    eng, _ = replay([e for e in events if e["ts_ms"] < at])
    assert eng.suspects.since_ms == {eng.channel_rows["a"]: 0.0}
    restored = Engine()
    for i in range(eng.store.n_channels):
        import_channel(restored, decode_snapshot(export_channel(eng, i)))
    assert restored.suspects.since_ms == {restored.channel_rows["a"]: 0.0}
    _, rest = replay([e for e in events if e["ts_ms"] >= at], engine=restored)
    end = next(v for v in rest if v.channel == "a")
    assert (end.ts_ms, SUSPECT_METRIC in end.metrics) == (START + WARM_S * 1000 + 200, False)


def test_a_restart_with_suspicion_turned_off_ends_it_with_its_share(cut):
    """Records taken while a is suspect, restored into an engine whose policy has ``suspect_run = 0``: the first
    chunk ends the suspicion with a's share (no verdict keeps a route share of 0 with ``suspect_run`` 0)."""
    records, after, _, _ = cut
    restored = Engine(PolicyConfig(suspect_run=0))
    for blob in records:
        import_channel(restored, decode_snapshot(blob))
    assert restored.suspects.since_ms
    _, got = replay(after, engine=restored)
    a = [v for v in got if v.channel == "a"]
    assert (SUSPECT_METRIC in a[0].metrics, a[0].metrics["route_share"], a[0].ts_ms) == (
        False, 0.5, min(e["ts_ms"] for e in after))
    assert not any(SUSPECT_METRIC in v.metrics for v in got) and restored.suspects.since_ms == {}


def test_a_restart_after_a_suspicion_ran_out_keeps_it_from_a_new_one():
    """tests/unit/test_suspects.py ``starved_then_failing``: records taken at +40.3 s (the suspicion ran out at
    the +40 s round; the fault's failures have begun) restore ``suspect_expired_ms``: the restored engine
    trips a at +40.84 s without suspecting it again, byte-identical to the engine that never stopped."""
    events = starved_then_failing()
    at = START + WARM_S * 1000 + 40_300
    before, after = [e for e in events if e["ts_ms"] < at], [e for e in events if e["ts_ms"] >= at]
    eng, _ = replay(before)
    _, want = replay(after, engine=eng)
    at_cut, _ = replay(before)
    assert at_cut.suspects.expired == {at_cut.channel_rows["a"]: START + WARM_S * 1000 + 40_000}
    restored = Engine()
    for i in range(at_cut.store.n_channels):
        import_channel(restored, decode_snapshot(export_channel(at_cut, i)))
    _, got = replay(after, engine=restored)
    assert [_enc.encode(v) for v in got] == [_enc.encode(v) for v in want]
    assert next(v for v in got if v.channel == "a").state == "open"
