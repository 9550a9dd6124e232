"""The engine's route-wide and peer-relative part (SPEC §4.2 "Route-wide events", issue #33 part 4).

:class:`RouteWide` (``engine.routes.wide``) keeps, per channel, its last round's 5 min P95 and its
recent outcomes, and applies the rules of :mod:`pipeline.policy.route_wide` with each route's numbers
(:meth:`~pipeline.policy.defaults.PolicyConfig.route_wide_for`: ``[route_wide]`` of policy.toml, per route
``[route."name".route_wide]``) on routes of at least ``min_channels`` (3) channels (a smaller route costs
one length check per round and is never touched):

* :meth:`RouteWide.peer_findings`, called in each round before the state machines step: the
  ``peer_latency`` soft finding (a channel far slower than its route peers, which its own drifting
  baseline cannot see), with the metric ``peer_p95_ratio`` while it holds;
* :meth:`RouteWide.apply`, called by :class:`~pipeline.engine.route_shares.RouteShares` after the
  panic floor: when most of a route is degraded together, its equally bad channels share one weight
  (``weight``, 0.5) and their verdicts say ``route_wide``, so
  the shares do not churn among them as each channel's own state flips;
* :meth:`RouteWide.keep_on_trip`: a failure run between rounds does not take a route-wide channel
  out of the route until the next round decides.

Peers are read as of their own last round (at most ``peer_max_age_ms``, 60 s by default, old): channels of a route
reach a round boundary with their own events, not necessarily in one call. A channel's finding in force
(:attr:`RouteWide.peer_active`: the rule has hysteresis) and its route-wide weight (:attr:`RouteWide.weight`,
read by :meth:`RouteWide.keep_on_trip` between rounds) are in its snapshot
(:class:`~pipeline.state.channel_state.RoundState`), with what its peers read of it (:attr:`RouteWide.p95`,
:attr:`RouteWide.recent`), so a restart changes no verdict; route-wide membership is decided every round.
"""

from __future__ import annotations

from math import nan

import numpy as np

from pipeline.policy.defaults import PolicyConfig
from pipeline.policy.route_wide import PEER_LATENCY, peer_latency_fired, route_wide_members
from pipeline.policy.routes import has_hard_fault
from pipeline.policy.state_machine import HEALTHY, NO_DATA, ChannelMachine
from pipeline.windows.store import WindowStore
from pipeline.windows.view import WindowView

class RouteWide:
    """Per-channel state of the route-wide and peer-relative rules (see the module docstring).

    ``store``: channel registry and route members; ``machines``: the engine's state machines (shared
    list); ``policy``: whose :meth:`~pipeline.policy.defaults.PolicyConfig.route_wide_for` gives each
    route's numbers (None: the built-in policy). Attributes read by the engine: :attr:`weight` (channel index -> the route-wide weight it is
    published at, this round) and :attr:`peer_active` (channel indices flagged ``peer_latency``).
    """

    def __init__(self, store: WindowStore, machines: list[ChannelMachine], policy: PolicyConfig | None = None):
        self.store = store
        self.machines = machines
        self.policy = policy if policy is not None else PolicyConfig()
        #: channel index -> (round ms, 5 min P95 ms, its 99 % lower bound ms) as of its last round.
        self.p95: dict[int, tuple[int, float, float]] = {}
        #: channel index -> (judged requests, failures) of the last minute, as of its last round.
        self.recent: dict[int, tuple[float, float]] = {}
        #: channel indices whose ``peer_latency`` finding is in force.
        self.peer_active: set[int] = set()
        #: channel index -> the weight a route-wide event holds it at (reason ``route_wide``).
        self.weight: dict[int, float] = {}

    def peer_findings(self, rows: np.ndarray, view: WindowView, now_ms: int) -> tuple[list[bool], list[float]]:
        """The ``peer_latency`` finding of channels ``rows`` (int (n,)) at their round ``now_ms``, from the
        round's ``view`` (features ``p95_ms`` / ``p95_lower_ms``; without them nothing fires). Returns
        ``(fired, ratio)``, lists of n: ``ratio`` is the channel's point P95 / its peers' median (NaN
        where there is no median: a route of fewer than 3 channels, or peers without a P95). A finding is
        kept while its peers' evidence is thin, and cleared when the route has fewer than ``min_channels``
        channels, or fewer with data (not ``no_data``): peers moved away or gone idle are no peers."""
        n = len(rows)
        fired, ratio = [False] * n, [float("nan")] * n
        extra = view.extra
        if "p95_ms" not in extra or "p95_lower_ms" not in extra:
            return fired, ratio
        members, routes = self.store.route_members(), self.store.routes
        cfg_for = self.policy.route_wide_for
        n_5m = extra["n_latency_5m"] if "n_latency_5m" in extra else None
        p95_all, lower_all = extra["p95_ms"], extra["p95_lower_ms"]
        todo = []
        for j, i in enumerate(rows.tolist()):
            cfg = cfg_for(routes[i])
            if len(members[routes[i]]) < cfg.min_channels:
                self.peer_active.discard(i)  # a route shrunk under the rule's size: no peers, no finding
                continue
            thin = n_5m is not None and n_5m[j] < cfg.peer_min_samples  # SPEC §4.3: thin window, no P95
            self.p95[i] = (now_ms, nan if thin else float(p95_all[j]), nan if thin else float(lower_all[j]))
            todo.append((j, i, cfg))
        # route -> (sorted live P95s, channel -> its place, channels with data): once per route and call,
        # linear in the route's size, not quadratic
        live: dict[str, tuple[np.ndarray, dict[int, int], int]] = {}
        for j, i, cfg in todo:
            route = routes[i]
            if route not in live:
                got = sorted((v[1], k) for k in members[route] if (v := self.p95.get(k)) is not None
                             and now_ms - v[0] <= cfg.peer_max_age_ms and self.machines[k].state != NO_DATA
                             and np.isfinite(v[1]))
                with_data = sum(self.machines[k].state != NO_DATA for k in members[route])
                live[route] = (np.array([x for x, _ in got], np.float64), {k: at for at, (_, k) in enumerate(got)},
                               with_data)
            values, place, with_data = live[route]
            at = place.get(i)
            n_peers = len(values) - (at is not None)
            if with_data < cfg.min_channels:
                on = False  # peers gone idle (no_data): fewer channels in service than the rule needs, no peers
            elif n_peers < cfg.peer_min_peers:
                on = i in self.peer_active  # no evidence either way: keep the finding
            else:
                med = _median_without(values, at)
                _, p, lo = self.p95[i]
                on = bool(peer_latency_fired(np.array([lo]), np.array([p]), np.array([med]),
                                             np.array([i in self.peer_active]), cfg.peer_trip_ratio,
                                             cfg.peer_clear_ratio)[0])
                ratio[j] = p / med if med > 0 else nan
            fired[j] = on
            if on:
                self.peer_active.add(i)
            else:
                self.peer_active.discard(i)
        return fired, ratio

    def note(self, rows: np.ndarray, requests: np.ndarray, failures: np.ndarray) -> None:
        """The last minute's judged ``requests`` and ``failures`` of channels ``rows`` at their round."""
        self.recent.update(zip(rows.tolist(), zip(np.asarray(requests, np.float64).tolist(),
                                                   np.asarray(failures, np.float64).tolist())))

    def apply(self, idx: list[int], w: tuple[float, ...], probing: np.ndarray | None,
              panic_weight: dict[int, float]) -> tuple[tuple[float, ...], np.ndarray | None]:
        """Route ``idx``'s weights ``w`` (after the panic floor) and ``half_open`` mask after the route-wide
        rule with the route's numbers: members (:func:`~pipeline.policy.route_wide.route_wide_members`) get
        its ``weight`` (0.5), are not held to a probe share and leave
        ``panic_weight`` (updated in place); :attr:`weight` is updated for the route."""
        if self.weight:
            for i in idx:
                self.weight.pop(i, None)
        cfg = self.policy.route_wide_for(self.store.routes[idx[0]]) if idx else None
        if cfg is None or len(idx) < cfg.min_channels:
            return w, probing
        ms = [self.machines[i] for i in idx]
        if all(m.state == HEALTHY for m in ms):
            return w, probing
        # non-healthy by the §4 detectors: not by an error class of SPEC §4.1 (cause "" until a full
        # recovery: a channel ramping back after a spent quota is not part of a route-wide event)
        affected = np.array([m.state not in (HEALTHY, NO_DATA) and m.cause == "" and not has_hard_fault(m.reasons)
                             and "rate_limited" not in m.reasons and i not in self.peer_active
                             for i, m in zip(idx, ms)])
        with_data = np.array([m.state != NO_DATA for m in ms])
        recent = [self.recent.get(i, (0.0, 0.0)) for i in idx]
        members = route_wide_members(affected, with_data, np.array([r[0] for r in recent]),
                                     np.array([r[1] for r in recent]), cfg.min_channels, cfg.worse_z,
                                     cfg.worse_ratio)
        if not members.any():
            return w, probing
        out = list(w)
        for j in np.flatnonzero(members).tolist():
            out[j] = cfg.weight
            self.weight[idx[j]] = cfg.weight
            panic_weight.pop(idx[j], None)
        if probing is not None:
            probing = probing & ~members
        return tuple(out), probing

    def keep_on_trip(self, i: int) -> float | None:
        """The weight channel ``i`` keeps when a trip between rounds opens it: its route-wide weight while
        it is a member and the trip is no hard fault (the next round decides), else None (and it leaves
        :attr:`weight`)."""
        w = self.weight.get(i)
        if w is None or has_hard_fault(self.machines[i].reasons):
            self.weight.pop(i, None)
            return None
        return w


__all__ = ["PEER_LATENCY", "RouteWide"]


def _median_without(values: np.ndarray, at: int | None) -> float:
    """The median of sorted ``values`` (float (m,)) without the element at index ``at`` (None: all of them);
    equal to ``np.median`` of that list (the mean of the two middle values for an even count). Needs at
    least one value left."""
    n = len(values) - (at is not None)

    def nth(t: int) -> float:  # t-th smallest of the list without ``at``
        return float(values[t if at is None or t < at else t + 1])

    if n % 2:
        return nth(n // 2)
    return float(np.mean([nth(n // 2 - 1), nth(n // 2)]))
