"""The latest verdict per channel, turned into per-route traffic shares.

Pure (no Kafka, no event loop): a router, or :class:`~pipeline.router.
subscriber.HealthSubscriber`, feeds it :class:`~pipeline.contracts.Verdict`
objects and reads :class:`RouteWeights`.

Rules:

- **Latest wins, replays ignored.** Delivery is at-least-once, so a verdict
  may arrive twice. A verdict is ignored when its ``seq`` is <= the stored
  one of its channel, unless its ``ts_ms`` is newer (a restarted pipeline
  that did not restore its counters starts ``seq`` again at 1).
- **Membership follows the latest verdict.** A channel belongs to the route
  named by its latest accepted verdict; a verdict naming another route moves
  it there. A route with no channel left disappears.
- **Shares are the engine's bounded route shares** (``metrics.route_share``,
  SPEC §4): the worker already limits how fast a channel's share may grow per
  round (``PolicyConfig.max_share_growth``), so a router must not re-normalise
  raw weights (that would undo the anti-flip-flop bound). Shares are used as
  published (normalised to sum 1 only against rounding); a channel at weight
  0 counts 0 (a pre-trip verdict carries no share). When a verdict of
  the route at a weight above 0 lacks ``route_share`` (an older worker), the route falls back to
  its weights normalised within the route, and ``source`` says ``weights``.
  When every share is 0 every share is 0 and ``all_open`` is set, so the
  router applies its own fallback rule.
- **A suspicion never darkens a route.** A suspect channel (metric
  ``suspect_run``, :mod:`pipeline.engine.suspects`) publishes share 0 while
  the engine sees another channel of its route in service; when the router
  sees every share at 0 all the same (that peer forced ``open`` or to weight
  0 by an operator, or without a verdict yet), the suspects not forced by an
  override share the route by their weights (SPEC §4.2: never a dark route
  by inference).
- **Overrides are honoured.** A channel under an operator's channel override
  (verdict ``override`` of kind ``open``/``healthy``/``weight``) counts with the
  forced weight against the others' ``k × route_share`` (k channels in the
  route: 1 for each channel of an all-healthy route), then the route is
  normalised: forcing one of two equal channels to 0.5 gives it 1/3, forcing
  it open gives the other all. Applied at once, not ramped: it is the last
  resort. A route freeze needs nothing here: the worker holds the shares.
- **Capacity caps are kept.** A channel whose verdict carries ``metrics.max_share`` (SPEC §4.2: a
  learned capacity, in (0, 1)) is overloaded above that share of the route. The engine's
  ``route_share`` already respects it; when the table re-normalises itself (an override, or the
  ``weights`` fallback) a capped channel is held to its cap and the excess goes to the uncapped
  channels with a share, in proportion to their shares (none: the shares stay, the traffic has to
  go somewhere). ``RouteWeights.max_shares`` lists the caps.
- **Fail-static.** When the newest verdict of a route was received more than
  ``stale_after_s`` ago (the pipeline stopped), the last known shares are
  still returned, flagged ``stale``; a fresh verdict clears the flag.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Callable

from pipeline.contracts import SUSPECT_METRIC, Verdict

#: Default staleness bound: three 30 s evaluation rounds (SPEC §4) missed.
DEFAULT_STALE_AFTER_S = 90.0


@dataclass(frozen=True)
class RouteWeights:
    """Traffic shares of one route's channels, as a router uses them.

    ``shares``: channel -> share in [0, 1], summing to 1 (all 0 when
    ``all_open``). ``weights``: channel -> the verdict's raw ``weight``.
    ``states``: channel -> verdict ``state``. ``stale``: the newest verdict of
    the route is older than the table's ``stale_after_s`` (shares are the last
    known ones). ``age_s``: seconds since the newest verdict of the route was
    received (table clock). Channels are in name order.
    """

    route: str
    shares: dict[str, float]
    weights: dict[str, float]
    states: dict[str, str]
    stale: bool
    age_s: float
    all_open: bool
    source: str = "route_share"
    overridden: tuple[str, ...] = ()
    #: channel -> its learned capacity cap (``metrics.max_share``), for the capped channels only.
    max_shares: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class _Entry:
    verdict: Verdict
    received_s: float


class HealthTable:
    """Latest verdict per channel, grouped by route.

    ``stale_after_s`` > 0: age (seconds, by ``clock``) beyond which a route's
    shares are flagged stale. ``clock``: seconds, monotonic (injectable for
    tests). Raises ``ValueError`` for a non-positive or non-finite bound.
    Not thread-safe; use it from one thread or event loop.
    """

    def __init__(self, stale_after_s: float = DEFAULT_STALE_AFTER_S,
                 clock: Callable[[], float] = time.monotonic):
        if not (math.isfinite(stale_after_s) and stale_after_s > 0):
            raise ValueError(f"stale_after_s must be a positive number, got {stale_after_s!r}")
        self.stale_after_s = float(stale_after_s)
        self._clock = clock
        self._entries: dict[str, _Entry] = {}
        self._routes: dict[str, set[str]] = {}
        #: Verdicts stored / ignored as replays or out of order.
        self.accepted = 0
        self.ignored = 0

    def update(self, verdict: Verdict) -> bool:
        """Store ``verdict`` if it is newer than the channel's stored one.

        Returns True when stored, False when ignored (``seq`` <= stored and
        ``ts_ms`` not newer). Raises ``ValueError`` for a weight outside
        [0, 1] or not finite, or an empty channel or route name.
        """
        if not verdict.channel or not verdict.route:
            raise ValueError("verdict has an empty channel or route")
        if not (isinstance(verdict.weight, (int, float)) and 0.0 <= verdict.weight <= 1.0):
            raise ValueError(f"verdict weight must be in [0, 1], got {verdict.weight!r} for {verdict.channel!r}")
        old = self._entries.get(verdict.channel)
        if old is not None and verdict.seq <= old.verdict.seq and verdict.ts_ms <= old.verdict.ts_ms:
            self.ignored += 1
            return False
        if old is not None and old.verdict.route != verdict.route:
            self._leave(verdict.channel, old.verdict.route)
        self._entries[verdict.channel] = _Entry(verdict, self._clock())
        self._routes.setdefault(verdict.route, set()).add(verdict.channel)
        self.accepted += 1
        return True

    def forget(self, channel: str) -> bool:
        """Drop ``channel`` (e.g. a tombstone on the compacted topic).

        Returns False when the channel was unknown.
        """
        entry = self._entries.pop(channel, None)
        if entry is None:
            return False
        self._leave(channel, entry.verdict.route)
        return True

    def _leave(self, channel: str, route: str) -> None:
        members = self._routes[route]
        members.discard(channel)
        if not members:
            del self._routes[route]

    def routes(self) -> list[str]:
        """Names of the routes with at least one channel, sorted."""
        return sorted(self._routes)

    def channels(self, route: str) -> list[str]:
        """Channels of ``route``, sorted. Raises ``KeyError`` for an unknown route."""
        if route not in self._routes:
            raise KeyError(f"no verdicts for route {route!r}")
        return sorted(self._routes[route])

    def verdict(self, channel: str) -> Verdict | None:
        """The stored verdict of ``channel``, or None."""
        entry = self._entries.get(channel)
        return entry.verdict if entry else None

    def latest(self) -> dict[str, Verdict]:
        """The newest accepted verdict of every channel (channel → verdict)."""
        return {c: e.verdict for c, e in self._entries.items()}

    def weights(self, route: str) -> RouteWeights:
        """Current :class:`RouteWeights` of ``route``.

        Raises ``KeyError`` when no verdict of the route has been received
        (the router then uses its own default rule).
        """
        names = self.channels(route)
        entries = [self._entries[c] for c in names]
        raw = {c: float(e.verdict.weight) for c, e in zip(names, entries)}
        shares, source, overridden = route_shares([e.verdict for e in entries])
        total = sum(shares.values())
        age_s = max(0.0, self._clock() - max(e.received_s for e in entries))
        return RouteWeights(
            route=route,
            shares=shares,
            weights=raw,
            states={c: e.verdict.state for c, e in zip(names, entries)},
            stale=age_s > self.stale_after_s,
            age_s=age_s,
            all_open=total <= 0,
            source=source,
            overridden=overridden,
            max_shares={c: cap for c, e in zip(names, entries) if (cap := _max_share(e.verdict)) is not None},
        )

    def snapshot(self) -> dict[str, dict]:
        """JSON-ready view for display: route -> flags and per-channel rows.

        Each route has ``stale``, ``age_s``, ``all_open`` and ``channels``:
        channel -> ``state``, ``weight``, ``share``, ``reasons``, ``seq``,
        ``ts_ms`` and ``age_s`` (seconds since that verdict was received).
        """
        now_s = self._clock()
        out: dict[str, dict] = {}
        for route in self.routes():
            rw = self.weights(route)
            rows = {}
            for c in rw.shares:
                e = self._entries[c]
                rows[c] = {
                    "state": e.verdict.state,
                    "weight": rw.weights[c],
                    "share": rw.shares[c],
                    "reasons": list(e.verdict.reasons),
                    "seq": e.verdict.seq,
                    "ts_ms": e.verdict.ts_ms,
                    "age_s": max(0.0, now_s - e.received_s),
                }
            out[route] = {"stale": rw.stale, "age_s": rw.age_s, "all_open": rw.all_open, "channels": rows}
        return out


_CHANNEL_OVERRIDES = ("open", "healthy", "weight")


def route_shares(verdicts: list[Verdict]) -> tuple[dict[str, float], str, tuple[str, ...]]:
    """Shares of one route's channels from their latest verdicts (rules in the module docstring).

    Returns ``(channel -> share in [0, 1] summing to 1 or all 0, source, overridden channels)``.
    """
    import msgspec

    k = len(verdicts)
    # a channel at weight 0 gets no traffic whatever its share said (the engine's pre-trip verdict of a
    # failure run carries no route_share: the others' shares are re-bounded at the next round)
    shares_in = [0.0 if float(v.weight) <= 0 else v.metrics.get("route_share") for v in verdicts]
    usable = all(isinstance(s, (int, float)) and math.isfinite(s) and s >= 0 for s in shares_in)
    source = "route_share" if usable else "weights"
    overridden = tuple(v.channel for v in verdicts
                       if v.override is not msgspec.UNSET and v.override.get("kind") in _CHANNEL_OVERRIDES)
    x = {}
    for v, s in zip(verdicts, shares_in):
        if v.channel in overridden:
            x[v.channel] = float(v.weight)
        elif usable:
            x[v.channel] = float(s) * (k if overridden else 1)  # type: ignore[arg-type]
        else:
            x[v.channel] = float(v.weight)
    total = sum(x.values())
    if total <= 0:  # a suspicion never darkens a route (module docstring): the suspects by their weights
        x = {v.channel: float(v.weight) if SUSPECT_METRIC in v.metrics and v.channel not in overridden else 0.0
             for v in verdicts}
        total = sum(x.values())
    out = {c: (w / total if total > 0 else 0.0) for c, w in x.items()}
    if overridden or not usable:  # re-normalised here: keep the capacity caps the engine's shares kept
        out = keep_caps(out, {v.channel: cap for v in verdicts if (cap := _max_share(v)) is not None
                            and v.channel not in overridden})
    return out, source, overridden


def _max_share(v: Verdict) -> float | None:
    """A verdict's learned capacity cap (``metrics.max_share`` in (0, 1)), or None."""
    cap = v.metrics.get("max_share")
    return float(cap) if isinstance(cap, (int, float)) and 0 < cap < 1 else None


def keep_caps(shares: dict[str, float], caps: dict[str, float]) -> dict[str, float]:
    """``shares`` (summing to 1 or 0) with each capped channel at most its cap, the excess moved to the
    uncapped channels with a share, in proportion to their shares; unchanged when none has one. For a
    router that re-normalises shares itself (an override here, the LiteLLM hook's model group).

    >>> keep_caps({"a": 0.9, "b": 0.1}, {"a": 0.6})
    {'a': 0.6, 'b': 0.4}
    """
    excess = sum(max(0.0, shares[c] - cap) for c, cap in caps.items() if c in shares)
    takers = {c: s for c, s in shares.items() if c not in caps and s > 0}
    base = sum(takers.values())
    if excess <= 1e-12 or base <= 0:
        return shares
    return {c: (min(s, caps[c]) if c in caps else s + excess * takers.get(c, 0.0) / base)
            for c, s in shares.items()}
