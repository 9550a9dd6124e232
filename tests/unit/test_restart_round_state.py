"""A restart continues SPEC §4.2's round state exactly: healthy-only learning, the capacity cap and the
peer-relative finding (issue #33 parts 2, 4 and 5).

Guarantee checked: an engine restored from its channels' snapshots and fed the same calls as the engine
that never stopped publishes byte-identical verdicts (``route_share``, ``max_share`` and the CUSUM's
``error_baseline_rate`` included) and ends with the same machines, for restarts at 12 points of a stream
where, at the restart points,

* route "p": primary ``x`` fails outright, backup ``y`` takes the whole route and sheds 10 % of it: ``y``
  is capped (``max_share``, reason ``over_capacity``) and its capacity model (usual share, held shares,
  usual failure counts, ``judged_since_ms``) decides its next rounds;
* route "r": ``c`` is 4x slower than its two peers (``peer_latency``), then 2.5x: inside the rule's
  hysteresis band (trips at 3x, clears at 2x), so only the finding in force keeps it flagged;
* ``c`` is held (not healthy) longer than the baselines' hold cap (``learn_hold_ms``, set to 10 min here
  instead of 6 h to keep the stream short): its events enter the baselines again from the cap on,
  counted from the hold's first event (``held_since_ms``), not from the restart.

Without these in the snapshots the restored engine drops ``c``'s finding at its next round, counts ``c``'s
hold afresh (its baselines then skip 10 more minutes) and forgets ``y``'s usual share (no cap): checked to
fail on the code before (branch s10-route at 327ee8f, the snapshots without
:data:`pipeline.state.snapshot.ROUND_STATE`).
"""

from __future__ import annotations

import msgspec
import numpy as np
import pytest

from pipeline.contracts import RequestEvent
from pipeline.engine import Engine
from pipeline.engine.state_io import machine_dict
from pipeline.ingest.structure import resolve_onto
from pipeline.state.snapshot import ROUND_STATE, SnapshotError, decode_snapshot, export_channel, import_channel

HOUR = 3_600_000
T0 = 1_750_000_000_000 - 1_750_000_000_000 % HOUR
MIN = 60_000
#: The baselines' hold cap of both engines (WindowStore.learn_hold_ms; 6 h by default).
HOLD_MS = 10 * MIN
_enc = msgspec.json.Encoder()


def _latency_factor(ch: str, t: int) -> float:
    """``c`` is 4x slower from minute 20, 2.5x from minute 30, 1x from minute 60."""
    if ch != "c":
        return 1.0
    m = (t - T0) / MIN
    return 4.0 if 20 <= m < 30 else 2.5 if 30 <= m < 60 else 1.0


def _calls(minutes: int = 70, seed: int = 3) -> list[list[RequestEvent]]:
    """One call per 10 s span with every channel's events (route "r": a, b, c at 1 request/s; route "p":
    x, y at 2 requests/s each, x failing every request from minute 20 to 40, y 10 % from minute 22, once it
    carries the route, to 40)."""
    rng = np.random.default_rng(seed)
    calls = []
    for span in range(minutes * 6):
        events = []
        for ch, route, per_s in (("a", "r", 1), ("b", "r", 1), ("c", "r", 1), ("x", "p", 2), ("y", "p", 2)):
            for k in range(10 * per_s):
                ts = T0 + span * 10_000 + k * (1_000 // per_s) + ord(ch)
                m = (ts - T0) / MIN
                failing = (20 <= m < 40 and ch == "x") or (22 <= m < 40 and ch == "y" and rng.random() < 0.10)
                events.append(RequestEvent(
                    event_id=f"{ch}{ts}", ts_ms=ts, channel=ch, route=route, status="error" if failing else "ok",
                    latency_ms=float(200.0 * _latency_factor(ch, ts) * rng.lognormal(0.0, 0.2)), tier="paid"))
        events.sort(key=lambda e: e.ts_ms)
        resolve_onto(events)
        calls.append(events)
    return calls


def _engine() -> Engine:
    eng = Engine()
    eng.store.learn_hold_ms = HOLD_MS
    return eng


def _run(eng: Engine, calls: list[list[RequestEvent]]) -> list[list[bytes]]:
    return [[_enc.encode(v) for v in eng.process(events, low_watermark_ms=0, fields=eng.read_fields(events)).verdicts]
            for events in calls]


def _final(eng: Engine) -> dict:
    return {name: (machine_dict(eng.machines[i]), eng.seq[i], bool(eng.learns[i])) for name, i in eng.channel_rows.items()}


def _replay_with_states(calls: list[list[RequestEvent]]) -> tuple:
    """One engine fed ``calls`` in order: the calls, the verdict bytes of each, every channel's snapshot record
    after each call, and the engine's final state."""
    eng = _engine()
    out, states = [], []
    for events in calls:
        out.extend(_run(eng, [events]))
        states.append([export_channel(eng, i) for i in range(eng.store.n_channels)])
    return calls, out, states, _final(eng)


@pytest.fixture(scope="module")
def reference():
    return _replay_with_states(_calls())


def _verdicts(out: list[list[bytes]], channel: str) -> list[dict]:
    return [v for per_call in out for b in per_call if (v := msgspec.json.decode(b))["channel"] == channel]


def test_the_stream_caps_y_flags_c_in_its_band_and_outlasts_the_hold_cap(reference):
    calls, out, states, _ = reference
    y = _verdicts(out, "y")
    capped = [v for v in y if "max_share" in v["metrics"]]
    first = next(v for v in y if v["state"] != "healthy")  # overload, not breakage: capped, not opened
    assert capped and (first["state"], first["reasons"]) == ("degraded", ["over_capacity"])
    c = _verdicts(out, "c")
    band = [v for v in c if T0 + 35 * MIN <= v["ts_ms"] < T0 + 60 * MIN]
    assert band and all("peer_latency" in v["reasons"] for v in band)  # kept by the finding in force
    assert all(2.0 < v["metrics"]["peer_p95_ratio"] < 3.0 for v in band)  # inside the hysteresis band
    # the round state each restart must carry is in the records at the restart points
    at_40 = {decode_snapshot(b).channel: decode_snapshot(b).extensions.get(ROUND_STATE, {})
             for b in states[_cut(calls, 40)]}
    assert {"peer_active", "held_since_ms"} <= at_40["c"].keys()
    assert {"usual", "held", "max_share", "judged_since_ms", "usual_counts"} <= at_40["y"].keys()
    held = np.frombuffer(at_40["c"]["held_since_ms"][2], np.int64)[0]
    assert T0 < held <= T0 + 40 * MIN - HOLD_MS  # c's hold is past its cap: its events learn again


def _cut(calls: list[list[RequestEvent]], minute: float) -> int:
    """Index of the call that starts at ``minute``."""
    return next(k for k, c in enumerate(calls) if c[0].ts_ms >= T0 + minute * MIN)


@pytest.mark.parametrize("minute", [21, 22.5, 24, 27, 31, 33.5, 36, 40, 42, 45, 52, 61])
def test_a_restart_changes_no_verdict(reference, minute):
    calls, out, states, final = reference
    cut = _cut(calls, minute)
    restored = _engine()
    for blob in states[cut - 1]:
        import_channel(restored, decode_snapshot(blob))
    assert restored.state.dropped_state == {}
    assert _run(restored, calls[cut:]) == out[cut:], f"restart at minute {minute}"
    assert _final(restored) == final


def test_records_without_round_state_restore_its_defaults_and_bad_values_are_refused(reference):
    calls, _, states, _ = reference
    blob = next(b for b in states[_cut(calls, 40)] if decode_snapshot(b).channel == "y")
    snap = decode_snapshot(blob)
    bare = msgspec.structs.replace(snap, extensions={k: v for k, v in snap.extensions.items() if k != ROUND_STATE})
    eng = _engine()
    i = import_channel(eng, bare)
    assert i not in eng.routes.capacity.max_share and eng.store.held_since_ms[i] == -1
    assert bool(eng.learns[i]) is (eng.machines[i].state in ("healthy", "no_data"))
    packed = snap.extensions[ROUND_STATE]
    for key, arr in (("max_share", np.array([1.5])), ("held", np.full(11, 0.5)), ("usual", np.array([-0.1]))):
        bad = {**snap.extensions, ROUND_STATE: {**packed, key: ("<f8", list(arr.shape), arr.tobytes())}}
        with pytest.raises(SnapshotError):
            import_channel(_engine(), msgspec.structs.replace(snap, extensions=bad))
    wrong = {**snap.extensions, ROUND_STATE: {**packed, "max_share": ("<i8", [1], np.array([1]).tobytes())}}
    with pytest.raises(SnapshotError):
        import_channel(_engine(), msgspec.structs.replace(snap, extensions=wrong))


@pytest.fixture(scope="module")
def per_channel():
    """The same stream with each channel's events of a span in a call of their own (a, b, c, x, y): each
    channel reaches a round boundary in its own call, so a round reads its route peers as of their last
    round (P95s, recent outcomes, failure ratios, the panic floor's weights), and a restart between two
    calls falls inside a round in progress."""
    calls = [[e for e in events if e.channel == ch] for events in _calls() for ch in "abcxy"]
    for events in calls:
        resolve_onto(events)
    return _replay_with_states(calls)


@pytest.mark.parametrize("minute,after", [(24, "c"), (31.5, "a"), (36, "x"), (42, "b"), (45, "c")])
def test_a_restart_inside_a_round_changes_no_verdict(per_channel, minute, after):
    calls, out, states, final = per_channel
    cut = next(k for k, c in enumerate(calls) if c[0].ts_ms >= T0 + minute * MIN and c[0].channel == after) + 1
    records = {decode_snapshot(b).channel: decode_snapshot(b) for b in states[cut - 1]}
    saved = {ch: r.extensions.get(ROUND_STATE, {}).keys() for ch, r in records.items()}
    assert all({"fail_ratio", "recent"} <= keys for keys in saved.values())
    assert all({"p95", "p95_round_ms"} <= saved[ch] for ch in "abc")
    restored = _engine()
    for record in records.values():
        import_channel(restored, record)
    assert _run(restored, calls[cut:]) == out[cut:], f"restart at minute {minute} after {after}'s call"
    assert _final(restored) == final


def test_the_per_channel_stream_keeps_the_route_in_service_by_the_panic_floor(per_channel):
    _, out, _, _ = per_channel
    panic = [v for v in _verdicts(out, "x") + _verdicts(out, "y") if "route_panic" in v["reasons"]]
    assert panic and T0 + 30 * MIN <= min(v["ts_ms"] for v in panic) <= T0 + 45 * MIN
