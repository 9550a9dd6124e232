"""Consecutive-failure runs over each channel's last requests (SPEC §4.2).

The run is counted over requests, not over time: failures separated by long
quiet gaps still add up, and nothing resets every 60 s. A run is capped at
``window`` (default 100, the "last 100 requests" of SPEC §4.2). Requests that
are neither success nor upstream failure (``cancelled``, ``filtered``) leave
the run unchanged.
"""

from __future__ import annotations

import numpy as np


#: Batches of at most this many events take :meth:`RunTracker.update`'s per-event path (same results).
SMALL_BATCH = 32
#: :meth:`RunTracker.update` follows only the channels with a failure when at most 1 in this many judged
#: events failed (the usual batch: failures are rare), every judged event otherwise (same results).
FEW_FAILURES = 8


class RunTracker:
    """Trailing consecutive-failure run per channel.

    ``trailing`` int32 (C,): failures since the channel's last success,
    capped at ``window`` (>= 1).
    """

    def __init__(self, window: int = 100, capacity: int = 16):
        if window < 1:
            raise ValueError(f"window must be >= 1, got {window}")
        self.window = int(window)
        self.trailing = np.zeros(capacity, dtype=np.int32)
        #: See :meth:`update` (input indices of threshold crossings; (2, groups) between internal calls).
        self.crossed_at: np.ndarray = np.zeros(0, np.int64)
        #: See :meth:`update` (input indices of ``early`` threshold crossings).
        self.crossed_early = np.zeros(0, np.int64)

    def ensure_capacity(self, n_channels: int) -> None:
        """Grow (doubling) so channel indices < ``n_channels`` fit."""
        cap = self.trailing.shape[0]
        if n_channels > cap:
            self.trailing = np.concatenate([self.trailing, np.zeros(max(n_channels, 2 * cap) - cap, np.int32)])

    def reset(self, channel: int) -> None:
        """Forget the run of ``channel`` (on entering ``half_open``: judge new probes only)."""
        self.trailing[channel] = 0

    def update(self, channel: np.ndarray, outcome: np.ndarray, threshold: np.ndarray | None = None,
               early: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Feed events in arrival order; return ``(channels, max_run)``.

        ``channel`` int (n,); ``outcome`` int8 (n,): 1 failure, 0 success,
        -1 neutral (ignored). Returns the distinct channels touched (int64,
        sorted) and, for each, the longest run reached during this batch
        (including the run carried in from earlier batches). With
        ``threshold`` (per channel index, shape (C,)), :attr:`crossed_at`
        then holds, per returned channel, the input index of the first event
        whose run reached the threshold (-1: none); with ``early`` (a second
        threshold per channel, same shape), :attr:`crossed_early` likewise.

        >>> t = RunTracker()
        >>> t.update(np.array([0, 0, 1, 0, 0]), np.array([1, 1, 1, 0, 1], np.int8))
        (array([0, 1]), array([2, 1], dtype=int32))
        >>> int(t.trailing[0]), int(t.trailing[1])
        (1, 1)
        """
        channel = np.asarray(channel, dtype=np.int64)
        outcome = np.asarray(outcome, dtype=np.int8)
        limits = [t for t in (threshold, early) if t is not None]
        out = self._update(channel, outcome, limits)
        crossed = self.crossed_at
        empty = np.zeros(0, np.int64)
        self.crossed_at = crossed[0] if threshold is not None else empty
        self.crossed_early = crossed[-1] if early is not None else empty
        return out

    def _update(self, channel: np.ndarray, outcome: np.ndarray,
                limits: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`update` with its thresholds as a list (0 to 2 arrays (C,)); leaves :attr:`crossed_at`
        as an int64 array (len(limits), groups) of first crossings (-1: none), one row per threshold."""
        if channel.shape[0] <= SMALL_BATCH:
            return self._update_small(channel, outcome, limits)
        keep = outcome >= 0
        original = np.flatnonzero(keep)
        channel, outcome = channel[keep], outcome[keep]
        self.crossed_at = np.zeros((len(limits), 0), np.int64)
        if channel.size == 0:
            return np.zeros(0, np.int64), np.zeros(0, np.int32)
        fail = outcome == 1
        n_fail = int(np.count_nonzero(fail))
        if n_fail * FEW_FAILURES > channel.shape[0]:
            return self._update_sorted(channel, fail, original, limits)
        return self._update_few_failures(channel, fail, original, limits)

    def _update_few_failures(self, channel: np.ndarray, fail: np.ndarray, original: np.ndarray,
                             limits: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`update` of judged events (``channel``, ``fail`` (n,), input indices ``original``) of which
        few failed: only the channels with a failure (or a threshold <= 0) are followed event by event
        (:meth:`_update_sorted` on their events); every other channel only had successes, so its run
        ends at 0, its largest run in the batch is 0 and it crosses no threshold >= 1."""
        cap = self.trailing.shape[0]
        if 8 * channel.shape[0] >= cap:  # many events for the channel count: a bincount, not a sort
            groups = np.flatnonzero(np.bincount(channel, minlength=cap))
        else:
            groups = np.unique(channel)
        failing = np.zeros(cap, bool)
        failing[channel[fail]] = True
        for threshold in limits:
            low = groups[np.asarray(threshold)[groups] <= 0]
            failing[low] = True
        followed = failing[channel]
        max_run = np.zeros(groups.shape[0], np.int32)
        crossed = np.full((len(limits), groups.shape[0]), -1, np.int64)
        if followed.any():
            sub = np.flatnonzero(followed)
            sub_groups, sub_max = self._update_sorted(channel[sub], fail[sub], original[sub], limits)
            at = np.searchsorted(groups, sub_groups)
            max_run[at] = sub_max
            crossed[:, at] = self.crossed_at
        quiet = groups[~failing[groups]]
        self.trailing[quiet] = 0
        self.crossed_at = crossed
        return groups, max_run

    def _update_sorted(self, channel: np.ndarray, fail: np.ndarray, original: np.ndarray,
                       limits: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`update` of judged events (``channel``, ``fail`` (n,) bool, input indices ``original``)
        grouped by channel with one stable sort."""
        order = np.argsort(channel, kind="stable")
        ch, fail = channel[order], fail[order]
        n = ch.size
        starts = np.flatnonzero(np.r_[True, ch[1:] != ch[:-1]])
        groups = ch[starts]
        group_no = np.repeat(np.arange(starts.size), np.diff(np.r_[starts, n]))
        big = np.int64(n + self.window + 2)
        pos = np.arange(n, dtype=np.int64)
        key = group_no * big + pos
        # Key of the last success at or before each event; a group's carried-in
        # run acts as a virtual success `carried + 1` positions before its start.
        reset = np.where(~fail, key, np.iinfo(np.int64).min)
        carried = self.trailing[groups].astype(np.int64)
        first_fail = fail[starts]
        reset[starts] = np.where(first_fail, key[starts] - 1 - carried, key[starts])
        last_reset = np.maximum.accumulate(reset)
        run = np.minimum(key - last_reset, self.window).astype(np.int32)
        max_run = np.maximum.reduceat(run, starts)
        ends = np.r_[starts[1:], n] - 1
        self.trailing[groups] = run[ends]
        self.crossed_at = np.zeros((len(limits), groups.size), np.int64)
        for row, threshold in enumerate(limits):
            hit = run >= np.asarray(threshold)[ch]
            first = np.minimum.reduceat(np.where(hit, pos, n), starts)
            self.crossed_at[row] = np.where(first < n, original[order[np.minimum(first, n - 1)]], -1)
        return groups, max_run

    def _update_small(self, channel: np.ndarray, outcome: np.ndarray,
                      limits: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`update` for a batch of at most :data:`SMALL_BATCH` events, one event at a time (the same
        results: a run continues from the carried one, a success resets it to 0, each value capped at
        ``window``); some twenty numpy calls would cost more than the loop."""
        window = self.window
        trailing = self.trailing
        runs: dict[int, list[int]] = {}  # channel -> [uncapped run, max run, first crossing index per limit]
        lims = [np.asarray(t) for t in limits]
        k = len(lims)
        for i, (c, o) in enumerate(zip(channel.tolist(), outcome.tolist())):
            if o < 0:
                continue
            st = runs.get(c)
            if st is None:
                st = runs[c] = [int(trailing[c]), 0] + [-1] * k
            st[0] = st[0] + 1 if o == 1 else 0
            run = min(st[0], window)
            if run > st[1]:
                st[1] = run
            for j in range(k):
                if st[2 + j] < 0 and run >= lims[j][c]:
                    st[2 + j] = i
        groups = sorted(runs)
        for c in groups:
            trailing[c] = min(runs[c][0], window)
        self.crossed_at = np.array([[runs[c][2 + j] for c in groups] for j in range(k)], np.int64).reshape(
            k, len(groups))
        return np.array(groups, np.int64), np.array([runs[c][1] for c in groups], np.int32)

    def state(self) -> dict[str, np.ndarray]:
        """Arrays for a snapshot."""
        return {"trailing": self.trailing}

    def load(self, state: dict[str, np.ndarray]) -> None:
        """Restore from :meth:`state`."""
        self.trailing = state["trailing"].astype(np.int32).copy()
