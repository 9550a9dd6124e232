"""Which channels of an :class:`~pipeline.engine.Engine` are held, and which are in memory (SPEC §8).

Bounded per-worker channel state (:class:`~pipeline.config.StateLimits`):

:class:`Residency` (the engine's ``residency``) holds the evicted channels'
snapshot bytes, which channels are in memory and the counts:

- :meth:`Residency.admit` runs before a batch is counted: events of evicted channels
  bring their state back (:func:`~pipeline.state.snapshot.import_channel`).
  New channels that would take the resident channels over ``max_channels``
  first make room: the least-recently-seen resident channels without events
  for ``evict_horizon_ms`` are evicted (SPEC §8: a flood of new names never
  locks out a real channel, issue #34 part 2). New channels still without
  room, or beyond ``held_limit`` channels held in all, are refused in order of
  first sight (their events go to the caller's ``refused`` list, to be
  dead-lettered as ``too_many_channels``; the processor counts them per name
  prefix, :mod:`pipeline.ingest.prefix_counts`).
- :meth:`Residency.evict_idle` runs after each low-watermark advance: a channel without
  events for ``evict_idle_ms`` of event time is exported into
  ``residency.evicted`` (compressed snapshot bytes, a few KB), its window rows are
  emptied with their memory handed back, and it is no longer evaluated. Its
  registry entry, state machine and ``seq`` stay, so route shares and verdict
  numbering are unchanged; its next event restores it exactly.

A channel's snapshot goes out and comes back through the two callables the
engine gives (``export(row) -> bytes``, ``load(bytes)``, the engine's own
:mod:`pipeline.state.snapshot` functions): no import of the engine here.
"""

from __future__ import annotations

import logging
from itertools import compress
from typing import TYPE_CHECKING, Callable, Mapping, Sequence

import numpy as np

from pipeline.config import StateLimits
from pipeline.contracts import RequestEvent
from pipeline.state.refusals import RefusalLog
from pipeline.windows.store import WindowStore

if TYPE_CHECKING:
    from pipeline.engine.columns import EventFields

log = logging.getLogger(__name__)

#: At most this many channels are evicted per call of :meth:`Residency.evict_idle` (each costs a snapshot
#: export, ~0.5 ms with the rounds around it), so a sweep over thousands of idle channels is spread over many
#: batches.
EVICT_PER_CALL = 64

def refusal_log() -> RefusalLog:
    """An engine's bounded warnings about evicted channels' snapshots that cannot be loaded back
    (:meth:`Residency.restore`; :class:`~pipeline.state.refusals.RefusalLog`)."""
    return RefusalLog(log, "evicted snapshot", outcome="its windows start empty")


class Residency:
    """Evicted channels and channels in memory of one engine (SPEC §8; see the module docstring).

    ``limits``: channel limit and idle eviction; ``store``: the engine's windows (registry, newest
    event times, rows to clear); ``export(row)``: snapshot bytes of a channel row; ``load(raw)``: import
    snapshot bytes (raises :class:`~pipeline.state.snapshot.SnapshotError` when they cannot be loaded);
    ``mark_changed(rows)``: flag channel rows changed since their last captured snapshot.
    """

    def __init__(self, limits: StateLimits, store: WindowStore, export: Callable[[int], bytes],
                 load: Callable[[bytes], object], mark_changed: Callable[[object], None]):
        self.limits = limits
        self.store = store
        self.export = export
        self.load = load
        self.mark_changed = mark_changed
        #: channel → snapshot bytes of an evicted channel.
        self.evicted: dict[str, bytes] = {}
        #: per channel row: windows in memory.
        self.resident = np.zeros(0, bool)
        self.evictions = self.returns = self.bad_snapshots = self.refused_count = 0
        #: evictions made to give a new channel room (also in ``evictions``).
        self.pressure_evictions = 0
        #: bounded warnings about evicted channels' snapshots that cannot be loaded back (``bad_snapshots``)
        self.snapshot_refusals = refusal_log()
        self._evict_round: int | None = None  # event-time round of the last idle scan (see evict_due)
        self._evict_backlog = False

    def grow(self, n: int) -> None:
        """Room for ``n`` channel rows; new rows are resident."""
        if self.resident.shape[0] < n:
            self.resident = np.concatenate([self.resident, np.ones(n - self.resident.shape[0], bool)])

    def held(self, n: int) -> int:
        """Channels among the first ``n`` rows whose windows are in memory."""
        return int(self.resident[:n].sum())

    def admit(self, events: Sequence[RequestEvent], structure: Sequence | None, refused: list[RequestEvent],
              rows: Mapping[str, int], fields: EventFields, now_ms: int | None = None
              ) -> tuple[Sequence[RequestEvent], Sequence | None, EventFields]:
        """Restore the evicted channels of ``events``; make room for new ones; refuse new channels over the limit.

        ``rows``: channel name → row of the channels registered; ``now_ms``: the event time (UTC epoch ms)
        room is made at (:meth:`make_room`; default: the store's watermark). Returns ``(events, structure, fields)``
        without the refused events (``structure``, per event, may be None; ``fields``: the events' fields);
        the refused ones are appended to ``refused`` and counted in ``refused_count``.
        """
        names = set(fields.channel)
        if self.evicted and not names.isdisjoint(self.evicted):
            self.restore(names.intersection(self.evicted), rows)  # held already: never refused
        new = names.difference(rows)
        if not new:
            return events, structure, fields
        c = self.store.n_channels
        room = self.limits.max_channels - self.held(c)
        if len(new) > room:
            room += self.make_room(len(new) - room, [rows[n] for n in names if n in rows],
                                   self.store.watermark_ms if now_ms is None else now_ms)
        room = max(min(room, self.limits.held_limit - c), 0)
        if len(new) <= room:
            return events, structure, fields
        order = [c for c in dict.fromkeys(fields.channel) if c in new]
        out = set(order[room:])
        keep = [c not in out for c in fields.channel]
        gone = list(compress(events, [not k for k in keep]))
        refused.extend(gone)
        self.refused_count += len(gone)
        return (list(compress(events, keep)), (list(compress(structure, keep)) if structure is not None else None),
                fields.take(np.flatnonzero(keep)))

    def make_room(self, need: int, busy: Sequence[int], now_ms: int | None) -> int:
        """Evict up to ``need`` resident channels, least recently seen first, among those without events for
        ``evict_horizon_ms`` before event time ``now_ms`` and not in ``busy`` (rows of the batch being
        admitted). Returns the number evicted (0 while ``now_ms`` is None: no event time known yet).

        An evicted channel returns exactly on its next event (:meth:`restore`), so a ``now_ms`` pushed ahead
        by a far-future stamp (at most the decoder's future bound) costs snapshot round trips, never state."""
        c = self.store.n_channels
        if now_ms is None or need <= 0 or c == 0:
            return 0
        last = self.store.last_ts_ms[:c]
        idle = self.resident[:c] & (last <= now_ms - self.limits.evict_horizon_ms)
        idle[np.asarray(busy, np.int64)] = False
        rows = np.flatnonzero(idle)
        if rows.size > need:
            rows = rows[np.argsort(last[rows], kind="stable")[:need]]
        self._evict(rows)
        self.pressure_evictions += int(rows.size)
        return int(rows.size)

    def restore(self, names: set[str], rows: Mapping[str, int]) -> None:
        """Load evicted channels ``names`` back from their snapshots (their registry ``rows`` stay).

        A snapshot that cannot be loaded (a corrupt record read from the state
        topic) starts that channel's windows empty: counted in
        ``bad_snapshots`` and logged (bounded: :class:`~pipeline.state.refusals.RefusalLog`), never raised.
        """
        from pipeline.state.snapshot import SnapshotError

        for name in names:
            raw = self.evicted.pop(name)
            i = rows[name]
            try:
                self.load(raw)
            except SnapshotError as exc:
                self.bad_snapshots += 1
                self.snapshot_refusals.refuse(name, str(exc))
            self.resident[i] = True
            self.mark_changed(i)  # also when its windows start empty
            self.returns += 1
        self.snapshot_refusals.summary()

    def evict_due(self, now_ms: int, round_ms: int) -> None:
        """The idle scan after a low-watermark advance to ``now_ms``: it reads every channel, so once per
        evaluation round of event time (``round_ms`` long) is enough (eviction is an hour's idleness), and
        again at once while the previous call hit its per-call limit."""
        round_ = now_ms // round_ms
        if round_ != self._evict_round or self._evict_backlog:
            self._evict_round = round_
            self._evict_backlog = self.evict_idle(now_ms) >= EVICT_PER_CALL

    def evict_idle(self, now_ms: int, limit: int = EVICT_PER_CALL) -> int:
        """Evict up to ``limit`` resident channels without events for ``evict_idle_ms`` at event time ``now_ms``.

        ``evict_idle_ms`` 0 disables eviction. Returns the number evicted.
        """
        idle_ms = self.limits.evict_idle_ms
        c = self.store.n_channels
        if idle_ms <= 0 or c == 0:
            return 0
        idle = np.flatnonzero(self.resident[:c] & (self.store.last_ts_ms[:c] <= now_ms - idle_ms))[:limit]
        self._evict(idle)
        return int(idle.size)

    def _evict(self, rows: np.ndarray) -> None:
        """Export channel ``rows`` (resident) to snapshot bytes in ``evicted`` and empty their windows."""
        if not rows.size:
            return
        names = self.store.names
        for i in rows.tolist():
            self.evicted[names[i]] = self.export(i)
        self.resident[rows] = False
        self.mark_changed(rows)  # its record is now the eviction's snapshot bytes
        self.store.clear_rows(rows)
        self.evictions += int(rows.size)
