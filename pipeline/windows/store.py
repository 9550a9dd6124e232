"""All event-time window state of one worker, and the per-round view of it.

:class:`WindowStore` owns the channel registry, the short ring (30 × 10 s)
of named counters (:mod:`pipeline.windows.features`), the watermark and the
signals' own windows (:mod:`pipeline.windows.extension`: the latency
histograms of ``latency_p95_ratio``, the failure runs of
``consecutive_failures``, the quality rings of ``quality``, the CUSUMs, ...),
one mechanism for all of them.
:meth:`WindowStore.export_channel` / :meth:`WindowStore.import_channel` move
one channel's rows as a :class:`ChannelWindows`, counters and signal windows by name.
:meth:`WindowStore.view` turns them into a :class:`WindowView` of per-channel
aggregates (arrays of shape (C,)) that every detector reads.
"""

from __future__ import annotations

from itertools import compress
from types import MappingProxyType
from typing import Callable, Mapping, cast

import numpy as np

from pipeline.windows.extension import SignalWindows, WindowSpec, row_selector
from pipeline.windows.features import V1_COUNTER_NAMES, Counter, EventColumns, counter_layout  # noqa: F401
from pipeline.windows.ring import IntervalRing
from pipeline.windows.view import ChannelWindows, WindowView

# Columns of the base counters in the short ring (:data:`pipeline.windows.features.BASE_COUNTERS`);
# counters a signal adds follow them, addressed by name.
JUDGED, FAILURES, OK, NEUTRAL, CHECKED, MISSING, RATE_LIMITED = range(7)
N_COUNTERS = 7

SHORT_SLOT_MS = 10_000
#: How long a channel's baselines stop learning while it is not healthy (SPEC §4.2, issue #33 part 5):
#: 6 h of event time, a quarter of the 24 h baseline. Past it the condition is taken as the channel's new
#: normal and its events enter the baselines again, so (a) the baseline never empties (with no cap a
#: channel degraded for 24 h would have no baseline hour left, and a latency finding without a baseline
#: is kept, i.e. it could never clear) and (b) the absorbed condition moves a P95 baseline after ~1.2 h
#: (5 % of 24 h), so a new normal clears ~7 h after its onset instead of never. Outages and incident
#: windows of a few hours (the scenarios' bad hours, failover drills) stay out of the baseline.
LEARN_HOLD_MS = 6 * 3_600_000


class WindowStore:
    """Bounded event-time state for all channels of a worker.

    ``window_ms`` / ``short_window_ms``: the 5 min and 1 min windows
    (multiples of 10 s); ``baseline_hours``: 24; ``counters``: counters kept
    beside the base ones (from the signals' ``counters``; names must not
    repeat: ``ValueError``); ``windows``: the signals' window factories
    (:mod:`pipeline.windows.extension`; names must not repeat:
    ``ValueError``), all of the signals' own state: the engine passes every
    registered signal's (latency histograms, failure runs, quality rings,
    CUSUMs, ...). The store's own ring: ``short``, 30 × 10 s counters
    (30 × n_counters × 4 bytes per busy channel; a slot never written costs
    no resident memory, see :mod:`pipeline.windows.ring`).
    """

    def __init__(self, window_ms: int = 300_000, short_window_ms: int = 60_000, baseline_hours: int = 24,
                 counters: tuple[Counter, ...] = (),
                 windows: tuple[Callable[[WindowSpec], SignalWindows], ...] = (),
                 learn_hold_ms: int = LEARN_HOLD_MS):
        if learn_hold_ms < 0:
            raise ValueError(f"learn_hold_ms must be >= 0, got {learn_hold_ms}")
        if window_ms % SHORT_SLOT_MS or short_window_ms % SHORT_SLOT_MS or short_window_ms > window_ms:
            raise ValueError("window lengths must be multiples of 10 s with short <= long")
        self.window_ms = window_ms
        self.short_window_ms = short_window_ms
        self.baseline_hours = baseline_hours
        #: Short-ring counters in column order; :attr:`counter_column` maps their names to columns.
        self.counters = counter_layout(counters)
        self._extra = self.counters[N_COUNTERS:]
        self.counter_column = {c.name: j for j, c in enumerate(self.counters)}
        self.short = IntervalRing(SHORT_SLOT_MS, window_ms // SHORT_SLOT_MS, len(self.counters), 0)
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
        #: Longest event time a channel's baselines skip its events (:data:`LEARN_HOLD_MS`, :meth:`add`).
        self.learn_hold_ms = int(learn_hold_ms)
        #: Per channel: event time of the first event its baselines skipped in the current hold, -1 while it
        #: learns (in its snapshot: :attr:`ChannelWindows.held_since_ms <pipeline.windows.view.ChannelWindows>`).
        self.held_since_ms = np.full(16, -1, dtype=np.int64)
        self._holding = False  # some channel is in a hold (held_since_ms >= 0 somewhere)
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
        rings emptied with their memory handed back, every signal's windows cleared."""
        rows = np.asarray(rows, dtype=np.int64)
        self.short.clear_rows(rows)
        self.held_since_ms[rows[rows < self.held_since_ms.shape[0]]] = -1
        for ext in self.extensions.values():
            ext.clear_rows(rows)

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
        for ext in self.extensions.values():
            ext.ensure_capacity(n)
        if n > self.last_ts_ms.shape[0]:
            self.last_ts_ms = np.concatenate([self.last_ts_ms, np.zeros(n, np.int64)])
        if n > self.held_since_ms.shape[0]:
            self.held_since_ms = np.concatenate([self.held_since_ms, np.full(n, -1, np.int64)])

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
        rows = cast(list[int], idx)  # every name is registered now
        if list(map(self.routes.__getitem__, rows)) != routes:
            for name, route in dict(zip(names, routes)).items():
                i = index[name]
                if self.routes[i] != route:
                    self.routes[i] = route
                    self._members = None
        if list(map(self.tiers.__getitem__, rows)) != tiers:
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
    def add(self, cols: EventColumns, learn: np.ndarray | None = None) -> np.ndarray:
        """Add validated events to the counters and every signal's windows; returns ``late_mask``, bool
        (n,): the events that fell out of the short ring (still counted where a signal's windows reach
        back further, e.g. the latency baseline).

        ``learn``: bool (n,), True for the events of channels whose baselines learn now (SPEC §4.2: the
        engine passes ``state in (healthy, no_data)`` of each event's channel; None: every event). The
        short windows take every event (detection needs them); the 24 h baselines of the signals'
        windows (:meth:`SignalWindows.add_learning`) skip the others, for at most
        :attr:`learn_hold_ms` of event time per hold (:meth:`baseline_mask`).
        """
        n = len(cols)
        if n == 0:
            return np.zeros(0, bool)
        # One (n,) column per counter, in column order (JUDGED .. RATE_LIMITED, then the signals' own):
        # bool columns add 1 where True (IntervalRing.add), no (n, k) matrix is built.
        checked_ok = cols.checked & cols.ok
        columns = [cols.outcome >= 0, cols.outcome == 1, cols.ok, cols.outcome < 0, checked_ok,
                   cols.missing & checked_ok, cols.rate_limited]
        columns.extend(counter.of(cols) for counter in self._extra)
        late = self.short.add(cols.channel, cols.ts_ms, columns)
        np.maximum.at(self.last_ts_ms, cols.channel, cols.ts_ms)
        hi = int(cols.ts_ms.max())
        self.watermark_ms = hi if self.watermark_ms is None else max(self.watermark_ms, hi)
        base = self.baseline_mask(cols, learn)
        for ext in self.extensions.values():
            ext.add_learning(cols, late, base)
        return late

    def baseline_mask(self, cols: EventColumns, learn: np.ndarray | None) -> np.ndarray | None:
        """The events of ``cols`` that enter the baselines: bool (n,), or None for all of them.

        ``learn`` as in :meth:`add` (all events of one channel in a batch share their channel's value).
        A channel whose events are not learning starts a hold at its first such event's ``ts_ms``
        (:attr:`held_since_ms`); its events learn again once they are :attr:`learn_hold_ms` or more
        after that start (the cap, :data:`LEARN_HOLD_MS`), and the hold ends with its first learning
        event. Vectorised: a few array operations per batch, none per event.
        """
        held = self.held_since_ms
        ch = cols.channel
        if learn is None or bool(np.all(learn)):
            if self._holding:
                held[ch] = -1
                self._holding = bool((held >= 0).any())
            return None
        learn = np.asarray(learn, dtype=bool)
        held[ch[learn]] = -1
        skip = ~learn
        hc = ch[skip]
        fresh = held[hc] < 0  # channels entering a hold: it starts at their first held event of the batch
        if fresh.any():
            first = hc[fresh]
            held[first] = np.iinfo(np.int64).max
            np.minimum.at(held, first, cols.ts_ms[skip][fresh])
        self._holding = True
        return learn | (cols.ts_ms - held[ch] >= self.learn_hold_ms)

    # -- reads ------------------------------------------------------------
    def view(self, now_ms: int, since_ms: np.ndarray | None = None, rows: np.ndarray | None = None) -> WindowView:
        """Aggregates at event time ``now_ms`` for the channels ``rows`` (unique indices; default: all).

        Arrays in the result have shape ``(len(rows),)``. ``since_ms`` int64
        (same length as ``rows``) optionally starts each channel's windows at
        its state entry (slot granularity: 10 s, rounded up). The signals'
        windows add their features (:meth:`SignalWindows.features`).
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
        sel = row_selector(rows)
        ids = ring.slot_id[sel]
        m5 = ((ids >= lo_long[:, None]) & (ids < hi)).astype(np.float32)
        m1 = ((ids >= lo_short[:, None]) & (ids < hi)).astype(np.float32)
        s5 = ring.sum_counts(m5, sel)
        s1 = ring.sum_counts(m1, sel)
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
            extra=extra,
        )

    # -- snapshot -----------------------------------------------------------
    def state(self) -> dict[str, object]:
        """Everything needed to resume after a restart (arrays + registry)."""
        return {
            "short": self.short.state(),
            "names": list(self.names), "routes": list(self.routes), "tiers": list(self.tiers),
            "last_ts_ms": self.last_ts_ms, "watermark_ms": self.watermark_ms,
            "counters": [c.name for c in self.counters],
            "extensions": {name: [ext.export_row(i) for i in range(self.n_channels)]
                           for name, ext in self.extensions.items()},
        }

    def load(self, state: dict[str, object]) -> None:
        """Restore from :meth:`state` (raises ``ValueError`` on shape mismatch).

        Short-ring counters are matched by name (a state without names has the
        version-1 columns); a counter the state lacks starts empty, one this
        store does not keep is dropped; so are signal windows, by signal name.
        """
        short = dict(state["short"])  # type: ignore[call-overload]
        names = list(cast(list[str], state.get("counters")) or V1_COUNTER_NAMES)
        old = np.asarray(short["counts"])
        counts = np.zeros(old.shape[:2] + (len(self.counters),), old.dtype)
        for j, c in enumerate(self.counters):
            if c.name in names:
                counts[:, :, j] = old[:, :, names.index(c.name)]
        short["counts"] = counts
        self.short.load(short)
        self._reserved = 0
        self.names = list(cast(list[str], state["names"]))
        self.routes = list(cast(list[str], state["routes"]))
        self._members = None
        self.tiers = list(cast(list[str | None], state["tiers"]))
        self._index = {n: i for i, n in enumerate(self.names)}
        self.last_ts_ms = np.asarray(state["last_ts_ms"], dtype=np.int64).copy()
        self.held_since_ms = np.full(max(self.last_ts_ms.shape[0], self.short.capacity), -1, dtype=np.int64)
        self._holding = False
        self.watermark_ms = state["watermark_ms"]  # type: ignore[assignment]
        saved = dict(state.get("extensions") or {})  # type: ignore[call-overload]
        for name, ext in self.extensions.items():
            ext.ensure_capacity(self.short.capacity)
            rows = saved.get(name)
            for i in range(self.n_channels):
                ext.import_row(i, rows[i] if rows is not None and i < len(rows) else None)

    def export_channel(self, i: int) -> ChannelWindows:
        """Copies of channel ``i``'s rows of every window (``0 <= i < n_channels``)."""
        return ChannelWindows(
            short_slot_id=self.short.slot_id[i].copy(),
            counters={c.name: self.short.counts[i, :, j].copy() for j, c in enumerate(self.counters)},
            last_ts_ms=int(self.last_ts_ms[i]),
            extensions={name: ext.export_row(i) for name, ext in self.extensions.items()},
            held_since_ms=int(self.held_since_ms[i]),
        )

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

        Raises ``ValueError`` naming the array when a ring's size differs from this store's
        configuration, a signal window the store keeps lacks an array or has another shape, a slot id
        is outside ``-1 .. 2**44`` (no interval of a real timestamp is further) or ``last_ts_ms`` is not
        in ``0 .. 2**53``."""
        ns = self.short.n_slots
        shapes: dict[str, tuple[np.ndarray | None, tuple[int, ...]]] = {
            "short_slot_id": (w.short_slot_id, (ns,)), **{f"counter {n}": (a, (ns,)) for n, a in w.counters.items()}}
        for name, layout in self.windows_layout().items():
            got = w.extensions.get(name)
            if got is not None:
                shapes.update({f"windows {name}.{key}": (got.get(key), shape) for key, shape in layout.items()})
        if not 0 <= w.last_ts_ms <= 1 << 53:
            raise ValueError(f"state last_ts_ms {w.last_ts_ms} out of range")
        if not -1 <= w.held_since_ms <= 1 << 53:
            raise ValueError(f"state held_since_ms {w.held_since_ms} out of range")
        for what, (arr, shape) in shapes.items():
            if arr is None or np.shape(arr) != shape:
                raise ValueError(f"state {what} has shape {None if arr is None else np.shape(arr)}, store {shape}")
            if what.endswith("slot_id") and arr.size and not (-1 <= int(arr.min()) and int(arr.max()) <= 1 << 44):
                raise ValueError(f"state {what} holds slot ids outside -1 .. 2**44")

    def import_channel(self, i: int, w: ChannelWindows) -> list[str]:
        """Load ``w`` into registered channel ``i``; returns the names of ``w``'s counters and signal windows
        this store does not keep.

        Counters and signal windows are matched by name: one this store keeps and ``w`` lacks (a feature
        added since ``w`` was saved) starts empty, every other one keeps its history. Raises
        ``ValueError`` (:meth:`check_channel`) before anything is loaded when a ring's size differs from
        this store's configuration.
        """
        self.check_channel(w)
        self.short.slot_id[i] = w.short_slot_id
        for j, c in enumerate(self.counters):
            got = w.counters.get(c.name)
            self.short.counts[i, :, j] = 0.0 if got is None else got
        for name, ext in self.extensions.items():
            ext.import_row(i, w.extensions.get(name))
        self.last_ts_ms[i] = max(int(self.last_ts_ms[i]), w.last_ts_ms)
        self.held_since_ms[i] = w.held_since_ms
        self._holding = self._holding or w.held_since_ms >= 0
        return sorted(set(w.counters) - set(self.counter_column)) + sorted(
            f"windows {n}" for n in set(w.extensions) - set(self.extensions))
