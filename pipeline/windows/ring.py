"""Rings of per-interval counters and latency histograms, for all channels.

One :class:`IntervalRing` holds, per channel, ``n_slots`` intervals of
``slot_ms`` event time each: a counter vector and a latency histogram per
interval. A slot is identified by its absolute interval number
``ts_ms // slot_ms``; writing an event whose interval is newer than what a
ring position holds evicts the old interval (the ring rolls over in event
time, never in wall-clock time). Address space is fixed per channel:
``n_slots * (n_counters + n_buckets) * 4`` bytes; resident memory grows with
the intervals a channel has written. The counters and histograms are stored
slot-major (all channels' cells of one ring position side by side) and handed
out as (channel, slot, k) views: a channel that wrote one interval makes one
cell of ``n_counters * 4`` / ``n_buckets * 4`` bytes resident, sharing its
pages with the channels that wrote the same position (the OS maps a zeroed
page on first write), not a 4 KiB page of a row of its own (docs/MEMORY.md).

The store's ring (see :mod:`pipeline.windows.store`): 30 × 10 s counters
(the 1 min and 5 min windows of SPEC §4.1–4.4). The signals' windows keep
rings of their own (:mod:`pipeline.windows.extension`), e.g. the latency
signal's 10 × 30 s and 25 × 1 h histograms (the rolling 24 h baseline of
SPEC §4.3 plus the hour being filled).
"""

from __future__ import annotations

import ctypes
import mmap
import sys
from typing import Sequence

import numpy as np

#: Linux ``madvise(2)`` advice that drops private anonymous pages (they read back as zeros).
_MADV_DONTNEED = 4
#: Linux ``madvise(2)`` advice: no transparent huge pages for this range.
_MADV_NOHUGEPAGE = 15
_LIBC = ctypes.CDLL(None, use_errno=True) if sys.platform.startswith("linux") else None
_PAGE = mmap.PAGESIZE


def _madvise(a: np.ndarray, advice: int) -> tuple[int, int, bool]:
    """``madvise`` on the whole pages inside ``a``: ``(start, end, done)`` of that page range."""
    start, n = a.ctypes.data, a.nbytes
    lo, hi = -(-start // _PAGE) * _PAGE, (start + n) // _PAGE * _PAGE
    if _LIBC is None or hi <= lo:
        return lo, hi, False
    return lo, hi, _advise(lo, hi - lo, advice)


def _advise(address: int, length: int, advice: int) -> bool:
    return _LIBC is not None and _LIBC.madvise(ctypes.c_void_p(address), ctypes.c_size_t(length), advice) == 0


def small_pages(a: np.ndarray) -> np.ndarray:
    """Ask Linux not to back ``a`` with transparent huge pages; returns ``a``.

    numpy advises huge pages (2 MiB) for large arrays (numpy docs: "madvise hugepage"), so one
    write to a fresh ring makes 2 MiB resident: the 16 KB a one-event channel writes would cost
    ~80 KB per channel. With 4 KiB pages an untouched slot costs nothing. A no-op elsewhere.
    """
    _madvise(a, _MADV_NOHUGEPAGE)
    return a


def release_cells(cells: np.ndarray, rows: np.ndarray) -> None:
    """Zero channels ``rows`` of the slot-major C-contiguous ``cells`` (n_slots, C, k), handing back to the
    OS the memory pages that are then all zeros.

    Only cells holding a non-zero value are written (reading a page never written maps no memory). A page
    wholly inside ``cells`` that holds only zeros afterwards is dropped with ``madvise(MADV_DONTNEED)``
    (Linux, Linux man-pages madvise(2): private anonymous pages read back zero-filled and are resident again
    only when written); pages shared with cells of channels still holding data stay. Elsewhere (no Linux
    libc) the cells are zeroed in place (same contents, memory stays resident). ``rows`` int (m,).
    """
    n_slots, capacity, k = cells.shape
    rows = np.asarray(rows, dtype=np.int64)
    if k == 0 or rows.size == 0:
        return
    if not cells.flags.c_contiguous:
        raise ValueError("release_cells needs C-contiguous cells")
    start = cells.ctypes.data
    first = -(-start // _PAGE) * _PAGE  # the pages wholly inside ``cells``: [first, first + n_pages * _PAGE)
    n_pages = max((start + cells.nbytes - first) // _PAGE, 0)
    pages = cells.reshape(-1).view(np.uint8)[first - start:first - start + n_pages * _PAGE].reshape(n_pages, _PAGE)
    cell_bytes = k * cells.itemsize
    span = np.arange(-(-cell_bytes // _PAGE) + 1)  # the pages a cell can touch, from the page of its first byte
    for lo in range(0, rows.shape[0], _CLEAR_ROWS):
        part = rows[lo:lo + _CLEAR_ROWS]
        pos, j = np.nonzero(cells[:, part].any(axis=2))
        if not pos.size:
            continue
        held = pos * capacity + part[j]  # flat cell indices
        cells.reshape(-1, k)[held] = 0.0
        if _LIBC is None:
            continue
        byte = start + held * cell_bytes
        touched = ((byte - first) // _PAGE)[:, None] + span
        touched = touched[(touched >= 0) & (touched < n_pages)
                          & (first + touched * _PAGE < (byte + cell_bytes)[:, None])]
        touched = np.unique(touched)
        empty = touched[~pages[touched].any(axis=1)]
        if empty.size:  # runs of consecutive pages, one madvise each
            cut = np.flatnonzero(np.diff(empty) != 1) + 1
            for run in np.split(empty, cut):
                _advise(first + int(run[0]) * _PAGE, run.shape[0] * _PAGE, _MADV_DONTNEED)


def assign_cells(row: np.ndarray, values: np.ndarray) -> None:
    """``row[...] = values`` for one channel's float32 cells ``row`` (n_slots, k) (a view of a ring's
    ``counts`` / ``hist``), writing only the cells whose old or new bytes are not all zero.

    The same bits as the plain assignment, but a restored sparse channel writes (makes resident) only its
    cells holding data, not a page in each of the ring's ``n_slots`` planes. ``values`` any shape and dtype
    the assignment accepts (cast to float32).
    """
    new = np.ascontiguousarray(np.broadcast_to(np.asarray(values, dtype=np.float32), row.shape))
    write = new.view(np.uint32).any(axis=-1) | row.view(np.uint32).any(axis=-1)
    row[write] = new[write]


#: :func:`release_cells` takes this many channels at a time (a (n_slots, rows, k) copy of at most ~11 MB for
#: the largest ring, 25 x 336 float32 buckets).
_CLEAR_ROWS = 256
#: :meth:`IntervalRing.add` reads only the touched cells when the batch has fewer events than
#: 1/8 of the ring's (channel, slot) cells; above that, one pass over all cells is cheaper than a sort.
_FEW_EVENTS_PER_CELL = 8
#: The increment of a histogram cell, as the ring's dtype (a Python float would leave ufunc.at's fast path).
_ONE = np.float32(1.0)
#: :meth:`IntervalRing.add` scatters counters as one (k, n) matrix up to this many cells (64 KiB of int64
#: indices), column by column above (each temporary (n,)-sized, below glibc's 128 KiB mmap threshold).
_MATRIX_CELLS = 8192
#: :func:`_scatter_columns` scatters dense float columns this many events at a time (a (j, events) index
#: matrix of at most 9 x 8,192 int64 = 576 KiB, whatever the batch size).
_SCATTER_EVENTS = 8192


def _scatter_add(target: np.ndarray, base: np.ndarray, offset: int, column: np.ndarray) -> None:
    """``target[base[i] + offset] += column[i]`` for every event ``i`` in order (float32, ``np.add.at``),
    skipping zero increments; a bool ``column`` adds 1 where True."""
    column = np.asarray(column)
    if column.dtype == np.bool_:
        nz = np.flatnonzero(column)
        if nz.shape[0]:
            np.add.at(target, base[nz] + offset, _ONE)
        return
    column = np.asarray(column, np.float32)
    nonzero = column != 0.0
    count = int(np.count_nonzero(nonzero))
    if 2 * count > column.shape[0]:
        np.add.at(target, base + offset, column)
    elif count:
        nz = np.flatnonzero(nonzero)
        np.add.at(target, base[nz] + offset, column[nz])


def _scatter_columns(target: np.ndarray, base: np.ndarray, columns: Sequence[np.ndarray]) -> None:
    """``target[base[i] + j] += columns[j][i]`` for every column ``j`` (n,) and event ``i``, in event order per
    cell (float32, ``np.add.at``); bool columns add 1 where True.

    The same cell contents as :func:`_scatter_add` column by column, in fewer scatters: the bool columns'
    True events in one ``np.add.at`` of 1s (integer counts: order does not matter), the dense float
    columns as one (j, event) matrix per :data:`_SCATTER_EVENTS` events (a call of ``np.add.at`` costs
    about as much as 4,000 increments; each cell still receives its increments in event order). Sparse
    float columns (at most half nonzero) keep their own scatter of the nonzero increments.
    """
    ones: list[np.ndarray] = []
    dense: list[tuple[int, np.ndarray]] = []
    for j, col in enumerate(columns):
        col = np.asarray(col)
        if col.dtype == np.bool_:
            nz = np.flatnonzero(col)
            if nz.shape[0]:
                ones.append(base[nz] + j)
            continue
        col = np.asarray(col, np.float32)
        if 2 * int(np.count_nonzero(col)) > col.shape[0]:
            dense.append((j, col))
        else:
            _scatter_add(target, base, j, col)
    if ones:
        np.add.at(target, ones[0] if len(ones) == 1 else np.concatenate(ones), _ONE)
    if len(dense) == 1:
        np.add.at(target, base + dense[0][0], dense[0][1])
    elif dense:
        offsets = np.array([j for j, _ in dense], np.int64)[:, None]
        values = np.array([col for _, col in dense], np.float32)
        for s in range(0, base.shape[0], _SCATTER_EVENTS):
            part = base[s:s + _SCATTER_EVENTS]
            np.add.at(target, (offsets + part).reshape(-1), values[:, s:s + _SCATTER_EVENTS].reshape(-1))


class IntervalRing:
    """Per-channel ring of ``n_slots`` event-time intervals.

    Arrays (C = channel capacity, grows by doubling):
      ``slot_id``  int64 (C, n_slots): interval number held, -1 = empty;
      ``counts``   float32 (C, n_slots, n_counters);
      ``hist``     float32 (C, n_slots, n_buckets) latency histograms.
    ``counts`` and ``hist`` are views of slot-major (n_slots, C, k) C-contiguous
    arrays (not C-contiguous themselves; ``.copy()`` of a row is): the cells of
    one ring position of all channels lie side by side, so the memory a channel
    makes resident is the cells it wrote, not a page per row (module doc).
    float32 keeps sums exact up to 2**24 per interval and lets window sums
    run as one ``einsum`` (:func:`masked_sums`).

    ``slot_ms`` > 0, ``n_slots`` >= 1. Raises ``ValueError`` otherwise.
    """

    def __init__(self, slot_ms: int, n_slots: int, n_counters: int, n_buckets: int, capacity: int = 16):
        if slot_ms <= 0 or n_slots < 1 or n_counters < 0 or n_buckets < 0:
            raise ValueError("slot_ms must be > 0, n_slots >= 1, n_counters and n_buckets >= 0")
        self.slot_ms = int(slot_ms)
        self.n_slots = int(n_slots)
        self.n_counters = int(n_counters)
        self.n_buckets = int(n_buckets)
        self.slot_id = np.full((capacity, n_slots), -1, dtype=np.int64)
        self._set_cells(_cells(n_slots, capacity, n_counters), _cells(n_slots, capacity, n_buckets))

    def _set_cells(self, counts: np.ndarray, hist: np.ndarray) -> None:
        """Install slot-major storage ``counts`` / ``hist`` (n_slots, C, k) and their (C, n_slots, k) views."""
        self._counts_sm, self._hist_sm = counts, hist
        self.counts = counts.transpose(1, 0, 2)
        self.hist = hist.transpose(1, 0, 2)

    @property
    def capacity(self) -> int:
        """Number of channel rows allocated."""
        return self.slot_id.shape[0]

    def ensure_capacity(self, n_channels: int) -> None:
        """Grow (by doubling, at least to ``n_channels``) so that channel indices < ``n_channels`` fit."""
        cap = self.capacity
        if n_channels <= cap:
            return
        new = max(n_channels, 2 * cap)
        held = np.nonzero(self.slot_id >= 0)  # (channel, slot) pairs holding an interval
        self.slot_id = np.concatenate([self.slot_id, np.full((new - cap, self.n_slots), -1, np.int64)])
        # np.zeros takes zeroed pages from the OS lazily: rows not yet used add no resident memory
        # (a reserve for channels that may never come costs nothing). Only the slots that hold an
        # interval are copied, so the empty slots of sparse channels (one event: one slot of 30) and of
        # released rows (:meth:`clear_rows`) stay untouched pages.
        grown = []
        for old in (self.counts, self.hist):
            cells = _cells(self.n_slots, new, old.shape[2])
            cells.transpose(1, 0, 2)[held] = old[held]
            grown.append(cells)
        self._set_cells(*grown)

    def clear_rows(self, rows: np.ndarray | list[int]) -> None:
        """Empty channels ``rows`` (all slots), giving their cells' memory back (:func:`release_cells`)."""
        rows = np.asarray(rows, dtype=np.int64)
        self.slot_id[rows] = -1
        release_cells(self._counts_sm, rows)
        release_cells(self._hist_sm, rows)

    def add(
        self,
        channel: np.ndarray,
        ts_ms: np.ndarray,
        counter_rows: np.ndarray | Sequence[np.ndarray] | None = None,
        hist_mask: np.ndarray | Sequence[np.ndarray] | None = None,
        hist_key: np.ndarray | Sequence[np.ndarray] | None = None,
        slot: np.ndarray | None = None,
    ) -> np.ndarray:
        """Add a batch of events; returns a bool mask of events too old for the ring.

        ``channel`` int (n,), ``ts_ms`` int64 (n,). ``counter_rows``: the
        increments, an (n, n_counters) array or a sequence of n_counters
        columns (n,) (cheaper: no matrix is built); a bool column adds 1
        where True. ``hist_key``: int (n,) bucket indices counted where
        ``hist_mask`` (bool (n,); None: everywhere) is True, or a sequence of
        such keys with a sequence of masks (several histogram increments per
        event on one bucket axis, e.g. a TTFT bucket and a stall class).
        Every event opens its interval (evicting what its ring position
        held), whether or not it adds anything. An event is too old (mask
        True, not counted) when it is ``n_slots`` or more intervals older
        than the channel's newest event. ``slot``: optionally ``ts_ms //
        slot_ms``, already computed.

        Each counter and histogram cell receives its events' increments one
        by one in batch order, in float32 (``np.add.at``), so the contents do
        not depend on how a batch is split; zero counter increments are
        skipped (adding +0.0 changes no float32 value a ring can hold).
        Large batches are scattered column by column: a k x n int64 index
        array (k >= 4 counters, 4,000 events) would pass glibc's 128 KiB
        mmap threshold and pay page faults on every call.
        """
        channel = np.asarray(channel, dtype=np.int64)
        n = channel.shape[0]
        if n == 0:
            return np.zeros(0, bool)
        if slot is None:
            slot = np.asarray(ts_ms, dtype=np.int64) // self.slot_ms
        ns = self.n_slots
        pos = slot % ns
        flat = channel * ns
        flat += pos
        cell = pos * self.slot_id.shape[0]  # the (position, channel) cell of the slot-major counts / hist
        cell += channel
        ids = self.slot_id.reshape(-1)
        held = ids[flat]
        newer = slot > held
        if newer.any():  # some events open an interval: evict what their positions held
            self._evict(ids, flat, slot, newer)
            held = ids[flat]
        fits = slot == held
        # Too old for the channel's whole ring although its position holds the same interval (the channel
        # has moved on by n_slots or more since): needs the channel's newest interval. In the usual batch
        # every event is newer than the ring's overall newest interval minus n_slots: one max decides.
        if n * ns <= ids.shape[0]:
            fits &= slot > self.slot_id[channel].max(axis=1) - ns
        else:
            limit = int(ids.max()) - ns
            if int(slot.min()) <= limit:
                doubt = np.flatnonzero(fits & (slot <= limit))
                if doubt.size:
                    fits[doubt] = slot[doubt] > self.slot_id[channel[doubt]].max(axis=1) - ns
        every = bool(fits.all())
        kept = None if every else np.flatnonzero(fits)
        # Scatter-adds on the flat (1-D) arrays with matching dtypes: numpy's ufunc.at takes its fast path
        # only then (several times slower with a 2-D target, a tuple index or a Python scalar; see
        # docs/THROUGHPUT.md, "Design measurements").
        if counter_rows is not None and self.n_counters:
            k = self.n_counters
            base = (cell if kept is None else cell[kept]) * k
            target = np.reshape(self._counts_sm, -1, copy=False)
            if n * k <= _MATRIX_CELLS:  # one scatter-add of a (k, n) matrix: fewer numpy calls
                vt = (np.asarray(counter_rows, np.float32).T if isinstance(counter_rows, np.ndarray)
                      else np.array(counter_rows, np.float32))
                _scatter_add(target, (np.arange(k)[:, None] + base).reshape(-1), 0,
                             (vt if kept is None else vt[:, kept]).reshape(-1))
            else:
                columns = counter_rows.T if isinstance(counter_rows, np.ndarray) else counter_rows
                _scatter_columns(target, base, [col if kept is None else np.asarray(col)[kept] for col in columns])
        if hist_key is not None and self.n_buckets:
            target = np.reshape(self._hist_sm, -1, copy=False)
            single = isinstance(hist_key, np.ndarray)
            keys = (hist_key,) if single else hist_key
            masks = (hist_mask,) if single else ((None,) * len(keys) if hist_mask is None else hist_mask)
            for key, mask in zip(keys, masks):
                sel = fits if mask is None else fits & mask
                np.add.at(target, cell[sel] * self.n_buckets + np.asarray(key)[sel], _ONE)
        return ~fits

    def _evict(self, ids: np.ndarray, flat: np.ndarray, slot: np.ndarray, newer: np.ndarray) -> None:
        """Move the positions ``flat[newer]`` (flat indices into ``ids``) to the newest interval their
        events bring, zeroing their counters and histograms."""
        sub = np.flatnonzero(newer)
        cells, to = flat[sub], slot[sub]
        if sub.shape[0] * _FEW_EVENTS_PER_CELL < ids.shape[0]:
            # Few such events for the ring's size: only their cells are touched (a copy of every channel's
            # slot ids would make a small batch cost as much as a large one). Each of them moves (its event
            # is newer than what it holds); zeroing a cell twice is harmless, cheaper than np.unique.
            self._zero(cells)
            np.maximum.at(ids, cells, to)
            return
        newest = ids.copy()
        np.maximum.at(newest, cells, to)
        evict = np.flatnonzero(newest != ids)
        self._zero(evict)
        ids[evict] = newest[evict]

    def _zero(self, cells: np.ndarray) -> None:
        """Zero the counters and histograms of flat (channel, slot) cells ``cells`` (indices into ``slot_id``)."""
        channel, pos = np.divmod(cells, self.n_slots)
        pos *= self.slot_id.shape[0]
        pos += channel  # the same cells in the slot-major arrays
        if self.n_counters:
            self._counts_sm.reshape(-1, self.n_counters)[pos] = 0.0
        if self.n_buckets:
            self._hist_sm.reshape(-1, self.n_buckets)[pos] = 0.0

    def window_mask(self, lo_slot: np.ndarray | int, hi_slot: int) -> np.ndarray:
        """float32 (C, n_slots): 1 where the held interval is in ``[lo_slot, hi_slot)``.

        ``lo_slot`` may be per channel (shape (C,)) to start a window at a
        channel's state change (judging a channel only on traffic since then).
        """
        lo = np.asarray(lo_slot, dtype=np.int64)
        if lo.ndim == 1:
            lo = lo[:, None]
        return ((self.slot_id >= np.maximum(lo, 0)) & (self.slot_id < hi_slot)).astype(np.float32)

    def sum_counts(self, mask: np.ndarray, rows: slice | np.ndarray = slice(None)) -> np.ndarray:
        """Counter sums over the masked intervals of channels ``rows``: float64 (n, n_counters) (:func:`masked_sums`)."""
        return masked_sums(mask, self.counts, rows)

    def sum_hist(self, mask: np.ndarray, rows: slice | np.ndarray = slice(None)) -> np.ndarray:
        """Histogram sums over the masked intervals of channels ``rows``: float64 (n, n_buckets) (:func:`masked_sums`)."""
        return masked_sums(mask, self.hist, rows)

    def state(self) -> dict[str, np.ndarray]:
        """Arrays for a snapshot (see :meth:`load`)."""
        return {"slot_id": self.slot_id, "counts": self.counts, "hist": self.hist}

    def load(self, state: dict[str, np.ndarray]) -> None:
        """Restore arrays saved by :meth:`state`; raises ``ValueError`` on a shape mismatch."""
        if state["counts"].shape[1:] != self.counts.shape[1:] or state["hist"].shape[1:] != self.hist.shape[1:]:
            raise ValueError(
                f"snapshot ring shape {state['hist'].shape[1:]} does not match configured {self.hist.shape[1:]}"
            )
        self.slot_id = state["slot_id"].astype(np.int64).copy()
        loaded = []
        for a in (state["counts"], state["hist"]):
            cells = _cells(self.n_slots, self.slot_id.shape[0], a.shape[2])
            written = a.any(axis=2)  # only cells holding data are written: the others stay unmapped pages
            cells.transpose(1, 0, 2)[written] = a[written]
            loaded.append(cells)
        self._set_cells(*loaded)


def _cells(n_slots: int, capacity: int, k: int) -> np.ndarray:
    """Zeroed slot-major float32 cells (n_slots, capacity, k), on small pages (:func:`small_pages`)."""
    return small_pages(np.zeros((n_slots, capacity, k), dtype=np.float32))


def masked_sums(mask: np.ndarray, cube: np.ndarray, rows: slice | np.ndarray = slice(None)) -> np.ndarray:
    """Per channel of ``rows``, the sum of ``cube``'s intervals where ``mask`` is 1: float64 (n, k).

    ``cube`` float32 (C, n_slots, k) (a ring's ``counts`` or ``hist``); ``rows`` a slice or unique channel
    indices; ``mask`` float32 (n, n_slots) of 0/1 for those channels. Sums are float32 (exact for integer
    counts below 2**24). One ``einsum``, faster than a batched ``matmul`` of (1, n_slots) @ (n_slots, k)
    here; when the indices pick at least a quarter of the rows up to the largest, the mask is spread over
    those rows instead of copying the picked rows of ``cube`` (a channel's latency histograms: ~40 KB).

    >>> cube = np.arange(12, dtype=np.float32).reshape(3, 2, 2)
    >>> masked_sums(np.array([[1, 0], [1, 1]], np.float32), cube, np.array([0, 2])).tolist()
    [[0.0, 1.0], [18.0, 20.0]]
    """
    if not isinstance(rows, slice) and rows.size:
        top = int(rows.max()) + 1
        if 4 * rows.shape[0] >= top:
            spread = np.zeros((top, mask.shape[1]), np.float32)
            spread[rows] = mask
            return np.einsum("cs,csk->ck", spread, cube[:top])[rows].astype(np.float64)
    return np.einsum("cs,csk->ck", mask, cube[rows]).astype(np.float64)


def coarsen_slots(ids: np.ndarray, hist: np.ndarray, factor: int, n_slots: int) -> tuple[np.ndarray, np.ndarray]:
    """One channel's histogram slots regrouped into slots ``factor`` (>= 1) times longer, keeping the
    ``n_slots`` newest: ``(slot_id int64 (n_slots,), hist float32 (n_slots, k))`` in ring positions
    (``id % n_slots``; -1 / zeros where none). ``ids`` int64 (m,) are the old slots' interval numbers (-1:
    empty), ``hist`` (m, k) their histograms; a new slot sums the old ones it covers. For snapshots
    written with 10 s latency slots (now 30 s)."""
    out_ids = np.full(n_slots, -1, np.int64)
    out = np.zeros((n_slots, hist.shape[-1]), np.float32)
    held = ids >= 0
    if not held.any():
        return out_ids, out
    target = ids[held] // factor
    keep = target > target.max() - n_slots
    for t, h in zip(target[keep].tolist(), hist[held][keep]):
        out_ids[t % n_slots] = t
        out[t % n_slots] += h
    return out_ids, out
