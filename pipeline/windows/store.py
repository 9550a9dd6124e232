"""All event-time window state of one worker, and the per-round view of it.

:class:`WindowStore` owns the channel registry, the short ring (30 × 10 s)
of named counters (:mod:`pipeline.windows.features`), the baseline ring
(25 × 1 h), the consecutive-failure runs and the watermark.
:meth:`WindowStore.export_channel` / :meth:`WindowStore.import_channel` move
one channel's rows as a :class:`ChannelWindows`, counters by name.
:meth:`WindowStore.view` turns them into a :class:`WindowView` of per-channel
aggregates (arrays of shape (C,)) that every detector reads.
"""

from __future__ import annotations

from itertools import compress
from types import MappingProxyType
from typing import Callable, Mapping

import numpy as np

from pipeline.windows.extension import SignalWindows, WindowSpec
from pipeline.windows.features import V1_COUNTER_NAMES, Counter, EventColumns, counter_layout  # noqa: F401
from pipeline.windows.histogram import LatencyBuckets
from pipeline.windows.quality import QualityWindows
from pipeline.windows.ring import IntervalRing
from pipeline.windows.runs import RunTracker
from pipeline.windows.view import ChannelWindows, WindowView

# Columns of the base counters in the short ring (:data:`pipeline.windows.features.BASE_COUNTERS`);
# counters a signal adds follow them, addressed by name.
JUDGED, FAILURES, OK, NEUTRAL, CHECKED, MISSING, RATE_LIMITED = range(7)
N_COUNTERS = 7

SHORT_SLOT_MS = 10_000
#: Slot of the short latency histograms: 30 s, the round interval (SPEC §4), so a round's 5 min
#: window is the same whole slots as with 10 s ones at a third of the memory.
LAT_SLOT_MS = 30_000
BASE_SLOT_MS = 3_600_000
#: One-sided confidence of the P95 lower bounds in the view (issue #19: a handful of outliers in a thin
#: window cannot lift the bound; :meth:`LatencyBuckets.quantile_bound`).
P95_BOUND_CONFIDENCE = 0.99
#: The same for the last 30 s slot alone: 95 %, so a P95 x2 swap at 4 req/s (120 samples) is certified in
#: the round it happens; a clean channel still needs ~10 of 120 answers above 1.8x its P95 to trip.
P95_BOUND_CONFIDENCE_30S = 0.95
#: Null scale of the 30 s shift evidence: SPEC §4.3's clear ratio (:mod:`pipeline.signals.latency_p95_ratio`).
SHIFT_NULL_RATIO = 1.2


class WindowStore:
    """Bounded event-time state for all channels of a worker.

    ``buckets``: latency bucket mapping; ``window_ms`` / ``short_window_ms``:
    the 5 min and 1 min windows (multiples of 10 s); ``baseline_hours``: 24;
    ``counters``: counters kept beside the base ones (from the signals'
    ``counters``; names must not repeat: ``ValueError``); ``windows``: the
    signals' window factories (:mod:`pipeline.windows.extension`; names
    must not repeat: ``ValueError``).
    Rings: ``short`` 30 × 10 s counters, ``short_lat`` 10 × 30 s latency
    histograms (10 s slots when ``window_ms`` is not a multiple of 30 s),
    ``base`` 25 × 1 h histograms. Memory per busy channel ≈ (10 + 25) ×
    n_buckets × 4 + 30 × n_counters × 4 bytes; a slot never written costs no
    resident memory (see :mod:`pipeline.windows.ring`).
    """

    def __init__(self, buckets: LatencyBuckets | None = None, window_ms: int = 300_000,
                 short_window_ms: int = 60_000, baseline_hours: int = 24, run_window: int = 100,
                 counters: tuple[Counter, ...] = (),
                 windows: tuple[Callable[[WindowSpec], SignalWindows], ...] = ()):
        if window_ms % SHORT_SLOT_MS or short_window_ms % SHORT_SLOT_MS or short_window_ms > window_ms:
            raise ValueError("window lengths must be multiples of 10 s with short <= long")
        self.buckets = buckets or LatencyBuckets()
        self.window_ms = window_ms
        self.short_window_ms = short_window_ms
        self.baseline_hours = baseline_hours
        k = self.buckets.n_buckets
        #: Short-ring counters in column order; :attr:`counter_column` maps their names to columns.
        self.counters = counter_layout(counters)
        self._extra = self.counters[N_COUNTERS:]
        self.counter_column = {c.name: j for j, c in enumerate(self.counters)}
        self.short = IntervalRing(SHORT_SLOT_MS, window_ms // SHORT_SLOT_MS, len(self.counters), 0)
        lat_ms = LAT_SLOT_MS if window_ms % LAT_SLOT_MS == 0 else SHORT_SLOT_MS
        self.short_lat = IntervalRing(lat_ms, window_ms // lat_ms, 0, k)
        self.base = IntervalRing(BASE_SLOT_MS, baseline_hours + 1, 0, k)
        self.runs = RunTracker(run_window)
        self.quality = QualityWindows(SHORT_SLOT_MS, window_ms // SHORT_SLOT_MS, BASE_SLOT_MS, baseline_hours + 1)
        spec = WindowSpec(window_ms, short_window_ms, baseline_hours)
        #: Signal name → its own windows (see :mod:`pipeline.windows.extension`).
        self.extensions: dict[str, SignalWindows] = {}
        for make in windows:
            w = make(spec)
            if w.name in self.extensions:
                raise ValueError(f"signal windows {w.name!r} are declared twice")
            w.ensure_capacity(16)
            self.extensions[w.name] = w
        #: The optional event columns the signals' windows read (:attr:`SignalWindows.columns`), each once.
        self.optional_columns: tuple[str, ...] = tuple(dict.fromkeys(c for ext in self.extensions.values()
                                                                     for c in ext.columns))
        self.names: list[str] = []
        self.routes: list[str] = []
        self.tiers: list[str | None] = []
        self._index: dict[str, int] = {}
        self._members: dict[str, list[int]] | None = None  # route -> channel indices (see route_members)
        self.last_ts_ms = np.zeros(16, dtype=np.int64)
        self.watermark_ms: int | None = None
        self._base_hour = np.full(16, -1, dtype=np.int64)
        self._base_vals = np.full((16, 3), np.nan)
        self._base_min = 1
        #: Channel rows every array holds (see :meth:`reserve`); 0 after :meth:`load` replaced them.
        self._reserved = 0

    # -- registry ---------------------------------------------------------
    def channel_index(self, name: str, route: str, tier: str | None) -> int:
        """Index of channel ``name`` (registered on first sight; route/tier updated)."""
        idx = self._index.get(name)
        if idx is None:
            self._members = None
            idx = len(self.names)
            self._index[name] = idx
            self.names.append(name)
            self.routes.append(route)
            self.tiers.append(tier)
            self.reserve(idx + 1)
        else:
            if self.routes[idx] != route:
                self.routes[idx] = route
                self._members = None
            if tier is not None and self.tiers[idx] != tier:
                self.tiers[idx] = tier
        return idx

    def clear_rows(self, rows: np.ndarray) -> None:
        """Empty the windows of channels ``rows`` (evicted channels; their registry entries stay):
        rings emptied with their histogram memory handed back, runs and cached baselines reset."""
        rows = np.asarray(rows, dtype=np.int64)
        self.short.clear_rows(rows)
        self.short_lat.clear_rows(rows)
        self.base.clear_rows(rows)
        self.quality.short.clear_rows(rows)  # = quality.reset, handing the memory back
        self.quality.base.clear_rows(rows)
        for ext in self.extensions.values():
            ext.clear_rows(rows)
        for r in rows.tolist():
            self.runs.reset(r)
            self.invalidate_baseline(r)

    @property
    def index(self) -> Mapping[str, int]:
        """Channel name → row (read-only view of the registry)."""
        return MappingProxyType(self._index)

    def route_members(self) -> dict[str, list[int]]:
        """Route -> indices of its channels, in index order (cached until a channel is added or moves route)."""
        if self._members is None:
            members: dict[str, list[int]] = {}
            for i, r in enumerate(self.routes):
                members.setdefault(r, []).append(i)
            self._members = members
        return self._members

    def reserve(self, n_channels: int) -> None:
        """Make room for ``n_channels`` channels in every ring at once (e.g. before restoring that many
        snapshots; registering them one by one grows the arrays by doubling, copying them each time)."""
        n = int(n_channels)
        if n <= self._reserved:  # registering a channel: one comparison, not a call per ring
            return
        n = max(n, 2 * self._reserved)  # by doubling, as each array would grow
        self._reserved = n
        self.short.ensure_capacity(n)
        self.short_lat.ensure_capacity(n)
        self.base.ensure_capacity(n)
        self.runs.ensure_capacity(n)
        self.quality.ensure_capacity(n)
        for ext in self.extensions.values():
            ext.ensure_capacity(n)
        if n > self.last_ts_ms.shape[0]:
            self.last_ts_ms = np.concatenate([self.last_ts_ms, np.zeros(n, np.int64)])

    def channel_indices(self, names: list[str], routes: list[str], tiers: list[str | None]) -> np.ndarray:
        """:meth:`channel_index` for many events at once: int64 (n,).

        Same result and final registry as calling :meth:`channel_index` per
        event in order (new channels are registered in order of first sight;
        a channel ends with the route of its last event and the last tier
        that was not None).
        """
        index = self._index
        idx = list(map(index.get, names))
        if None in idx:
            for k, i in enumerate(idx):
                if i is None:
                    i = index.get(names[k])
                    idx[k] = i if i is not None else self.channel_index(names[k], routes[k], tiers[k])
        # The usual batch changes no route or tier: one C-level comparison each finds out.
        if list(map(self.routes.__getitem__, idx)) != routes:
            for name, route in dict(zip(names, routes)).items():
                i = index[name]
                if self.routes[i] != route:
                    self.routes[i] = route
                    self._members = None
        if list(map(self.tiers.__getitem__, idx)) != tiers:
            for name, tier in dict(zip(compress(names, tiers), compress(tiers, tiers))).items():
                i = index[name]
                if self.tiers[i] != tier:
                    self.tiers[i] = tier
        return np.fromiter(idx, np.int64, len(idx))

    @property
    def n_channels(self) -> int:
        """Channels registered so far."""
        return len(self.names)

    # -- writes -----------------------------------------------------------
    def add(self, cols: EventColumns, run_threshold: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Add validated events; returns ``(late_mask, run_channels, run_max)``.

        ``late_mask`` bool (n,) marks events that fell out of the short ring
        (they are still counted in the baseline). ``run_channels`` /
        ``run_max``: see :meth:`RunTracker.update`; with ``run_threshold``
        (per channel) ``self.runs.crossed_at`` gives the crossing events.
        """
        n = len(cols)
        if n == 0:
            return np.zeros(0, bool), np.zeros(0, np.int64), np.zeros(0, np.int32)
        # One (n,) column per counter, in column order (JUDGED .. RATE_LIMITED, then the signals' own):
        # bool columns add 1 where True (IntervalRing.add), no (n, k) matrix is built.
        checked_ok = cols.checked & cols.ok
        columns = [cols.outcome >= 0, cols.outcome == 1, cols.ok, cols.outcome < 0, checked_ok,
                   cols.missing & checked_ok, cols.rate_limited]
        columns.extend(counter.of(cols) for counter in self._extra)
        key = self.buckets.key_of(cols.latency_ms)
        late = self.short.add(cols.channel, cols.ts_ms, columns)
        self.short_lat.add(cols.channel, cols.ts_ms, None, cols.ok & ~late, key)
        self.base.add(cols.channel, cols.ts_ms, None, cols.ok, key)
        hours = cols.ts_ms // BASE_SLOT_MS
        if self._base_hour.shape[0] > 0:
            known = cols.channel < self._base_hour.shape[0]
            touched = cols.channel[known][hours[known] < self._base_hour[cols.channel[known]]]
            if touched.size:  # a late event landed in an hour a cached baseline covers
                self._base_hour[np.unique(touched)] = -1
        np.maximum.at(self.last_ts_ms, cols.channel, cols.ts_ms)
        hi = int(cols.ts_ms.max())
        self.watermark_ms = hi if self.watermark_ms is None else max(self.watermark_ms, hi)
        run_ch, run_max = self.runs.update(cols.channel, cols.outcome, run_threshold)
        for ext in self.extensions.values():
            ext.add(cols, late)
        return late, run_ch, run_max

    # -- reads ------------------------------------------------------------
    def _baseline(self, now_ms: int, min_latency: int, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Baseline P95 / samples / hours for ``rows`` at ``now_ms``, cached per channel and hour."""
        hour = now_ms // BASE_SLOT_MS
        c = self.n_channels
        if self._base_hour.shape[0] < c or self._base_min != min_latency:
            grow = max(c, 16) - self._base_hour.shape[0]
            if grow > 0:
                self._base_hour = np.concatenate([self._base_hour, np.full(grow, -1, np.int64)])
                self._base_vals = np.concatenate([self._base_vals, np.full((grow, 3), np.nan)])
            if self._base_min != min_latency:
                self._base_hour[:] = -1
                self._base_min = min_latency
        stale = rows[self._base_hour[rows] != hour]
        if stale.size:
            ids = self.base.slot_id[stale]
            mask = ((ids >= max(hour - self.baseline_hours, 0)) & (ids < hour)).astype(np.float32)
            hist = self.base.sum_hist(mask, stale)
            self._base_vals[stale, 0] = self.buckets.quantile(hist, 0.95, min_count=min_latency)
            self._base_vals[stale, 1] = hist.sum(axis=1)
            self._base_vals[stale, 2] = mask.sum(axis=1)
            self._base_hour[stale] = hour
        v = self._base_vals[rows]
        return v[:, 0], v[:, 1], v[:, 2]

    def invalidate_baseline(self, row: int | None = None) -> None:
        """Drop cached baselines (one channel, or all) after its rings changed outside :meth:`add`."""
        if row is None:
            self._base_hour[:] = -1
        elif row < self._base_hour.shape[0]:
            self._base_hour[row] = -1

    def view(self, now_ms: int, since_ms: np.ndarray | None = None, min_latency: int = 1,
             min_baseline: int = 1, rows: np.ndarray | None = None) -> WindowView:
        """Aggregates at event time ``now_ms`` for the channels ``rows`` (unique indices; default: all).

        Arrays in the result have shape ``(len(rows),)``. ``since_ms`` int64
        (same length as ``rows``) optionally starts each channel's windows at
        its state entry (slot granularity: 10 s, rounded up). Baseline P95s
        are recomputed once per event-time hour (cached).
        """
        c = self.n_channels
        rows = np.arange(c) if rows is None else np.asarray(rows, dtype=np.int64)
        n = rows.shape[0]
        hi = -(-now_ms // SHORT_SLOT_MS)  # slots strictly before the one after now
        n_long = self.window_ms // SHORT_SLOT_MS
        n_short = self.short_window_ms // SHORT_SLOT_MS
        lo_long = np.full(n, max(hi - n_long, 0), dtype=np.int64)
        lo_short = np.full(n, max(hi - n_short, 0), dtype=np.int64)
        if since_ms is not None:
            since_slot = -(-np.asarray(since_ms, dtype=np.int64) // SHORT_SLOT_MS)
            lo_long = np.maximum(lo_long, since_slot)
            lo_short = np.maximum(lo_short, since_slot)
        ring = self.short
        # All channels in order (the usual round): slice views instead of fancy-index copies.
        full = n == c and (n == 0 or (rows[0] == 0 and rows[-1] == c - 1 and bool(np.all(rows[1:] > rows[:-1]))))
        sel = slice(0, c) if full else rows
        ids = ring.slot_id[sel]
        m5 = ((ids >= lo_long[:, None]) & (ids < hi)).astype(np.float32)
        m1 = ((ids >= lo_short[:, None]) & (ids < hi)).astype(np.float32)
        s5 = ring.sum_counts(m5, sel)
        s1 = ring.sum_counts(m1, sel)
        lat = self.short_lat
        per = lat.slot_ms // SHORT_SLOT_MS  # 10 s slots per latency slot; window ends are whole latency slots
        lat_ids = lat.slot_id[sel]
        lat_lo = -(-lo_long // per)
        lat_hi = -(-hi // per)
        h5 = lat.sum_hist(((lat_ids >= lat_lo[:, None]) & (lat_ids < lat_hi)).astype(np.float32), sel)
        n_lat = h5.sum(axis=1)
        p95 = self.buckets.quantile(h5, 0.95, min_count=min_latency)
        p95_lo = self.buckets.quantile_bound(h5, 0.95, P95_BOUND_CONFIDENCE, min_count=min_latency)
        h30 = lat.sum_hist(((lat_ids >= np.maximum(lat_lo, lat_hi - 1)[:, None]) & (lat_ids < lat_hi))
                           .astype(np.float32), sel)
        p95_lo30 = self.buckets.quantile_bound(h30, 0.95, P95_BOUND_CONFIDENCE_30S, min_count=min_latency)
        base_p95, base_n, base_hours = self._baseline(now_ms, min_baseline, rows)
        quality = self.quality.aggregates(rows, now_ms, since_ms, self.baseline_hours)
        extra = {}
        for j, counter in enumerate(self._extra, N_COUNTERS):
            extra[f"{counter.name}_5m"], extra[f"{counter.name}_1m"] = s5[:, j], s1[:, j]
        for ext in self.extensions.values():
            extra.update(ext.features(rows, now_ms, since_ms))
        return WindowView(
            now_ms=now_ms,
            judged_1m=s1[:, JUDGED], failures_1m=s1[:, FAILURES],
            judged_5m=s5[:, JUDGED], failures_5m=s5[:, FAILURES], ok_5m=s5[:, OK],
            checked_5m=s5[:, CHECKED], missing_5m=s5[:, MISSING], rate_limited_5m=s5[:, RATE_LIMITED],
            p95_ms=p95, n_latency_5m=n_lat, p95_lower_ms=p95_lo, p95_lower_30s_ms=p95_lo30,
            n_latency_30s=h30.sum(axis=1), p95_30s_ms=self.buckets.quantile(h30, 0.95, min_count=min_latency),
            n_shift_30s=self.buckets.count_above(h30, base_p95, SHIFT_NULL_RATIO),
            base_p95_ms=base_p95, base_n=base_n, base_hours=base_hours,
            run=self.runs.trailing[rows].astype(np.float64),
            **quality, extra=extra,
        )

    # -- snapshot -----------------------------------------------------------
    def state(self) -> dict[str, object]:
        """Everything needed to resume after a restart (arrays + registry)."""
        return {
            "short": self.short.state(), "short_lat": self.short_lat.state(), "base": self.base.state(),
            "runs": self.runs.state(),
            "names": list(self.names), "routes": list(self.routes), "tiers": list(self.tiers),
            "last_ts_ms": self.last_ts_ms, "watermark_ms": self.watermark_ms,
            "quality": self.quality.state(), "counters": [c.name for c in self.counters],
            "extensions": {name: [ext.export_row(i) for i in range(self.n_channels)]
                           for name, ext in self.extensions.items()},
        }

    def load(self, state: dict[str, object]) -> None:
        """Restore from :meth:`state` (raises ``ValueError`` on shape mismatch).

        Short-ring counters are matched by name (a state without names has the
        version-1 columns); a counter the state lacks starts empty, one this
        store does not keep is dropped.
        """
        short = dict(state["short"])  # type: ignore[call-overload]
        names = list(state.get("counters") or V1_COUNTER_NAMES)  # type: ignore[attr-defined]
        old = np.asarray(short["counts"])
        counts = np.zeros(old.shape[:2] + (len(self.counters),), old.dtype)
        for j, c in enumerate(self.counters):
            if c.name in names:
                counts[:, :, j] = old[:, :, names.index(c.name)]
        short["counts"] = counts
        self.short.load(short)
        self._reserved = 0
        self.short_lat.load(state["short_lat"])  # type: ignore[arg-type]
        self.base.load(state["base"])  # type: ignore[arg-type]
        self.runs.load(state["runs"])  # type: ignore[arg-type]
        self.names = list(state["names"])  # type: ignore[arg-type]
        self.routes = list(state["routes"])  # type: ignore[arg-type]
        self._members = None
        self.tiers = list(state["tiers"])  # type: ignore[arg-type]
        self._index = {n: i for i, n in enumerate(self.names)}
        self.last_ts_ms = np.asarray(state["last_ts_ms"], dtype=np.int64).copy()
        self.watermark_ms = state["watermark_ms"]  # type: ignore[assignment]
        if "quality" in state:
            self.quality.load(state["quality"])  # type: ignore[arg-type]
        else:  # a state saved before quality windows existed: start them empty
            self.quality = QualityWindows(SHORT_SLOT_MS, self.window_ms // SHORT_SLOT_MS, BASE_SLOT_MS,
                                          self.baseline_hours + 1)
        self.quality.ensure_capacity(self.short.capacity)
        saved = dict(state.get("extensions") or {})  # type: ignore[call-overload]
        for name, ext in self.extensions.items():
            ext.ensure_capacity(self.short.capacity)
            rows = saved.get(name)
            for i in range(self.n_channels):
                ext.import_row(i, rows[i] if rows is not None and i < len(rows) else None)
        self.invalidate_baseline()

    def export_channel(self, i: int) -> ChannelWindows:
        """Copies of channel ``i``'s rows of every window (``0 <= i < n_channels``)."""
        q = self.quality
        return ChannelWindows(
            n_buckets=self.buckets.n_buckets,
            short_slot_id=self.short.slot_id[i].copy(),
            counters={c.name: self.short.counts[i, :, j].copy() for j, c in enumerate(self.counters)},
            short_hist=self.short_lat.hist[i].copy(), short_lat_slot_id=self.short_lat.slot_id[i].copy(),
            base_slot_id=self.base.slot_id[i].copy(),
            base_hist=self.base.hist[i].copy(), run=int(self.runs.trailing[i]), last_ts_ms=int(self.last_ts_ms[i]),
            quality_short_slot_id=q.short.slot_id[i].copy(),
            quality_short_counts=q.short.counts[i].copy(),
            quality_base_slot_id=q.base.slot_id[i].copy(),
            quality_base_counts=q.base.counts[i].copy(),
            quality_model=q.version[i],
            extensions={name: ext.export_row(i) for name, ext in self.extensions.items()},
        )

    def _load_10s_hist(self, i: int, ids: np.ndarray, hist: np.ndarray) -> None:
        """Sum 10 s latency histograms (slot ids ``ids``, from an older snapshot) into row ``i`` of the
        latency ring, keeping its ``n_slots`` newest slots."""
        lat = self.short_lat
        lat.slot_id[i] = -1
        lat.hist[i] = 0.0
        held = ids >= 0
        if not held.any():
            return
        target = ids[held] * self.short.slot_ms // lat.slot_ms
        keep = target > target.max() - lat.n_slots
        for t, h in zip(target[keep].tolist(), hist[held][keep]):
            lat.slot_id[i, t % lat.n_slots] = t
            lat.hist[i, t % lat.n_slots] += h

    def windows_layout(self) -> dict[str, dict[str, tuple[int, ...]]]:
        """Signal name → array name → shape of one channel's row of that signal's windows (signals whose
        windows declare it: :meth:`~pipeline.windows.extension.SignalWindows.row_layout`)."""
        out = {}
        for name, ext in self.extensions.items():
            layout = ext.row_layout()
            if layout is not None:
                out[name] = layout
        return out

    def check_channel(self, w: ChannelWindows) -> None:
        """Check that ``w`` fits this store before anything of it is loaded (:meth:`import_channel`).

        Raises ``ValueError`` naming the array when the bucket layout or a ring's size differs from this
        store's configuration, a signal window the store keeps lacks an array or has another shape, a
        slot id is outside ``-1 .. 2**44`` (no interval of a real timestamp is further), ``run`` is not
        in ``0 .. 2**31 - 1`` or ``last_ts_ms`` not in ``0 .. 2**53``."""
        k, ns, nb = self.buckets.n_buckets, self.short.n_slots, self.base.n_slots
        nl = self.short_lat.n_slots if w.short_lat_slot_id is not None else ns
        if w.n_buckets != k:
            raise ValueError(f"state has {w.n_buckets} latency buckets, store {k}")
        shapes = {"short_slot_id": (w.short_slot_id, (ns,)), "short_hist": (w.short_hist, (nl, k)),
                  "base_slot_id": (w.base_slot_id, (nb,)), "base_hist": (w.base_hist, (nb, k)),
                  **{f"counter {n}": (a, (ns,)) for n, a in w.counters.items()}}
        if w.short_lat_slot_id is not None:
            shapes["short_lat_slot_id"] = (w.short_lat_slot_id, (nl,))
        if w.quality_short_slot_id is not None:
            q = self.quality
            shapes.update(quality_short_slot_id=(w.quality_short_slot_id, q.short.slot_id.shape[1:]),
                          quality_short_counts=(w.quality_short_counts, q.short.counts.shape[1:]),
                          quality_base_slot_id=(w.quality_base_slot_id, q.base.slot_id.shape[1:]),
                          quality_base_counts=(w.quality_base_counts, q.base.counts.shape[1:]))
        for name, layout in self.windows_layout().items():
            got = w.extensions.get(name)
            if got is not None:
                shapes.update({f"windows {name}.{key}": (got.get(key), shape) for key, shape in layout.items()})
        if not (0 <= w.run <= np.iinfo(self.runs.trailing.dtype).max and 0 <= w.last_ts_ms <= 1 << 53):
            raise ValueError(f"state run {w.run} or last_ts_ms {w.last_ts_ms} out of range")
        for what, (arr, shape) in shapes.items():
            if arr is None or np.shape(arr) != shape:
                raise ValueError(f"state {what} has shape {None if arr is None else np.shape(arr)}, store {shape}")
            if what.endswith("slot_id") and arr.size and not (-1 <= int(arr.min()) and int(arr.max()) <= 1 << 44):
                raise ValueError(f"state {what} holds slot ids outside -1 .. 2**44")

    def import_channel(self, i: int, w: ChannelWindows) -> list[str]:
        """Load ``w`` into registered channel ``i``; returns the names of ``w``'s counters this store does not keep.

        Counters are matched by name: one this store keeps and ``w`` lacks (a
        feature added since ``w`` was saved) starts empty, every other counter
        and ring keeps its history. Raises ``ValueError`` (:meth:`check_channel`) before anything is
        loaded when the bucket layout or a ring's size differs from this store's configuration.
        """
        self.check_channel(w)
        self.short.slot_id[i] = w.short_slot_id
        for j, c in enumerate(self.counters):
            got = w.counters.get(c.name)
            self.short.counts[i, :, j] = 0.0 if got is None else got
        if w.short_lat_slot_id is not None:
            self.short_lat.slot_id[i] = w.short_lat_slot_id
            self.short_lat.hist[i] = w.short_hist
        else:
            self._load_10s_hist(i, np.asarray(w.short_slot_id), np.asarray(w.short_hist))
        self.base.slot_id[i] = w.base_slot_id
        self.base.hist[i] = w.base_hist
        q = self.quality
        if w.quality_short_slot_id is not None:
            q.short.slot_id[i] = w.quality_short_slot_id
            q.short.counts[i] = w.quality_short_counts
            q.base.slot_id[i] = w.quality_base_slot_id
            q.base.counts[i] = w.quality_base_counts
        else:
            q.reset([i])
        q.version[i] = w.quality_model
        for name, ext in self.extensions.items():
            ext.import_row(i, w.extensions.get(name))
        self.runs.trailing[i] = w.run
        self.last_ts_ms[i] = max(int(self.last_ts_ms[i]), w.last_ts_ms)
        self.invalidate_baseline(i)
        return sorted(set(w.counters) - set(self.counter_column)) + sorted(
            f"windows {n}" for n in set(w.extensions) - set(self.extensions))
