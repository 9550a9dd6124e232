"""Which channels of an :class:`~pipeline.engine.Engine` are held, and which are in memory (SPEC §8).

Bounded per-worker channel state (:class:`~pipeline.config.StateLimits`):

- :func:`admit` runs before a batch is counted: events of evicted channels
  bring their state back (:func:`~pipeline.state.snapshot.import_channel`),
  and new channels beyond ``max_channels`` (resident + evicted) are refused
  in order of first sight (their events go to the caller's ``refused`` list,
  to be dead-lettered as ``too_many_channels``).
- :func:`evict_idle` runs after each low-watermark advance: a channel without
  events for ``evict_idle_ms`` of event time is exported into
  ``engine.evicted`` (compressed snapshot bytes, a few KB), its window rows are
  emptied with their memory handed back, and it is no longer evaluated. Its
  registry entry, state machine and ``seq`` stay, so route shares and verdict
  numbering are unchanged; its next event restores it exactly.
"""

from __future__ import annotations

import logging
from itertools import compress
from operator import attrgetter
from typing import TYPE_CHECKING, Sequence

import numpy as np

from pipeline.contracts import RequestEvent
from pipeline.state.refusals import RefusalLog

if TYPE_CHECKING:
    from pipeline.engine.core import Engine
    from pipeline.engine.columns import EventFields

log = logging.getLogger(__name__)

_CHANNEL = attrgetter("channel")

#: At most this many channels are evicted per call of :func:`evict_idle` (each costs a snapshot export,
#: ~0.5 ms with the rounds around it), so a sweep over thousands of idle channels is spread over many batches.
EVICT_PER_CALL = 64


def admit(engine: "Engine", events: Sequence[RequestEvent], structure: Sequence | None,
          refused: list[RequestEvent], fields: EventFields | None = None
          ) -> tuple[Sequence[RequestEvent], Sequence | None, EventFields | None]:
    """Restore the evicted channels of ``events``; refuse new channels over the limit.

    Returns ``(events, structure, fields)`` without the refused events
    (``structure``, per event, and ``fields``, the events' fields already read,
    may be None); the refused ones are appended to ``refused`` and counted in
    ``engine.refused_count``.
    """
    names = set(map(_CHANNEL, events) if fields is None else fields.channel)
    if engine.evicted and not names.isdisjoint(engine.evicted):
        restore(engine, names.intersection(engine.evicted))
    new = names.difference(engine.channel_rows)
    room = max(engine.limits.max_channels - engine.store.n_channels, 0)
    if len(new) <= room:
        return events, structure, fields
    order = [c for c in dict.fromkeys(map(_CHANNEL, events)) if c in new]
    out = set(order[room:])
    keep = [e.channel not in out for e in events]
    before = len(refused)
    refused.extend(compress(events, [not k for k in keep]))
    engine.refused_count += len(refused) - before
    return (list(compress(events, keep)), (list(compress(structure, keep)) if structure is not None else None),
            None if fields is None else fields.take(np.flatnonzero(keep)))


def refusal_log() -> RefusalLog:
    """An engine's bounded warnings about evicted channels' snapshots that cannot be loaded back
    (:func:`restore`; :class:`~pipeline.state.refusals.RefusalLog`)."""
    return RefusalLog(log, "evicted snapshot", outcome="its windows start empty")


def restore(engine: "Engine", names: set[str]) -> None:
    """Load evicted channels ``names`` back from their snapshots (their registry rows stay).

    A snapshot that cannot be loaded (a corrupt record read from the state
    topic) starts that channel's windows empty: counted in
    ``engine.bad_snapshots`` and logged (bounded: :class:`~pipeline.state.refusals.RefusalLog`), never raised.
    """
    from pipeline.state.snapshot import SnapshotError, decode_snapshot, import_channel

    for name in names:
        raw = engine.evicted.pop(name)
        i = engine.channel_rows[name]
        try:
            import_channel(engine, decode_snapshot(raw))
        except SnapshotError as exc:
            engine.bad_snapshots += 1
            engine.snapshot_refusals.refuse(name, str(exc))
        engine.resident[i] = True
        engine.changed[i] = True  # also when its windows start empty
        engine.returns += 1
    engine.snapshot_refusals.summary()


def evict_idle(engine: "Engine", now_ms: int, limit: int = EVICT_PER_CALL) -> int:
    """Evict up to ``limit`` resident channels without events for ``evict_idle_ms`` at event time ``now_ms``.

    ``evict_idle_ms`` 0 disables eviction. Returns the number evicted.
    """
    idle_ms = engine.limits.evict_idle_ms
    c = engine.store.n_channels
    if idle_ms <= 0 or c == 0:
        return 0
    from pipeline.state.snapshot import export_channel

    idle = np.flatnonzero(engine.resident[:c] & (engine.store.last_ts_ms[:c] <= now_ms - idle_ms))[:limit]
    names = engine.store.names
    for i in idle.tolist():
        engine.evicted[names[i]] = export_channel(engine, i)
    if idle.size:
        engine.resident[idle] = False
        engine.changed[idle] = True  # its record is now the eviction's snapshot bytes
        engine.store.clear_rows(idle)
        engine.evictions += int(idle.size)
    return int(idle.size)
