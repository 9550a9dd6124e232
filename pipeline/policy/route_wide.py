"""Route-wide events and peer-relative latency (SPEC §4.2 "Route-wide events", issue #33 part 4).

Two rules that look at a route's channels side by side, as pure functions over arrays (the engine's
part :class:`~pipeline.engine.route_wide.RouteWide` holds the per-channel state and calls them):

* **Peer-relative latency** (:func:`peer_latency_fired`): a channel's 24 h baseline follows a slow
  creep (P95 x 4 over two days moves the SPEC §4.3 ratio to at most ~1.5, under its 1.8 trip line), so
  its own baseline cannot see it; its route peers can. A channel is flagged ``peer_latency`` when the
  99 % lower confidence bound of its 5 min P95 (:meth:`~pipeline.windows.histogram.LatencyBuckets.
  quantile_bound`, David & Nagaraja §7.1) is at or above :attr:`RouteWideConfig.peer_trip_ratio` (3) x the median of
  its peers' 5 min P95s, and clears when its point P95 is at or below :attr:`~RouteWideConfig.peer_clear_ratio` (2) x that
  median (hysteresis of the same 1.5 proportion as SPEC §4.3's 1.8 / 1.2). The comparison to the
  route's other hosts is Envoy's outlier detection (``outlier_detection``, success rate: a host is
  ejected below ``mean - success_rate_stdev_factor x stdev`` of the cluster, with
  ``success_rate_minimum_hosts`` 5 and ``success_rate_request_volume`` 100); channels of one model
  from different providers differ at rest (chat-8b: groq 450 ms vs together 900 ms, 2x), so instead
  of a stdev of five or more hosts the rule is a ratio to the peers' median over at least
  :attr:`~RouteWideConfig.peer_min_peers` (2) peers (a route of three or more channels), each with the SPEC §4.3
  ``latency_min_requests`` answers in its window (its P95 is NaN below).
* **Route-wide** (:func:`route_wide_members`): when more than half of a route's channels with data
  (and at least :attr:`~RouteWideConfig.min_channels`, 3, channels) are non-healthy by detector findings (no
  hard fault, not flagged against their peers), the event is the route's (an upstream or model-wide
  slowdown), not theirs: moving traffic among equally bad channels only churns the shares. Those
  channels then share one weight (:attr:`~RouteWideConfig.weight`, 0.5, the degraded floor) with the reason
  ``route_wide``. Envoy's ``max_ejection_percent`` (default 10 %) is the same idea: never eject most
  of a cluster by outlier detection. A channel clearly worse than the rest of them is not "equally
  bad" and keeps its own weight: its recent failure share is above the pooled share of the others by
  a one-sided two-proportion z-test at :attr:`~RouteWideConfig.worse_z` (3.09, alpha 1e-3; Agresti, "Categorical Data
  Analysis", 3rd ed., §3.1.3, pooled-variance form) and at least :attr:`~RouteWideConfig.worse_ratio` (2) x that share.

Every number is a field of :class:`RouteWideConfig` (``[route_wide]`` in policy.toml, per route
``[route."name".route_wide]``), documented there with its source; :data:`DEFAULTS` holds the built-in ones.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields, replace
from typing import Any, Mapping

import numpy as np

#: Reason of a channel whose P95 is far above its route peers' (a soft finding: ``degraded``).
PEER_LATENCY = "peer_latency"
#: Reason of a channel degraded together with most of its route (its weight is the route's common one).
ROUTE_WIDE = "route_wide"
#: Table of the settings in policy.toml (``[route_wide]``; per route ``[route."name".route_wide]``).
TABLE = "route_wide"


@dataclass(frozen=True)
class RouteWideConfig:
    """The numbers of both rules, frozen; ``[route_wide]`` in policy.toml, per route ``[route."name".route_wide]``
    over it (:func:`~pipeline.policy.defaults.load_policy`). Validated on construction: a bad value raises
    ``ValueError`` naming ``<where>.<key>`` and the rule (e.g. ``route_wide.peer_trip_ratio must be >
    route_wide.peer_clear_ratio``); booleans are not numbers. Defaults and their sources:
    """

    #: Trip: 99 % lower bound of the 5 min P95 at or above this x the peers' median 5 min P95 (finite, > the
    #: clear ratio). 3: above the 2x rest spread of providers of one model (background route chat-8b: groq
    #: 450 ms, together 900 ms) by the SPEC §4.3 margin 1.5 (1.8 / 1.2).
    peer_trip_ratio: float = 3.0
    #: Clear: point 5 min P95 at or below this x the peers' median (> 0; trip / clear = 1.5, as SPEC §4.3 1.8 / 1.2).
    peer_clear_ratio: float = 2.0
    #: Peers with a P95 needed for a median (integer >= 1; 2: a route of at least 3 channels; Envoy's
    #: ``success_rate_minimum_hosts`` is 5 for its stdev rule).
    peer_min_peers: int = 2
    #: Answers a 5 min P95 needs to count (integer >= 1; SPEC §4.3 ``latency_min_requests`` default 50).
    peer_min_samples: int = 50
    #: A peer's P95 older than this is not used (ms, integer >= 1; two rounds of SPEC §4's 30 s).
    peer_max_age_ms: int = 60_000
    #: Channels a route needs for either rule (integer >= 3: two channels are a pair, primary and backup,
    #: SPEC §5.2, whose joint trouble is the panic floor's business).
    min_channels: int = 3
    #: The weight route-wide members share, in (0, 1]: SPEC §4 ``degraded_floor_weight`` (0.5).
    weight: float = 0.5
    #: One-sided z of the "clearly worse" two-proportion test (finite, > 0; 3.09: alpha = 1e-3).
    worse_z: float = 3.09
    #: ... and the least ratio of failure shares that counts as clearly worse (finite, >= 1).
    worse_ratio: float = 2.0
    #: The table these numbers came from, for error messages (not a setting).
    where: str = field(default=TABLE, compare=False, repr=False)

    def __post_init__(self) -> None:
        w = self.where
        for name in ("peer_trip_ratio", "peer_clear_ratio", "weight", "worse_z", "worse_ratio"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                raise ValueError(f"{w}.{name} must be a finite number, got {v!r}")
        for name, least in (("peer_min_peers", 1), ("peer_min_samples", 1), ("peer_max_age_ms", 1),
                            ("min_channels", 3)):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < least:
                raise ValueError(f"{w}.{name} must be an integer >= {least}, got {v!r}")
        if not self.peer_clear_ratio > 0:
            raise ValueError(f"{w}.peer_clear_ratio must be > 0, got {self.peer_clear_ratio!r}")
        if not self.peer_trip_ratio > self.peer_clear_ratio:
            raise ValueError(f"{w}.peer_trip_ratio must be > {w}.peer_clear_ratio (hysteresis), got "
                             f"{self.peer_trip_ratio!r} <= {self.peer_clear_ratio!r}")
        if not 0.0 < self.weight <= 1.0:
            raise ValueError(f"{w}.weight must be in (0, 1], got {self.weight!r}")
        if not self.worse_z > 0:
            raise ValueError(f"{w}.worse_z must be > 0, got {self.worse_z!r}")
        if not self.worse_ratio >= 1:
            raise ValueError(f"{w}.worse_ratio must be >= 1, got {self.worse_ratio!r}")

    @classmethod
    def keys(cls) -> list[str]:
        """The policy-file keys of the table, sorted."""
        return sorted(f.name for f in fields(cls) if f.name != "where")

    def with_table(self, table: Mapping[str, Any], where: str) -> RouteWideConfig:
        """This config with the keys of one policy-file table (``where`` names it in errors). Raises
        ``ValueError`` naming ``where`` for a table that is not one, an unknown key or a bad value."""
        if not isinstance(table, Mapping):
            raise ValueError(f"[{where}] must be a table, got {table!r}")
        unknown = set(table) - set(self.keys())
        if unknown:
            raise ValueError(f"[{where}]: unknown keys {sorted(unknown)}; valid keys: {self.keys()}")
        return replace(self, where=where, **table)


#: The built-in numbers (what a policy file without ``[route_wide]`` gets).
DEFAULTS = RouteWideConfig()


def peer_median(values: np.ndarray, groups: np.ndarray, min_peers: int = DEFAULTS.peer_min_peers) -> np.ndarray:
    """Per channel, the median of ``values`` over the *other* channels of its group.

    ``values`` float (k,) (NaN or infinite: no value; not counted); ``groups`` (k,), the route of each
    channel (any sortable dtype). Returns float (k,), NaN where fewer than ``min_peers`` (>= 1) peers
    have a value; otherwise exactly ``np.median`` of the peers' values (the mean of the two middle ones
    for an even count). O(k log k): one sort by (group, value); a channel's peers are its group's sorted
    values without its own, so their median is one or two order statistics of that sorted list, at
    most three candidates (the middle ones and their right neighbour), not a median per channel.
    The engine does not call it: its twin ``pipeline.engine.route_wide._median_without`` does the same
    one route at a time; this is the array form the rule is stated and tested in.

    >>> peer_median(np.array([100.0, 110.0, 400.0, np.nan]), np.array([0, 0, 0, 0])).tolist()
    [255.0, 250.0, 105.0, 110.0]
    >>> peer_median(np.array([100.0, 110.0]), np.array([0, 0])).tolist()
    [nan, nan]
    """
    v = np.asarray(values, np.float64)
    out = np.full(v.shape, np.nan)
    if v.size == 0:
        return out
    _, gid = np.unique(np.asarray(groups), return_inverse=True)
    gid = gid.reshape(-1)
    ok = np.isfinite(v)
    order = np.lexsort((np.where(ok, v, np.inf), gid))  # by group, its values ascending, no-values last
    ranked = v[order]
    start = np.searchsorted(gid[order], gid)  # where each channel's group begins in ``ranked``
    rank = np.empty(v.size, np.int64)
    rank[order] = np.arange(v.size)
    rank -= start  # a channel's place among its group's values (a value's place: ties are interchangeable)
    n = np.bincount(gid, weights=ok)[gid].astype(np.int64) - ok  # its peers with a value
    has = n >= max(1, min_peers)

    def nth(t: np.ndarray) -> np.ndarray:  # t-th smallest peer value (t < n), skipping the channel's own
        picked: np.ndarray = ranked[np.minimum(start + t + (ok & (t >= rank)), v.size - 1)]  # clipped: unused
        return picked

    lo, hi = nth(np.where(has, (n - 1) // 2, 0)), nth(np.where(has, n // 2, 0))
    out[has] = np.where(n % 2 == 1, hi, (lo + hi) / 2)[has]
    return out


def peer_latency_fired(p95_lower_ms: np.ndarray, p95_ms: np.ndarray, peers_ms: np.ndarray, active: np.ndarray,
                       trip: float = DEFAULTS.peer_trip_ratio, clear: float = DEFAULTS.peer_clear_ratio) -> np.ndarray:
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
                       failures: np.ndarray, min_channels: int = DEFAULTS.min_channels,
                       worse_z: float = DEFAULTS.worse_z, worse_ratio: float = DEFAULTS.worse_ratio) -> np.ndarray:
    """The channels of one route that a route-wide event holds at the route's common weight.

    ``affected`` bool (k,): non-healthy by detector findings (no hard fault, not flagged against
    peers); ``with_data`` bool (k,): has data (not ``no_data``); ``requests`` / ``failures`` float (k,):
    its recent (1 min) judged requests and upstream failures. Route-wide when ``k >= min_channels``
    and more than half of the channels with data are affected; then every affected channel that is not
    clearly worse than the pooled rest of the affected ones (one-sided two-proportion z >= ``worse_z``
    and share >= ``worse_ratio`` x theirs; :class:`RouteWideConfig`) is a member. Returns bool (k,) (all False: not route-wide).

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
    # each affected channel against the pooled rest: the rest's totals are the affected totals minus its
    # own (one pass, linear in the route's size: a route of 2,000 channels is 2,000 tests, not 4 million sums)
    at = np.flatnonzero(aff)
    ni, fi = n[at], f[at]
    n_all, f_all = float(ni.sum()), float(fi.sum())
    n2, f2 = n_all - ni, f_all - fi
    with np.errstate(divide="ignore", invalid="ignore"):
        p1, p2 = fi / ni, f2 / n2
        pooled = (fi + f2) / (ni + n2)
        se = np.sqrt(pooled * (1.0 - pooled) * (1.0 / ni + 1.0 / n2))
        worse = (ni > 0) & (n2 > 0) & (se > 0) & ((p1 - p2) / se >= worse_z) & (p1 >= worse_ratio * p2)
    members: np.ndarray = aff.copy()
    members[at[worse]] = False
    if int(members.sum()) * 2 <= n_data:  # what is left is no longer most of the route
        return np.zeros(k, bool)
    return members
