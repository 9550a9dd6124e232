"""Validated request events → the engine's columns (:class:`~pipeline.windows.features.EventColumns`).

Status codes and outcomes (SPEC §3-4: ``error``, ``timeout`` and
``rate_limited`` are upstream failures, ``ok`` a success, ``cancelled`` and
``filtered`` neutral), the structure flags ingest resolved onto each event
(:func:`resolve_structure`, :func:`structure_flags`) and the per-event arrays
(:func:`event_arrays`, :func:`make_columns`). The engine registers the
channels; nothing here keeps state.

:class:`EventFields` holds every field the engine and the stream processor
read of a batch's events, as columns: read once per decoded message while
the decoder still has its events in cache
(:meth:`pipeline.ingest.decode.Decoder.decode_many` with ``read``), instead
of one pass over the whole batch per field later on (docs/THROUGHPUT.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import chain, repeat
from operator import attrgetter, is_not, itemgetter
from typing import Callable, Sequence

import numpy as np

from pipeline.contracts import FAILURE_STATUSES, RequestEvent
from pipeline.windows.features import OPTIONAL_COLUMNS, EventColumns, float_column

_TS = attrgetter("ts_ms")
_STATUS = attrgetter("status")
_LATENCY = attrgetter("latency_ms")
_CHANNEL = attrgetter("channel")
_ROUTE = attrgetter("route")
_TIER = attrgetter("tier")
_MISSING = attrgetter("missing_fields")
_PARSE_OK = attrgetter("parse_ok")
_EVENT_ID = attrgetter("event_id")
_FIRST = itemgetter(0)
#: Status → small code; outcome per code (1 upstream failure, 0 ok, -1 neutral).
_STATUS_CODE = {"ok": 0, "error": 1, "timeout": 2, "rate_limited": 3, "cancelled": 4, "filtered": 5}
_RATE_LIMITED_CODE = _STATUS_CODE["rate_limited"]
_CANCELLED_CODE = _STATUS_CODE["cancelled"]
_OUTCOME_OF_CODE = np.array([1 if s in FAILURE_STATUSES else (0 if s == "ok" else -1) for s in _STATUS_CODE],
                            dtype=np.int8)
_NOT_CHECKED: tuple[None, None] = (None, None)


def resolve_structure(events: Sequence[RequestEvent],
                      parse: list | None = None) -> tuple[list, np.ndarray, np.ndarray]:
    """``(structure, checked, missing)`` per event, read from the flags ingest resolved onto it.

    Events come with ``parse_ok`` / ``missing_fields`` resolved by
    :func:`pipeline.ingest.structure.resolve_onto` (the decoder and
    :func:`pipeline.engine.replay.replay` call it): ``parse_ok`` None is "not
    checked", True/False "checked"; no rule is applied here. Unchecked
    events share one ``(None, None)`` (one C-level scan finds the others).
    ``parse``: the events' ``parse_ok`` values, when already read (:class:`EventFields`).
    """
    n = len(events)
    if parse is None:
        parse = list(map(_PARSE_OK, events))
    if parse.count(None) == n:
        return [_NOT_CHECKED] * n, np.zeros(n, bool), np.zeros(n, bool)
    checked = np.fromiter(map(is_not, parse, repeat(None)), bool, n)
    missing = np.zeros(n, bool)
    structure: list = [_NOT_CHECKED] * n
    for i in np.flatnonzero(checked).tolist():
        fields = events[i].missing_fields
        structure[i] = (parse[i], fields)
        missing[i] = parse[i] is False or bool(fields)
    return structure, checked, missing


def structure_flags(structure: Sequence[tuple[bool | None, list[str] | None]]) -> tuple[np.ndarray, np.ndarray]:
    """``checked`` (parse_ok is not None) and ``missing`` (parse failed or a field missing) per event."""
    n = len(structure)
    checked = np.fromiter(map(is_not, map(_FIRST, structure), repeat(None)), bool, n)
    missing = np.zeros(n, bool)
    for i in np.flatnonzero(checked).tolist():
        parse_ok, fields = structure[i]
        missing[i] = parse_ok is False or bool(fields)
    return checked, missing


def event_arrays(events: Sequence[RequestEvent]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(ts_ms int64, status code int8, latency_ms float64)``, each of shape (len(events),)."""
    n = len(events)
    return (np.fromiter(map(_TS, events), np.int64, n),
            np.fromiter(map(_STATUS_CODE.__getitem__, map(_STATUS, events)), np.int8, n),
            np.fromiter(map(_LATENCY, events), np.float64, n))


def channel_keys(events: Sequence[RequestEvent]) -> tuple[list[str], list[str], list[str | None]]:
    """``(channel, route, tier)`` lists of ``events``, to register them in a store."""
    return list(map(_CHANNEL, events)), list(map(_ROUTE, events)), list(map(_TIER, events))


def make_columns(channel: np.ndarray, events: Sequence[RequestEvent], ts: np.ndarray, code: np.ndarray,
                 latency: np.ndarray, checked: np.ndarray, missing: np.ndarray,
                 optional: dict[str, np.ndarray] | None = None) -> EventColumns:
    """:class:`EventColumns` of one chunk (all arrays shape (n,); ``channel`` the store's indices).

    ``optional``: optional columns already read (:attr:`EventFields.optional`), the others are read
    from ``events`` when a window asks for them."""
    outcome = _OUTCOME_OF_CODE[code]
    cache = {"cancelled": code == _CANCELLED_CODE}
    if optional:
        cache.update(optional)
    return EventColumns(channel=channel, ts_ms=ts, outcome=outcome, ok=outcome == 0, latency_ms=latency,
                        checked=checked, missing=missing, rate_limited=code == _RATE_LIMITED_CODE,
                        events=events, _cache=cache)


@dataclass
class EventFields:
    """The fields of ``n`` events the engine and the stream processor read, as columns in the events' order.

    ``ts_ms`` int64 (n,), ``code`` int8 (n,) (status code, :data:`_STATUS_CODE`), ``latency_ms``
    float64 (n,); lists of n: ``event_id``, ``channel``, ``route``, ``tier`` (str or None) and
    ``parse_ok`` (bool or None, as ingest resolved it); ``optional``: column name (of
    :data:`~pipeline.windows.features.OPTIONAL_COLUMNS`) -> float64 (n,), NaN where absent, for the
    columns asked for when read.

    The values are those of the events when read: events changed afterwards (the decoder has already
    resolved and cut them by then) would not be seen here.
    """

    ts_ms: np.ndarray
    code: np.ndarray
    latency_ms: np.ndarray
    event_id: list[str]
    channel: list[str]
    route: list[str]
    tier: list[str | None]
    parse_ok: list[bool | None]
    optional: dict[str, np.ndarray]

    @classmethod
    def read(cls, events: Sequence[RequestEvent], optional: Sequence[str] = OPTIONAL_COLUMNS) -> "EventFields":
        """Read ``events`` (one C-level pass per field). ``optional``: the optional columns to read.

        Raises ``KeyError`` for an unknown status (validated events have none) and ``ValueError`` for an
        ``optional`` name that is not in :data:`~pipeline.windows.features.OPTIONAL_COLUMNS`.
        """
        unknown = set(optional).difference(OPTIONAL_COLUMNS)
        if unknown:
            raise ValueError(f"unknown optional columns {sorted(unknown)}; known: {OPTIONAL_COLUMNS}")
        n = len(events)
        ts, code, latency = event_arrays(events)
        channel, route, tier = channel_keys(events)
        return cls(ts, code, latency, list(map(_EVENT_ID, events)), channel, route, tier,
                   list(map(_PARSE_OK, events)),
                   {name: float_column(events, attrgetter(name), n) for name in optional})

    def __len__(self) -> int:
        return int(self.ts_ms.shape[0])

    @classmethod
    def concat(cls, parts: Sequence["EventFields"]) -> "EventFields":
        """One :class:`EventFields` of several, in order (they must have the same optional columns).

        Raises ``ValueError`` for no parts or parts with different optional columns."""
        if not parts:
            raise ValueError("EventFields.concat needs at least one part")
        if len(parts) == 1:
            return parts[0]
        names = parts[0].optional.keys()
        if any(p.optional.keys() != names for p in parts):
            raise ValueError("EventFields.concat: the parts hold different optional columns")
        return cls(*(np.concatenate([getattr(p, f) for p in parts]) for f in ("ts_ms", "code", "latency_ms")),
                   *(list(chain.from_iterable(getattr(p, f) for p in parts)) for f in _LIST_FIELDS),
                   {k: np.concatenate([p.optional[k] for p in parts]) for k in names})

    def take(self, index: np.ndarray) -> "EventFields":
        """The events at positions ``index`` (int array), in that order."""
        get = picker(index)
        return EventFields(self.ts_ms[index], self.code[index], self.latency_ms[index],
                           *(get(getattr(self, f)) for f in _LIST_FIELDS),
                           {k: v[index] for k, v in self.optional.items()})


_LIST_FIELDS = ("event_id", "channel", "route", "tier", "parse_ok")


def picker(index: np.ndarray) -> Callable[[Sequence], list]:
    """A function ``items -> [items[i] for i in index]`` (``index``: int array of positions); one
    ``itemgetter`` made once serves every list of a batch (C-level, no Python per item)."""
    pick = index.tolist()
    if len(pick) < 2:  # itemgetter of one position returns the item itself, of none it cannot be made
        return lambda items: [items[i] for i in pick]
    get = itemgetter(*pick)
    return lambda items: list(get(items))
