"""``event_id`` is an event's identity: a re-sent event is counted and stored once (SPEC §8).

:class:`EventIdDedup` remembers the ids of recent events in two generations
(Python sets of the ids' 64-bit hashes, so every batch is checked with
C-level set operations and no per-event Python code on the usual batch
without duplicates). The current generation is retired (it becomes the
previous one, the previous one is dropped) when it holds ``max_ids / 2`` ids
or spans ``horizon_ms / 2`` of event time, so memory stays bounded
(≈ 95 bytes per id measured, ``max_ids`` ids at most) and the horizon is stated:

  a copy is dropped when its first copy was seen at most ``horizon_ms / 2``
  of event time and at most ``max_ids / 2`` distinct ids before it (it may
  be dropped up to twice as far back).

Two different ids collide only when their 64-bit hashes are equal (about
``n² / 2**65`` for ``n`` ids held: < 1e-7 at a million). The memory is the
worker's own: it starts empty after a restart or rebalance (see
docs/RELIABILITY.md for what holds then).
"""

from __future__ import annotations

from operator import attrgetter
from typing import Sequence

from pipeline.contracts import RequestEvent

_EVENT_ID = attrgetter("event_id")


class EventIdDedup:
    """Drop events whose ``event_id`` was seen within the horizon.

    ``horizon_ms`` > 0 (event time) and ``max_ids`` >= 2: see the module
    doc. ``dropped``: duplicates dropped so far. Raises ``ValueError`` for
    out-of-range arguments.
    """

    def __init__(self, horizon_ms: int = 600_000, max_ids: int = 500_000):
        if horizon_ms <= 0 or max_ids < 2:
            raise ValueError(f"horizon_ms must be > 0 and max_ids >= 2, got {horizon_ms}, {max_ids}")
        self.horizon_ms = int(horizon_ms)
        self.max_ids = int(max_ids)
        self.current: set[int] = set()
        self.previous: set[int] = set()
        #: event time at which the current generation started (None: empty).
        self.started_ms: int | None = None
        self.dropped = 0

    def __len__(self) -> int:
        """Ids held (both generations)."""
        return len(self.current) + len(self.previous)

    def filter(self, events: Sequence[RequestEvent], event_time_ms: int | None,
               ids: Sequence[str] | None = None) -> list[int] | None:
        """Remember the ids of ``events``; return the positions of duplicates (None: there are none).

        A duplicate is an event whose id was seen before (an earlier batch
        within the horizon, or earlier in ``events``); the first copy is
        kept. ``event_time_ms``: the worker's newest event time (None:
        unknown), used to retire generations. ``ids``: the events' ``event_id``
        values when already read (same order).
        """
        if not events:
            return None
        if ids is None:
            ids = list(map(_EVENT_ID, events))
        batch = set(map(hash, ids))
        if len(batch) == len(events) and batch.isdisjoint(self.current) and batch.isdisjoint(self.previous):
            self._remember(batch, event_time_ms)
            return None
        keys = list(map(hash, ids))
        seen_before = (batch & self.current) | (batch & self.previous)
        dup: list[int] = []
        first: set[int] = set()
        for i, k in enumerate(keys):
            if k in seen_before or k in first:
                dup.append(i)
            else:
                first.add(k)
        self.dropped += len(dup)
        self._remember(first, event_time_ms)
        return dup

    def _remember(self, keys: set[int], event_time_ms: int | None) -> None:
        if self.started_ms is None:
            self.started_ms = event_time_ms
        aged = (event_time_ms is not None and self.started_ms is not None
                and event_time_ms - self.started_ms >= self.horizon_ms // 2)
        if aged or len(self.current) + len(keys) > self.max_ids // 2:
            self.previous = self.current
            self.current = set()
            self.started_ms = event_time_ms
        self.current |= keys
