"""Suspicion: a channel's route share moved to its peers on a short failure run, before any trip
(SPEC §4.2 "protect the route", issue #33).

A failure run of ``consecutive_failures`` (5) opens a channel (SPEC §4.2 pre-trip). When a channel
fails hard, LLM requests sent before the fault keep completing OK for a few seconds (they take seconds;
``ts_ms`` is when a request finished, SPEC §3), and each of them ends the run counted in completion
order: the trip waits until they have drained (2.5 to 3 s on backup-overload, where the primary's 503s
take 40 ms and its successes 2.4 s), and every request routed to the channel meanwhile fails. Counting
the run in send order (``ts_ms - latency_ms``) instead would trip at once but cannot see the requests
still in flight: on clean traffic with fast failures it multiplies false trips (measured: 5.2 times the
rate of independent failures, 3,181 vs 614 runs of 5 on 100,000 requests at a 40 % failure share).

So the decision is split, as Envoy splits outlier ejection (reversible, on little evidence) from its
breakers: a run of ``PolicyConfig.suspect_run`` (3) failures makes the channel *suspect*. A suspect keeps
its state and weight (no verdict turns non-healthy, no alert); its published ``route_share`` is 0 (metric
``suspect_run``), so routers send its traffic to its peers (:func:`pipeline.router.table.route_shares`
normalises the others). The suspicion ends at the first success **sent after** the request that made
it (fresh evidence: a success sent before it says nothing about the requests since), when the
channel trips (its trip verdict says the rest), or at its first verdict (a round at the latest)
``PolicyConfig.suspect_max_ms`` (10 s) or more after it began: a router that follows the share sends
the channel nothing, so no fresh success can come; its share back, 2 more failures make the run of 5
and trip it, a success ends the run. On clean traffic it ends one request latency after it began; while
the channel is failing, stale successes do not end it, and the run of 5 then opens it.

A channel becomes suspect only while its route keeps another channel in service (weight above 0, not
``open`` / ``half_open`` / ``recovering``, not suspect: a router hands it the suspect's share at once, and a
``recovering`` channel's share may only ramp, SPEC §4) and no channel of its route has a learned ``max_share`` or
a share that just rose (:meth:`~pipeline.policy.capacity.CapacityModel.share_rose`: a route short of capacity
cannot take load on weak evidence, and a cap is learned only after the overload was judged; SPEC §4.2
"overload is not breakage"); only channels in ``healthy``,
``degraded`` or ``recovering``. When its last peer leaves service, the suspicion ends (never a dark
route by inference).

Sources: Higress ai-proxy removes a key after 3 consecutive failures until a health check passes
(``provider/failover.go``, ``failureThreshold`` 3); Envoy outlier detection ejects on 5 consecutive 5xx
(``consecutive_5xx``) for a base ejection time. False suspicions on independent failures: a run of 3
starts at a request with probability ``q p^3`` (Feller, An Introduction to Probability Theory and Its
Applications, vol. 1, XIII.7), e.g. every 2.7e7 requests at the simulator's paid base failure share
0.3 %; each moves one channel's share for about one request latency.
"""

from __future__ import annotations

from pipeline.policy.capacity import CapacityModel
from pipeline.policy.defaults import PolicyConfig
from pipeline.policy.state_machine import DEGRADED, HALF_OPEN, HEALTHY, OPEN, RECOVERING, ChannelMachine
from pipeline.windows.store import WindowStore

__all__ = ["Suspects"]

#: States a channel may become suspect in (in service, not probing).
_SUSPECTABLE = frozenset((HEALTHY, DEGRADED, RECOVERING))


class Suspects:
    """The engine's suspect channels (``engine.suspects``): channel row -> when the request that made it
    suspect was sent (epoch ms, float)."""

    def __init__(self, store: WindowStore, machines: list[ChannelMachine], capacity: CapacityModel,
                 policy: PolicyConfig):
        self.store = store
        self.machines = machines
        self.capacity = capacity
        self.max_ms = policy.suspect_max_ms
        #: channel row -> send time (epoch ms) of the request that completed its suspicion run.
        self.since_ms: dict[int, float] = {}
        #: channel row -> event time (epoch ms) its suspicion began at (that request's ``ts_ms``).
        self.began_ms: dict[int, int] = {}
        #: channel row -> event time (epoch ms) its last suspicion ran out (``max_ms``) while its failure run went
        #: on: it may not become suspect again before a success ends that run (its share is back so that more
        #: requests complete the run of ``consecutive_failures`` and trip it; a new suspicion at the run's next
        #: failure would starve it of them again, and a router following the shares would never see it open).
        self.expired: dict[int, int] = {}

    def start(self, i: int, sent_ms: float, at_ms: int) -> None:
        """Channel ``i`` is suspect from event time ``at_ms`` on, made so by a request sent at ``sent_ms``."""
        self.since_ms[i] = sent_ms
        self.began_ms[i] = at_ms

    def end(self, i: int) -> None:
        """Channel ``i`` is suspect no more (no-op when it was not)."""
        self.since_ms.pop(i, None)
        self.began_ms.pop(i, None)

    def _in_service(self, j: int) -> bool:
        m = self.machines[j]
        return m.weight > 0 and m.state not in (OPEN, HALF_OPEN, RECOVERING) and j not in self.since_ms

    def has_peer(self, i: int) -> bool:
        """Whether another channel of channel ``i``'s route is in service (weight above 0, not ``open``,
        ``half_open`` or ``recovering``, not suspect)."""
        return any(j != i and self._in_service(j) for j in self.store.route_members()[self.store.routes[i]])

    def may_suspect(self, i: int) -> bool:
        """Whether channel ``i`` may become suspect now (module text: its state, a peer in service, no
        learned capacity cap nor a share that just rose on its route)."""
        m = self.machines[i]
        if m.state not in _SUSPECTABLE or m.weight <= 0 or i in self.since_ms or i in self.expired:
            return False
        members = self.store.route_members()[self.store.routes[i]]
        if any(self.capacity.share_rose(j) for j in members):  # capped, or its share rose (module text)
            return False
        return self.has_peer(i)

    def holds(self, i: int, now_ms: int | None = None) -> bool:
        """Whether channel ``i`` is suspect now; a suspicion whose channel left service (a trip), whose
        route has no other channel in service any more, or (with event time ``now_ms``) that began
        ``max_ms`` or more before ``now_ms`` ends here (returns False)."""
        if i not in self.since_ms:
            return False
        if now_ms is not None and now_ms - self.began_ms.get(i, now_ms) >= self.max_ms:
            self.end(i)
            self.expired[i] = now_ms
            return False
        if self.machines[i].state not in _SUSPECTABLE or not self.has_peer(i):
            self.end(i)
            return False
        return True
