"""Route-wide events and peer-relative latency (SPEC §4.2 "Route-wide events", issue #33 part 4).

Two rules that look at a route's channels side by side, as pure functions over arrays (the engine's
part :class:`~pipeline.engine.route_wide.RouteWide` holds the per-channel state and calls them):

* **Peer-relative latency** (:func:`peer_latency_fired`): a channel's 24 h baseline follows a slow
  creep (P95 x 4 over two days moves the SPEC §4.3 ratio to at most ~1.5, under its 1.8 trip line), so
  its own baseline cannot see it; its route peers can. A channel is flagged ``peer_latency`` when the
  99 % lower confidence bound of its 5 min P95 (:meth:`~pipeline.windows.histogram.LatencyBuckets.
  quantile_bound`, David & Nagaraja §7.1) is at or above :data:`PEER_TRIP_FACTOR` x the median of
  its peers' 5 min P95s, and clears when its point P95 is at or below :data:`PEER_CLEAR_FACTOR` x that
  median (hysteresis of the same 1.5 proportion as SPEC §4.3's 1.8 / 1.2). The comparison to the
  route's other hosts is Envoy's outlier detection (``outlier_detection``, success rate: a host is
  ejected below ``mean - success_rate_stdev_factor x stdev`` of the cluster, with
  ``success_rate_minimum_hosts`` 5 and ``success_rate_request_volume`` 100); channels of one model
  from different providers differ at rest (chat-8b: groq 450 ms vs together 900 ms, 2x), so instead
  of a stdev of five or more hosts the rule is a ratio to the peers' median over at least
  :data:`PEER_MIN_PEERS` peers (a route of three or more channels), each with the SPEC §4.3
  ``latency_min_requests`` answers in its window (its P95 is NaN below).
* **Route-wide** (:func:`route_wide_members`): when more than half of a route's channels with data
  (and at least :data:`ROUTE_WIDE_MIN_CHANNELS` channels) are non-healthy by detector findings (no
  hard fault, not flagged against their peers), the event is the route's (an upstream or model-wide
  slowdown), not theirs: moving traffic among equally bad channels only churns the shares. Those
  channels then share one weight (:data:`ROUTE_WIDE_WEIGHT`, the degraded floor) with the reason
  ``route_wide``. Envoy's ``max_ejection_percent`` (default 10 %) is the same idea: never eject most
  of a cluster by outlier detection. A channel clearly worse than the rest of them is not "equally
  bad" and keeps its own weight: its recent failure share is above the pooled share of the others by
  a one-sided two-proportion z-test at :data:`WORSE_Z` (alpha 1e-3; Agresti, "Categorical Data
  Analysis", 3rd ed., §3.1.3, pooled-variance form) and at least :data:`WORSE_RATIO` x that share.
"""

from __future__ import annotations

import numpy as np

#: Reason of a channel whose P95 is far above its route peers' (a soft finding: ``degraded``).
PEER_LATENCY = "peer_latency"
#: Reason of a channel degraded together with most of its route (its weight is the route's common one).
ROUTE_WIDE = "route_wide"
#: Trip: 99 % lower bound of the 5 min P95 at or above this x the peers' median 5 min P95. Above the
#: 2x rest spread of providers of one model (background route chat-8b) by the SPEC §4.3 margin 1.5.
PEER_TRIP_FACTOR = 3.0
#: Clear: point 5 min P95 at or below this x the peers' median (trip / clear = 1.5, as SPEC §4.3 1.8 / 1.2).
PEER_CLEAR_FACTOR = 2.0
#: Peers needed for a median (a route of at least 3 channels; Envoy needs 5 hosts for its stdev rule).
PEER_MIN_PEERS = 2
#: A route-wide event needs at least this many channels on the route (two channels are a pair:
#: primary and backup, SPEC §5.2, whose joint trouble is the panic floor's business).
ROUTE_WIDE_MIN_CHANNELS = 3
#: The weight route-wide channels share: SPEC §4 ``degraded_floor_weight`` (0.5).
ROUTE_WIDE_WEIGHT = 0.5
#: One-sided z of the "clearly worse" test (alpha = 1e-3).
WORSE_Z = 3.09
#: ... and the least ratio of failure shares that counts as clearly worse.
WORSE_RATIO = 2.0


def peer_median(values: np.ndarray, groups: np.ndarray, min_peers: int = PEER_MIN_PEERS) -> np.ndarray:
    """Per channel, the median of ``values`` over the *other* channels of its group.

    ``values`` float (k,) (NaN: no value; not counted); ``groups`` int (k,), the route of each channel.
    Returns float (k,), NaN where fewer than ``min_peers`` (>= 1) peers have a value.

    >>> peer_median(np.array([100.0, 110.0, 400.0, np.nan]), np.array([0, 0, 0, 0])).tolist()
    [255.0, 250.0, 105.0, 110.0]
    >>> peer_median(np.array([100.0, 110.0]), np.array([0, 0])).tolist()
    [nan, nan]
    """
    v = np.asarray(values, np.float64)
    g = np.asarray(groups)
    out = np.full(v.shape, np.nan)
    for grp in np.unique(g).tolist():
        members = np.flatnonzero(g == grp)
        for i in members.tolist():
            peers = v[members[members != i]]
            peers = peers[np.isfinite(peers)]
            if len(peers) >= max(1, min_peers):
                out[i] = float(np.median(peers))
    return out


def peer_latency_fired(p95_lower_ms: np.ndarray, p95_ms: np.ndarray, peers_ms: np.ndarray, active: np.ndarray,
                       trip: float = PEER_TRIP_FACTOR, clear: float = PEER_CLEAR_FACTOR) -> np.ndarray:
    """The ``peer_latency`` finding per channel, with hysteresis.

    ``p95_lower_ms``: 99 % lower bound of each channel's 5 min P95; ``p95_ms``: its point P95;
    ``peers_ms``: its peers' median P95 (:func:`peer_median`); all float (k,) in ms, NaN where not known;
    ``active`` bool (k,): the finding as of the last round. Trips at ``lower >= trip x peers``; an
    active one stays until ``p95 <= clear x peers``; without evidence (a NaN) the previous finding is
    kept (SPEC §4.3's rule for thin data); so is it for a peers' median of 0 ms, which gives no ratio. Raises ``ValueError`` unless ``trip >= clear > 0``.

    >>> peer_latency_fired(np.array([350.0, 90.0]), np.array([380.0, 100.0]), np.array([110.0, 300.0]),
    ...                    np.array([False, False])).tolist()
    [True, False]
    >>> peer_latency_fired(np.array([200.0]), np.array([250.0]), np.array([110.0]), np.array([True])).tolist()
    [True]
    """
    if not trip >= clear > 0:
        raise ValueError(f"need trip >= clear > 0, got trip={trip}, clear={clear}")
    lo, p, peers = (np.asarray(a, np.float64) for a in (p95_lower_ms, p95_ms, peers_ms))
    act = np.asarray(active, bool)
    with np.errstate(invalid="ignore"):
        trips = lo >= trip * peers
        clears = p <= clear * peers
    known = np.isfinite(peers) & (peers > 0)  # a 0 ms median (cached answers, a bad latency field) gives no ratio
    out: np.ndarray = np.where(act, ~(known & np.isfinite(p) & clears), known & np.isfinite(lo) & trips)
    return out


def route_wide_members(affected: np.ndarray, with_data: np.ndarray, requests: np.ndarray,
                       failures: np.ndarray, min_channels: int = ROUTE_WIDE_MIN_CHANNELS) -> np.ndarray:
    """The channels of one route that a route-wide event holds at the route's common weight.

    ``affected`` bool (k,): non-healthy by detector findings (no hard fault, not flagged against
    peers); ``with_data`` bool (k,): has data (not ``no_data``); ``requests`` / ``failures`` float (k,):
    its recent (1 min) judged requests and upstream failures. Route-wide when ``k >= min_channels``
    and more than half of the channels with data are affected; then every affected channel that is not
    clearly worse than the pooled rest of the affected ones (one-sided two-proportion z >= :data:`WORSE_Z`
    and share >= :data:`WORSE_RATIO` x theirs) is a member. Returns bool (k,) (all False: not route-wide).

    >>> route_wide_members(np.array([True, True, True, False]), np.ones(4, bool), np.full(4, 120.0),
    ...                    np.array([10.0, 12.0, 9.0, 0.0])).tolist()
    [True, True, True, False]
    >>> route_wide_members(np.array([True, True, True]), np.ones(3, bool), np.full(3, 120.0),
    ...                    np.array([10.0, 12.0, 120.0])).tolist()  # the third is down, not route-wide
    [True, True, False]
    >>> route_wide_members(np.array([True, True, False, False]), np.ones(4, bool), np.full(4, 120.0),
    ...                    np.zeros(4)).tolist()  # half is not most
    [False, False, False, False]
    """
    aff = np.asarray(affected, bool) & np.asarray(with_data, bool)
    k = len(aff)
    n_data = int(np.asarray(with_data, bool).sum())
    if k < min_channels or int(aff.sum()) * 2 <= n_data:
        return np.zeros(k, bool)
    n = np.asarray(requests, np.float64)
    f = np.asarray(failures, np.float64)
    members: np.ndarray = aff.copy()
    for i in np.flatnonzero(aff).tolist():
        rest = aff.copy()
        rest[i] = False
        n2, f2 = float(n[rest].sum()), float(f[rest].sum())
        if n[i] <= 0 or n2 <= 0:
            continue
        p1, p2 = f[i] / n[i], f2 / n2
        pooled = (f[i] + f2) / (n[i] + n2)
        se = np.sqrt(pooled * (1.0 - pooled) * (1.0 / n[i] + 1.0 / n2))
        if se > 0 and (p1 - p2) / se >= WORSE_Z and p1 >= WORSE_RATIO * p2:
            members[i] = False
    if int(members.sum()) * 2 <= n_data:  # what is left is no longer most of the route
        return np.zeros(k, bool)
    return members
