"""What a router's users feel: goodput and blackout of a route under a policy's shares (issue #33 part 6).

The router model (docs/SCORECARD.md "Goodput"), on a 1 s grid of scenario time over the scored window
``[warmup_s, duration_s)`` (the 2 h healthy warm-up is left out: every policy serves it alike):

* demand: route ``r`` receives ``D_r(t) = sum_c expected_rps(c, t)`` first-attempt requests per second
  (:meth:`~pipeline.tools.simulate.scenario.Scenario.expected_rps`: the route's arrival rate, day/night
  curve and burst envelope; replayed channels: their own arrivals). No retries: each request is tried once.
* shares: the router sends share ``S_c(t)`` of ``D_r(t)`` to channel ``c`` (``sum_c S_c = 1``, or all 0:
  the route is blacked out and its requests are not served).
* truth: a request on ``c`` at ``t`` succeeds with probability ``q_c(t, L_c)``, the scenario's injected
  failure model at the load ``L_c = S_c D_r`` the router puts on it: baseline + fault error rates, 1 in an
  outage or a ``consecutive_failures`` window, quota refusals, and the overload term
  ``+ error_gain x (L_c / capacity_rps - 1)`` above a channel's capacity
  (:func:`~pipeline.tools.simulate.faults.overload_factors`); replayed channels: 1 - their real failure
  share over the last 60 s (load does not change it). Content faults (hollow answers) do not count:
  goodput measures served requests, not answer quality.
* ``goodput`` = ``sum_t sum_c S_c D_r q_c(t, S_c D_r) / sum_t D_r`` over the route's grid (0..1);
  ``blackout_s`` = seconds of the grid with ``D_r > 0`` and every share 0.

Shares per policy: channel-health, the engine's published ``route_share`` of each channel's latest
verdict at a weight above 0 (what :mod:`pipeline.router.table` hands a router), normalised; a peer, the
route's static shares among the channels its breaker keeps in service (:func:`peer_shares`); the
``oracle``, the allocation that maximises the expected successes knowing ``q`` (:func:`oracle_shares`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pipeline.tools.simulate.channels import ChannelProfile
from pipeline.tools.simulate.faults import Effects, channel_effects, failure_probability, overload_factors
from pipeline.tools.simulate.scenario import Scenario
from pipeline.tools.simulate.usage_faults import quota_refusal_probability

#: Grid step of the router model, seconds.
GRID_S = 1.0
#: Chunks the oracle splits a second's demand into (greedy allocation by marginal successes; exact for
#: concave ``L q(L)``, which the linear overload term gives until its cap).
ORACLE_CHUNKS = 20


@dataclass(frozen=True)
class RouteTruth:
    """One route on the grid: ``t_s`` (n,) scenario seconds, ``demand_rps`` (n,), ``channels`` (k names),
    ``static`` (k, n) the route's configured shares (its ``RouteSpec.shares``; replayed channels: their
    arrival rates), columns summing to 1 where there is demand."""

    route: str
    t_s: np.ndarray
    demand_rps: np.ndarray
    channels: tuple[str, ...]
    static: np.ndarray


class Truth:
    """The scenario's injected truth on the grid, per route: demand and success probabilities."""

    def __init__(self, sc: Scenario, grid_s: float = GRID_S):
        self.sc = sc
        t = np.arange(float(sc.warmup_s), float(sc.duration_s), grid_s)
        self.grid_s = grid_s
        by_route: dict[str, list[str]] = {}
        for c in sc.channels:
            by_route.setdefault(c.route, []).append(c.name)
        self.routes: dict[str, RouteTruth] = {}
        self._eff: dict[str, Effects] = {}
        self._fixed: dict[str, np.ndarray] = {}
        specs = {r.name: r for r in sc.routes}
        for r, chans in by_route.items():
            rps = np.array([np.asarray(sc.expected_rps(c, t), dtype=np.float64) for c in chans])
            demand = rps.sum(axis=0)
            if r in specs:  # the configured split: a router does not know which channel is suppressed
                conf = np.array([specs[r].shares.get(c, 0.0) for c in chans], np.float64)
                rps = np.outer(conf / conf.sum(), demand)
            with np.errstate(invalid="ignore", divide="ignore"):
                static = np.where(demand > 0, rps / np.where(demand > 0, demand, 1.0), 0.0)
            self.routes[r] = RouteTruth(r, t, demand, tuple(chans), static)
        for c in sc.channels:
            if isinstance(c, ChannelProfile):
                eff = channel_effects(c, sc.faults, t)
                self._eff[c.name] = eff
                self._fixed[c.name] = quota_refusal_probability(c, sc.faults, t)
            else:
                self._fixed[c.name] = np.nan_to_num(np.asarray(sc.injected_error_rate(c.name, t), np.float64), nan=0.0)

    def success(self, channel: str, load_rps: np.ndarray) -> np.ndarray:
        """``q_c(t, L)`` on the grid for the load ``load_rps`` (n,) req/s; values in [0, 1]."""
        prof = self.sc.channel(channel)
        if not isinstance(prof, ChannelProfile):
            return 1.0 - self._fixed[channel]
        eff = self._eff[channel]
        _, ol_err = overload_factors(eff, load_rps)
        p = np.where(eff.suppressed, 1.0, failure_probability(prof, eff, ol_err))
        out: np.ndarray = (1.0 - p) * (1.0 - self._fixed[channel])
        return out


def outcome(truth: Truth, route: str, shares: np.ndarray) -> tuple[float, float, float]:
    """``(served, demand, blackout_s)`` of ``route`` under ``shares`` (k, n): expected successful
    requests and requests over the grid, and the seconds with demand but no share."""
    rt = truth.routes[route]
    d = rt.demand_rps
    served = sum(float(np.sum(shares[j] * d * truth.success(c, shares[j] * d)))
                 for j, c in enumerate(rt.channels))
    dark = (d > 0) & (shares.sum(axis=0) <= 0)
    g = truth.grid_s
    return served * g, float(d.sum()) * g, float(dark.sum()) * g


def peer_shares(rt: RouteTruth, in_service: np.ndarray) -> np.ndarray:
    """A breaker-following router's shares: the static shares among the channels in service.

    ``in_service`` bool (k, n). Every channel out: all 0 (blackout)."""
    w = rt.static * in_service
    tot = w.sum(axis=0)
    out: np.ndarray = np.where(tot > 0, w / np.where(tot > 0, tot, 1.0), 0.0)
    return out


def oracle_shares(truth: Truth, route: str, chunks: int = ORACLE_CHUNKS) -> np.ndarray:
    """Shares (k, n) that maximise the expected successes knowing ``q``: the demand in ``chunks`` equal
    parts, each to the channel with the largest marginal gain ``(L+d) q(L+d) - L q(L)``."""
    rt = truth.routes[route]
    k, n = len(rt.channels), len(rt.t_s)
    load = np.zeros((k, n))
    step = rt.demand_rps / chunks
    cur = np.array([load[j] * truth.success(c, load[j]) for j, c in enumerate(rt.channels)])
    cols = np.arange(n)
    for _ in range(chunks):
        nxt = np.array([(load[j] + step) * truth.success(c, load[j] + step) for j, c in enumerate(rt.channels)])
        best = np.argmax(nxt - cur, axis=0)
        load[best, cols] += step
        cur[best, cols] = nxt[best, cols]
    with np.errstate(invalid="ignore", divide="ignore"):
        out: np.ndarray = np.where(rt.demand_rps > 0, load / np.where(rt.demand_rps > 0, rt.demand_rps, 1.0), 0.0)
    return out


def step_shares(rt: RouteTruth, changes: list[tuple[float, dict[str, float]]]) -> np.ndarray:
    """Shares (k, n) from a time-ordered list of ``(t_s, {channel: share})`` route snapshots, each in force
    from its time on (before the first: the static shares); a snapshot summing to 0 blacks the route out."""
    out = rt.static.copy()
    idx = {c: j for j, c in enumerate(rt.channels)}
    times = np.array([t for t, _ in changes])
    at = np.searchsorted(times, rt.t_s, side="right") - 1  # snapshot in force at each grid point (-1: none)
    for m, (_, snap) in enumerate(changes):
        cols = at == m
        if not cols.any():
            continue
        col = np.zeros(len(rt.channels))
        for c, s in snap.items():
            if c in idx:
                col[idx[c]] = s
        tot = col.sum()
        out[:, cols] = (col / tot)[:, None] if tot > 0 else 0.0
    return out
