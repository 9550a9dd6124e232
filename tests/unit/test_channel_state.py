"""Bounded channel state (issue #16 item 3, SPEC §8): channel limit, idle eviction, ``no_data`` cadence."""

from __future__ import annotations

import msgspec
import numpy as np

from pipeline.config import StateLimits
from pipeline.contracts import RequestEvent
from pipeline.engine import Engine
from pipeline.policy.defaults import PolicyConfig
from pipeline.engine.batch import BatchProcessor

T0 = 1_780_000_000_000 - 1_780_000_000_000 % 3_600_000
MIN = 60_000
HOUR = 3_600_000


def _ev(i: int, ts: int, channel: str, route: str = "r", latency: float = 100.0, status: str = "ok") -> RequestEvent:
    return RequestEvent(event_id=f"{channel}-{i}", ts_ms=ts, channel=channel, route=route, status=status,
                        latency_ms=latency)


def test_the_channel_over_the_limit_is_refused_counted_and_dead_lettered() -> None:
    now = T0 + HOUR
    proc = BatchProcessor(Engine(limits=StateLimits(max_channels=3)), clock_ms=lambda: now)
    enc = msgspec.json.Encoder()
    msgs = [enc.encode(_ev(k, T0 + k, f"c{k % 4}")) for k in range(8)]  # c0 c1 c2 c3 c0 c1 c2 c3
    out = proc.process(msgs)
    assert [(d.reason, d.event_id) for d in out.dead_letters] == [("too_many_channels", "c3-3"),
                                                                 ("too_many_channels", "c3-7")]
    assert "limit of 3 channels" in out.dead_letters[0].detail
    assert sorted(r[0].event_id for r in out.stored) == ["c0-0", "c0-4", "c1-1", "c1-5", "c2-2", "c2-6"]
    assert proc.engine.store.names == ["c0", "c1", "c2"]
    assert proc.refused == 2 and proc.counters.by_reason["too_many_channels"] == 2
    # A known channel is still taken; the new one still refused.
    out = proc.process([enc.encode(_ev(9, T0 + 9, "c1")), enc.encode(_ev(10, T0 + 10, "c4"))])
    assert [d.event_id for d in out.dead_letters] == ["c4-10"] and [r[0].event_id for r in out.stored] == ["c1-9"]


def test_an_envelope_with_a_refused_event_is_stored_as_rows_of_its_accepted_events() -> None:
    """``split_stored`` takes the refused events: their envelope is not stored whole (it holds them)."""
    now = T0 + HOUR
    proc = BatchProcessor(Engine(limits=StateLimits(max_channels=1)), clock_ms=lambda: now)
    enc = msgspec.json.Encoder()
    whole = enc.encode({"events": [_ev(0, T0, "a"), _ev(1, T0 + 1, "a")]})
    mixed = enc.encode({"events": [_ev(2, T0 + 2, "a"), _ev(3, T0 + 3, "b")]})
    out = proc.process([whole, mixed])
    assert [d.event_id for d in out.dead_letters] == ["b-3"]
    assert out.envelopes == [(whole, 2)] and [r[0].event_id for r in out.stored] == ["a-2"]


def _traffic(channel: str, route: str, start: int, end: int, every_ms: int, latency: float) -> list[RequestEvent]:
    return [_ev(k, t, channel, route, latency + (k % 7) * 10) for k, t in enumerate(range(start, end, every_ms))]


def _run(evict_idle_ms: int) -> tuple[Engine, list, dict]:
    """Channel x: 3 h of traffic, 2 h idle, then back with a latency step; y keeps event time moving."""
    policy = PolicyConfig(no_data_heartbeat_ms=0)
    engine = Engine(policy, StateLimits(evict_idle_ms=evict_idle_ms))
    x = _traffic("x", "rx", T0, T0 + 3 * HOUR, 5_000, 100.0)
    x += _traffic("x", "rx", T0 + 5 * HOUR, T0 + 6 * HOUR, 5_000, 400.0)
    events = sorted(x + _traffic("y", "ry", T0, T0 + 6 * HOUR, 10_000, 80.0), key=lambda e: e.ts_ms)
    verdicts = []
    seen: dict = {}
    for k in range(0, len(events), 100):
        batch = events[k:k + 100]
        verdicts += engine.process(batch, low_watermark_ms=batch[-1].ts_ms, fields=engine.read_fields(batch)).verdicts
        hour = batch[-1].ts_ms // HOUR
        seen.setdefault(hour, (engine.n_resident, "x" in engine.residency.evicted))
    return engine, verdicts, seen


def test_an_idle_channel_is_evicted_and_returns_with_its_baseline_and_identical_verdicts() -> None:
    kept, kept_verdicts, _ = _run(evict_idle_ms=0)
    evicted, evicted_verdicts, seen = _run(evict_idle_ms=HOUR)
    hour0 = T0 // HOUR
    assert seen[hour0 + 2] == (2, False) and seen[hour0 + 4] == (1, True)  # idle 1 h: evicted
    assert evicted.residency.evictions == 1 and evicted.residency.returns == 1 and evicted.n_resident == 2 and not evicted.residency.evicted
    assert kept.residency.evictions == 0 and kept.n_resident == 2
    xs = [msgspec.to_builtins(v) for v in evicted_verdicts if v.channel == "x"]
    assert xs == [msgspec.to_builtins(v) for v in kept_verdicts if v.channel == "x"]
    # The 24 h baseline came back: the latency step after the return is judged against it.
    back = [v for v in evicted_verdicts if v.channel == "x" and v.ts_ms > T0 + 5 * HOUR + 10 * MIN]
    assert back and back[0].metrics["baseline_samples"] == 3 * 720 and "latency_p95_ratio" in back[-1].reasons


def test_eviction_empties_the_rows_and_the_snapshot_restores_them() -> None:
    engine = Engine(limits=StateLimits(evict_idle_ms=HOUR))
    engine.process((batch := _traffic("a", "r", T0, T0 + 20 * MIN, 5_000, 100.0)), low_watermark_ms=T0 + 20 * MIN,
                   fields=engine.read_fields(batch))
    i = engine.store.index["a"]
    lat = engine.store.extensions["latency_p95_ratio"]  # the latency windows (LatencyWindows)
    hist = lat.base.hist[i].copy()
    assert engine.advance(T0 + 2 * HOUR) and engine.residency.evicted.keys() == {"a"} and engine.n_resident == 0
    assert not lat.base.hist[i].any() and not lat.short.hist[i].any()
    assert (lat.base.slot_id[i] == -1).all()
    assert engine.advance(T0 + 3 * HOUR) == []  # an evicted channel is not evaluated
    engine.process((batch := [_ev(999, T0 + 3 * HOUR, "a")]), low_watermark_ms=T0 + 3 * HOUR,
                   fields=engine.read_fields(batch))
    assert engine.n_resident == 1 and not engine.residency.evicted
    pos = (T0 // HOUR) % lat.base.n_slots  # the hour of the first traffic: back as it was
    assert lat.base.slot_id[i, pos] == T0 // HOUR and hist[pos].sum() == 240
    np.testing.assert_array_equal(lat.base.hist[i, pos], hist[pos])


def test_an_evicted_channel_keeps_its_snapshot_in_the_state_records() -> None:
    proc = BatchProcessor(Engine(limits=StateLimits(evict_idle_ms=HOUR)), clock_ms=lambda: T0 + 3 * HOUR)
    proc.engine.process((batch := _traffic("a", "r", T0, T0 + 10 * MIN, 5_000, 100.0)), low_watermark_ms=T0 + 10 * MIN,
                        fields=proc.engine.read_fields(batch))
    proc.engine.advance(T0 + 2 * HOUR)
    records = dict(proc.snapshots())
    assert records["a"] is proc.engine.residency.evicted["a"]


def test_no_data_is_published_on_the_transition_then_at_the_heartbeat() -> None:
    engine = Engine(PolicyConfig(no_data_heartbeat_ms=10 * MIN), StateLimits(evict_idle_ms=HOUR))
    engine.process((batch := [_ev(0, T0, "a")]), low_watermark_ms=T0, fields=engine.read_fields(batch))
    out = []
    for t in range(T0, T0 + 2 * HOUR, 30_000):
        out += [v for v in engine.advance(t) if v.state == "no_data"]
    entered = T0 + 5 * MIN  # the round 5 min after the event
    assert [v.ts_ms - entered for v in out] == [0, 10 * MIN, 20 * MIN, 30 * MIN, 40 * MIN, 50 * MIN]
    assert [v.seq for v in out] == list(range(out[0].seq, out[0].seq + 6))
    assert engine.residency.evicted.keys() == {"a"}  # idle 1 h: evicted, no more heartbeats


def test_the_limits_are_read_from_the_environment() -> None:
    import pytest

    from pipeline.config import ConfigError, load_settings

    env = {"CHANNEL_HEALTH_MAX_CHANNELS": "500", "CHANNEL_HEALTH_EVICT_IDLE_S": "0",
           "CHANNEL_HEALTH_DEDUP_HORIZON_S": "60", "CHANNEL_HEALTH_DEDUP_MAX_IDS": "1000"}
    assert load_settings(env).state_limits == StateLimits(500, 0, 60_000, 1000)
    assert load_settings({}).state_limits == StateLimits()
    with pytest.raises(ConfigError, match="CHANNEL_HEALTH_MAX_CHANNELS must be an integer >= 1"):
        load_settings({"CHANNEL_HEALTH_MAX_CHANNELS": "0"})


def test_a_snapshot_with_10_s_latency_histograms_loads_into_the_30_s_ring() -> None:
    """Snapshots written before the 30 s latency ring hold 30 x 10 s histograms: summed into 30 s slots."""
    from pipeline.state.snapshot import _pack, decode_snapshot, export_channel, import_channel

    events = _traffic("a", "r", T0, T0 + 4 * MIN, 1_000, 100.0)
    engine = Engine()
    engine.process(events, low_watermark_ms=T0, fields=engine.read_fields(events))
    i = engine.store.index["a"]
    windows = engine.store.extensions["latency_p95_ratio"]
    lat = windows.short
    keys = windows.buckets.key_of(np.array([e.latency_ms for e in events]))
    slot10 = np.array([e.ts_ms for e in events]) // 10_000
    old = np.zeros((engine.store.short.n_slots, lat.n_buckets), np.float32)  # per 10 s slot, as written before
    for p, s in enumerate(engine.store.short.slot_id[i].tolist()):
        if s >= 0:
            old[p] = np.bincount(keys[slot10 == s], minlength=lat.n_buckets)
    snap = decode_snapshot(export_channel(engine, i))
    snap.short_hist, snap.short_lat_slot_id = _pack(old), b""
    fresh = Engine()
    j = import_channel(fresh, snap)
    back = fresh.store.extensions["latency_p95_ratio"].short
    np.testing.assert_array_equal(back.slot_id[j], lat.slot_id[i])
    np.testing.assert_array_equal(back.hist[j], lat.hist[i])
    assert lat.hist[i].sum() == 240


def _restarted(evict_idle_ms: int) -> tuple[BatchProcessor, list]:
    """A worker with channel a idle for 2 h and b busy, restarted from its state records; then a returns.
    (No heartbeats: a resident idle channel has them, an evicted one not.)"""
    enc = msgspec.json.Encoder()
    clock = T0 + 6 * HOUR
    limits, policy = StateLimits(evict_idle_ms=evict_idle_ms), PolicyConfig(no_data_heartbeat_ms=0)
    warm = BatchProcessor(Engine(policy, limits), clock_ms=lambda: clock)
    a = _traffic("a", "ra", T0, T0 + 2 * HOUR, 10_000, 100.0)
    b = _traffic("b", "rb", T0, T0 + 4 * HOUR, 10_000, 100.0)
    msgs = [enc.encode(e) for e in sorted(a + b, key=lambda e: e.ts_ms)]
    for k in range(0, len(msgs), 200):
        warm.process(msgs[k:k + 200], [0] * len(msgs[k:k + 200]), list(range(k, k + len(msgs[k:k + 200]))))
    records = {name: (blob, cov, part) for name, blob, cov, part in warm.snapshot_records({0: len(msgs) - 1})}
    proc = BatchProcessor(Engine(policy, limits), clock_ms=lambda: clock)
    assert proc.load_snapshots(records, {0}) == 2
    back = [enc.encode(e) for e in _traffic("a", "ra", T0 + 4 * HOUR, T0 + 4 * HOUR + 10 * MIN, 5_000, 300.0)]
    verdicts = []
    for k in range(0, len(back), 20):
        verdicts += proc.process(back[k:k + 20], [0] * len(back[k:k + 20]),
                                 list(range(len(msgs) + k, len(msgs) + k + len(back[k:k + 20])))).verdicts
    return proc, verdicts


def test_a_restart_holds_idle_channels_evicted_and_they_return_exactly() -> None:
    held, held_verdicts = _restarted(evict_idle_ms=HOUR)
    loaded, loaded_verdicts = _restarted(evict_idle_ms=0)
    assert held.engine.residency.returns == 1 and loaded.engine.residency.returns == 0  # a was held evicted until its event
    assert [msgspec.to_builtins(v) for v in held_verdicts if v.channel == "a"] == [
        msgspec.to_builtins(v) for v in loaded_verdicts if v.channel == "a"]
    assert any(v.channel == "a" and v.metrics["baseline_samples"] == 720 for v in held_verdicts)


def test_machine_dict_is_asdict_with_its_own_reasons_list() -> None:
    """The snapshot's machine dict (:func:`pipeline.engine.state_io.machine_dict`) equals ``dataclasses.asdict``
    and shares no list with the machine; every field is flat (what makes the shallow copy enough)."""
    import dataclasses

    from pipeline.engine.state_io import machine_dict
    from pipeline.policy.state_machine import ChannelMachine

    m = ChannelMachine(state="open", weight=0.25, entered_ms=7, penalty=1.5, reasons=["error_rate"], base_ms=3)
    d = machine_dict(m)
    assert d == dataclasses.asdict(m) and d["reasons"] == ["error_rate"] and d["reasons"] is not m.reasons
    assert {type(v) for v in d.values()} <= {int, float, str, list, type(None)}
    assert all(isinstance(r, str) for r in d["reasons"])
