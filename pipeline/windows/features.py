"""Window features by name: the event columns, and the per-interval counters the short ring keeps.

A :class:`Counter` turns a batch of :class:`EventColumns` into one number per
event (0/1 or a count); the short ring (30 × 10 s) sums it per interval, and
:meth:`pipeline.windows.store.WindowStore.view` exposes its sums over the
last 5 min and 1 min as ``<name>_5m`` / ``<name>_1m``. Counters are stored,
snapshotted and restored **by name** (:mod:`pipeline.state.snapshot`), so a
counter added by a new signal (``Signal.counters``) starts empty on a
restored channel while every other counter keeps its history.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import compress
from operator import attrgetter
from typing import Any, Callable, Sequence

import numpy as np

#: Optional numeric event fields (SPEC §3) a signal may read as columns: float64, NaN where absent.
OPTIONAL_COLUMNS: tuple[str, ...] = ("ttft_ms", "max_stream_gap_ms", "input_tokens", "output_tokens",
                                     "cost_usd", "quota_remaining")


@dataclass
class EventColumns:
    """A batch of validated events as columns (all arrays shape (n,)).

    ``channel`` int64 index from :meth:`WindowStore.channel_index`;
    ``ts_ms`` int64 event time; ``outcome`` int8 (1 upstream failure,
    0 success, -1 neutral: cancelled/filtered); ``ok`` bool (status ok);
    ``latency_ms`` float64 >= 0; ``checked`` bool (structure judged);
    ``missing`` bool (judged and missing a field or unparseable);
    ``rate_limited`` bool.

    ``events``: the request events the rows came from (same order), or
    None; :meth:`column` reads their optional fields on demand, so the hot
    path pays only for the columns a registered signal asks for.
    """

    channel: np.ndarray
    ts_ms: np.ndarray
    outcome: np.ndarray
    ok: np.ndarray
    latency_ms: np.ndarray
    checked: np.ndarray
    missing: np.ndarray
    rate_limited: np.ndarray
    events: Sequence[Any] | None = None
    _cache: dict[str, np.ndarray] = field(default_factory=dict, repr=False)

    _ARRAYS = ("channel", "ts_ms", "outcome", "ok", "latency_ms", "checked", "missing", "rate_limited")

    def take(self, mask: np.ndarray) -> "EventColumns":
        """The rows selected by ``mask`` (bool (n,)); optional columns read so far are kept."""
        arrays = {f: getattr(self, f)[mask] for f in self._ARRAYS}
        out = EventColumns(**arrays, events=None if self.events is None else list(compress(self.events, mask.tolist())))
        out._cache.update({k: v[mask] for k, v in self._cache.items()})
        return out

    def column(self, name: str) -> np.ndarray:
        """Optional event field ``name`` as float64 (n,), NaN where the event lacks it.

        ``name`` is one of :data:`OPTIONAL_COLUMNS`, or ``"cancelled"`` (bool:
        status ``cancelled``). Raises ``KeyError`` for another name and
        ``ValueError`` when the columns were built without their events.
        """
        got = self._cache.get(name)
        if got is not None:
            return got
        if name != "cancelled" and name not in OPTIONAL_COLUMNS:
            raise KeyError(f"unknown event column {name!r}; optional ones: {OPTIONAL_COLUMNS + ('cancelled',)}")
        if self.events is None:
            if len(self) == 0:
                got = np.zeros(0, bool if name == "cancelled" else np.float64)
            else:
                raise ValueError(f"column {name!r}: these EventColumns carry no events")
        elif name == "cancelled":
            got = np.fromiter((e.status == "cancelled" for e in self.events), bool, len(self))
        else:
            got = float_column(self.events, attrgetter(name), len(self))
        self._cache[name] = got
        return got

    def __len__(self) -> int:
        return int(self.channel.shape[0])


def float_column(events: Sequence[Any], get: Callable[[Any], Any], n: int) -> np.ndarray:
    """``get(e)`` of the ``n`` events as float64, NaN where it is None.

    When the first event has the field, the values are read straight into
    float64 (``np.fromiter``), which is cheaper than numpy's conversion of an
    object array; a None met on the way (``TypeError``) falls back to that
    conversion, which maps None to NaN. When the first event lacks it, the
    values are listed once: a field no event carries (the usual case for an
    optional one) then costs one pass and a count of Nones (about half the
    cost of the conversion). Same values either way.
    """
    if n and get(events[0]) is not None:
        try:
            return np.fromiter(map(get, events), np.float64, n)
        except TypeError:
            pass
        return np.array(np.fromiter(map(get, events), object, n), np.float64)
    values = list(map(get, events))
    if values.count(None) == n:
        return np.full(n, np.nan)
    return np.array(np.fromiter(values, object, n), np.float64)


@dataclass(frozen=True)
class Counter:
    """A named per-interval counter of the short ring.

    ``name``: snake_case, unique in a store; the view exposes ``<name>_5m``
    and ``<name>_1m`` (float64 sums, shape (C,)). ``of``: ``EventColumns ->``
    array (n,) of the amount each event adds (bool or float, >= 0). ``doc``:
    what it counts (one line).
    """

    name: str
    of: Callable[[EventColumns], np.ndarray]
    doc: str

    def __post_init__(self) -> None:
        if not self.name.isidentifier() or self.name != self.name.lower():
            raise ValueError(f"counter name must be a lower-case identifier, got {self.name!r}")


#: The counters every store keeps, in the column order of snapshot version 1 (SPEC §4.1-4.4).
BASE_COUNTERS: tuple[Counter, ...] = (
    Counter("judged", lambda c: c.outcome >= 0, "requests judged: success or upstream failure"),
    Counter("failures", lambda c: c.outcome == 1, "upstream failures (error, timeout, rate_limited)"),
    Counter("ok", lambda c: c.ok, "requests with status ok"),
    Counter("neutral", lambda c: c.outcome < 0, "cancelled or filtered requests"),
    Counter("checked", lambda c: c.checked & c.ok, "ok answers whose structure was judged"),
    Counter("missing", lambda c: c.missing & c.checked & c.ok, "checked ok answers missing a field or unparseable"),
    Counter("rate_limited", lambda c: c.rate_limited, "requests with status rate_limited"),
)

#: Counter names of snapshot version 1, whose short-ring counts were positional.
V1_COUNTER_NAMES: tuple[str, ...] = tuple(c.name for c in BASE_COUNTERS)


def counter_layout(extra: tuple[Counter, ...] = ()) -> tuple[Counter, ...]:
    """:data:`BASE_COUNTERS` followed by ``extra``; raises ``ValueError`` on a repeated name."""
    out = BASE_COUNTERS + tuple(extra)
    seen: set[str] = set()
    for c in out:
        if c.name in seen:
            raise ValueError(f"window counter {c.name!r} is declared twice")
        seen.add(c.name)
    return out
