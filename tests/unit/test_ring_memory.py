"""A ring's resident memory grows with the intervals its channels wrote (issue #34 part 1).

The counters and histograms are stored slot-major (:mod:`pipeline.windows.ring`): a channel that wrote
one interval holds one cell of ``n_buckets * 4`` bytes, next to the other channels' cells of that ring
position, instead of a 4 KiB page of its own row (the row-major layout before: a one-event channel
wrote one page of each latency ring, docs/MEMORY.md). Bytes are counted as 4 KiB pages holding a
non-zero byte (:func:`~pipeline.tools.bench.channel_memory.written_bytes`: Linux makes an anonymous
page resident on its first write, mmap(2)); figures for the latency signal's 1 h ring, 25 slots of
336 buckets (``base.hist``: 33,600 B per channel allocated).
"""

from __future__ import annotations

import numpy as np

from pipeline.tools.bench.channel_memory import PAGE, arrays, owners, written_bytes
from pipeline.windows.ring import IntervalRing

HOUR_MS = 3_600_000
T0 = 1_780_000_000_000 - 1_780_000_000_000 % HOUR_MS
N = 2_048
BUCKETS = 336


def _cells_written(ring: IntervalRing) -> int:
    """Written bytes of the ring's float cells (the slot-major arrays; ``slot_id`` left out)."""
    return sum(written_bytes(a) for a in owners(arrays(ring)) if a.dtype == np.float32)


def _one_event_each(ring: IntervalRing, ts_ms: np.ndarray) -> None:
    ch = np.arange(N, dtype=np.int64)
    ring.add(ch, ts_ms, hist_mask=np.ones(N, bool), hist_key=(ch * 7) % BUCKETS)


def test_one_event_channels_write_one_cell_each_not_a_page() -> None:
    ring = IntervalRing(HOUR_MS, 25, 0, BUCKETS, capacity=N)
    _one_event_each(ring, np.full(N, T0 + 5))
    # 2,048 cells of 1,344 B side by side: exactly 672 pages (the row-major layout wrote 2,048 pages).
    assert _cells_written(ring) == N * BUCKETS * 4 == 672 * PAGE
    assert ring.hist.sum() == N and ring.hist[:, T0 // HOUR_MS % 25].sum(axis=1).tolist() == [1.0] * N


def test_growing_and_clearing_keep_only_written_cells_resident() -> None:
    ring = IntervalRing(HOUR_MS, 25, 0, BUCKETS, capacity=16)
    ring.ensure_capacity(N)  # doubling copies only the held cells: nothing written yet
    assert _cells_written(ring) == 0
    # The first half of the channels in one hour, the second in the next: each half's cells are one run
    # of pages of their ring position (a page is shared by the cells of ~3 neighbouring channels: had
    # neighbours alternated hours, every page of both positions would hold a written cell).
    ts = np.where(np.arange(N) < N // 2, T0 + 5, T0 + HOUR_MS + 5)
    _one_event_each(ring, ts)
    written = _cells_written(ring)
    assert written <= N * BUCKETS * 4 + 2 * PAGE
    ring.ensure_capacity(2 * N)
    assert _cells_written(ring) == written
    ring.clear_rows(np.arange(N - 1))
    assert _cells_written(ring) == PAGE and ring.hist[N - 1].sum() == 1.0  # the last channel's cell stays
    ring.clear_rows([N - 1])
    assert _cells_written(ring) == 0 and (ring.slot_id == -1).all()


def test_clearing_busy_channels_hands_their_pages_back_to_the_os() -> None:
    """Linux: ``clear_rows`` drops the pages left all zero (``madvise(MADV_DONTNEED)``), so evicting busy
    channels shrinks the process (RSS, psutil) by their cells: 2,048 channels × 25 × 1,344 B = 68.8 MB."""
    import sys

    import psutil
    import pytest

    if not sys.platform.startswith("linux"):
        pytest.skip("page release is Linux madvise(2)")
    proc = psutil.Process()
    ring = IntervalRing(HOUR_MS, 25, 0, BUCKETS, capacity=N)
    for h in range(25):
        _one_event_each(ring, np.full(N, T0 + h * HOUR_MS + 5))
    assert _cells_written(ring) == 25 * N * BUCKETS * 4
    full = proc.memory_info().rss
    ring.clear_rows(np.arange(N))
    assert full - proc.memory_info().rss >= 0.9 * 25 * N * BUCKETS * 4
    assert _cells_written(ring) == 0


def test_restoring_a_row_writes_only_the_cells_holding_data() -> None:
    """``assign_cells`` (a snapshot's row restored, ``RingWindows.import_row``): the plain assignment's bits
    (a -0.0 included), but a one-cell row written into an empty channel makes one cell resident, not a
    page in each of the 25 planes (~25 pages of 4 KiB for 2,048 such restores before: 200 MB at 20,000)."""
    from pipeline.windows.ring import assign_cells

    ring = IntervalRing(HOUR_MS, 25, 0, BUCKETS, capacity=N)
    row = np.zeros((25, BUCKETS), np.float32)
    row[3, 7], row[9, 1] = 2.0, -0.0  # a cell holding only -0.0 is written too (its bytes are not zero)
    for c in range(N):
        assign_cells(ring.hist[c], row)
    assert _cells_written(ring) == 2 * N * BUCKETS * 4  # planes 3 and 9 only: 2 x 672 pages
    assert np.array_equal(ring.hist[N - 1].view(np.uint32), row.view(np.uint32))
    busy = np.arange(25 * BUCKETS, dtype=np.float32).reshape(25, BUCKETS)
    assign_cells(ring.hist[0], busy)
    assert np.array_equal(ring.hist[0], busy)
    assign_cells(ring.hist[0], np.zeros((25, BUCKETS)))  # old data overwritten with zeros
    assert not ring.hist[0].any()
