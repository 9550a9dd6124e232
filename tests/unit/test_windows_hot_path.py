"""The signals' windows and the short ring hold what the code before the hot-path work wrote, bit for bit.

Issue #15: the windows now hand IntervalRing.add per-counter columns (no (n, k) matrix), the
slow_stream windows give each stream's TTFT / gap / stall-class buckets as one event (they were
three concatenated events) and the cost windows convert their counters to float32 once. Each test
feeds the same seeded batches (many channels, late events, slot roll-over, absent fields) to the
windows and to rings fed the previous way (the ``add`` code of commit 34362c7 over
:func:`test_ring_add.reference_add`), and compares every array bitwise after each batch.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from pipeline.signals.cost import CostWindows, cost_rows
from pipeline.signals.latency_p95_ratio import LatencyWindows
from pipeline.stats import CusumDesign
from pipeline.windows.cusum import BernoulliCusum
from pipeline.windows.extension import WindowSpec
from pipeline.windows.features import EventColumns
from pipeline.signals.quota import QUOTA_SLOT_MS, QuotaWindows
from pipeline.windows.ring import IntervalRing
from pipeline.windows.store import WindowStore
from pipeline.signals.slow_stream import BASE_SLOT_MS, STREAM_BUCKETS, StreamWindows, stall_classes

from test_ring_add import _assert_same, _row_major, reference_add

T0 = 1_767_000_000_000


def _batches(seed: int, n_channels: int = 200, n_batches: int = 30):
    """EventColumns with every optional column cached: ~30 s of event time per 10 batches, 10 % late
    events (up to 2 h), a few channels 40 min ahead, fields present on a random share of events."""
    rng = np.random.default_rng(seed)
    clock = T0
    ahead = np.zeros(n_channels, np.int64)
    for _ in range(n_batches):
        n = int(rng.choice([1, 5, 16, 300, 2000]))
        clock += int(rng.integers(0, 8_000))
        if rng.random() < 0.1:
            ahead[rng.integers(0, n_channels)] += 2_400_000
        ch = rng.integers(0, n_channels, n)
        ts = clock + ahead[ch] + rng.integers(0, 3_000, n)
        late = rng.random(n) < 0.1
        ts[late] -= rng.integers(0, 7_200_000, int(late.sum()))
        status = rng.choice(4, n, p=[0.85, 0.05, 0.05, 0.05])  # ok, error, rate_limited, cancelled
        ok = status == 0
        outcome = np.where(ok, 0, np.where(status == 3, -1, 1)).astype(np.int8)
        checked = rng.random(n) < 0.3

        def some(values: np.ndarray, share: float) -> np.ndarray:
            return np.where(rng.random(n) < share, values, np.nan)

        cols = EventColumns(ch.astype(np.int64), ts.astype(np.int64), outcome, ok, rng.gamma(2.0, 400.0, n),
                            checked, checked & (rng.random(n) < 0.1), status == 2)
        cols._cache.update(
            ttft_ms=some(rng.gamma(2.0, 2_000.0, n), rng.choice([0.0, 0.7, 1.0])),
            max_stream_gap_ms=some(rng.gamma(2.0, 2_500.0, n), rng.choice([0.0, 0.5])),
            cancelled=status == 3,
            cost_usd=some(rng.gamma(2.0, 1e-3, n) * rng.choice([1.0, 0.0], n, p=[0.9, 0.1]), 0.8),
            output_tokens=some(rng.integers(0, 900, n).astype(np.float64), 0.7),
            quota_remaining=some(rng.random(n), rng.choice([0.0, 0.3])),
        )
        yield cols, rng.random(n) < 0.05


class RefRing(SimpleNamespace):
    """A ring with row-major arrays (:func:`test_ring_add._row_major`, the layout before the slot-major
    cells of issue #34) written by the previous ``add`` (commit 34362c7)."""

    add = reference_add


def _twin(ring: IntervalRing) -> RefRing:
    return RefRing(**vars(_row_major(ring.slot_ms, ring.n_slots, ring.n_counters, ring.n_buckets, ring.capacity)))


# The previous add of each windows class, verbatim but for the ring argument names.

def _old_stream_add(w: StreamWindows, rings: dict, cols: EventColumns) -> None:
    judged, cls = stall_classes(cols)
    if not judged.any():
        return
    ttft, gap = cols.column("ttft_ms"), cols.column("max_stream_gap_ms")
    it = np.flatnonzero(cols.ok & ~np.isnan(ttft))
    ig = np.flatnonzero(cols.ok & ~np.isnan(gap))
    ic = np.flatnonzero(judged)
    ch, ts = cols.channel, cols.ts_ms
    b = STREAM_BUCKETS
    chan = np.concatenate([ch[it], ch[ig], ch[ic]])
    tss = np.concatenate([ts[it], ts[ig], ts[ic]])
    keys = np.concatenate([b.key_of(ttft[it]), b.key_of(gap[ig]) + w.k, cls[ic] + 2 * w.k])
    rings["short"].add(chan, tss, None, np.ones(chan.shape[0], bool), keys)
    nb = it.shape[0] + ig.shape[0]
    rings["base"].add(chan[:nb], tss[:nb], None, np.ones(nb, bool), keys[:nb])
    assert BASE_SLOT_MS == 3_600_000


def _old_cost_add(rings: dict, cols: EventColumns, late: np.ndarray) -> None:
    cost = cols.column("cost_usd")
    with np.errstate(invalid="ignore"):
        keep = (cost > 0.0) & np.isfinite(cost) & ~np.asarray(late, bool)
    if not keep.any():
        return
    rows = cost_rows(cost[keep], cols.column("output_tokens")[keep])
    for ring in rings.values():
        ring.add(cols.channel[keep], cols.ts_ms[keep], rows)


def _old_quota_add(rings: dict, cols: EventColumns) -> None:
    q = cols.column("quota_remaining")
    has = ~np.isnan(q)
    sel = has | cols.rate_limited
    if not sel.any():
        return
    q, has, ts = q[sel], has[sel], cols.ts_ms[sel]
    rows = np.zeros((q.shape[0], 5))
    rows[:, 0] = np.where(has, np.clip(q, 0.0, 1.0), 0.0)
    rows[:, 1] = has
    rows[:, 2] = np.where(has, (ts % QUOTA_SLOT_MS) / 1000.0, 0.0)
    rows[:, 3] = cols.rate_limited[sel]
    rows[:, 4] = 1.0
    rings["minute"].add(cols.channel[sel], ts, rows)


def _old_short_rows(cols: EventColumns) -> np.ndarray:
    rows = np.zeros((len(cols), 7), dtype=np.float32)
    rows[:, 0] = cols.outcome >= 0
    rows[:, 1] = cols.outcome == 1
    rows[:, 2] = cols.ok
    rows[:, 3] = cols.outcome < 0
    rows[:, 4] = cols.checked & cols.ok
    rows[:, 5] = cols.missing & cols.checked & cols.ok
    rows[:, 6] = cols.rate_limited
    return rows


@pytest.mark.parametrize("seed", range(3))
def test_signal_windows_equal_previous_feeding(seed):
    spec = WindowSpec()
    stream, cost, quota = StreamWindows(spec), CostWindows(spec), QuotaWindows(spec)
    cusum = BernoulliCusum(spec, "error_rate", "error", CusumDesign(p_floor=0.001, shift=0.01),
                           lambda c: c.outcome >= 0, lambda c: c.outcome == 1)
    for w in (stream, cost, quota, cusum):
        w.ensure_capacity(200)
    twins = {id(w): {k: _twin(r) for k, r in w.rings.items()} for w in (stream, cost, quota, cusum)}
    for cols, late in _batches(seed):
        for w in (stream, cost, quota, cusum):
            w.add(cols, late)
        _old_stream_add(stream, twins[id(stream)], cols)
        _old_cost_add(twins[id(cost)], cols, late)
        _old_quota_add(twins[id(quota)], cols)
        trials = cols.outcome >= 0
        rows = np.empty((len(cols), 2), np.float32)
        rows[:, 0], rows[:, 1] = trials, (cols.outcome == 1) & trials
        twins[id(cusum)]["slots"].add(cols.channel, cols.ts_ms, rows)
        for w in (stream, cost, quota, cusum):
            for key, ring in w.rings.items():
                _assert_same(ring, twins[id(w)][key])


@pytest.mark.parametrize("seed", range(3))
def test_store_rings_equal_previous_feeding(seed):
    store = WindowStore(windows=(LatencyWindows,))
    latency = store.extensions["latency_p95_ratio"]
    for i in range(200):
        store.channel_index(f"c{i}", "r", None)
    short, lat, base = _twin(store.short), _twin(latency.short), _twin(latency.base)
    for cols, _ in _batches(seed):
        late = store.add(cols)
        key = latency.buckets.key_of(cols.latency_ms)
        want = short.add(cols.channel, cols.ts_ms, _old_short_rows(cols))
        lat.add(cols.channel, cols.ts_ms, None, cols.ok & ~want, key)
        base.add(cols.channel, cols.ts_ms, None, cols.ok, key)
        assert late.tolist() == want.tolist()
        for new, ref in ((store.short, short), (latency.short, lat), (latency.base, base)):
            _assert_same(new, ref)
