"""Channel and route profiles: how a healthy channel behaves (SPEC §1, §3, §4.1).

A :class:`ChannelProfile` says how one channel (provider + model + pool, e.g.
``lepton/llama-70b@free``) answers when nothing is wrong: its latency
distribution (real llmperf measurements rescaled, :class:`LatencyModel`), its
baseline failure rate and failure mix, its capacity and how it reacts to
load above it, and which share of its answers are structured (JSON objects
or tool calls) with ``expected_fields``.

A :class:`RouteSpec` groups interchangeable channels: the day-peak arrival
rate of the route, its static traffic shares and which Azure trace shapes
its bursts and token counts.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal, Mapping

import numpy as np

from .traces import LlmperfTrace

Tier = Literal["free", "paid"]

#: Baseline failure rate per tier. SPEC §4.1: free channels have a lower
#: baseline error rate than paid ones (trip lines 0.35 % vs 0.5 %); the
#: simulator uses 0.2 % (free) and 0.3 % (paid), below both lines.
BASE_ERROR_RATE: dict[str, float] = {"free": 0.002, "paid": 0.003}

#: Share of each failure status among baseline failures, per tier (a free
#: pool hits rate limits more often; a paid one times out more often).
DEFAULT_FAILURE_MIX: dict[str, dict[str, float]] = {
    "free": {"error": 0.5, "rate_limited": 0.4, "timeout": 0.1},
    "paid": {"error": 0.7, "timeout": 0.2, "rate_limited": 0.1},
}

#: Statuses a failure can take (a subset of SPEC §3 statuses that count as
#: upstream failures, ``pipeline.contracts.FAILURE_STATUSES``).
FAILURE_KINDS: tuple[str, ...] = ("error", "timeout", "rate_limited")

#: HTTP status and ``error_type`` reported for a simulated failure.
FAILURE_HTTP: dict[str, tuple[int, str]] = {
    "error": (502, "upstream_error"),
    "timeout": (504, "upstream_timeout"),
    "rate_limited": (429, "rate_limited"),
}

#: Default client timeout for a ``timeout`` failure, milliseconds.
DEFAULT_TIMEOUT_MS = 30_000.0

#: Longest pause between streamed chunks as a multiple of the mean
#: inter-token latency (llmperf gives only the mean; ~150 tokens per answer
#: make the longest gap a few times the mean). Modelled, not measured.
STREAM_GAP_ITL_FACTOR = 4.0


def _check_share(name: str, value: float) -> None:
    if not (0.0 <= value <= 1.0) or not math.isfinite(value):
        raise ValueError(f"{name} must be in [0, 1], got {value!r}")


def normalised_mix(mix: Mapping[str, float]) -> dict[str, float]:
    """Validate a failure mix ``{status: weight}`` and scale it to sum 1.

    Raises ``ValueError`` for an unknown status, a negative weight or a zero sum.
    """
    unknown = set(mix) - set(FAILURE_KINDS)
    if unknown:
        raise ValueError(f"unknown failure status {sorted(unknown)}; valid: {list(FAILURE_KINDS)}")
    if any(v < 0 or not math.isfinite(v) for v in mix.values()):
        raise ValueError(f"failure mix weights must be finite and >= 0: {dict(mix)}")
    total = float(sum(mix.values()))
    if total <= 0:
        raise ValueError("failure mix weights sum to 0")
    return {k: float(v) / total for k, v in mix.items() if v > 0}


@dataclass(frozen=True)
class ChannelProfile:
    """Healthy behaviour of one channel.

    name: ``provider/model@tier`` (the ``@tier`` suffix, if present, must
        equal ``tier``).
    route: the route the channel belongs to.
    tier: ``free`` or ``paid`` (selects the detector's policy class).
    latency_source: llmperf file stem (``llmperf-leaderboard/<stem>.json``)
        whose successful end-to-end latencies give the distribution shape.
    latency_ms, latency_quantile: the shape is scaled so its
        ``latency_quantile`` quantile (0 < q < 1; 0.5 = the median) equals
        ``latency_ms`` (> 0) at latency multiplier 1.0.
    error_rate: baseline failure probability per request in [0, 1]; ``None``
        = :data:`BASE_ERROR_RATE` of the tier (free 0.2 %, paid 0.3 %).
    failure_mix: ``{status: weight}`` of baseline failures; ``None`` =
        :data:`DEFAULT_FAILURE_MIX` of the tier.
    timeout_ms: latency reported for a ``timeout`` (> 0).
    capacity_rps: request rate (req/s, 30 s average) above which latency and
        failures rise; ``None`` = unlimited.
    overload_latency_gain: latency x ``(1 + gain * excess)`` where
        ``excess = load / capacity - 1`` (>= 0).
    overload_error_gain: failure probability ``+ gain * excess`` (>= 0).
    structured_share: share of requests that carry ``expected_fields`` [0, 1].
    json_object_share: among structured requests, share of JSON-object answers
        (the rest are tool-call answers) [0, 1].
    gateway_check_share: among structured ``ok`` answers, share for which the
        gateway reports ``missing_fields`` itself instead of sending
        ``response_text`` [0, 1].
    missing_rate: baseline share of structured ``ok`` answers that miss a
        required field [0, 1].
    chat_share: share of the other (not structured) ``ok`` answers that carry
        a free-text ``response_text`` and ``prompt_text`` from the MT-bench
        pool of good answers (:mod:`.chat_answers`) [0, 1]; what the quality
        model scores (SPEC §4.5).
    price_in_usd_per_mtok, price_out_usd_per_mtok: list prices for
        ``cost_usd`` (USD per million input/output tokens, >= 0).
    quota_remaining: share of the daily quota left at scenario time 0 that
        the channel reports in ``quota_remaining`` (SPEC §3, [0, 1]);
        ``None``: the channel reports no quota.
    account: the ``account`` every event of the channel carries (SPEC §3, §4.1), or None.
    quota_drain_per_h: how much of the quota a normal hour uses (>= 0); the
        reported level falls linearly (``quota_drain`` faults take over in
        their window, :mod:`.usage_faults`).

    Raises ``ValueError`` on any value out of range.
    """

    name: str
    route: str
    tier: Tier
    latency_source: str = "together_70b"
    latency_ms: float = 1500.0
    latency_quantile: float = 0.5
    error_rate: float | None = None
    failure_mix: Mapping[str, float] | None = None
    timeout_ms: float = DEFAULT_TIMEOUT_MS
    capacity_rps: float | None = None
    overload_latency_gain: float = 1.5
    overload_error_gain: float = 0.05
    structured_share: float = 0.0
    json_object_share: float = 0.5
    gateway_check_share: float = 0.3
    missing_rate: float = 0.0
    chat_share: float = 0.0
    price_in_usd_per_mtok: float = 0.0
    price_out_usd_per_mtok: float = 0.0
    quota_remaining: float | None = None
    quota_drain_per_h: float = 0.0
    #: The credential / quota pool behind the channel (SPEC §3 ``account``), sent on every event; None: none.
    account: str | None = None

    def __post_init__(self) -> None:
        if not self.name or not self.route:
            raise ValueError("channel name and route must be non-empty")
        if self.tier not in ("free", "paid"):
            raise ValueError(f"{self.name}: tier must be 'free' or 'paid', got {self.tier!r}")
        if "@" in self.name and self.name.rsplit("@", 1)[1] != self.tier:
            raise ValueError(f"{self.name}: name suffix does not match tier {self.tier!r}")
        if not (self.latency_ms > 0 and math.isfinite(self.latency_ms)):
            raise ValueError(f"{self.name}: latency_ms must be > 0, got {self.latency_ms}")
        if not 0.0 < self.latency_quantile < 1.0:
            raise ValueError(f"{self.name}: latency_quantile must be in (0, 1)")
        if self.error_rate is not None:
            _check_share(f"{self.name}: error_rate", self.error_rate)
        if self.failure_mix is not None:
            normalised_mix(self.failure_mix)
        if not self.timeout_ms > 0:
            raise ValueError(f"{self.name}: timeout_ms must be > 0")
        if self.capacity_rps is not None and not self.capacity_rps > 0:
            raise ValueError(f"{self.name}: capacity_rps must be > 0 or None")
        if self.overload_latency_gain < 0 or self.overload_error_gain < 0:
            raise ValueError(f"{self.name}: overload gains must be >= 0")
        for share in ("structured_share", "json_object_share", "gateway_check_share", "missing_rate",
                      "chat_share"):
            _check_share(f"{self.name}: {share}", getattr(self, share))
        if self.price_in_usd_per_mtok < 0 or self.price_out_usd_per_mtok < 0:
            raise ValueError(f"{self.name}: prices must be >= 0")
        if self.quota_remaining is not None:
            _check_share(f"{self.name}: quota_remaining", self.quota_remaining)
        if not (self.quota_drain_per_h >= 0 and math.isfinite(self.quota_drain_per_h)):
            raise ValueError(f"{self.name}: quota_drain_per_h must be >= 0")

    @property
    def base_error_rate(self) -> float:
        """Baseline failure probability (``error_rate`` or the tier default)."""
        return BASE_ERROR_RATE[self.tier] if self.error_rate is None else self.error_rate

    @property
    def base_failure_mix(self) -> dict[str, float]:
        """Normalised ``{status: share}`` of baseline failures."""
        return normalised_mix(self.failure_mix or DEFAULT_FAILURE_MIX[self.tier])


@dataclass(frozen=True)
class RouteSpec:
    """A group of interchangeable channels (SPEC §3 ``route``).

    name: route name. peak_rps: arrival rate (req/s) of the whole route at
    the day peak (load factor 1.0), > 0. shares: static traffic share per
    channel name (>= 0, sum > 0; normalised on use). trace: Azure trace
    (``conv`` or ``code``) for burstiness and token counts. burstiness: blend
    of the trace envelope in [0, 1]. retry_failures: a failed first attempt
    is retried once on another channel of the route (by the current shares),
    as a naive gateway does; this is how a backup takes a failing primary's
    load when no health-aware router intervenes.

    Raises ``ValueError`` on invalid values.
    """

    name: str
    peak_rps: float
    shares: Mapping[str, float]
    trace: Literal["conv", "code"] = "conv"
    burstiness: float = 1.0
    retry_failures: bool = False

    def __post_init__(self) -> None:
        if not self.peak_rps > 0:
            raise ValueError(f"route {self.name}: peak_rps must be > 0")
        if not self.shares:
            raise ValueError(f"route {self.name}: no channels")
        if any(v < 0 or not math.isfinite(v) for v in self.shares.values()):
            raise ValueError(f"route {self.name}: shares must be finite and >= 0")
        if sum(self.shares.values()) <= 0:
            raise ValueError(f"route {self.name}: shares sum to 0")
        if self.trace not in ("conv", "code"):
            raise ValueError(f"route {self.name}: trace must be 'conv' or 'code'")
        _check_share(f"route {self.name}: burstiness", self.burstiness)

    @property
    def channel_names(self) -> tuple[str, ...]:
        """Channel names in configuration order."""
        return tuple(self.shares)

    def static_share(self, channel: str) -> float:
        """Normalised static share of ``channel`` (0 if not on this route)."""
        return float(self.shares.get(channel, 0.0)) / float(sum(self.shares.values()))


@dataclass(frozen=True, eq=False)
class LatencyModel:
    """Successful-request latency distribution built from an llmperf file.

    The successful requests' end-to-end latencies, sorted, are scaled by one
    factor so that the ``quantile`` quantile equals ``latency_ms``; sampling
    draws ``u ~ U(0, 1)`` and interpolates linearly between the order
    statistics (the continuous distribution whose quantiles are exactly
    ``numpy.quantile(..., method="linear")`` of the scaled samples). TTFT and
    mean inter-token latency of the same requests are scaled alike and
    interpolated at the same ``u`` (so ``ttft <= latency`` holds).

    Arrays (shape (n,), n = successful requests in the file): ``e2e_ms``
    ascending, ``ttft_ms``, ``itl_ms``; milliseconds, >= 0.
    """

    source: str
    e2e_ms: np.ndarray
    ttft_ms: np.ndarray
    itl_ms: np.ndarray

    @classmethod
    def from_llmperf(cls, trace: LlmperfTrace, latency_ms: float, quantile: float) -> "LatencyModel":
        """Scale ``trace``'s successful requests so the ``quantile`` quantile is ``latency_ms``.

        Raises ``ValueError`` if the file has fewer than 2 successful requests.
        """
        ok = trace.ok_mask
        if ok.sum() < 2:
            raise ValueError(f"llmperf {trace.name}: fewer than 2 successful requests")
        e2e = trace.e2e_latency_s[ok] * 1000.0
        order = np.argsort(e2e, kind="stable")
        e2e = e2e[order]
        scale = latency_ms / float(np.quantile(e2e, quantile))
        return cls(
            source=trace.name,
            e2e_ms=e2e * scale,
            ttft_ms=np.minimum(trace.ttft_s[ok][order] * 1000.0, trace.e2e_latency_s[ok][order] * 1000.0)
            * scale,
            itl_ms=trace.inter_token_latency_s[ok][order] * 1000.0 * scale,
        )

    def quantile(self, q: float) -> float:
        """The ``q`` quantile (0..1) of the latency at multiplier 1.0, ms."""
        return float(np.quantile(self.e2e_ms, q))

    @property
    def p95_ms(self) -> float:
        """P95 of the latency at multiplier 1.0, ms."""
        return self.quantile(0.95)

    def sample(self, rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Draw ``n`` requests: ``(latency_ms, ttft_ms, max_stream_gap_ms)``, each shape (n,).

        ``max_stream_gap_ms`` = mean inter-token latency x
        :data:`STREAM_GAP_ITL_FACTOR` x lognormal(0, 0.25), capped at
        ``latency - ttft``.
        """
        u = rng.random(n)
        pos = u * (len(self.e2e_ms) - 1)
        grid = np.arange(len(self.e2e_ms), dtype=np.float64)
        lat = np.interp(pos, grid, self.e2e_ms)
        ttft = np.interp(pos, grid, self.ttft_ms)
        itl = np.interp(pos, grid, self.itl_ms)
        gap = itl * STREAM_GAP_ITL_FACTOR * np.exp(rng.normal(0.0, 0.25, n))
        gap = np.minimum(gap, np.maximum(lat - ttft, 0.0))
        return lat, ttft, gap


#: Time constant of the load average that drives overload effects, seconds.
LOAD_TAU_S = 30.0
