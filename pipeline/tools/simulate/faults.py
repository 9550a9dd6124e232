"""Injected faults and their effect on a channel over scenario time (SPEC §5).

A :class:`Fault` acts on one channel during ``[start_s, end_s)`` of scenario
time (seconds since the scenario start, event time). Ramped kinds grow
linearly from nothing at ``start_s`` to full strength at
``start_s + ramp_s`` (default ``ramp_s = end_s - start_s``) and hold until
``end_s``; at ``end_s`` the channel is healthy again.

Kinds and ``params``:

``latency_ramp``
    ``factor`` (> 0): latency multiplier at full strength (e.g. 800/180 for
    a P95 of 180 -> 800 ms); ``ramp_s``.
``error_ramp``
    ``to_rate`` in [0, 1]: total failure probability at full strength,
    baseline included (e.g. 0.046 from a 0.002 baseline); ``ramp_s``;
    ``mix``: ``{status: weight}`` of the injected failures (default
    :data:`DEFAULT_FAULT_MIX`); ``curve`` (>= 1, default 1): the added
    failure probability grows as ``progress ** curve``, so with ``curve`` 2
    failures stay near the baseline early in the ramp and accelerate late
    (a saturating backend: queues, hence latency, build up first; timeouts
    and load shedding follow once they overflow).
``missing_fields``
    ``to_rate`` in [0, 1]: share of structured ``ok`` answers missing a
    required field at full strength, baseline included; ``ramp_s``.
``outage``
    every request fails: ``status`` (default ``error``), ``http_status``
    (default 503), ``error_type`` (default ``upstream_unavailable``),
    ``latency_ms`` (default 60: a fast refusal).
``consecutive_failures``
    the channel gets no traffic in the window except ``count`` failures at
    ``start_s + i * gap_s`` (i = 0..count-1); ``gap_s`` > 0,
    ``start_s + (count - 1) * gap_s < end_s``; ``status`` (default
    ``error``), ``http_status`` (502), ``error_type``
    (``upstream_error``), ``latency_ms`` (250).
``quality_drift``
    answers keep their ``ok`` status, latency and fields but turn useless
    (SPEC §5.4): ``to_rate`` in [0, 1] is the share of the channel's chat
    answers (``chat_share``) that are useless at full strength; ``ramp_s``;
    ``mix``: ``{kind: weight}`` over ``refusal``, ``truncated``,
    ``off_topic`` (default equal weights; see :mod:`.chat_answers`).
``overload``
    the channel is load-sensitive in the window: ``capacity_rps`` (> 0),
    optional ``latency_gain`` and ``error_gain`` (default: the channel's
    ``overload_latency_gain`` / ``overload_error_gain``). Above capacity,
    latency x ``(1 + latency_gain * excess)`` and failure probability
    ``+ error_gain * excess`` with ``excess = load / capacity - 1``.

Stream, quota and cost kinds (SPEC §5.6, §5.7, §4.8; their effects are in
:mod:`.usage_faults`):

``stream_stall``
    ``to_rate`` in [0, 1]: share of successful streams that stall at full
    strength; ``ramp_s``; ``stall_ms`` (> 0, default 8000): median stall,
    lognormal with ``stall_sigma`` (default 0.2); ``repeat`` in [0, 1]
    (default 0.5): share of stalled streams that stall a second time;
    ``before_first_token`` in [0, 1] (default 0.25): share of first stalls
    that delay the first token; ``client_timeout_ms`` (> 0, default 15000):
    the client cancels a stream still running then (status ``cancelled``);
    ``impatient`` in [0, 1] (default 0): share of the streams that did not
    stall which the client cancels anyway, at a uniform point after the
    first token (a control for cancels that are no upstream's fault).
``quota_drain``
    the channel's quota (``ChannelProfile.quota_remaining``) drains
    linearly from its level at ``start_s`` to 0 over ``drain_s`` (> 0,
    <= the window); below ``slow_below`` (in (0, 1], default 0.1) latency
    grows linearly to ``slow_factor`` (>= 1, default 2.5) and a share of
    requests rising to ``pre_429_share`` (in [0, 1], default 0.1) is refused
    with HTTP 429; from ``start_s + drain_s`` to ``end_s`` every request is
    refused (429 ``quota_exhausted``). At ``end_s`` the daily quota resets.
``cost_creep``
    ``cost_usd`` x ``factor`` (> 0, e.g. 1.3 for +30 %) in the window: a
    step at ``start_s``, or a linear ramp over ``ramp_s`` when given.

Error-class kinds (SPEC §4.1, issue #32): an ``outage`` (and a
``consecutive_failures``) may also set ``error_message`` (text) and
``retry_after_s`` (>= 0), which its failed events carry.

``caller_errors``
    the client's fault, not the channel's: a share ``share`` in (0, 1] of the
    requests that would have succeeded fail with ``http_status`` (default
    400), ``error_type`` (default ``context_length_exceeded``) and
    ``error_message``; the channel's true failure probability is unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

import numpy as np

from .channels import FAILURE_KINDS, ChannelProfile, normalised_mix

FAULT_KINDS: tuple[str, ...] = (
    "latency_ramp",
    "error_ramp",
    "missing_fields",
    "outage",
    "consecutive_failures",
    "overload",
    "quality_drift",
    "stream_stall",
    "quota_drain",
    "cost_creep",
    "caller_errors",
)

#: Kinds of useless answer a ``quality_drift`` fault produces, default mix.
DEFAULT_USELESS_MIX: dict[str, float] = {"refusal": 1.0, "truncated": 1.0, "off_topic": 1.0}


def normalised_useless_mix(mix: Mapping[str, float]) -> dict[str, float]:
    """Validate a ``quality_drift`` mix ``{kind: weight}`` and scale it to sum 1."""
    unknown = set(mix) - set(DEFAULT_USELESS_MIX)
    if unknown:
        raise ValueError(f"quality_drift: unknown useless kind {sorted(unknown)}; valid: {list(DEFAULT_USELESS_MIX)}")
    if any(not (float(v) >= 0) for v in mix.values()) or sum(float(v) for v in mix.values()) <= 0:
        raise ValueError("quality_drift: mix weights must be >= 0 and sum to > 0")
    total = sum(float(v) for v in mix.values())
    return {k: float(v) / total for k, v in mix.items() if float(v) > 0}

#: Status mix of failures injected by an ``error_ramp`` without ``mix``.
DEFAULT_FAULT_MIX: dict[str, float] = {"error": 0.6, "timeout": 0.2, "rate_limited": 0.2}

#: Overload effects are capped at this failure probability.
MAX_OVERLOAD_ERROR_RATE = 0.5


def _rate(params: Mapping[str, Any], key: str, kind: str) -> float:
    if key not in params:
        raise ValueError(f"{kind} fault needs params[{key!r}]")
    v = float(params[key])
    if not 0.0 <= v <= 1.0:
        raise ValueError(f"{kind} fault: {key} must be in [0, 1], got {v}")
    return v


@dataclass(frozen=True)
class Fault:
    """One injected fault: ``kind`` on ``channel`` during ``[start_s, end_s)``.

    Raises ``ValueError`` for an unknown kind (the message lists the valid
    ones), ``end_s <= start_s``, a negative start or invalid ``params``.
    """

    channel: str
    kind: str
    start_s: float
    end_s: float
    params: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.kind not in FAULT_KINDS:
            raise ValueError(f"unknown fault kind {self.kind!r}; valid: {', '.join(FAULT_KINDS)}")
        if not (self.start_s >= 0 and self.end_s > self.start_s):
            raise ValueError(f"fault {self.kind} on {self.channel}: need 0 <= start_s < end_s")
        p = self.params
        ramp = p.get("ramp_s")
        if ramp is not None and not 0 < float(ramp) <= self.end_s - self.start_s:
            raise ValueError(f"fault {self.kind}: ramp_s must be in (0, end_s - start_s]")
        if self.kind == "latency_ramp":
            if not float(p.get("factor", 0)) > 0:
                raise ValueError("latency_ramp fault needs params['factor'] > 0")
        elif self.kind == "error_ramp":
            _rate(p, "to_rate", self.kind)
            if not float(p.get("curve", 1.0)) >= 1.0:
                raise ValueError(f"error_ramp fault: curve must be >= 1, got {p.get('curve')}")
            normalised_mix(p.get("mix", DEFAULT_FAULT_MIX))
        elif self.kind == "missing_fields":
            _rate(p, "to_rate", self.kind)
        elif self.kind in ("outage", "consecutive_failures"):
            status = p.get("status", "error")
            if status not in FAILURE_KINDS:
                raise ValueError(f"{self.kind} fault: status must be one of {FAILURE_KINDS}")
            if float(p.get("latency_ms", 0)) < 0:
                raise ValueError(f"{self.kind} fault: latency_ms must be >= 0")
            if float(p.get("retry_after_s", 0)) < 0:
                raise ValueError(f"{self.kind} fault: retry_after_s must be >= 0")
            if self.kind == "consecutive_failures":
                count, gap = int(p.get("count", 0)), float(p.get("gap_s", 0))
                if count < 1 or gap <= 0:
                    raise ValueError("consecutive_failures fault needs count >= 1 and gap_s > 0")
                if self.start_s + (count - 1) * gap >= self.end_s:
                    raise ValueError("consecutive_failures fault: the last failure falls after end_s")
        elif self.kind == "caller_errors":
            if not 0.0 < float(p.get("share", 0.0)) <= 1.0:
                raise ValueError(f"caller_errors fault: share must be in (0, 1], got {p.get('share')}")
        elif self.kind == "quality_drift":
            _rate(p, "to_rate", self.kind)
            normalised_useless_mix(p.get("mix", DEFAULT_USELESS_MIX))
        elif self.kind == "overload":
            if not float(p.get("capacity_rps", 0)) > 0:
                raise ValueError("overload fault needs params['capacity_rps'] > 0")
        elif self.kind == "stream_stall":
            _rate(p, "to_rate", self.kind)
            for key in ("repeat", "before_first_token", "impatient"):
                if key in p:
                    _rate(p, key, self.kind)
            for key in ("stall_ms", "client_timeout_ms", "stall_sigma"):
                if key in p and not float(p[key]) > 0:
                    raise ValueError(f"stream_stall fault: {key} must be > 0, got {p[key]}")
        elif self.kind == "quota_drain":
            if not 0 < float(p.get("drain_s", 0)) <= self.end_s - self.start_s:
                raise ValueError("quota_drain fault needs params['drain_s'] in (0, end_s - start_s]")
            if not 0 < float(p.get("slow_below", 0.1)) <= 1 or not float(p.get("slow_factor", 2.5)) >= 1:
                raise ValueError("quota_drain fault: need 0 < slow_below <= 1 and slow_factor >= 1")
            if "pre_429_share" in p:
                _rate(p, "pre_429_share", self.kind)
        elif self.kind == "cost_creep":
            if not float(p.get("factor", 0)) > 0:
                raise ValueError("cost_creep fault needs params['factor'] > 0")

    def __iter__(self):
        """Unpack as ``(channel, kind, start_s, end_s, params)``."""
        return iter((self.channel, self.kind, self.start_s, self.end_s, self.params))

    @property
    def ramp_s(self) -> float:
        """Seconds from ``start_s`` to full strength."""
        return float(self.params.get("ramp_s", self.end_s - self.start_s))

    def active(self, t_s: np.ndarray | float) -> np.ndarray:
        """Boolean: ``start_s <= t_s < end_s`` (shape of ``t_s``)."""
        t = np.asarray(t_s, dtype=np.float64)
        return (t >= self.start_s) & (t < self.end_s)

    def strength(self, t_s: np.ndarray | float) -> np.ndarray:
        """Ramp progress in [0, 1]: 0 outside the window, linear to 1 over ``ramp_s``."""
        t = np.asarray(t_s, dtype=np.float64)
        frac = np.clip((t - self.start_s) / self.ramp_s, 0.0, 1.0)
        return np.where(self.active(t), frac, 0.0)

    def failure_times_s(self) -> np.ndarray:
        """Scheduled failure times of a ``consecutive_failures`` fault, seconds; else empty."""
        if self.kind != "consecutive_failures":
            return np.zeros(0)
        count, gap = int(self.params["count"]), float(self.params["gap_s"])
        return self.start_s + gap * np.arange(count, dtype=np.float64)


@dataclass(frozen=True, eq=False)
class Effects:
    """What the faults do to one channel at times ``t_s`` (all shape (n,)).

    latency_factor: multiplier on the healthy latency (>= 0), day/night and
    overload not included. error_extra: list of ``(extra_probability, mix)``
    per ``error_ramp`` (probability added to the baseline; may be negative
    when a ramp targets less than the baseline). missing_rate: share of
    structured ok answers that are hollow, in [0, 1]. outage: the
    ``outage`` fault active at each time, as an index into ``outages``
    (-1: none). suppressed: bool, the channel takes no regular traffic
    (``consecutive_failures`` window). capacity_rps, latency_gain,
    error_gain: the load sensitivity in force (capacity ``nan`` = unlimited).
    useless_rate: share of chat answers turned useless by ``quality_drift``
    faults, in [0, 1]; useless_mix: ``{kind: share}`` of the last such fault
    active in the window (the default mix where none).
    """

    latency_factor: np.ndarray
    error_extra: list[tuple[np.ndarray, dict[str, float]]]
    missing_rate: np.ndarray
    outage: np.ndarray
    outages: list[Fault]
    suppressed: np.ndarray
    capacity_rps: np.ndarray
    latency_gain: np.ndarray
    error_gain: np.ndarray
    useless_rate: np.ndarray
    useless_mix: dict[str, float]


def channel_effects(channel: ChannelProfile, faults: list[Fault] | tuple[Fault, ...], t_s: np.ndarray) -> Effects:
    """Evaluate the ``faults`` of ``channel`` at scenario times ``t_s`` (seconds, shape (n,)).

    Faults on other channels are ignored. Later faults win where windows of
    ``outage`` or ``overload`` overlap.
    """
    t = np.asarray(t_s, dtype=np.float64)
    n = t.shape
    lat = np.ones(n)
    missing = np.full(n, channel.missing_rate)
    outage = np.full(n, -1, dtype=np.int64)
    suppressed = np.zeros(n, dtype=bool)
    cap = np.full(n, np.nan if channel.capacity_rps is None else channel.capacity_rps)
    lgain = np.full(n, channel.overload_latency_gain)
    egain = np.full(n, channel.overload_error_gain)
    extra: list[tuple[np.ndarray, dict[str, float]]] = []
    outages: list[Fault] = []
    useless = np.zeros(n)
    useless_mix = normalised_useless_mix(DEFAULT_USELESS_MIX)
    base = channel.base_error_rate
    for f in faults:
        if f.channel != channel.name:
            continue
        if f.kind == "latency_ramp":
            lat = lat * (1.0 + (float(f.params["factor"]) - 1.0) * f.strength(t))
        elif f.kind == "error_ramp":
            extra.append(
                ((float(f.params["to_rate"]) - base) * f.strength(t) ** float(f.params.get("curve", 1.0)),
                 normalised_mix(f.params.get("mix", DEFAULT_FAULT_MIX)))
            )
        elif f.kind == "missing_fields":
            missing = missing + (float(f.params["to_rate"]) - channel.missing_rate) * f.strength(t)
        elif f.kind == "outage":
            outages.append(f)
            outage = np.where(f.active(t), len(outages) - 1, outage)
        elif f.kind == "consecutive_failures":
            suppressed |= f.active(t)
        elif f.kind == "quality_drift":
            useless = np.maximum(useless, float(f.params["to_rate"]) * f.strength(t))
            if np.any(f.active(t)):
                useless_mix = normalised_useless_mix(f.params.get("mix", DEFAULT_USELESS_MIX))
        elif f.kind == "overload":
            on = f.active(t)
            cap = np.where(on, float(f.params["capacity_rps"]), cap)
            lgain = np.where(on, float(f.params.get("latency_gain", channel.overload_latency_gain)), lgain)
            egain = np.where(on, float(f.params.get("error_gain", channel.overload_error_gain)), egain)
    return Effects(
        latency_factor=lat,
        error_extra=extra,
        missing_rate=np.clip(missing, 0.0, 1.0),
        outage=outage,
        outages=outages,
        suppressed=suppressed,
        capacity_rps=cap,
        latency_gain=lgain,
        error_gain=egain,
        useless_rate=np.clip(useless, 0.0, 1.0),
        useless_mix=useless_mix,
    )


def overload_factors(effects: Effects, load_rps: float | np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(latency_multiplier, extra_failure_probability)`` at ``load_rps`` (req/s).

    Both have the shape of the effects' arrays; unlimited capacity gives (1, 0).
    The extra failure probability is capped at :data:`MAX_OVERLOAD_ERROR_RATE`.
    """
    cap = effects.capacity_rps
    limited = np.isfinite(cap)
    with np.errstate(invalid="ignore", divide="ignore"):
        excess = np.where(limited, np.maximum(0.0, np.asarray(load_rps, dtype=np.float64) / cap - 1.0), 0.0)
    lat = 1.0 + effects.latency_gain * excess
    err = np.minimum(effects.error_gain * excess, MAX_OVERLOAD_ERROR_RATE)
    return lat, err


def failure_probability(channel: ChannelProfile, effects: Effects, overload_error: np.ndarray) -> np.ndarray:
    """Total failure probability per time (baseline + ramps + overload), in [0, 1]; 1 in an outage."""
    p = np.full(effects.latency_factor.shape, channel.base_error_rate)
    for extra, _mix in effects.error_extra:
        p = p + extra
    p = np.clip(p + overload_error, 0.0, 1.0)
    return np.where(effects.outage >= 0, 1.0, p)
