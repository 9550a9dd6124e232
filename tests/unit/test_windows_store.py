"""pipeline.windows.store / ring: exact window counts, P95s and the 24 h baseline."""

from __future__ import annotations

import math

import numpy as np
import pytest

from pipeline.windows.histogram import LatencyBuckets
from pipeline.windows.ring import IntervalRing
from pipeline.signals.consecutive_failures import FailureRuns
from pipeline.signals.latency_p95_ratio import BASE_SLOT_MS, LAT_SLOT_MS, LatencyWindows
from pipeline.signals.quality import QualityScoreWindows
from pipeline.windows.store import SHORT_SLOT_MS, EventColumns, WindowStore

def _store() -> WindowStore:
    """A store with the windows of latency, failure runs and quality (which need no optional columns)."""
    return WindowStore(windows=(LatencyWindows, FailureRuns, QualityScoreWindows))


ALPHA = 0.02
TOL = ALPHA * (1 + 1e-9)
HOUR = 3_600_000
T0 = 1_750_000_000_000 + 1_234  # not aligned to 10 s nor to the hour
assert T0 % HOUR and T0 % SHORT_SLOT_MS

# outcome codes as EventColumns wants them
STATUSES = np.array(["ok", "error", "timeout", "rate_limited", "cancelled", "filtered"])
OUTCOME = {"ok": 0, "error": 1, "timeout": 1, "rate_limited": 1, "cancelled": -1, "filtered": -1}


def _columns(channel, ts, status, latency, checked, missing) -> EventColumns:
    status = np.asarray(status)
    outcome = np.array([OUTCOME[s] for s in status], dtype=np.int8)
    return EventColumns(
        channel=np.asarray(channel, dtype=np.int64),
        ts_ms=np.asarray(ts, dtype=np.int64),
        outcome=outcome,
        ok=outcome == 0,
        latency_ms=np.asarray(latency, dtype=np.float64),
        checked=np.asarray(checked, dtype=bool),
        missing=np.asarray(missing, dtype=bool),
        rate_limited=status == "rate_limited",
    )


class Data:
    """3 h of seeded events on channel 0 (plus a noisier channel 1), fed in shuffled batches."""

    def __init__(self, seed: int = 7):
        rng = np.random.default_rng(seed)
        n = 3 * 3600 * 3  # ~3 req/s for 3 h on channel 0
        ts0 = np.sort(T0 + rng.integers(0, 3 * HOUR, n))
        hour_of = (ts0 - T0) // HOUR
        median = np.array([150.0, 260.0, 90.0])[hour_of]  # a different level per hour
        lat0 = np.clip(rng.lognormal(np.log(median), 0.6), 1.0, 300_000.0)
        st0 = rng.choice(STATUSES, n, p=[0.93, 0.02, 0.01, 0.01, 0.02, 0.01])
        n1 = 4_000
        ts1 = np.sort(T0 + rng.integers(0, 3 * HOUR, n1))
        lat1 = np.clip(rng.exponential(2_000.0, n1) + 5, 1.0, 300_000.0)
        st1 = rng.choice(STATUSES, n1, p=[0.8, 0.1, 0.05, 0.03, 0.01, 0.01])
        ch = np.r_[np.zeros(n, np.int64), np.ones(n1, np.int64)]
        ts = np.r_[ts0, ts1]
        order = np.argsort(ts, kind="stable")
        self.channel, self.ts = ch[order], ts[order]
        self.latency = np.r_[lat0, lat1][order]
        self.status = np.r_[st0, st1][order]
        ok = self.status == "ok"
        self.checked = ok & (rng.random(ts.size) < 0.7)
        self.missing = self.checked & (rng.random(ts.size) < 0.05)
        # shuffle within batches of ~500 (disorder of a few minutes at most)
        self.batches = []
        i = 0
        while i < ts.size:
            j = min(ts.size, i + int(rng.integers(50, 900)))
            perm = i + rng.permutation(j - i)
            self.batches.append(perm)
            i = j
        self.store = _store()
        assert self.store.channel_index("a", "r", "paid") == 0
        assert self.store.channel_index("b", "r", "free") == 1
        self.late = np.zeros(ts.size, bool)
        for idx in self.batches:
            late = self.store.add(self._cols(idx))
            self.late[idx] = late

    def _cols(self, idx) -> EventColumns:
        return _columns(self.channel[idx], self.ts[idx], self.status[idx], self.latency[idx],
                        self.checked[idx], self.missing[idx])

    def in_slots(self, ch: int, lo_slot: int, hi_slot: int) -> np.ndarray:
        slot = self.ts // SHORT_SLOT_MS
        return (self.channel == ch) & (slot >= lo_slot) & (slot < hi_slot)


@pytest.fixture(scope="module")
def data() -> Data:
    return Data()


def test_nothing_late_when_fed_in_order(data):
    assert not data.late.any()
    assert data.store.watermark_ms == int(data.ts.max())
    for ch in (0, 1):
        assert data.store.last_ts_ms[ch] == data.ts[data.channel == ch].max()


def _last_slot_offsets(data) -> list[int]:
    # A 30-slot ring serves exact 5 min windows only for a `now` in or after the
    # newest event's slot (older slots of the window were recycled for newer ones).
    mx = int(data.ts.max())
    return [0, -(mx % SHORT_SLOT_MS) + 1, 1, 4_321, 10_000, 25_000, 70_005]


@pytest.mark.parametrize("k", range(7))
def test_view_windows_exact(data, k):
    now = int(data.ts.max()) + _last_slot_offsets(data)[k]
    v = data.store.view(now)
    hi = -(-now // SHORT_SLOT_MS)
    for ch in (0, 1):
        w5 = data.in_slots(ch, hi - 30, hi)
        w1 = data.in_slots(ch, hi - 6, hi)
        s5, s1 = data.status[w5], data.status[w1]
        judged5 = np.isin(s5, ["ok", "error", "timeout", "rate_limited"])
        fail5 = np.isin(s5, ["error", "timeout", "rate_limited"])
        assert v.judged_5m[ch] == judged5.sum()
        assert v.failures_5m[ch] == fail5.sum()
        assert v.judged_1m[ch] == np.isin(s1, ["ok", "error", "timeout", "rate_limited"]).sum()
        assert v.failures_1m[ch] == np.isin(s1, ["error", "timeout", "rate_limited"]).sum()
        assert v.ok_5m[ch] == (s5 == "ok").sum()
        assert v.rate_limited_5m[ch] == (s5 == "rate_limited").sum()
        assert v.checked_5m[ch] == data.checked[w5].sum()
        assert v.missing_5m[ch] == data.missing[w5].sum()
        # Latency histograms have 30 s slots: the window is their whole slots from the first one that
        # starts in the 5 min (the same events for a round's `now`, a multiple of 30 s).
        per = LAT_SLOT_MS // SHORT_SLOT_MS
        wl = data.in_slots(ch, -(-(hi - 30) // per) * per, -(-hi // per) * per)
        ok_lat = data.latency[wl & (data.status == "ok")]
        assert v.n_latency_5m[ch] == ok_lat.size
        if ok_lat.size:
            exact = float(np.quantile(ok_lat, 0.95, method="lower"))
            assert abs(v.p95_ms[ch] - exact) <= TOL * exact
        else:
            assert math.isnan(v.p95_ms[ch])


def test_aligned_now_is_exactly_last_five_minutes(data):
    """Fed every event before an aligned ``now``: the windows are exactly [now - 5 min, now)."""
    now = int(data.ts.max()) // SHORT_SLOT_MS * SHORT_SLOT_MS - 20 * 60_000
    store = _store()
    store.channel_index("a", "r", "paid")
    store.channel_index("b", "r", "free")
    sel = np.flatnonzero(data.ts < now)
    store.add(data._cols(sel))
    v = store.view(now)
    for ch in (0, 1):
        w = (data.channel == ch) & (data.ts >= now - 300_000) & (data.ts < now)
        ok = w & (data.status == "ok")
        assert v.ok_5m[ch] == ok.sum()
        exact = float(np.quantile(data.latency[ok], 0.95, method="lower"))
        assert abs(v.p95_ms[ch] - exact) <= TOL * exact
        w1 = (data.channel == ch) & (data.ts >= now - 60_000) & (data.ts < now)
        assert v.judged_1m[ch] == (w1 & np.isin(data.status, ["ok", "error", "timeout", "rate_limited"])).sum()
        assert v.failures_1m[ch] == (w1 & np.isin(data.status, ["error", "timeout", "rate_limited"])).sum()


def test_baseline_is_complete_hours_before_current_hour(data):
    now = int(data.ts.max())
    hour = now // BASE_SLOT_MS
    v = data.store.view(now)
    ts_hour = data.ts // BASE_SLOT_MS
    assert hour - ts_hour.min() == 3  # T0 unaligned: 4 hour slots touched, 3 before the current
    for ch in (0, 1):
        base = (data.channel == ch) & (ts_hour < hour) & (ts_hour >= hour - 24)
        ok = base & (data.status == "ok")
        assert v.base_hours[ch] == 3
        assert v.base_n[ch] == ok.sum()
        exact = float(np.quantile(data.latency[ok], 0.95, method="lower"))
        assert abs(v.base_p95_ms[ch] - exact) <= TOL * exact
        # the current hour is not part of it
        cur = (data.channel == ch) & (ts_hour == hour) & (data.status == "ok")
        assert cur.sum() > 0


def test_baseline_with_fresh_store_each_hour(data):
    """Querying at an earlier hour (fresh store fed up to then) gives that hour's baseline."""
    cut_hour = int(data.ts.min()) // HOUR + 2
    cut = cut_hour * HOUR + 1
    store = _store()
    store.channel_index("a", "r", "paid")
    store.channel_index("b", "r", "free")
    sel = np.flatnonzero(data.ts < cut)
    store.add(data._cols(sel))
    v = store.view(cut)
    ts_hour = data.ts // HOUR
    ok = (data.channel == 0) & (ts_hour < cut_hour) & (data.status == "ok")
    assert v.base_hours[0] == 2
    assert v.base_n[0] == ok.sum()
    exact = float(np.quantile(data.latency[ok], 0.95, method="lower"))
    assert abs(v.base_p95_ms[0] - exact) <= TOL * exact


def test_no_baseline_in_first_hour():
    store = _store()
    store.channel_index("a", "r", None)
    t = np.arange(100) * 1_000 + (T0 // HOUR) * HOUR + 10 * HOUR
    store.add(_columns(np.zeros(100), t, ["ok"] * 100, np.full(100, 50.0), np.zeros(100), np.zeros(100)))
    v = store.view(int(t[-1]))
    assert v.base_hours[0] == 0 and v.base_n[0] == 0 and math.isnan(v.base_p95_ms[0])
    assert v.n_latency_5m[0] == 100 - (t < t[-1] // 10_000 * 10_000 + 10_000 - 300_000).sum()


def test_base_hours_near_epoch_counts_only_hours_with_data():
    store = _store()
    store.channel_index("a", "r", None)
    t = np.arange(100) * 1_000 + 10 * HOUR
    store.add(_columns(np.zeros(100), t, ["ok"] * 100, np.full(100, 50.0), np.zeros(100), np.zeros(100)))
    assert store.view(int(t[-1])).base_hours[0] == 0  # actual: 24


def test_baseline_drops_hours_older_than_24():
    store = _store()
    store.channel_index("a", "r", None)
    # one event (latency = hour number + 1) in each of 30 hours
    hours = np.arange(30)
    t = hours * HOUR + 1_000 + 100 * HOUR
    store.add(_columns(np.zeros(30), t, ["ok"] * 30, (hours + 1) * 100.0, np.zeros(30), np.zeros(30)))
    v = store.view(129 * HOUR + 5_000)
    assert v.base_hours[0] == 24 and v.base_n[0] == 24  # hours 5..28
    exact = float(np.quantile((np.arange(5, 29) + 1) * 100.0, 0.95, method="lower"))
    assert abs(v.base_p95_ms[0] - exact) <= TOL * exact


@pytest.mark.parametrize("since_offset", [0, 1, 9_999, 10_000, 45_000, 61_234, 200_000, 400_000])
def test_since_restricts_windows(data, since_offset):
    now = int(data.ts.max())
    hi = -(-now // SHORT_SLOT_MS)
    since = np.array([now - since_offset, np.iinfo(np.int64).min // 2], dtype=np.int64)
    v = data.store.view(now, since_ms=since)
    since_slot = -(-int(since[0]) // SHORT_SLOT_MS)  # rounded up to a slot
    for ch, lo5, lo1 in ((0, max(hi - 30, since_slot), max(hi - 6, since_slot)), (1, hi - 30, hi - 6)):
        w5, w1 = data.in_slots(ch, lo5, hi), data.in_slots(ch, lo1, hi)
        judged = np.isin(data.status, ["ok", "error", "timeout", "rate_limited"])
        fails = np.isin(data.status, ["error", "timeout", "rate_limited"])
        assert v.judged_5m[ch] == (w5 & judged).sum()
        assert v.failures_5m[ch] == (w5 & fails).sum()
        assert v.judged_1m[ch] == (w1 & judged).sum()
        assert v.failures_1m[ch] == (w1 & fails).sum()
        per = LAT_SLOT_MS // SHORT_SLOT_MS  # latency: whole 30 s slots from the first starting in the window
        wl = data.in_slots(ch, -(-lo5 // per) * per, -(-hi // per) * per)
        assert v.n_latency_5m[ch] == (wl & (data.status == "ok")).sum()
    # since entirely in the future: empty windows, NaN P95
    v = data.store.view(now, since_ms=np.array([now + 20_000, now + 20_000]))
    assert v.judged_5m.tolist() == [0.0, 0.0] and v.judged_1m.tolist() == [0.0, 0.0]
    assert np.isnan(v.p95_ms).all()


def test_min_latency_gives_nan(data):
    now = int(data.ts.max())
    lat = data.store.extensions["latency_p95_ratio"]
    lat.min_latency = 10**9
    try:
        v = data.store.view(now)
    finally:
        lat.min_latency = 1
    assert np.isnan(v.p95_ms).all()
    assert (v.n_latency_5m > 0).all()


def test_min_baseline_is_honoured_on_second_call():
    store = _store()
    store.channel_index("a", "r", None)
    t = np.arange(0, 2 * HOUR, 10_000) + 5
    n = t.size
    store.add(_columns(np.zeros(n), t, ["ok"] * n, np.full(n, 100.0), np.zeros(n), np.zeros(n)))
    now = int(t[-1])
    assert not math.isnan(store.view(now).base_p95_ms[0])
    store.extensions["latency_p95_ratio"].min_baseline = 10**9
    assert math.isnan(store.view(now).base_p95_ms[0])


def test_run_in_view_and_rate_limited_is_failure():
    store = _store()
    store.channel_index("a", "r", None)
    st = ["ok", "error", "cancelled", "timeout", "filtered", "rate_limited"]
    t = 1_000_000 + np.arange(6) * 100
    late = store.add(_columns(np.zeros(6), t, st, np.full(6, 10.0), np.zeros(6), np.zeros(6)))
    runs = store.extensions["consecutive_failures"]
    assert not late.any() and runs.groups.tolist() == [0] and runs.max_run.tolist() == [3]
    v = store.view(int(t[-1]))
    assert v.run.tolist() == [3.0]
    assert v.judged_5m[0] == 4 and v.failures_5m[0] == 3 and v.rate_limited_5m[0] == 1 and v.ok_5m[0] == 1


def test_missing_counted_only_for_checked_ok():
    store = _store()
    store.channel_index("a", "r", None)
    st = ["ok", "ok", "ok", "error", "ok"]
    checked = [True, True, False, True, True]
    missing = [True, False, True, True, True]
    t = 50_000 + np.arange(5)
    store.add(_columns(np.zeros(5), t, st, np.full(5, 10.0), checked, missing))
    v = store.view(60_000)
    assert v.checked_5m[0] == 3 and v.missing_5m[0] == 2


def test_many_channels_grow_capacity():
    store = _store()
    n_ch = 40
    for i in range(n_ch):
        assert store.channel_index(f"c{i}", "r", None) == i
    assert store.channel_index("c3", "r2", "free") == 3 and store.routes[3] == "r2" and store.tiers[3] == "free"
    assert store.channel_index("c3", "r2", None) == 3 and store.tiers[3] == "free"
    ch = np.repeat(np.arange(n_ch), np.arange(n_ch) + 1)
    t = 100_000 + np.arange(ch.size)
    store.add(_columns(ch, t, ["ok"] * ch.size, np.full(ch.size, 10.0), np.zeros(ch.size), np.zeros(ch.size)))
    v = store.view(int(t[-1]))
    assert v.judged_5m.tolist() == list(map(float, np.arange(n_ch) + 1))
    assert v.p95_ms.shape == (n_ch,)


def test_snapshot_roundtrip(data):
    now = int(data.ts.max())
    fresh = _store()
    fresh.load(data.store.state())
    a, b = data.store.view(now), fresh.view(now)
    for f in ("judged_5m", "failures_1m", "p95_ms", "base_p95_ms", "base_n", "run"):
        np.testing.assert_array_equal(getattr(a, f), getattr(b, f))
    assert fresh.channel_index("b", "r", "free") == 1


def test_window_lengths_validated():
    with pytest.raises(ValueError):
        WindowStore(window_ms=305_000)
    with pytest.raises(ValueError):
        WindowStore(window_ms=60_000, short_window_ms=120_000)


# --- IntervalRing ------------------------------------------------------------

def _ring() -> IntervalRing:
    return IntervalRing(SHORT_SLOT_MS, 30, 1, 0, capacity=2)


def _busy_ring(newest: int) -> IntervalRing:
    """A ring whose channel 0 had traffic in each of the 30 slots up to ``newest``."""
    r = _ring()
    t = newest - np.arange(30) * SHORT_SLOT_MS
    assert not r.add(np.zeros(30), t, np.ones((30, 1), np.float32)).any()
    return r


def test_ring_too_old_more_than_five_minutes_behind_newest():
    newest = 10_000_000 + 4_321
    r = _busy_ring(newest)
    probes = np.array([newest - 300_001, newest - 310_000, newest - 3_600_000, newest - 299_999 - 10_000,
                       newest - 289_999, newest - 1, newest])
    too_old = r.add(np.zeros(probes.size), probes, np.ones((probes.size, 1), np.float32))
    slot_gap = newest // SHORT_SLOT_MS - probes // SHORT_SLOT_MS
    assert too_old.tolist() == (slot_gap >= 30).tolist()
    assert too_old.tolist() == [True, True, True, True, False, False, False]
    assert r.sum_counts(r.window_mask(0, 10**12)).tolist() == [[33.0], [0.0]]


@pytest.mark.parametrize("gap_ms", [0, 1, 150_000, 289_999, 299_999, 300_000, 300_001, 310_000, 10**7])
def test_ring_gap_rule_busy_channel(gap_ms):
    """Anything more than 5 min older than the channel's newest is too old; < 290 s always fits."""
    rng = np.random.default_rng(gap_ms)
    for newest in rng.integers(10**9, 2 * 10**9, 20):
        r = _busy_ring(int(newest))
        old = r.add(np.array([0]), np.array([newest - gap_ms]), np.ones((1, 1), np.float32))[0]
        if gap_ms > 300_000:
            assert old
        elif gap_ms < 290_000:
            assert not old
        else:
            assert old == (newest // 10_000 - (newest - gap_ms) // 10_000 >= 30)


@pytest.mark.parametrize("gap_ms", [310_000, 3_610_000, 10**7])
def test_ring_gap_rule_sparse_channel(gap_ms):
    r = _ring()
    newest = 1_000_000_000 + 4_321
    r.add(np.array([0]), np.array([newest]), np.ones((1, 1), np.float32))
    old = r.add(np.array([0]), np.array([newest - gap_ms]), np.ones((1, 1), np.float32))[0]
    assert old  # actual: False (counted nowhere, not reported)


def test_ring_old_and_new_in_same_batch_and_channels_independent():
    r = _ring()
    t = np.array([1_000_000, 1_000_000 + 300_000, 1_000_000])  # first two share a ring position
    ch = np.array([0, 0, 1])
    old = r.add(ch, t, np.ones((3, 1), np.float32))
    assert old.tolist() == [True, False, False]
    m = r.window_mask(0, 10**12)
    assert r.sum_counts(m).tolist() == [[1.0], [1.0]]


def test_ring_eviction_resets_position():
    r = IntervalRing(SHORT_SLOT_MS, 30, 1, 4, capacity=1)
    r.add(np.array([0, 0]), np.array([5_000, 5_001]), np.ones((2, 1), np.float32), np.array([True, True]),
          np.array([2, 3]))
    r.add(np.array([0]), np.array([305_000]), np.full((1, 1), 5.0, np.float32), np.array([True]), np.array([1]))
    assert r.slot_id[0, 0] == 30
    assert r.counts[0, 0].tolist() == [5.0]
    assert r.hist[0, 0].tolist() == [0.0, 1.0, 0.0, 0.0]
    assert r.sum_counts(r.window_mask(0, 30)).tolist() == [[0.0]]  # slot 0 is gone
    assert r.sum_counts(r.window_mask(30, 31)).tolist() == [[5.0]]


def test_ring_window_mask_per_channel_lo():
    r = IntervalRing(SHORT_SLOT_MS, 30, 1, 0, capacity=2)
    t = np.arange(10) * 10_000
    r.add(np.r_[np.zeros(10), np.ones(10)], np.r_[t, t], np.ones((20, 1), np.float32))
    m = r.window_mask(np.array([3, 7]), 9)
    assert r.sum_counts(m).tolist() == [[6.0], [2.0]]


@pytest.mark.parametrize("args", [(0, 30, 1, 1), (10, 0, 1, 1), (10, 3, -1, 1), (10, 3, 1, -1)])
def test_ring_validation(args):
    with pytest.raises(ValueError):
        IntervalRing(*args)


def test_ring_load_rejects_shape_mismatch():
    r = _ring()
    with pytest.raises(ValueError):
        r.load(IntervalRing(SHORT_SLOT_MS, 31, 1, 0).state())


def test_reserve_allocates_once_for_the_channels_to_come():
    store = _store()
    store.reserve(300)
    lat, runs = store.extensions["latency_p95_ratio"], store.extensions["consecutive_failures"]
    arrays = (store.short.counts, lat.base.hist, runs.tracker.trailing, store.last_ts_ms)
    assert store.short.capacity == lat.base.capacity == 300 and store.last_ts_ms.shape[0] >= 300
    for i in range(300):
        store.channel_index(f"p/m{i}", "chat", None)
    assert all(a is b for a, b in zip(arrays, (store.short.counts, lat.base.hist, runs.tracker.trailing,
                                               store.last_ts_ms)))  # no copy while registering them
    assert store.n_channels == 300 and store.short.capacity == 300


def test_route_members_follow_new_channels_and_route_moves():
    store = _store()
    for name, route in (("a", "chat"), ("b", "chat"), ("c", "code")):
        store.channel_index(name, route, None)
    assert store.route_members() == {"chat": [0, 1], "code": [2]}
    store.channel_indices(["b"], ["code"], [None])  # b's events now name another route
    assert store.route_members() == {"chat": [0], "code": [1, 2]}
    store.channel_index("d", "chat", None)
    assert store.route_members() == {"chat": [0, 3], "code": [1, 2]}
