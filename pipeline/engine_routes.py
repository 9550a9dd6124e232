"""Per-route traffic shares of an :class:`~pipeline.engine.Engine` after each round (SPEC §4 weights).

:class:`RouteShares` is the engine's part that turns channel weights into
bounded traffic shares per route (:func:`~pipeline.policy.routes.bounded_shares`),
once per round boundary and cached while a route is settled.
"""

from __future__ import annotations

import numpy as np

from pipeline.policy.defaults import PolicyConfig
from pipeline.policy.routes import bounded_shares
from pipeline.policy.state_machine import ChannelMachine
from pipeline.windows.store import WindowStore


class RouteShares:
    """Mixin of :class:`~pipeline.engine.Engine`: route shares from the channels' weights.

    Reads ``store``, ``machines`` and ``policy``; keeps ``prev_shares``,
    ``shares_by_route``, ``_share_round`` and ``_share_cache`` (set by the engine).
    """

    store: WindowStore
    machines: list[ChannelMachine]
    policy: PolicyConfig
    prev_shares: dict[str, np.ndarray]
    shares_by_route: dict[str, dict[str, float]]
    _share_round: dict[str, tuple[int, np.ndarray | None]]
    _share_cache: dict[str, tuple[tuple[float, ...], np.ndarray | None, np.ndarray, list[float]]]

    def _route_shares(self, rows: np.ndarray, now_ms: int) -> dict[int, float]:
        """Traffic shares after the round at ``now_ms`` of the routes that channels ``rows`` are on.

        Returns channel index -> share for every channel of those routes (other routes
        keep their shares: their channels had no round now). A route's growth bound
        (:func:`~pipeline.policy.routes.bounded_shares`) is applied once per round
        boundary: when its channels come due in several calls at the same ``now_ms``
        (channels reach a boundary with their own events), each call starts from the
        shares before that boundary. Cost grows with the routes touched, not with all
        channels of the worker; a route whose weights and start are those of its last
        computation reuses that result (a settled route: the usual case).
        """
        names, routes, machines = self.store.names, self.store.routes, self.machines
        members = self.store.route_members()
        out: dict[int, float] = {}
        for r in {routes[i] for i in rows.tolist()}:
            idx = members[r]
            start = self._share_round.get(r)
            if start is None or start[0] != now_ms:
                start = (now_ms, self.prev_shares.get(r))
                self._share_round[r] = start
            w = tuple(machines[i].weight for i in idx)
            cached = self._share_cache.get(r)
            if cached is not None and cached[0] == w and cached[1] is start[1]:
                s, values = cached[2], cached[3]  # same weights from the same start: same shares
            else:
                s = bounded_shares(np.array(w), start[1], self.policy.max_share_growth)
                if start[1] is not None and s.shape == start[1].shape and np.array_equal(s, start[1]):
                    s = start[1]  # unchanged (settled): keep the object, so the next round finds it cached
                values = s.tolist()
                self._share_cache[r] = (w, start[1], s, values)
                self.shares_by_route[r] = {names[i]: x for i, x in zip(idx, values)}
            self.prev_shares[r] = s
            out.update(zip(idx, values))
        return out

    def route_weights(self) -> dict[str, dict[str, float]]:
        """Current recommended weights: route → channel → weight."""
        out: dict[str, dict[str, float]] = {}
        for i, name in enumerate(self.store.names):
            out.setdefault(self.store.routes[i], {})[name] = self.machines[i].weight
        return out
