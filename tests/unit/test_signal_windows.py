"""A signal's own windows (pipeline.windows.extension): fed, viewed, moved with a channel by name."""

from __future__ import annotations

import dataclasses

import msgspec
import numpy as np
import pytest

from pipeline.contracts import RequestEvent
from pipeline.signals import SIGNALS, Examples, Finding, Signal
from pipeline.engine import Engine
from pipeline.engine.columns import event_arrays, make_columns, structure_flags
from pipeline.state.snapshot import SnapshotError, decode_snapshot, export_channel, import_channel
from pipeline.windows.extension import RingWindows, WindowSpec
from pipeline.windows.features import EventColumns
from pipeline.windows.ring import IntervalRing

HOUR = 3_600_000
T0 = 1_750_000_000_000 - 1_750_000_000_000 % HOUR


class TtftWindows(RingWindows):
    """Test windows: TTFT sum and count per 10 s; feature ``test_ttft_mean_5m`` (NaN without samples)."""

    name = "test_ttft"

    def __init__(self, spec: WindowSpec):
        self.window_ms = spec.window_ms
        self.rings = {"short": IntervalRing(10_000, spec.window_ms // 10_000, 2, 0)}

    def add(self, cols: EventColumns, late: np.ndarray) -> None:
        ttft = cols.column("ttft_ms")
        has = ~np.isnan(ttft)
        rows = np.stack([np.where(has, ttft, 0.0), has], axis=1)
        self.rings["short"].add(cols.channel, cols.ts_ms, rows)

    def features(self, rows, now_ms, since_ms):
        ring = self.rings["short"]
        lo = np.full(rows.shape[0], now_ms - self.window_ms) if since_ms is None else np.maximum(
            since_ms, now_ms - self.window_ms)
        s = ring.sum_counts(self.window_mask(ring, rows, lo, now_ms), rows)
        with np.errstate(invalid="ignore", divide="ignore"):
            return {"test_ttft_mean_5m": np.where(s[:, 1] > 0, s[:, 0] / s[:, 1], np.nan)}


@dataclasses.dataclass(frozen=True)
class TtftParams:
    """No policy fields (test signal)."""


class SlowFirstToken:
    reason = "test_ttft"

    def detect(self, view, th, active) -> Finding:
        mean = view.test_ttft_mean_5m
        return Finding(self.reason, np.nan_to_num(mean) > 5_000.0, {"test_ttft_mean_5m": mean})


TTFT = Signal(name="test_ttft", kind="soft", params=TtftParams, detector=SlowFirstToken(),
              features=("test_ttft_mean_5m",), metrics=("test_ttft_mean_5m",),
              examples=Examples(firing={"test_ttft_mean_5m": 9_000.0}, thin=({},)),
              rule="test only", default="5 s", windows=TtftWindows)


def _events(t_from: int, t_to: int, seed: int) -> list[RequestEvent]:
    rng = np.random.default_rng(seed)
    ts = np.sort(rng.integers(t_from, t_to, (t_to - t_from) // 500))
    return [RequestEvent(event_id=f"t{seed}-{i}", ts_ms=t, channel=f"c{i % 2}", route="chat", status="ok",
                         latency_ms=2_000.0, tier="paid",
                         ttft_ms=None if i % 4 == 3 else float(100 * (1 + i % 2) + i % 7))
            for i, t in enumerate(ts.tolist())]


def _want_mean(events: list[RequestEvent], channel: str, now_ms: int) -> float:
    lo = -(-(now_ms - 300_000) // 10_000) * 10_000
    got = [e.ttft_ms for e in events if e.channel == channel and lo <= e.ts_ms < now_ms and e.ttft_ms is not None]
    return sum(got) / len(got)


def _feed(eng: Engine, events: list[RequestEvent]) -> None:
    for k in range(0, len(events), 400):
        eng.process(events[k:k + 400], fields=eng.read_fields(events[k:k + 400]))


def test_signal_windows_feed_the_view_and_the_verdict_metrics():
    eng = Engine(signals=SIGNALS + (TTFT,))
    events = _events(T0, T0 + 20 * 60_000, 1)
    _feed(eng, events)
    now = T0 + 20 * 60_000
    view = eng.store.view(now)
    want = [_want_mean(events, c, now) for c in eng.store.names]
    np.testing.assert_allclose(view.test_ttft_mean_5m, want, rtol=1e-6)
    assert want[0] != want[1]


def test_signal_windows_move_with_a_snapshot_and_start_empty_without_one():
    events = _events(T0, T0 + 20 * 60_000, 2)
    eng = Engine(signals=SIGNALS + (TTFT,))
    _feed(eng, events)
    now = T0 + 20 * 60_000
    blobs = [export_channel(eng, i) for i in range(eng.store.n_channels)]
    back = Engine(signals=SIGNALS + (TTFT,))
    for b in blobs:
        import_channel(back, decode_snapshot(b))
    np.testing.assert_array_equal(back.store.view(now).test_ttft_mean_5m, eng.store.view(now).test_ttft_mean_5m)
    # a snapshot from an engine without the signal: its windows start empty, the rest is intact
    plain = Engine()
    _feed(plain, events)
    fresh = Engine(signals=SIGNALS + (TTFT,))
    for i in range(plain.store.n_channels):
        import_channel(fresh, decode_snapshot(export_channel(plain, i)))
    assert np.isnan(fresh.store.view(now).test_ttft_mean_5m).all()
    assert fresh.state.dropped_state == {}
    # and the other way: an engine without the signal drops its windows and counts them
    old = Engine()
    for b in blobs:
        import_channel(old, decode_snapshot(b))
    assert old.state.dropped_state == {"windows test_ttft": 2, "test_ttft": 2}


def test_store_state_round_trip_and_eviction_clear_the_signal_windows():
    eng = Engine(signals=SIGNALS + (TTFT,))
    events = _events(T0, T0 + 10 * 60_000, 3)
    _feed(eng, events)
    now = T0 + 10 * 60_000
    other = Engine(signals=SIGNALS + (TTFT,))
    other.store.load(eng.store.state())
    np.testing.assert_array_equal(other.store.view(now).test_ttft_mean_5m, eng.store.view(now).test_ttft_mean_5m)
    other.store.clear_rows(np.array([1]))
    got = other.store.view(now).test_ttft_mean_5m
    assert got[0] == pytest.approx(_want_mean(events, "c0", now)) and np.isnan(got[1])


def test_hostile_snapshot_windows_are_snapshot_errors():
    eng = Engine(signals=SIGNALS + (TTFT,))
    _feed(eng, _events(T0, T0 + 60_000, 4))
    snap = decode_snapshot(export_channel(eng, 0))
    (key, (dtype, shape, packed)), *_ = snap.extensions["test_ttft"].items()
    for bad in ({key: ("|O", shape, packed)}, {key: (dtype, [1 << 30], packed)}, {key: (dtype, shape, b"\x00junk")}):
        raw = msgspec.msgpack.encode(msgspec.structs.replace(snap, extensions={"test_ttft": bad}))
        with pytest.raises(SnapshotError):
            import_channel(Engine(signals=SIGNALS + (TTFT,)), decode_snapshot(raw))
    wrong = {k: (d, [s[0] + 1, *s[1:]], v) for k, (d, s, v) in snap.extensions["test_ttft"].items()}
    raw = msgspec.msgpack.encode(msgspec.structs.replace(snap, extensions={"test_ttft": wrong}))
    with pytest.raises(SnapshotError):
        import_channel(Engine(signals=SIGNALS + (TTFT,)), decode_snapshot(raw))


def test_optional_columns_read_on_demand_nan_where_absent_and_survive_take():
    events = [RequestEvent(event_id=str(i), ts_ms=T0 + i, channel="c", route="r", status=s, latency_ms=1.0,
                           cost_usd=c, quota_remaining=q)
              for i, (s, c, q) in enumerate([("ok", 0.5, None), ("cancelled", None, 0.25), ("ok", 2.0, 1.0)])]
    cols = make_columns(np.zeros(3, np.int64), events, *event_arrays(events), *structure_flags([(None, None)] * 3))
    assert cols.column("cancelled").tolist() == [False, True, False]
    np.testing.assert_array_equal(cols.column("cost_usd"), [0.5, np.nan, 2.0])
    kept = cols.take(np.array([False, True, True]))
    np.testing.assert_array_equal(kept.column("cost_usd"), [np.nan, 2.0])  # cached before take
    np.testing.assert_array_equal(kept.column("quota_remaining"), [0.25, 1.0])  # read after take
    with pytest.raises(KeyError, match="unknown event column"):
        cols.column("prompt_text")
