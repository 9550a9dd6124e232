"""IntervalRing.add equals the implementation it replaced (issue #15 hot path), bit for bit.

The reference below is ``IntervalRing.add`` as of commit 34362c7 (before the hot-path work):
a full copy of the slot ids with ``np.maximum.at`` for evictions, a per-channel max for the
too-old rule, ``np.add.at`` of every counter increment and ``np.unique`` counts for histograms.
The new path (eviction only where an event opens an interval, one ring-wide max, zero
increments skipped, ``np.add.at`` for histograms) must give the same too-old mask and the
same ``slot_id`` / ``counts`` / ``hist`` bits on seeded random batches: many channels, late
events up to twice the ring's span, channels far ahead of the others (stale positions),
slot roll-over inside a batch, batch sizes from 1 to 4,000, counters with zeros and
fractions, histogram masks.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from pipeline.windows.ring import IntervalRing


def reference_add(ring: SimpleNamespace, channel, ts_ms, counter_rows=None, hist_mask=None, hist_key=None):
    """``IntervalRing.add`` before the hot-path work (commit 34362c7), verbatim but for ``self``."""
    self = ring
    channel = np.asarray(channel, dtype=np.int64)
    if channel.shape[0] == 0:
        return np.zeros(0, bool)
    slot = np.asarray(ts_ms, dtype=np.int64) // self.slot_ms
    flat = channel * self.n_slots + slot % self.n_slots
    ids = self.slot_id.reshape(-1)
    if flat.shape[0] * 8 < ids.shape[0]:
        cells, inverse = np.unique(flat, return_inverse=True)
        held = ids[cells]
        newest = held.copy()
        np.maximum.at(newest, inverse, slot)
        moved = newest != held
        evict, evict_to = cells[moved], newest[moved]
    else:
        newest = ids.copy()
        np.maximum.at(newest, flat, slot)
        evict = np.nonzero(newest != ids)[0]
        evict_to = newest[evict]
    if evict.size:
        if self.n_counters:
            self.counts.reshape(-1, self.n_counters)[evict] = 0.0
        if self.n_buckets:
            self.hist.reshape(-1, self.n_buckets)[evict] = 0.0
        ids[evict] = evict_to
    fits = slot == ids[flat]
    top = int(channel.max()) + 1
    if top <= channel.shape[0]:
        newest_slot = self.slot_id[:top].max(axis=1)[channel]
    else:
        newest_slot = self.slot_id[channel].max(axis=1)
    fits &= slot > newest_slot - self.n_slots
    if counter_rows is not None and self.n_counters:
        k = self.n_counters
        cells = (flat[fits][:, None] * k + np.arange(k)).reshape(-1)
        np.add.at(np.reshape(self.counts, -1, copy=False), cells,
                  np.asarray(counter_rows, np.float32)[fits].reshape(-1))
    if hist_mask is not None and self.n_buckets:
        sel = fits & hist_mask
        cells, times = np.unique(flat[sel] * self.n_buckets + hist_key[sel], return_counts=True)
        np.reshape(self.hist, -1, copy=False)[cells] += times
    return ~fits


def _row_major(slot_ms: int, n_slots: int, n_counters: int, n_buckets: int, capacity: int) -> SimpleNamespace:
    """The reference's ring: the arrays C-contiguous (channel, slot, k), as ``IntervalRing`` kept them
    before its slot-major cells (issue #34), so the comparison checks the layout change too."""
    return SimpleNamespace(slot_ms=slot_ms, n_slots=n_slots, n_counters=n_counters, n_buckets=n_buckets,
                           slot_id=np.full((capacity, n_slots), -1, np.int64),
                           counts=np.zeros((capacity, n_slots, n_counters), np.float32),
                           hist=np.zeros((capacity, n_slots, n_buckets), np.float32))


def _bits(a: np.ndarray) -> np.ndarray:
    return a.view(np.uint32) if a.dtype == np.float32 else a


def _assert_same(new: IntervalRing, ref: SimpleNamespace) -> None:
    assert np.array_equal(new.slot_id, ref.slot_id)
    assert np.array_equal(_bits(new.counts), _bits(ref.counts))
    assert np.array_equal(_bits(new.hist), _bits(ref.hist))


def _batches(rng: np.random.Generator, ring: IntervalRing, n_channels: int, n_batches: int):
    """Batches ``(channel, ts_ms, rows, mask, key)`` of a clock moving ~1/3 slot per batch, with
    late events, a few channels running far ahead, and counters mixing 0/1 and fractions."""
    span = ring.slot_ms * ring.n_slots
    clock = 1_767_000_000_000 + int(rng.integers(0, ring.slot_ms))
    ahead = np.zeros(n_channels, np.int64)
    for _ in range(n_batches):
        n = int(rng.choice([1, 2, 3, 16, 32, 100, 1000, 4000]))
        clock += int(rng.integers(0, ring.slot_ms // 2 + 1))
        if rng.random() < 0.2:  # some channels jump ahead by up to two ring spans
            ahead[rng.integers(0, n_channels, 3)] += rng.integers(0, 2 * span, 3)
        ch = rng.integers(0, n_channels, n)
        ts = clock + ahead[ch] + rng.integers(0, ring.slot_ms // 3 + 1, n)
        late = rng.random(n) < 0.15
        ts[late] -= rng.integers(0, 2 * span, int(late.sum()))
        rows = None
        if ring.n_counters:
            rows = (rng.random((n, ring.n_counters)) < 0.3).astype(np.float64)
            frac = rng.random((n, ring.n_counters)) < 0.3
            rows[frac] = rng.normal(0.0, 3.0, int(frac.sum()))
        mask = rng.random(n) < 0.8 if ring.n_buckets else None
        key = rng.integers(0, ring.n_buckets, n) if ring.n_buckets else None
        yield ch, ts, rows, mask, key


RINGS = [(10_000, 30, 7, 0), (30_000, 10, 0, 20), (3_600_000, 25, 0, 20), (30_000, 21, 9, 0),
         (10_000, 12, 2, 0), (60_000, 32, 5, 3), (10_000, 1, 1, 1)]


def _as_given(rng: np.random.Generator, rows: np.ndarray | None):
    """The counter increments in one of the forms ``add`` takes: a matrix, float columns, or bool
    columns where the increments are 0/1."""
    if rows is None:
        return None
    form = rng.integers(0, 3)
    if form == 0:
        return rows
    if form == 2 and np.isin(rows, (0.0, 1.0)).all():
        return [c.astype(bool) for c in rows.T]
    return list(np.ascontiguousarray(rows.T))


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("shape", RINGS)
def test_add_equals_reference(shape, seed):
    rng = np.random.default_rng(seed)
    n_channels = int(rng.choice([5, 300, 1000]))
    new, ref = IntervalRing(*shape, capacity=n_channels), _row_major(*shape, capacity=n_channels)
    for ch, ts, rows, mask, key in _batches(rng, new, n_channels, 40):
        if rows is not None and rng.random() < 0.3:  # whole 0/1 columns, as the base counters
            rows = np.round(np.abs(rows)).clip(0, 1)
        slot = ts // new.slot_ms if rng.random() < 0.5 else None
        got = new.add(ch, ts, _as_given(rng, rows), mask, key, slot=slot)
        want = reference_add(ref, ch, ts, rows, mask, key)
        assert got.tolist() == want.tolist()
        _assert_same(new, ref)


@pytest.mark.parametrize("seed", range(4))
def test_several_keys_per_event_equal_concatenated_events(seed):
    """Keys (k1, k2, k3) with masks per event count as the reference counts three events each (the way
    the slow_stream windows fed their ring before)."""
    rng = np.random.default_rng(100 + seed)
    shape = (30_000, 10, 0, 30)
    new, ref = IntervalRing(*shape, capacity=400), _row_major(*shape, capacity=400)
    for ch, ts, _, _, _ in _batches(rng, new, 400, 40):
        n = ch.shape[0]
        keys = [rng.integers(10 * j, 10 * j + 10, n) for j in range(3)]
        masks = [rng.random(n) < p for p in (0.9, 0.2, 1.0)]
        masks[2] = np.ones(n, bool)  # every event counts at least once: it is in the reference batch
        got = new.add(ch, ts, hist_key=keys, hist_mask=masks)
        want = reference_add(ref, np.tile(ch, 3), np.tile(ts, 3), None, np.concatenate(masks),
                             np.concatenate(keys))
        assert got.tolist() == want[:n].tolist()
        _assert_same(new, ref)


def test_add_skips_zero_increments_exactly():
    """A zero increment adds nothing: a fractional cell keeps its exact bits."""
    r = IntervalRing(10_000, 3, 2, 0, capacity=1)
    r.add(np.array([0]), np.array([5]), np.array([[0.1, 0.0]]))
    r.add(np.array([0, 0]), np.array([6, 7]), np.array([[0.0, 0.0], [0.0, -0.0]]))
    assert r.counts[0, 0].tolist() == [np.float32(0.1), 0.0]
    assert np.signbit(r.counts[0, 0, 1]) == np.False_


@pytest.mark.parametrize("seed", range(3))
def test_dense_columns_in_several_scatters_equal_reference(seed, monkeypatch):
    """Dense float columns scattered as one (column, event) matrix per few events (``_SCATTER_EVENTS``
    set to 7, 64 and 8,192) and bool columns as one scatter of 1s: the reference's bits exactly."""
    import pipeline.windows.ring as ring_module

    rng = np.random.default_rng(200 + seed)
    monkeypatch.setattr(ring_module, "_SCATTER_EVENTS", int(rng.choice([7, 64, 8192])))
    shape = (30_000, 21, 9, 0)
    new, ref = IntervalRing(*shape, capacity=300), _row_major(*shape, capacity=300)
    for ch, ts, _, _, _ in _batches(rng, new, 300, 30):
        n = ch.shape[0]
        rows = rng.normal(0.0, 3.0, (n, 9)).astype(np.float32).astype(np.float64)  # dense fractions
        rows[:, 0] = rng.random(n) < 0.9  # 0/1 columns, given as bools below
        rows[:, 3] = rng.random(n) < 0.05
        rows[rng.random((n, 9)) < 0.1] = 0.0
        columns = [rows[:, j].astype(bool) if j in (0, 3) else rows[:, j].copy() for j in range(9)]
        got = new.add(ch, ts, columns)
        want = reference_add(ref, ch, ts, rows)
        assert got.tolist() == want.tolist()
        _assert_same(new, ref)
