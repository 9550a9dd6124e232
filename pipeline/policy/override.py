"""Operators' manual overrides applied to verdicts (SPEC §4 "Manual override", §3 ``override``).

Pure: no Kafka, no clock of its own. The worker feeds :class:`OverrideTable`
the records of ``channel.control`` (:mod:`pipeline.stream.control`) and passes
every verdict through :meth:`OverrideTable.apply` before it is published and
stored.

Kinds (``Override.kind``):

- ``open``: the channel is forced ``open``, weight 0 and ``route_share`` 0.
- ``healthy``: the channel is forced ``healthy``, weight 1.
- ``weight``: the channel's weight is forced to ``weight`` (0..1); the state is
  the engine's.
- ``freeze`` (``route`` set, no channel): every channel of the route keeps the
  ``weight`` and ``route_share`` of its last verdict before the freeze (the
  global switch: the routers' shares stop moving while the detectors go on).

The engine keeps evaluating underneath: ``reasons`` and ``metrics`` stay the
detectors' findings; the engine's own state and weight are kept in
``metrics["engine_state"]`` / ``metrics["engine_weight"]`` so a reader sees what
the override hides. The verdict carries an ``override`` object (``kind``, ``by``,
``reason``, ``expires_ts_ms``, ``set_ts_ms``, ``weight``, ``state`` when forced,
``route`` for a freeze).

A freeze holds the share *under* a suspicion (:mod:`pipeline.engine.suspects`: a verdict with metric
``suspect_run`` publishes ``route_share`` 0 for about one request latency, at most ``suspect_max_ms``): the
channel's last share before it, so a freeze set during a suspicion does not pin that transient 0 for its TTL.

Expiry is **wall time** (UTC epoch ms): a TTL is what an operator means ("for
the next 30 minutes"), not event time, which stands still while a channel is
idle and runs fast in a replay. A channel override takes precedence over a
route freeze.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Literal

import msgspec

from pipeline.contracts import SUSPECT_METRIC, Verdict

Kind = Literal["open", "healthy", "weight", "freeze"]
KINDS: tuple[str, ...] = ("open", "healthy", "weight", "freeze")

#: Longest ``channel`` / ``route`` name of an override (characters).
MAX_NAME_CHARS = 256
#: Longest ``by`` (display name) and ``key_id`` (characters).
MAX_BY_CHARS = 128
#: Longest ``reason`` (characters): every verdict of the channel carries it.
MAX_REASON_CHARS = 1024
#: Latest accepted timestamp, UTC epoch ms (2286-11-20; ClickHouse ``DateTime64(3)`` holds it).
MAX_TS_MS = 9_999_999_999_999
#: Default longest override (ms): 24 h (``CHANNEL_HEALTH_OVERRIDE_MAX_TTL``).
DEFAULT_MAX_TTL_MS = 86_400_000
#: Clock difference tolerated between the setter and the worker (ms) when the TTL is checked against the wall clock.
CLOCK_SLACK_MS = 60_000
#: Default most overrides in force at once (``CHANNEL_HEALTH_MAX_OVERRIDES``).
DEFAULT_MAX_OVERRIDES = 1000


class OverrideRefused(ValueError):
    """An override or control record breaks its contract; ``code`` is a short reason for counting
    (``malformed``, ``too_large``, ``ttl``, ``too_many_overrides``, ``unsigned``, ``bad_signature``,
    ``unknown_key``, ``key_mismatch``)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


class Override(msgspec.Struct, frozen=True, omit_defaults=True):
    """One operator override (the value of a ``channel.control`` record).

    Exactly one of ``channel`` (kinds ``open``/``healthy``/``weight``) or
    ``route`` (kind ``freeze``) is set. ``weight`` in [0, 1] is required for kind
    ``weight``. ``set_ts_ms`` < ``expires_ts_ms``, both UTC epoch ms (wall time).
    ``by``: who set it (a display name); ``reason``: why (non-empty).
    ``key_id``: the key that signed the record, set by the reader from the
    verified signature (:mod:`pipeline.stream.control`), never taken from the
    record; empty for an unsigned one. Bounds: :func:`validate`.
    """

    kind: Kind
    by: str
    reason: str
    set_ts_ms: int
    expires_ts_ms: int
    channel: str | None = None
    route: str | None = None
    weight: float | None = None
    key_id: str = ""

    @property
    def key(self) -> str:
        """The compaction key: ``channel:<name>`` or ``route:<name>``."""
        return f"channel:{self.channel}" if self.channel is not None else f"route:{self.route}"


def _check_text(name: str, value: object, most: int) -> None:
    if not isinstance(value, str) or len(value) > most:
        size = len(value) if isinstance(value, str) else type(value).__name__
        raise OverrideRefused("malformed", f"{name} must be a string of at most {most} characters, got {size}")


def validate(o: Override, max_ttl_ms: int = DEFAULT_MAX_TTL_MS) -> Override:
    """Return ``o`` if it is well formed; raise :class:`OverrideRefused` (a ``ValueError``) saying what is wrong.

    Bounds: ``channel``/``route`` 1..:data:`MAX_NAME_CHARS` characters, ``by`` and
    ``key_id`` at most :data:`MAX_BY_CHARS`, ``reason`` at most :data:`MAX_REASON_CHARS`;
    ``set_ts_ms`` / ``expires_ts_ms`` integers in 0..:data:`MAX_TS_MS` (UTC epoch ms),
    ``set_ts_ms < expires_ts_ms <= set_ts_ms + max_ttl_ms`` (``max_ttl_ms`` > 0, ms).
    """
    for name, value, most in (("by", o.by, MAX_BY_CHARS), ("reason", o.reason, MAX_REASON_CHARS),
                              ("key_id", o.key_id, MAX_BY_CHARS)):
        _check_text(name, value, most)
    for name, optional in (("channel", o.channel), ("route", o.route)):
        if optional is not None:
            _check_text(name, optional, MAX_NAME_CHARS)
    for name, ts in (("set_ts_ms", o.set_ts_ms), ("expires_ts_ms", o.expires_ts_ms)):
        if type(ts) is not int or not 0 <= ts <= MAX_TS_MS:
            raise OverrideRefused("malformed", f"{name} must be an integer 0..{MAX_TS_MS} (UTC epoch ms), got {ts!r}")
    if o.weight is not None and (type(o.weight) not in (int, float) or not 0.0 <= o.weight <= 1.0):
        raise OverrideRefused("malformed", f"--weight must be in 0..1, got {o.weight!r}")
    if o.kind not in KINDS:
        raise OverrideRefused("malformed", f"unknown override kind {o.kind!r} (one of {', '.join(KINDS)})")
    if o.kind == "freeze":
        if not o.route or o.channel is not None:
            raise OverrideRefused("malformed", "a freeze names a route (and no channel)")
    elif not o.channel or o.route is not None:
        raise OverrideRefused("malformed", f"a {o.kind!r} override names a channel (and no route)")
    if o.kind == "weight":
        if o.weight is None or not (0.0 <= o.weight <= 1.0):
            raise OverrideRefused("malformed", f"--weight must be in 0..1, got {o.weight!r}")
    if not o.reason or not o.reason.strip():
        raise OverrideRefused("malformed", "an override needs a reason (--reason TEXT)")
    if not o.by:
        raise OverrideRefused("malformed", "an override needs an author (by)")
    if o.expires_ts_ms <= o.set_ts_ms:
        raise OverrideRefused("malformed", "an override needs a positive TTL (--ttl DURATION)")
    if o.expires_ts_ms - o.set_ts_ms > max_ttl_ms:
        raise OverrideRefused("ttl", f"the override's TTL {(o.expires_ts_ms - o.set_ts_ms) / 3_600_000:.1f} h "
                                     f"exceeds the maximum {max_ttl_ms / 3_600_000:g} h "
                                     f"(CHANNEL_HEALTH_OVERRIDE_MAX_TTL)")
    return o


@dataclass(frozen=True)
class Change:
    """An audit entry: ``action`` is ``set``, ``clear`` or ``expire``; ``at_ms`` wall time (UTC epoch ms)."""

    action: str
    override: Override
    at_ms: int


class OverrideTable:
    """Overrides in force, by key; applies them to verdicts.

    Not thread-safe (one event loop). ``apply`` remembers each channel's last
    engine weight and share (for freezes) and its last published verdict (so
    the worker can re-publish a channel promptly when an override changes).
    ``max_overrides`` >= 1: most overrides in force at once; ``max_ttl_ms`` > 0:
    latest expiry accepted, ms after the wall clock of :meth:`put` (plus
    :data:`CLOCK_SLACK_MS`).
    """

    def __init__(self, max_overrides: int = DEFAULT_MAX_OVERRIDES, max_ttl_ms: int = DEFAULT_MAX_TTL_MS) -> None:
        if max_overrides < 1 or max_ttl_ms < 1:
            raise ValueError(f"max_overrides and max_ttl_ms must be >= 1, got {max_overrides}, {max_ttl_ms}")
        self.max_overrides, self.max_ttl_ms = max_overrides, max_ttl_ms
        self._active: dict[str, Override] = {}
        self._frozen: dict[str, dict[str, tuple[float, float | None]]] = {}  # route -> channel -> (weight, share)
        self._engine: dict[str, tuple[str, float, float | None]] = {}  # channel -> (route, weight, share)
        self.last: dict[str, Verdict] = {}  # channel -> last published verdict (overrides applied)

    def active(self) -> list[Override]:
        """Overrides in force, sorted by key."""
        return [self._active[k] for k in sorted(self._active)]

    def put(self, o: Override, now_ms: int) -> list[Change]:
        """Record ``o`` (replacing the one of its key).

        An already expired ``o`` still replaces the override of its key, which
        then ends: the latest record of a key is the one in force, as on the
        compacted topic (issue #35: ``override list`` kept an older ``weight 0.2``
        that a later, since expired, ``--healthy`` had replaced). It returns the
        ``set`` and ``expire`` of ``o`` when an override of its key was in
        force, else [] (a replay of old records audits nothing).

        ``now_ms``: wall time, UTC epoch ms. Raises :class:`OverrideRefused` (table
        unchanged) when ``o`` expires more than ``max_ttl_ms`` (+ :data:`CLOCK_SLACK_MS`)
        after ``now_ms``, or is for a new key while ``max_overrides`` are in force.
        """
        if o.expires_ts_ms <= now_ms:
            old = self._active.pop(o.key, None)
            if old is None:
                return []
            if old.kind == "freeze":
                self._frozen.pop(old.route or "", None)
            return [Change("set", o, now_ms), Change("expire", o, now_ms)]
        if o.expires_ts_ms - now_ms > self.max_ttl_ms + CLOCK_SLACK_MS:
            raise OverrideRefused("ttl", f"{o.key} would stay in force {(o.expires_ts_ms - now_ms) / 3_600_000:.1f} h "
                                         f"from now, beyond the maximum TTL {self.max_ttl_ms / 3_600_000:g} h")
        old = self._active.get(o.key)
        if old == o:
            return []  # a replay of the control topic
        if old is None and len(self._active) >= self.max_overrides:
            raise OverrideRefused("too_many_overrides", f"{o.key} refused: {len(self._active)} overrides are in force, "
                                                        f"the most allowed (CHANNEL_HEALTH_MAX_OVERRIDES)")
        self._active[o.key] = o
        if o.kind == "freeze":
            assert o.route is not None
            self._frozen[o.route] = {c: (w, s) for c, (r, w, s) in self._engine.items() if r == o.route}
        return [Change("set", o, now_ms)]

    def clear(self, key: str, now_ms: int) -> list[Change]:
        """Remove the override of ``key`` (``channel:X`` / ``route:R``); [] when none was in force."""
        o = self._active.pop(key, None)
        if o is None:
            return []
        if o.kind == "freeze":
            self._frozen.pop(o.route or "", None)
        return [Change("clear", o, now_ms)]

    def expire(self, now_ms: int) -> list[Change]:
        """Remove every override whose ``expires_ts_ms`` <= ``now_ms`` (wall time); returns the expiries."""
        gone = [k for k, o in self._active.items() if o.expires_ts_ms <= now_ms]
        out = []
        for k in gone:
            o = self._active.pop(k)
            if o.kind == "freeze":
                self._frozen.pop(o.route or "", None)
            out.append(Change("expire", o, now_ms))
        return out

    def affected(self, changes: Iterable[Change]) -> list[str]:
        """Channels whose last published verdict is changed by ``changes`` (to re-publish), sorted."""
        names: set[str] = set()
        for ch in changes:
            o = ch.override
            if o.channel is not None:
                names.add(o.channel)
            else:
                names.update(c for c, v in self.last.items() if v.route == o.route)
        return sorted(c for c in names if c in self.last)

    def apply(self, v: Verdict) -> Verdict:
        """``v`` with the override in force for its channel (or route) applied; ``v`` itself when none.

        Call with every verdict the engine publishes, in order: it also records
        the channel's engine weight and share (a later freeze holds them).
        """
        engine_v = v
        if v.override is not msgspec.UNSET:  # a re-publish: start from the engine's own values
            engine_v = _engine_view(v)
        share = engine_v.metrics.get("route_share")
        share = float(share) if isinstance(share, (int, float)) else None
        if SUSPECT_METRIC in engine_v.metrics:  # its share before the suspicion (module docstring)
            share = self._engine.get(v.channel, (v.route, 0.0, share))[2]
        self._engine[v.channel] = (v.route, float(engine_v.weight), share)
        o = self._active.get(f"channel:{v.channel}") or self._active.get(f"route:{v.route}")
        out = engine_v if o is None else self._forced(engine_v, o)
        self.last[v.channel] = out
        return out

    def republish(self, channel: str) -> Verdict | None:
        """The last published verdict of ``channel`` with the overrides now in force, ``seq`` + 1; None if unseen.

        The caller must make the engine's next ``seq`` of the channel larger
        (see :func:`pipeline.stream.control.bump_seq`).
        """
        last = self.last.get(channel)
        if last is None:
            return None
        return self.apply(msgspec.structs.replace(last, seq=last.seq + 1))

    def _forced(self, v: Verdict, o: Override) -> Verdict:
        metrics = dict(v.metrics)
        metrics["engine_state"] = v.state
        metrics["engine_weight"] = v.weight
        state, weight = v.state, float(v.weight)
        info: dict[str, object] = {"kind": o.kind, "by": o.by, "reason": o.reason,
                                   "expires_ts_ms": o.expires_ts_ms, "set_ts_ms": o.set_ts_ms}
        if o.key_id:
            info["key_id"] = o.key_id
        if o.kind == "open":
            state, weight = "open", 0.0
            metrics["route_share"] = 0.0
        elif o.kind == "healthy":
            state, weight = "healthy", 1.0
        elif o.kind == "weight":
            weight = float(o.weight)  # type: ignore[arg-type]
        else:  # freeze
            held = self._frozen.setdefault(o.route or "", {})
            if v.channel not in held:  # first seen during the freeze: hold from now on
                share0 = metrics.get("route_share") if SUSPECT_METRIC not in v.metrics else self._engine[v.channel][2]
                held[v.channel] = (weight, share0)  # type: ignore[assignment]
            weight, share = held[v.channel]
            if share is not None:
                metrics["route_share"] = share
            info["route"] = o.route
        metrics["engine_route_share"] = v.metrics.get("route_share")
        info["weight"] = weight
        if o.kind in ("open", "healthy"):
            info["state"] = state
        return msgspec.structs.replace(v, state=state, weight=weight, metrics=metrics, override=info)


def _engine_view(v: Verdict) -> Verdict:
    """Undo :meth:`OverrideTable._forced` on a published verdict (the engine's state, weight and share)."""
    m = dict(v.metrics)
    state = m.pop("engine_state", v.state)
    weight = m.pop("engine_weight", v.weight)
    if "engine_route_share" in m:
        m["route_share"] = m.pop("engine_route_share")
    return msgspec.structs.replace(v, state=state, weight=weight, metrics=m, override=msgspec.UNSET)
