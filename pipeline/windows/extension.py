"""Windows a signal brings with it: per-channel event-time state beyond the short-ring counters.

A signal whose features are not sums of 10 s counters (a P95 against its own
24 h baseline, a fit over 30 min of samples) declares
``Signal.windows``: a factory ``(WindowSpec) -> SignalWindows``. The
:class:`~pipeline.windows.store.WindowStore` keeps one instance per signal,
feeds it every accepted batch, merges its :meth:`SignalWindows.features` into
each round's :class:`~pipeline.windows.view.WindowView` and moves its rows
with a channel (eviction, snapshots) by name, as it does for counters: a
snapshot without a signal's rows starts them empty, rows of a signal no longer
registered are dropped.

:class:`RingWindows` implements the bookkeeping for windows made of
:class:`~pipeline.windows.ring.IntervalRing` s; a subclass writes ``add`` and
``features`` only.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Mapping

import numpy as np

from pipeline.windows.features import EventColumns
from pipeline.windows.ring import IntervalRing, assign_cells


@dataclass(frozen=True)
class WindowSpec:
    """The store's window configuration a signal's windows follow.

    ``window_ms`` / ``short_window_ms``: the 5 min and 1 min windows
    (multiples of 10 s, SPEC §4); ``baseline_hours``: the rolling baseline's
    complete hours (24, SPEC §4.3).
    """

    window_ms: int = 300_000
    short_window_ms: int = 60_000
    baseline_hours: int = 24


def row_selector(rows: np.ndarray) -> slice | np.ndarray:
    """Index for channel rows ``rows`` (unique int64): ``slice(0, n)`` when they are ``0 .. n - 1`` in order
    (the usual round: slicing makes views, not fancy-index copies), else ``rows`` itself."""
    n = rows.shape[0]
    if n and rows[0] == 0 and rows[-1] == n - 1 and bool(np.all(rows[1:] > rows[:-1])):
        return slice(0, n)
    return rows


class SignalWindows(ABC):
    """Per-channel state of one signal, rows indexed like the store's channels.

    ``name``: the signal's name (unique in a store; the key of its rows in
    snapshots). Every array a subclass exposes through :meth:`export_row`
    must have a fixed shape and dtype given the :class:`WindowSpec`.

    ``columns``: the optional event columns :meth:`add` reads
    (:meth:`EventColumns.column`). They are read with the batch's other
    fields, while the decoder still has the events in cache
    (:class:`pipeline.engine.columns.EventFields`); a column not declared
    here is read from the events when asked for (same values, one more pass).
    """

    name: str
    columns: tuple[str, ...] = ()

    @abstractmethod
    def ensure_capacity(self, n_channels: int) -> None:
        """Make room for channel rows ``0 .. n_channels - 1``."""

    @abstractmethod
    def add(self, cols: EventColumns, late: np.ndarray) -> None:
        """Count a batch of accepted events (``late`` bool (n,): too old for the short ring)."""

    def add_learning(self, cols: EventColumns, late: np.ndarray, learn: np.ndarray | None) -> None:
        """:meth:`add` with ``learn``: bool (n,), the events that may enter the signal's baselines (None:
        all; SPEC §4.2, baselines learn from healthy time only, see
        :meth:`WindowStore.add <pipeline.windows.store.WindowStore.add>`). Windows with a baseline
        override it (and make :meth:`add` call it with None); the default, for windows without one,
        counts every event (:meth:`add`)."""
        self.add(cols, late)

    @abstractmethod
    def features(self, rows: np.ndarray, now_ms: int, since_ms: np.ndarray | None) -> dict[str, np.ndarray]:
        """Feature name → float64 array (len(rows),) at event time ``now_ms``.

        ``since_ms`` (int64, len(rows)) optionally starts each channel's short
        windows at its state entry, as for the counters. Names must not clash
        with other features of the view.
        """

    @abstractmethod
    def clear_rows(self, rows: np.ndarray) -> None:
        """Empty channels ``rows`` (evicted or reset)."""

    @abstractmethod
    def export_row(self, i: int) -> dict[str, np.ndarray]:
        """Copies of channel ``i``'s arrays, by name."""

    @abstractmethod
    def import_row(self, i: int, arrays: Mapping[str, np.ndarray] | None) -> None:
        """Load :meth:`export_row` output into channel ``i`` (None: start empty).

        Raises ``ValueError`` naming the array when a shape does not match.
        """

    def row_layout(self) -> dict[str, tuple[int, ...]] | None:
        """Array name → shape of one channel's row, as :meth:`export_row` gives them; a snapshot's
        windows are checked against it before any channel changes (None: not declared, only
        :meth:`import_row` checks)."""
        return None


class RingWindows(SignalWindows):
    """:class:`SignalWindows` made of named :class:`IntervalRing` s in ``self.rings``.

    A subclass sets ``name`` and ``rings`` in ``__init__`` and implements
    :meth:`add` and :meth:`features`; capacity, clearing and the export /
    import of rows (``<ring>.slot_id`` / ``.counts`` / ``.hist``) follow.
    """

    rings: dict[str, IntervalRing]

    def ensure_capacity(self, n_channels: int) -> None:
        for ring in self.rings.values():
            ring.ensure_capacity(n_channels)

    def clear_rows(self, rows: np.ndarray) -> None:
        for ring in self.rings.values():
            ring.clear_rows(rows)

    def export_row(self, i: int) -> dict[str, np.ndarray]:
        out: dict[str, np.ndarray] = {}
        for key, ring in self.rings.items():
            out[f"{key}.slot_id"] = ring.slot_id[i].copy()
            if ring.n_counters:
                out[f"{key}.counts"] = ring.counts[i].copy()
            if ring.n_buckets:
                out[f"{key}.hist"] = ring.hist[i].copy()
        return out

    def row_layout(self) -> dict[str, tuple[int, ...]]:
        out: dict[str, tuple[int, ...]] = {}
        for key, ring in self.rings.items():
            out[f"{key}.slot_id"] = ring.slot_id.shape[1:]
            if ring.n_counters:
                out[f"{key}.counts"] = ring.counts.shape[1:]
            if ring.n_buckets:
                out[f"{key}.hist"] = ring.hist.shape[1:]
        return out

    def import_row(self, i: int, arrays: Mapping[str, np.ndarray] | None) -> None:
        if arrays is None:
            self.clear_rows(np.array([i]))
            return
        for key, ring in self.rings.items():
            parts = [("slot_id", ring.slot_id)]
            if ring.n_counters:
                parts.append(("counts", ring.counts))
            if ring.n_buckets:
                parts.append(("hist", ring.hist))
            for part, target in parts:
                got = arrays.get(f"{key}.{part}")
                if got is None:
                    raise ValueError(f"{self.name} windows: state lacks {key}.{part}")
                if np.shape(got) != target.shape[1:]:
                    raise ValueError(f"{self.name} windows: state {key}.{part} has shape {np.shape(got)}, "
                                     f"store {target.shape[1:]}")
            for part, target in parts:
                if part == "slot_id":
                    target[i] = arrays[f"{key}.{part}"]
                else:  # only the cells holding data are written (a sparse channel's pages stay unmapped)
                    assign_cells(target[i], arrays[f"{key}.{part}"])

    @staticmethod
    def window_mask(ring: IntervalRing, rows: np.ndarray, lo_ms: np.ndarray | int, hi_ms: int) -> np.ndarray:
        """float32 (len(rows), n_slots): 1 where ``ring`` holds an interval inside ``[lo_ms, hi_ms)``
        of event time for each channel of ``rows`` (``lo_ms`` rounded up, ``hi_ms`` up to whole slots)."""
        lo = -(-np.asarray(lo_ms, dtype=np.int64) // ring.slot_ms)
        if lo.ndim == 1:
            lo = lo[:, None]
        hi = -(-int(hi_ms) // ring.slot_ms)
        ids = ring.slot_id[rows]
        return ((ids >= np.maximum(lo, 0)) & (ids < hi)).astype(np.float32)
