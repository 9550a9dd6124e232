"""The scenario type: traffic, injected faults and the expected verdicts (SPEC §5).

The named scenarios are built in :mod:`pipeline.tools.simulate.scenarios`.

``SCENARIOS`` maps each name to a :class:`Scenario`; :func:`get_scenario`
looks one up (``ValueError`` listing the valid names otherwise). A scenario
is pure configuration; :meth:`Scenario.events` generates its request events
in event time (no sleeping) from the real traces in ``../shared/data``, or
from the samples shipped in the package where that folder is absent.

Times inside a scenario (``duration_s``, fault windows, ``expected``) are
*scenario seconds*: seconds of event time since the scenario start. An event
at scenario time ``t`` has ``ts_ms = start_ms + round(1000 * t)``. The
day/night phase is fixed by ``start_hour`` (hour of day at scenario time 0),
so a scenario behaves the same for any ``start_ms``.

Every scenario with faults starts with :data:`WARMUP_S` (2 h) of healthy
traffic so the detectors have baselines before anything goes wrong.

``expected`` is a tuple of JSON-ready dicts, each one check on the verdicts
(``channel.health``) of one channel, times in scenario seconds:

``{"channel", "state_in": [...], "by_s", "from_s"?, "reasons_any"?}``
    some verdict with ``from_s <= t <= by_s`` (``from_s`` default 0) has a
    state in ``state_in`` (and, with ``reasons_any``, one of those reasons).
``{"channel", "never_in": [...], "from_s", "to_s"}``
    no verdict with ``from_s <= t < to_s`` has a state in ``never_in``.
``{"channel", "state_sequence": [...], "from_s", "by_s"}``
    the states appear in this order (not necessarily adjacent) among the
    verdicts with ``from_s <= t <= by_s``.
``{"channel", "max_state_changes": k, "from_s", "to_s"}``
    at most ``k`` state changes in the window (no flip-flopping).

Expectations hold for the open loop (``shares=None``) and should hold for a
health-aware router closing the loop through ``shares``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable, Iterator, Literal, Mapping

import numpy as np

from .channels import ChannelProfile, LatencyModel, RouteSpec
from .faults import Fault, channel_effects, failure_probability, overload_factors
from .generator import Generator, SharesFn
from .load import BurstEnvelope, DiurnalCurve
from .replay import ReplayChannel
from .traces import load_azure_trace, load_llmperf, resolve_data_dir
from .usage_faults import quota_refusal_probability

#: Healthy warm-up before any fault, scenario seconds (brief: >= 2 h, so
#: the 24 h latency baselines of SPEC §4.3 have data).
WARMUP_S = 7200

BAD_STATES = ["degraded", "open", "half_open", "recovering"]

Channel = ChannelProfile | ReplayChannel


@lru_cache(maxsize=256)
def _burst(data_dir: Path, trace: str, burstiness: float, key: str) -> BurstEnvelope:
    return BurstEnvelope.from_trace(load_azure_trace(trace, data_dir), burstiness, key)  # type: ignore[arg-type]


@lru_cache(maxsize=256)
def _latency_model(source: str, latency_ms: float, quantile: float, data_dir: Path) -> LatencyModel:
    return LatencyModel.from_llmperf(load_llmperf(source, data_dir), latency_ms, quantile)


@dataclass(frozen=True)
class Scenario:
    """One named scenario: traffic, faults and the expected verdict timeline.

    name, description: identification. duration_s: event-time length,
    seconds (> 0). channels: :class:`ChannelProfile` (synthetic traffic) or
    :class:`ReplayChannel` (real-provider replay). routes: the routes of the
    synthetic channels. faults: injected :class:`Fault` s. expected: verdict
    checks (module doc). start_hour: hour of day at scenario time 0.
    night_fraction, latency_swing: day/night curve (:class:`DiurnalCurve`).
    warmup_s: healthy time before the first fault. data_dir: data folder
    (``None``: ``../shared/data`` if present, else the shipped samples; see
    :func:`~pipeline.tools.simulate.traces.resolve_data_dir`).

    Raises ``ValueError`` if a fault or route names an unknown channel, a
    channel's route is missing, or a fault starts before ``warmup_s``.
    """

    name: str
    description: str
    duration_s: int
    channels: tuple[Channel, ...]
    routes: tuple[RouteSpec, ...] = ()
    faults: tuple[Fault, ...] = ()
    expected: tuple[Mapping[str, Any], ...] = ()
    start_hour: float = 10.0
    night_fraction: float = 0.35
    latency_swing: float = 0.15
    warmup_s: int = WARMUP_S
    data_dir: Path | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        if not self.duration_s > 0:
            raise ValueError(f"{self.name}: duration_s must be > 0")
        names = [c.name for c in self.channels]
        if len(set(names)) != len(names):
            raise ValueError(f"{self.name}: duplicate channel names")
        routes = {r.name: r for r in self.routes}
        for c in self.channels:
            if isinstance(c, ChannelProfile):
                r = routes.get(c.route)
                if r is None or c.name not in r.shares:
                    raise ValueError(f"{self.name}: channel {c.name} is not on a route {c.route!r}")
        for r in self.routes:
            for cname in r.shares:
                ch = next((c for c in self.channels if c.name == cname), None)
                if not isinstance(ch, ChannelProfile) or ch.route != r.name:
                    raise ValueError(f"{self.name}: route {r.name} lists unknown channel {cname!r}")
        for f in self.faults:
            if f.channel not in names:
                raise ValueError(f"{self.name}: fault on unknown channel {f.channel!r}")
            if f.start_s < self.warmup_s:
                raise ValueError(f"{self.name}: fault {f.kind} starts before the {self.warmup_s} s warm-up")
        DiurnalCurve(self.start_hour, self.night_fraction, self.latency_swing)

    # ------------------------------------------------------------------ lookup

    @property
    def channel_names(self) -> tuple[str, ...]:
        """All channel names, configuration order."""
        return tuple(c.name for c in self.channels)

    def channel(self, name: str) -> Channel:
        """The channel called ``name``; ``KeyError`` listing valid names otherwise."""
        for c in self.channels:
            if c.name == name:
                return c
        raise KeyError(f"{self.name}: unknown channel {name!r}; valid: {', '.join(self.channel_names)}")

    def route(self, name: str) -> RouteSpec:
        """The route called ``name``; ``KeyError`` otherwise."""
        for r in self.routes:
            if r.name == name:
                return r
        raise KeyError(f"{self.name}: unknown route {name!r}")

    def burst_envelope(self, route: str, data_dir: str | Path | None = None) -> BurstEnvelope:
        """The burst envelope of ``route`` (its Azure trace, offset fixed by scenario + route name)."""
        r = self.route(route)
        folder = resolve_data_dir(data_dir if data_dir is not None else self.data_dir)
        return _burst(folder, r.trace, r.burstiness, f"{self.name}/{r.name}")

    @property
    def curve(self) -> DiurnalCurve:
        """The scenario's day/night curve."""
        return DiurnalCurve(self.start_hour, self.night_fraction, self.latency_swing)

    # ------------------------------------------------------------------ events

    def events(
        self,
        start_ms: int,
        seed: int = 0,
        shares: SharesFn | None = None,
        *,
        data_dir: str | Path | None = None,
        block_s: int = 10,
    ) -> Iterator[dict]:
        """Generate the scenario's request events, JSON-ready dicts (SPEC §3 names).

        start_ms: epoch ms of scenario time 0 (int). seed: all randomness
        derives from (seed, scenario name): same arguments -> same events.
        shares: ``shares(route, ts_ms) -> {channel: share}`` called once per
        route and block (``ts_ms`` = block start); requests are assigned by
        these shares (missing channels get 0, unknown names are ignored; all
        zero -> the static shares). Default: static configured shares.
        data_dir: overrides the scenario's data folder. block_s: generation
        block, seconds (>= 1); a ``shares`` change takes effect from the
        next block.

        Yields dicts with a unique ``event_id`` (``sim-<hash>-<n>``,
        increasing) and non-decreasing ``ts_ms``. Raises
        :class:`~pipeline.tools.simulate.traces.DataNotFoundError` if the data is
        missing, ``TypeError`` for a non-int ``start_ms``, ``ValueError``
        for a bad ``block_s`` or a negative share.
        """
        return Generator(self, start_ms, seed, shares, data_dir=data_dir, block_s=block_s).events()

    # ------------------------------------------------------------------ injected truth

    def _profile(self, channel: str) -> Channel:
        return self.channel(channel)

    def expected_rps(self, channel: str, t_s: float | np.ndarray) -> np.ndarray | float:
        """Expected first-attempt request rate of ``channel`` at ``t_s`` under static shares, req/s.

        ``route.peak_rps x load_factor(t) x burst(t) x share`` (``burst``: the
        route's trace envelope at the whole second of ``t``), with the shares of channels in a ``consecutive_failures`` window
        moved to their siblings. Replay channels: ``1 / spacing_s`` during
        the replay, else 0.
        """
        t = np.asarray(t_s, dtype=np.float64)
        c = self._profile(channel)
        if isinstance(c, ReplayChannel):
            n = len(c.trace(self.data_dir))
            on = (t >= c.offset_s) & (t < c.offset_s + n * c.spacing_s)
            out = np.where(on, 1.0 / c.spacing_s, 0.0)
            return float(out) if out.ndim == 0 else out
        route = self.route(c.route)
        weights = {}
        for name in route.channel_names:
            prof = self.channel(name)
            sup = channel_effects(prof, self.faults, t).suppressed  # type: ignore[arg-type]
            weights[name] = np.where(sup, 0.0, float(route.shares[name]))
        total = sum(weights.values())
        with np.errstate(invalid="ignore", divide="ignore"):
            share = np.where(total > 0, weights[channel] / total, 0.0)
        burst = self.burst_envelope(route.name).factor(np.floor(t))
        out = route.peak_rps * self.curve.load_factor(t) * burst * share
        return float(out) if np.ndim(out) == 0 else out

    def _base_failure(self, prof: ChannelProfile, t: np.ndarray) -> np.ndarray:
        eff = channel_effects(prof, self.faults, t)
        return failure_probability(prof, eff, np.zeros(t.shape))

    def expected_load_rps(self, channel: str, t_s: float | np.ndarray) -> np.ndarray | float:
        """Expected request rate incl. retries from failing siblings (``retry_failures`` routes), req/s.

        One pass: siblings' failure probabilities are taken without their own
        overload effects.
        """
        t = np.asarray(t_s, dtype=np.float64)
        c = self._profile(channel)
        load = np.asarray(self.expected_rps(channel, t), dtype=np.float64)
        if isinstance(c, ChannelProfile):
            route = self.route(c.route)
            if route.retry_failures:
                for other in route.channel_names:
                    if other == channel:
                        continue
                    rest = sum(v for k, v in route.shares.items() if k != other)
                    if rest <= 0:
                        continue
                    prof = self.channel(other)
                    fail = self._base_failure(prof, t)  # type: ignore[arg-type]
                    load = load + np.asarray(self.expected_rps(other, t)) * fail * route.shares[channel] / rest
        return float(load) if load.ndim == 0 else load

    def _load_if_limited(self, channel: str, eff: Any, t: np.ndarray) -> np.ndarray:
        """Expected load where a capacity is in force; zeros otherwise (no data needed)."""
        if not np.isfinite(eff.capacity_rps).any():
            return np.zeros(t.shape)
        return np.asarray(self.expected_load_rps(channel, t), dtype=np.float64)

    def _replay_window(self, c: ReplayChannel, t: np.ndarray, window_s: float, fn: Callable) -> np.ndarray:
        tr = c.trace(self.data_dir)
        fin = c.finish_s(self.data_dir)
        out = np.full(t.shape, np.nan)
        flat_t = t.reshape(-1)
        flat = out.reshape(-1)
        for i, ti in enumerate(flat_t):
            sel = (fin > ti - window_s) & (fin <= ti)
            if sel.any():
                flat[i] = fn(tr, sel)
        return out

    def injected_error_rate(self, channel: str, t_s: float | np.ndarray) -> float | np.ndarray:
        """Injected failure probability of ``channel`` at scenario time ``t_s`` (0..1).

        Synthetic channels: baseline + ramps + overload at the expected load
        (:meth:`expected_load_rps`), 1.0 in an outage or a
        ``consecutive_failures`` window (its only requests fail), with the
        quota refusals of a ``quota_drain`` fault on top. Replay
        channels: share of failures among the requests that finished in the
        60 s up to ``t_s`` (``nan`` if none).
        """
        t = np.asarray(t_s, dtype=np.float64)
        c = self._profile(channel)
        if isinstance(c, ReplayChannel):
            out = self._replay_window(c, t, 60.0, lambda tr, sel: float(np.mean([s != "ok" for s in np.array(tr.status)[sel]])))
        else:
            eff = channel_effects(c, self.faults, t)
            _, ol_err = overload_factors(eff, self._load_if_limited(channel, eff, t))
            out = np.where(eff.suppressed, 1.0, failure_probability(c, eff, ol_err))
            out = 1.0 - (1.0 - out) * (1.0 - quota_refusal_probability(c, self.faults, t))
        return float(out) if np.ndim(out) == 0 else out

    def injected_p95_ms(self, channel: str, t_s: float | np.ndarray) -> float | np.ndarray:
        """Injected P95 latency of successful requests of ``channel`` at ``t_s``, ms.

        Synthetic channels: the healthy P95 x day/night multiplier x fault
        factor x overload factor (expected load); ``nan`` in an outage or a
        ``consecutive_failures`` window (no successful requests). Replay
        channels: P95 of the successful requests that finished in the 300 s
        up to ``t_s`` (``nan`` if none). Needs the data (latency shape).
        """
        t = np.asarray(t_s, dtype=np.float64)
        c = self._profile(channel)
        if isinstance(c, ReplayChannel):
            def p95(tr, sel):
                ok = sel & tr.ok_mask
                return float(np.quantile(tr.e2e_latency_s[ok] * 1000.0, 0.95)) if ok.any() else np.nan

            out = self._replay_window(c, t, 300.0, p95)
        else:
            model = _latency_model(c.latency_source, c.latency_ms, c.latency_quantile, resolve_data_dir(self.data_dir))
            eff = channel_effects(c, self.faults, t)
            ol_lat, _ = overload_factors(eff, self._load_if_limited(channel, eff, t))
            out = model.p95_ms * self.curve.latency_multiplier(t) * eff.latency_factor * ol_lat
            out = np.where((eff.outage >= 0) | eff.suppressed, np.nan, out)
        return float(out) if np.ndim(out) == 0 else out

    def injected_missing_rate(self, channel: str, t_s: float | np.ndarray) -> float | np.ndarray:
        """Injected share of structured ``ok`` answers missing a field at ``t_s`` (0..1; replay: 0)."""
        t = np.asarray(t_s, dtype=np.float64)
        c = self._profile(channel)
        if isinstance(c, ReplayChannel):
            out = np.zeros(t.shape)
        else:
            out = channel_effects(c, self.faults, t).missing_rate
        return float(out) if np.ndim(out) == 0 else out

    def injected_useless_rate(self, channel: str, t_s: float | np.ndarray) -> float | np.ndarray:
        """Injected share of ``channel``'s chat answers that are useless at ``t_s`` (0..1; replay: 0)."""
        t = np.asarray(t_s, dtype=np.float64)
        c = self._profile(channel)
        if isinstance(c, ReplayChannel):
            out = np.zeros(t.shape)
        else:
            out = channel_effects(c, self.faults, t).useless_rate
        return float(out) if np.ndim(out) == 0 else out

    def time_when(
        self,
        channel: str,
        metric: Literal["error_rate", "p95_ms", "missing_rate", "useless_rate"],
        threshold: float,
        *,
        from_s: float = 0.0,
        to_s: float | None = None,
        step_s: float = 1.0,
    ) -> float | None:
        """First scenario time on a ``step_s`` grid in ``[from_s, to_s)`` at which the
        injected ``metric`` of ``channel`` is >= ``threshold``; ``None`` if never.

        E.g. ``time_when(ch, "error_rate", 0.015)``: when the injected error
        rate reaches 1.5 %. Raises ``ValueError`` for an unknown metric.
        """
        fns = {
            "error_rate": self.injected_error_rate,
            "p95_ms": self.injected_p95_ms,
            "missing_rate": self.injected_missing_rate,
            "useless_rate": self.injected_useless_rate,
        }
        if metric not in fns:
            raise ValueError(f"unknown metric {metric!r}; valid: {sorted(fns)}")
        grid = np.arange(from_s, self.duration_s if to_s is None else to_s, step_s)
        vals = np.asarray(fns[metric](channel, grid))
        hit = np.flatnonzero(np.nan_to_num(vals, nan=-np.inf) >= threshold)
        return float(grid[hit[0]]) if len(hit) else None


# =========================================================================== builders
