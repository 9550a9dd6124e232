"""Per-route traffic shares of an :class:`~pipeline.engine.Engine` after each round (SPEC §4 weights).

:class:`RouteShares` (the engine's ``routes``) is the engine's part that turns channel weights into
bounded traffic shares per route (:func:`~pipeline.policy.routes.bounded_shares`),
once per round boundary and cached while a route is settled.

A route's shares and the round in progress go into the snapshot of each of
its channels (:meth:`RouteShares.export_route_shares`, a
:class:`~pipeline.state.channel_state.RouteShareRecord` with a version raised
at every change, which also flags the route's channels changed so their next
capture carries it), and come back on restore
(:meth:`RouteShares.restore_route_shares`): the route's next round then starts
its growth bound where the stopped worker was, instead of afresh. Routes of
more than :data:`MAX_SAVED_ROUTE` channels are not saved (each record would
hold them all): they start their bound afresh after a restart.

Route protection (SPEC §4.2) happens here, per round, before the growth bound: the panic floor
(:func:`~pipeline.policy.routes.panic_floor`: when the route's weights sum to less than its panic
threshold, its least bad channels without a hard fault keep a floor weight, published with reason
``route_panic`` through :attr:`RouteShares.panic_weight`), the probe cap
(:func:`~pipeline.policy.routes.probe_capped`: a ``half_open`` channel gets its probe share, never the
whole route) and ``route_down`` (:attr:`RouteShares.down_routes`: every channel has a hard fault).
A settled route (no channel in ``half_open``, weights at or above the threshold) skips all three.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from pipeline.engine.route_wide import RouteWide
from pipeline.policy.capacity import CapacityModel, cap_shares
from pipeline.policy.defaults import PolicyConfig
from pipeline.policy.routes import bounded_shares, has_hard_fault, panic_floor, probe_capped
from pipeline.policy.state_machine import HALF_OPEN, NO_DATA, RECOVERING, ChannelMachine
from pipeline.state.channel_state import MAX_SAVED_ROUTE, RouteShareRecord
from pipeline.windows.store import WindowStore

#: A channel failing up to this much more (recent failure ratio, absolute) than a capped channel may
#: take its excess: a capped channel over its cap fails more than its ratio shows (it is overloaded).
RECEIVER_MARGIN = 0.01


class RouteShares:
    """The engine's route shares (``engine.routes``): traffic shares from the channels' weights.

    Reads ``store`` (channel registry and route members), ``machines`` (the
    engine's list of state machines, shared, appended to in place) and
    ``policy``; calls ``mark_changed(rows)`` for the channels of a route whose
    shares changed (their next snapshot carries the new version).
    """

    def __init__(self, store: WindowStore, machines: list[ChannelMachine], policy: PolicyConfig,
                 mark_changed: Callable[[list[int]], None]):
        self.store = store
        self.machines = machines
        self.policy = policy
        self.mark_changed = mark_changed
        #: route -> the shares of its channels (in route-member order) after its last round.
        self.prev_shares: dict[str, np.ndarray] = {}
        #: route → channel → traffic share after the last round (bounded shifts).
        self.shares_by_route: dict[str, dict[str, float]] = {}
        #: route -> (round boundary, shares before it): the growth bound's start (see :meth:`after_round`).
        self._share_round: dict[str, tuple[int, np.ndarray | None]] = {}
        #: route -> (weights [+ half_open mask], start shares, shares, shares as floats) of its last computation.
        self._share_cache: dict[str, tuple[tuple[float | bool, ...], np.ndarray | None, np.ndarray, list[float]]] = {}
        #: route -> version of its shares (raised at every change; continued from restored records).
        self._share_version: dict[str, int] = {}
        #: route -> the newest record restored for it, until the route's next round in this engine.
        self._restored_routes: dict[str, RouteShareRecord] = {}
        #: channel index -> its recent failure ratio (failures + 1) / (requests + 2) as of its last round.
        self.fail_ratio: dict[int, float] = {}
        #: channel index -> the weight the panic floor keeps it at (reason ``route_panic``), this round.
        self.panic_weight: dict[int, float] = {}
        #: routes whose every channel has a hard fault (reason ``route_down``), as of their last round.
        self.down_routes: set[str] = set()
        #: SPEC §4.2 capacity, not breakage: usual shares and learned ``max_share`` per channel index.
        self.capacity = CapacityModel()
        #: route-wide events and peer-relative latency (SPEC §4.2; :mod:`pipeline.engine.route_wide`).
        self.wide = RouteWide(store, machines, policy)

    def export_route_shares(self, i: int) -> RouteShareRecord | None:
        """The shares of channel ``i``'s route, for its snapshot: None before the route's first round,
        while a channel that joined the route since has not been through a round (the growth bound
        would not use those shares either) and for a route of more than :data:`MAX_SAVED_ROUTE`
        channels. A route restored and not yet through a round here gives back the record it was
        restored with."""
        r = self.store.routes[i]
        prev = self.prev_shares.get(r)
        if prev is None:
            return self._restored_routes.get(r)
        members = self.store.route_members()[r]
        if len(prev) != len(members) or len(members) > MAX_SAVED_ROUTE:
            return None
        names = [self.store.names[j] for j in members]
        round_ms, start = self._share_round[r]
        return RouteShareRecord(
            version=self._share_version.get(r, 0), shares=dict(zip(names, prev.tolist())), round_ms=round_ms,
            round_start=dict(zip(names, start.tolist())) if start is not None and len(start) == len(names) else None)

    def restore_route_shares(self, route: str, record: RouteShareRecord | None) -> None:
        """Take back a route's shares from one of its channels' snapshots (any number of calls per route:
        the newest record wins). Used at the route's next round when its channels are then exactly the
        record's (else that round starts without a growth bound, as a route's first round does); ignored
        when the route has had a round in this engine already (its shares are live)."""
        if record is None:
            return
        self._share_version[route] = max(self._share_version.get(route, 0), record.version)
        if route in self.prev_shares:
            return
        held = self._restored_routes.get(route)
        if held is None or (record.version, record.round_ms) > (held.version, held.round_ms):
            self._restored_routes[route] = record

    def _adopt_restored(self, r: str, idx: list[int]) -> None:
        """Route ``r``'s shares and round from its restored record, when it names exactly the route's
        channels ``idx``; the record is dropped either way."""
        record = self._restored_routes.pop(r, None)
        names = [self.store.names[i] for i in idx]
        if record is None or record.shares.keys() != set(names):
            return
        self.prev_shares[r] = np.array([record.shares[n] for n in names], np.float64)
        start = record.round_start
        self._share_round[r] = (record.round_ms, np.array([start[n] for n in names], np.float64)
                                if start is not None and start.keys() == record.shares.keys() else None)

    def _protect(self, r: str, idx: list[int], w: tuple[float, ...]) -> tuple[tuple[float, ...], np.ndarray | None]:
        """Route ``r``'s weights after the panic floor, and its ``half_open`` mask (None: none probing);
        updates :attr:`panic_weight` and :attr:`down_routes` for the route (SPEC §4.2)."""
        machines = self.machines
        if self.panic_weight:
            for i in idx:
                self.panic_weight.pop(i, None)
        states = [machines[i].state for i in idx]
        probing = np.array([s == HALF_OPEN for s in states]) if HALF_OPEN in states else None
        threshold = self.policy.panic_threshold(r)
        full = max(1.0 - self.policy.max_penalty, 1e-6)  # the weight left in service as panic_floor counts it
        left = sum(min(1.0, x / full) for x, s in zip(w, states) if s != HALF_OPEN)
        if left >= threshold * len(w) - 1e-12 and sum(w) > 0:  # settled: no panic, not route_down
            self.down_routes.discard(r)  # (every channel with a hard fault is open: all weights 0)
            return w, probing
        hard = [has_hard_fault(machines[i].reasons) for i in idx]
        if all(hard):
            self.down_routes.add(r)
        else:
            self.down_routes.discard(r)
        if left >= threshold * len(w) - 1e-12:
            return w, probing
        eligible = np.array([not h and s != NO_DATA for h, s in zip(hard, states)])
        ratio = np.array([self.fail_ratio.get(i, 0.5) for i in idx])
        weights, panicked = panic_floor(np.array(w), ratio, eligible,
                                        probing if probing is not None else np.zeros(len(w), bool),
                                        threshold, self.policy.route_panic_weight, full)
        for j in np.flatnonzero(panicked).tolist():
            self.panic_weight[idx[j]] = float(weights[j])
        if probing is not None:
            probing = probing & ~panicked  # a channel kept by the floor is not held to its probe share
        return tuple(weights.tolist()), probing

    def _caps(self, idx: list[int], w: tuple[float, ...]) -> tuple[np.ndarray, np.ndarray] | None:
        """``(caps, receivers)`` of a route's channels ``idx`` at weights ``w`` when one of them has a
        learned ``max_share`` (:mod:`pipeline.policy.capacity`), else None. Receivers: uncapped channels
        with weight whose recent failure ratio is at most the lowest of the capped ones plus
        :data:`RECEIVER_MARGIN` (an excess is moved only to a channel that serves it about as well or better)."""
        learned = self.capacity.max_share
        if not learned or not any(i in learned for i in idx):
            return None
        caps = np.array([learned.get(i, 1.0) for i in idx])
        ratio = np.array([self.fail_ratio.get(i, 0.5) for i in idx])
        line = float(ratio[caps < 1.0].min())
        receivers = (caps >= 1.0) & (np.array(w) > 0) & (ratio <= line + RECEIVER_MARGIN)
        return caps, receivers

    def keep_on_trip(self, i: int) -> float | None:
        """The weight channel ``i`` keeps when a failure run trips it between rounds, or None (it drops
        to 0): kept (reason ``route_panic``) when nothing else of its route has weight, it has no hard
        fault and the route's panic threshold is above 0: the trip must not black the route out
        until the next round (SPEC §4.2); the next round's panic floor then decides. A channel not kept
        leaves :attr:`panic_weight` (it is published at 0 now), so a later trip of the same chunk does
        not count it as in service (two trips in one chunk must not black the route out)."""
        r = self.store.routes[i]
        if self.policy.panic_threshold(r) <= 0 or has_hard_fault(self.machines[i].reasons) or any(
                self.panic_weight.get(j, self.machines[j].weight) > 0
                for j in self.store.route_members()[r] if j != i):
            self.panic_weight.pop(i, None)
            return None
        w = self.panic_weight.get(i, self.policy.route_panic_weight)
        self.panic_weight[i] = w
        return w

    def peer_over_cap(self, i: int) -> bool:
        """Whether another channel of channel ``i``'s route carried more than its learned ``max_share`` in
        its last round (:meth:`CapacityModel.over_cap <pipeline.policy.capacity.CapacityModel.over_cap>`):
        the route lacks the capacity ``i`` would add (SPEC §4.2)."""
        if not self.capacity.max_share:
            return False
        return any(j != i and self.capacity.over_cap(j) for j in self.store.route_members()[self.store.routes[i]])

    def readmitted(self, i: int, now_ms: int) -> dict[int, float]:
        """Channel ``i`` went ``half_open`` between rounds at event time ``now_ms`` on a run of successes
        (SPEC §4.2 re-admission on evidence): its recent failure ratio becomes the run's failure share, 0
        (until its next round counts its traffic since it left ``open``), and its route's shares are
        recomputed now (:meth:`after_round`: the probe cap, and a capped peer's excess to the channels
        that serve as well). Returns channel index -> share for the route's channels."""
        self.fail_ratio[i] = 0.0
        return self.after_round(np.array([i], np.int64), now_ms)

    def peer_returning(self, i: int) -> bool:
        """Whether another channel of channel ``i``'s route is ``half_open`` or ``recovering`` (coming back
        after an ``open``): a capped ``i`` then holds its cap (:meth:`CapacityModel.learn
        <pipeline.policy.capacity.CapacityModel.learn>`)."""
        machines = self.machines
        return any(j != i and machines[j].state in (HALF_OPEN, RECOVERING)
                   for j in self.store.route_members()[self.store.routes[i]])

    def last_share(self, i: int) -> float | None:
        """Channel ``i``'s share after its route's last round (None before one); after a restore and before
        the route's next round here, the share its restored record holds (the capacity model reads it)."""
        r = self.store.routes[i]
        shares = self.shares_by_route.get(r)
        if shares is None and (record := self._restored_routes.get(r)) is not None:
            shares = record.shares
        return None if shares is None else shares.get(self.store.names[i])

    def note_outcomes(self, rows: np.ndarray, requests: np.ndarray, failures: np.ndarray) -> None:
        """The recent (1 min) judged ``requests`` and ``failures`` of channels ``rows`` this round: the
        panic floor ranks channels by ``(failures + 1) / (requests + 2)`` (Laplace's rule: 0.5 without data)."""
        ratio = (np.asarray(failures, np.float64) + 1.0) / (np.asarray(requests, np.float64) + 2.0)
        self.fail_ratio.update(zip(rows.tolist(), ratio.tolist()))
        self.wide.note(rows, requests, failures)

    def after_round(self, rows: np.ndarray, now_ms: int) -> dict[int, float]:
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
            if self._restored_routes and r not in self.prev_shares:
                self._adopt_restored(r, idx)
            start = self._share_round.get(r)
            if start is None or start[0] != now_ms:
                start = (now_ms, self.prev_shares.get(r))
                self._share_round[r] = start
            w, probing = self._protect(r, idx, tuple(machines[i].weight for i in idx))
            w, probing = self.wide.apply(idx, w, probing, self.panic_weight)
            key: tuple[float | bool, ...] = w if probing is None else (*w, *probing.tolist())
            caps = self._caps(idx, w)
            if caps is not None:
                key = (*key, *caps[0].tolist(), *caps[1].tolist())
            cached = self._share_cache.get(r)
            if cached is not None and cached[0] == key and cached[1] is start[1]:
                s, values = cached[2], cached[3]  # same weights from the same start: same shares
            else:
                s = bounded_shares(np.array(w), start[1], self.policy.max_share_growth)
                if probing is not None:
                    s = probe_capped(s, np.array(w), probing, 1.0 - self.policy.max_penalty)
                if caps is not None:
                    s = cap_shares(s, caps[0], caps[1])
                if start[1] is not None and s.shape == start[1].shape and np.array_equal(s, start[1]):
                    s = start[1]  # unchanged (settled): keep the object, so the next round finds it cached
                values = s.tolist()
                last = self.prev_shares.get(r)
                if last is None or last.shape != s.shape or not np.array_equal(last, s):
                    self._share_version[r] = self._share_version.get(r, 0) + 1  # the channels' snapshots
                    self.mark_changed(idx)                                      # carry the new version
                self._share_cache[r] = (key, start[1], s, values)
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
