"""Validated request events → the engine's columns (:class:`~pipeline.windows.features.EventColumns`).

Status codes and outcomes (SPEC §3-4: ``error``, ``timeout`` and
``rate_limited`` are upstream failures, ``ok`` a success, ``cancelled`` and
``filtered`` neutral), the structure flags ingest resolved onto each event
(:func:`resolve_structure`, :func:`structure_flags`) and the per-event arrays
(:func:`event_arrays`, :func:`make_columns`). The engine registers the
channels; nothing here keeps state.
"""

from __future__ import annotations

from itertools import repeat
from operator import attrgetter, is_not, itemgetter
from typing import Sequence

import numpy as np

from pipeline.contracts import FAILURE_STATUSES, RequestEvent
from pipeline.windows.features import EventColumns

_TS = attrgetter("ts_ms")
_STATUS = attrgetter("status")
_LATENCY = attrgetter("latency_ms")
_CHANNEL = attrgetter("channel")
_ROUTE = attrgetter("route")
_TIER = attrgetter("tier")
_MISSING = attrgetter("missing_fields")
_PARSE_OK = attrgetter("parse_ok")
_FIRST = itemgetter(0)
#: Status → small code; outcome per code (1 upstream failure, 0 ok, -1 neutral).
_STATUS_CODE = {"ok": 0, "error": 1, "timeout": 2, "rate_limited": 3, "cancelled": 4, "filtered": 5}
_RATE_LIMITED_CODE = _STATUS_CODE["rate_limited"]
_CANCELLED_CODE = _STATUS_CODE["cancelled"]
_OUTCOME_OF_CODE = np.array([1 if s in FAILURE_STATUSES else (0 if s == "ok" else -1) for s in _STATUS_CODE],
                            dtype=np.int8)
_NOT_CHECKED: tuple[None, None] = (None, None)


def resolve_structure(events: Sequence[RequestEvent]) -> tuple[list, np.ndarray, np.ndarray]:
    """``(structure, checked, missing)`` per event, read from the flags ingest resolved onto it.

    Events come with ``parse_ok`` / ``missing_fields`` resolved by
    :func:`pipeline.ingest.structure.resolve_onto` (the decoder and
    :func:`pipeline.engine_replay.replay` call it): ``parse_ok`` None is "not
    checked", True/False "checked"; no rule is applied here. Unchecked
    events share one ``(None, None)`` (one C-level scan finds the others).
    """
    n = len(events)
    parse = list(map(_PARSE_OK, events))
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
                 latency: np.ndarray, checked: np.ndarray, missing: np.ndarray) -> EventColumns:
    """:class:`EventColumns` of one chunk (all arrays shape (n,); ``channel`` the store's indices)."""
    outcome = _OUTCOME_OF_CODE[code]
    return EventColumns(channel=channel, ts_ms=ts, outcome=outcome, ok=outcome == 0, latency_ms=latency,
                        checked=checked, missing=missing, rate_limited=code == _RATE_LIMITED_CODE,
                        events=events, _cache={"cancelled": code == _CANCELLED_CODE})
