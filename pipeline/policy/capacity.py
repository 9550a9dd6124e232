"""Capacity, not breakage: a learned ``max_share`` for a channel overloaded by the share it took (SPEC §4.2).

A backup that takes the whole route when its primary fails may fail more because it is over its
capacity, not because it is broken: opening it then leaves the route with nothing (or with the panic
floor) while the backup would serve most of a smaller share. This module decides, at route level,
whether a channel's ``error_rate`` trip is such an overload, and learns the share it can carry.

The decision (:meth:`CapacityModel.overloaded`), per channel whose ``error_rate`` detector fired this
round (the detector's own test says the failures rose; its guarantee is the detector's):

* **the share rose**: the largest share the channel held over the last :data:`LOAD_ROUNDS` rounds (the
  detector's longest window) is at least ``RISE_FACTOR x`` its usual share and ``RISE_MIN_ABS`` above it. The usual share is an EWMA
  (``USUAL_ALPHA`` per round) of the shares it held in rounds where it was healthy and no failure
  detector fired: the largest share at which its failure rate stayed under the detector's line. Each
  such round adds the smallest share it held over the last :data:`LOAD_ROUNDS` rounds, the share the
  detector's whole window has judged: a share it took only just now (a peer opened a round ago) is not
  yet one its failures were judged at (issue #33: the backup of backup-overload learned 0.55 / 0.57
  from the 2-3 clean rounds at share 1.0 before its detector fired, and its cap, the usual share, was
  above its capacity at the route's peak demand).
* **the failures are partial**: the Clopper-Pearson upper bound (Clopper & Pearson 1934, Biometrika
  26; :func:`pipeline.stats.exact_upper`, one-sided level ``1 - ALPHA``) of its last minute's failure
  rate is under :data:`BREAKAGE_RATE`. An overloaded upstream sheds a part of its requests (429, 503
  "overloaded", timeouts); a broken one fails most of them, and that still opens.

A channel already capped keeps the attribution while the detector's finding lasts (its 5 min window
remembers the overloaded minutes) as long as its last minute at the capped share is not failing
significantly more than usual: the Clopper-Pearson lower bound of that rate is at most
``max(2 x usual rate, usual rate + 0.005)``, the usual rate being the pooled failure rate of its clean
healthy rounds (counts decayed by ``1 - USUAL_ALPHA`` per round). A capped channel that does fail more
at its cap is broken after all: the trip stands.

Then the trip is not passed on: the channel is ``degraded`` with the reason ``over_capacity`` (kept while it
carries more than its cap: :meth:`CapacityModel.over_cap`) and gets
``max_share`` = its usual share (multiplicative decrease on a repeat: ``DECREASE x`` the share it held,
never under the usual share), published in its verdict's metrics; the route's shares respect it
(:func:`cap_shares`). Each round the channel is clean at its cap, the cap grows by ``INCREASE``
(additive increase); each round it is healthy under its cap, the cap relaxes toward 1 (its distance to
1 halves in ``RELAX_HALF_LIFE_ROUNDS``); it is dropped at 0.99. A channel that carries more than its
cap (nobody can take the excess) tells nothing about it. Replayed open-loop streams (the scorecard)
do not move load with the shares, so the cap learns there only from the rounds at the cap. The scheme is TCP's AIMD (additive increase, multiplicative
decrease; Chiu & Jain 1989), applied to a route share. 429s (``rate_limited``) count as failures of the
last minute, so they feed the same estimate.
"""

from __future__ import annotations

import numpy as np

from pipeline.stats import exact_lower, exact_upper

#: Reason code of a channel whose failures are attributed to the share it took.
OVER_CAPACITY = "over_capacity"
#: Rounds over which the largest share the channel held is taken: 10 rounds of 30 s, the 5 min window of
#: the ``error_rate`` detector (its finding lasts while the overloaded minutes are in its window).
LOAD_ROUNDS = 10
#: The held share must be at least this factor of the usual share ...
RISE_FACTOR = 1.4
#: ... and this much above it (absolute share).
RISE_MIN_ABS = 0.15
#: EWMA weight per clean round of the usual share (about 20 rounds = 10 min of memory at 30 s).
USUAL_ALPHA = 0.05
#: A failure rate whose upper bound reaches this is breakage, not overload.
BREAKAGE_RATE = 0.25
#: One-sided error of the Clopper-Pearson bound on the failure rate.
ALPHA = 0.01
#: Additive increase of ``max_share`` per clean round at the cap.
INCREASE = 0.05
#: Rounds (30 s) in which a healthy capped channel under its cap halves its cap's distance to 1 (10 min).
RELAX_HALF_LIFE_ROUNDS = 20
#: Per-round factor on ``1 - max_share`` of a healthy capped channel under its cap.
RELAX = 0.5 ** (1.0 / RELAX_HALF_LIFE_ROUNDS)
#: Multiplicative decrease on a repeat overload: the new cap is this factor of the share held.
DECREASE = 0.8


class CapacityModel:
    """Per channel index: the usual share, the recent held shares and the learned ``max_share``."""

    def __init__(self) -> None:
        #: channel -> EWMA of the shares it held in clean healthy rounds (None before the first).
        self.usual: dict[int, float] = {}
        #: channel -> the shares it held over the last :data:`LOAD_ROUNDS` rounds, newest last.
        self.held: dict[int, list[float]] = {}
        #: channel -> learned ``max_share`` in (0, 1); absent: uncapped.
        self.max_share: dict[int, float] = {}
        #: channel -> event time (ms) of its last round attributed to a share rise, while it is capped: it
        #: is judged on the traffic since (its detectors restart there, as a ``half_open`` channel's do
        #: from leaving ``open``), so the overloaded minutes stop counting once its share came down.
        self.judged_since_ms: dict[int, int] = {}
        #: channel -> (requests, failures) of its last minute in clean healthy rounds, decayed per round.
        self.usual_counts: dict[int, tuple[float, float]] = {}

    def note_share(self, i: int, share: float) -> None:
        """Channel ``i`` held ``share`` (in [0, 1]) of its route during the round that just ended. A channel
        that never held less than the whole route (alone on it) is not tracked: no memory, no cost."""
        if share >= 1.0 and i not in self.held:
            return
        h = self.held.setdefault(i, [])
        h.append(float(share))
        if len(h) > LOAD_ROUNDS:
            del h[0]

    def learn(self, i: int, clean: bool, healthy: bool, requests_1m: float = 0.0,
              failures_1m: float = 0.0, peer_returning: bool = False) -> None:
        """End of channel ``i``'s round: ``clean`` (no hard failure detector fired this round); a capped
        channel clean at its cap raises it by :data:`INCREASE` (not while ``peer_returning``: another
        channel of its route is ``half_open`` or ``recovering`` and takes the excess, SPEC §4.2: the route
        needs that channel's capacity back, not a probe of this one's; the cap holds), one ``healthy`` under its cap moves it
        toward 1 by :data:`RELAX` (dropped at 0.99); an uncapped one clean
        and ``healthy`` (its state) updates its usual share with the smallest share it held over the last
        :data:`LOAD_ROUNDS` rounds (module text), and its usual failure counts with ``requests_1m`` /
        ``failures_1m`` (its last minute)."""
        h = self.held.get(i)
        if not clean or not h:
            return
        if i in self.max_share:
            cap = self.max_share[i]
            if h[-1] > cap + 0.01:
                return  # it carried more than its cap (nobody to take the excess): no news on the cap
            if h[-1] >= cap - 0.02:
                if peer_returning:
                    return  # the excess feeds a returning peer: the cap holds
                cap += INCREASE  # clean at its cap: additive increase
            elif healthy:
                cap = 1.0 - (1.0 - cap) * RELAX  # healthy under its cap: the cap relaxes back up
            else:
                return
            if cap >= 0.99:
                del self.max_share[i]
                self.judged_since_ms.pop(i, None)
            else:
                self.max_share[i] = cap
            return
        if not healthy:
            return
        u = self.usual.get(i)
        judged = min(h)  # the share its detector's whole window has seen
        self.usual[i] = judged if u is None else u + USUAL_ALPHA * (judged - u)
        n, f = self.usual_counts.get(i, (0.0, 0.0))
        keep = 1.0 - USUAL_ALPHA
        self.usual_counts[i] = (keep * n + requests_1m, keep * f + failures_1m)

    def overloaded(self, i: int, requests_1m: float, failures_1m: float, now_ms: int = 0) -> float | None:
        """The ``max_share`` channel ``i`` gets when its ``error_rate`` trip is an overload (see the
        module text), else None (a breakage: the trip stands). ``requests_1m`` / ``failures_1m``:
        its judged requests and failures of the last minute (>= 0); ``now_ms``: the round's event time.
        Sets :attr:`max_share` and, on a share rise, :attr:`judged_since_ms`.

        >>> m = CapacityModel()
        >>> for _ in range(20): m.note_share(0, 0.5); m.learn(0, True, True)
        >>> for _ in range(3): m.note_share(0, 1.0)
        >>> m.overloaded(0, 800.0, 20.0), m.overloaded(0, 800.0, 700.0)
        (0.5, None)
        """
        u, h = self.usual.get(i), self.held.get(i)
        if u is None or not h:
            return None
        if requests_1m <= 0:
            return None
        held = max(h)
        if held < RISE_FACTOR * u or held < u + RISE_MIN_ABS:
            prev = self.max_share.get(i)
            return prev if prev is not None and self._fine_at_cap(i, requests_1m, failures_1m) else None
        upper = float(exact_upper(np.array([failures_1m]), np.array([requests_1m]), ALPHA)[0])
        if upper >= BREAKAGE_RATE:
            return None
        prev = self.max_share.get(i)
        cap = u if prev is None else max(u, min(prev, DECREASE * held))
        self.max_share[i] = cap
        self.judged_since_ms[i] = int(now_ms)
        return cap


    def share_rose(self, i: int) -> bool:
        """Whether channel ``i`` is capped or its largest share of the last :data:`LOAD_ROUNDS` rounds rose
        over its usual share by the rule of :meth:`overloaded` (``RISE_FACTOR`` x and ``RISE_MIN_ABS``).
        Its 429s without ``Retry-After`` then start no rate-limit cooldown (SPEC §4.1): they stay failures
        of its last minute and feed the same capacity test as its other failures (SPEC §4.2).

        >>> m = CapacityModel()
        >>> for _ in range(20): m.note_share(0, 0.5); m.learn(0, True, True)
        >>> before = m.share_rose(0); m.note_share(0, 1.0); before, m.share_rose(0)
        (False, True)
        """
        if i in self.max_share:
            return True
        u, h = self.usual.get(i), self.held.get(i)
        if u is None or not h:
            return False
        held = max(h)
        return held >= RISE_FACTOR * u and held >= u + RISE_MIN_ABS

    def over_cap(self, i: int) -> bool:
        """Whether capped channel ``i`` held more than its cap (+0.01) in its last round: it stays
        ``over_capacity`` (degraded) while it does, even on a round its restarted detectors are quiet."""
        cap = self.max_share.get(i)
        h = self.held.get(i)
        return cap is not None and bool(h) and h[-1] > cap + 0.01  # type: ignore[index]

    def _fine_at_cap(self, i: int, requests_1m: float, failures_1m: float) -> bool:
        """Whether capped channel ``i``'s last minute is not failing significantly more than usual."""
        n, f = self.usual_counts.get(i, (0.0, 0.0))
        rate = f / n if n > 0 else 0.0
        line = max(2.0 * rate, rate + 0.005)
        lower = float(exact_lower(np.array([failures_1m]), np.array([requests_1m]), ALPHA)[0])
        return lower <= line


def cap_shares(shares: np.ndarray, caps: np.ndarray, receivers: np.ndarray) -> np.ndarray:
    """Shares (k,) with each channel at most its cap, the excess moved to ``receivers``.

    ``shares`` float (k,) summing to 1 (or 0); ``caps`` float (k,) in (0, 1], 1 = uncapped;
    ``receivers`` bool (k,): the channels that may take an excess (in service, failing less than the
    capped channels, under their own caps). The excess goes to the receivers in proportion to their
    room under their caps, each up to its cap; what no receiver can take stays where it was (the
    traffic has to go somewhere: a capped channel is overloaded, not broken).

    >>> cap_shares(np.array([0.95, 0.05]), np.array([0.6, 1.0]), np.array([False, True])).round(3).tolist()
    [0.6, 0.4]
    >>> cap_shares(np.array([1.0, 0.0]), np.array([0.6, 1.0]), np.array([False, False])).tolist()
    [1.0, 0.0]
    """
    s = np.asarray(shares, np.float64)
    over = np.maximum(s - caps, 0.0)
    excess = float(over.sum())
    room = np.where(receivers, np.maximum(caps - s, 0.0), 0.0)
    total_room = float(room.sum())
    if excess <= 1e-12 or total_room <= 1e-12:
        return s
    moved = min(excess, total_room)
    out: np.ndarray = s - over * (moved / excess) + room * (moved / total_room)
    return out
