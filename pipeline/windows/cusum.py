"""One-sided Bernoulli CUSUM on per-10 s counts: a signal's own windows for a failure-type rate.

The test (Page 1954, "Continuous inspection schemes", Biometrika 41; for a
proportion inspected continuously: Reynolds & Stoumbos 1999, J. Quality
Technology 31(1)): each complete 10 s slot of a channel with ``n`` trials of
which ``k`` are events (failures, hollow answers) adds the log-likelihood
ratio of rate ``p1`` against ``p0``::

    S <- max(0, S + k * log(p1 / p0) + (n - k) * log((1 - p1) / (1 - p0)))

and the channel alarms while ``S >= h``. Summing a slot's trials first and
checking ``S`` at slot ends only is the same walk watched less often: it can
only alarm later, never earlier, than the per-request chart.

``p0`` is the channel's own in-control rate: a 24 h exponentially weighted
count of trials and events (learned only while ``S < h`` and the store lets
the channel's batch learn: healthy time only, SPEC §4.2), shrunk toward
``prior_rate`` by ``prior_trials`` pseudo-trials and never below
``p_floor``. ``p1 = max(p0 + shift, 2 p0)``: the smallest change worth
catching (Page: design the chart for the shift to detect).

``h`` comes from a stated in-control average run length, ``arl0_days``
channel-days at the channel's own traffic (24 h weighted trials per second,
at least ``min_rate_per_s``), through Siegmund's approximation for a random
walk of log-likelihood ratios (Siegmund 1985, "Sequential Analysis", §X.2,
eq. 10.14 with 2|mu|/sigma^2 = 1): ``ARL0 ~= (e^h - h - 1) / KL(p0 || p1)``
trials, solved for ``h``, less ``overshoot × log(p1 / p0)`` (default 0.2):
Siegmund's formula ignores the overshoot of ``S`` past ``h``, which the
large jump of a rare event makes big, so it overstates the threshold the
ARL needs (the corrected approximation, Siegmund 1985 §X.3, lowers ``h`` by
the mean overshoot). The exact ARL of the per-trial chart (Markov chain on
the lattice of the non-event step, Brook & Evans 1972, Biometrika 59) at
the corrected ``h`` is 1.05-2.1 × the stated ARL for ``p0`` from 5e-5 to
3 % at 0.05 and 4 req/s (at 0.25 × it falls to 1.00 ×; at the plain
Siegmund ``h`` it is 1.3-5.5 ×). The guarantee is checked by simulation over
seeded streams in ``tests/unit/test_cusum.py``.

A channel judged on the traffic since a state entry (``since_ms``, SPEC §4
half-open) restarts its chart at 0 from that time. After an alarm ``S`` is
capped at ``cap_h × h`` (default 2), so a finished fault clears within about
``(cap_h - 1) h / |log((1 - p1) / (1 - p0))|`` clean trials.

Memory per channel: a 12 × 10 s ring of two float32 counters with int64
slot ids (192 bytes) and six float64 of state (48 bytes): 240 bytes.
Per event: one ring write (two counters), no optional column.
"""

from __future__ import annotations

from typing import Callable, Mapping

import numpy as np

from pipeline.stats import CusumDesign, design_h, llr_weights
from pipeline.windows.extension import RingWindows, WindowSpec
from pipeline.windows.features import EventColumns
from pipeline.windows.ring import IntervalRing

SLOT_MS = 10_000
N_SLOTS = 12
#: State columns: chart value, newest folded slot, chart start slot, weighted trials, events, seconds.
S, LAST, START, TRIALS, EVENTS, SECONDS = range(6)


class BernoulliCusum(RingWindows):
    """Per-channel Bernoulli CUSUM windows (module docstring); features ``<prefix>_cusum`` (S),
    ``<prefix>_cusum_h`` (h), ``<prefix>_p0`` and ``<prefix>_p1`` (float64 (C,) each).

    ``name``: the owning signal's name; ``trials_of`` / ``events_of``: ``EventColumns ->`` bool (n,)
    (events must be trials); ``design``: :class:`CusumDesign`.
    """

    def __init__(self, spec: WindowSpec, name: str, prefix: str, design: CusumDesign,
                 trials_of: Callable[[EventColumns], np.ndarray], events_of: Callable[[EventColumns], np.ndarray]):
        self.name, self.prefix, self.design = name, prefix, design
        self.trials_of, self.events_of = trials_of, events_of
        self.rings = {"slots": IntervalRing(SLOT_MS, N_SLOTS, 2, 0)}
        self.state = self._fresh(16)
        # per channel: its newest batch did not learn (SPEC §4.2, :meth:`add_learning`); not in snapshots
        self.hold = np.zeros(16, bool)
        self._any_hold = False

    @staticmethod
    def _fresh(n: int) -> np.ndarray:
        st = np.zeros((n, 6))
        st[:, LAST] = -1.0
        st[:, START] = -1.0
        return st

    def ensure_capacity(self, n_channels: int) -> None:
        super().ensure_capacity(n_channels)
        if n_channels > self.state.shape[0]:
            grow = max(n_channels, 2 * self.state.shape[0]) - self.state.shape[0]
            self.state = np.concatenate([self.state, self._fresh(grow)])
            self.hold = np.concatenate([self.hold, np.zeros(grow, bool)])

    def clear_rows(self, rows: np.ndarray) -> None:
        super().clear_rows(rows)
        self.state[np.asarray(rows, np.int64)] = self._fresh(1)
        self.hold[np.asarray(rows, np.int64)] = False

    def export_row(self, i: int) -> dict[str, np.ndarray]:
        # "hold" (bool (1,)), only while the channel's p0 is held (SPEC §4.2): a learning channel's record
        # is the one written before holds existed, byte for byte; optional on import (absent: not held),
        # so it is not in row_layout
        row = {**super().export_row(i), "state": self.state[i].copy()}
        if self.hold[i]:
            row["hold"] = self.hold[i:i + 1].copy()
        return row

    def row_layout(self) -> dict[str, tuple[int, ...]]:
        return {**super().row_layout(), "state": (6,)}

    def import_row(self, i: int, arrays: Mapping[str, np.ndarray] | None) -> None:
        if arrays is not None:
            got = arrays.get("state")
            if got is None or np.shape(got) != (6,):
                raise ValueError(f"{self.name} windows: state has shape {None if got is None else np.shape(got)}, store (6,)")
        super().import_row(i, arrays)
        self.state[i] = self._fresh(1)[0] if arrays is None else np.asarray(arrays["state"], np.float64)
        hold = None if arrays is None else arrays.get("hold")
        self.hold[i] = hold is not None and np.shape(hold) == (1,) and bool(np.asarray(hold)[0])
        self._any_hold = self._any_hold or bool(self.hold[i])

    def add(self, cols: EventColumns, late: np.ndarray) -> None:
        self.add_learning(cols, late, None)

    def add_learning(self, cols: EventColumns, late: np.ndarray, learn: np.ndarray | None) -> None:
        """Count trials and events; a channel whose batch does not ``learn`` (bool (n,), one value per
        channel; None: all learn) keeps its ``p0`` while its next slots are folded (SPEC §4.2)."""
        trials = self.trials_of(cols)
        self.rings["slots"].add(cols.channel, cols.ts_ms, [trials, self.events_of(cols) & trials])
        if learn is None:
            if self._any_hold:
                self.hold[cols.channel] = False
                self._any_hold = bool(self.hold.any())
        else:
            self.hold[cols.channel] = ~np.asarray(learn, bool)
            self._any_hold = True

    def features(self, rows: np.ndarray, now_ms: int, since_ms: np.ndarray | None) -> dict[str, np.ndarray]:
        """Fold every complete slot not yet folded into each channel's chart, then report it."""
        st = self.state[rows]
        d = self.design
        hi = int(now_ms) // SLOT_MS  # slots < hi are complete
        if since_ms is not None:
            start = -(-np.asarray(since_ms, np.int64) // SLOT_MS)
            reset = start > st[:, START]
            st[reset, S] = 0.0
            st[reset, START] = start[reset]
        p0, p1, h = self._design_now(st)
        a, b = llr_weights(p0, p1)
        ring = self.rings["slots"]
        ids = ring.slot_id[rows]
        counts = ring.counts[rows].astype(np.float64)
        order = np.argsort(ids, axis=1)
        ids = np.take_along_axis(ids, order, axis=1)
        counts = np.take_along_axis(counts, order[:, :, None], axis=1)
        fold = (ids > st[:, LAST, None]) & (ids < hi) & (ids >= st[:, START, None])
        s = st[:, S]
        for j in range(ids.shape[1]):
            n, k = counts[:, j, 0], counts[:, j, 1]
            s = np.where(fold[:, j], np.minimum(np.maximum(s + k * a + (n - k) * b, 0.0), d.cap_h * h), s)
        st[:, S] = s
        new_n = (counts[:, :, 0] * fold).sum(axis=1)
        new_k = (counts[:, :, 1] * fold).sum(axis=1)
        first = np.where(fold.any(axis=1), np.where(fold, ids, hi).min(axis=1) - 1, hi - 1)
        prev = np.where(st[:, LAST] >= 0, st[:, LAST], first)
        elapsed_s = np.clip(hi - 1 - prev, 0, None) * (SLOT_MS / 1000.0)
        decay = np.exp(-elapsed_s / d.baseline_s)
        learn = (s < h) & ~self.hold[rows]
        st[:, TRIALS] = st[:, TRIALS] * decay + np.where(learn, new_n, 0.0)
        st[:, EVENTS] = st[:, EVENTS] * decay + np.where(learn, new_k, 0.0)
        # exposure in exponentially weighted seconds, integrated over the elapsed time (tau (1 - decay)):
        # one step over T equals many steps summing to T, so a channel evicted while idle and evaluated
        # again on its return gets the same h as one evaluated every round (tests/unit/test_channel_state.py)
        st[:, SECONDS] = st[:, SECONDS] * decay + np.where(learn, d.baseline_s * -np.expm1(-elapsed_s / d.baseline_s), 0.0)
        st[:, LAST] = np.maximum(st[:, LAST], hi - 1)
        self.state[rows] = st
        p0, p1, h = self._design_now(st)  # after learning: a second view at the same time reports the same
        p = self.prefix
        return {f"{p}_cusum": s, f"{p}_cusum_h": h, f"{p}_p0": p0, f"{p}_p1": p1}

    def _design_now(self, st: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(p0, p1, h)`` of state rows ``st`` (n, 6)."""
        d = self.design
        p0, p1 = d.rates(st[:, TRIALS], st[:, EVENTS])
        with np.errstate(divide="ignore", invalid="ignore"):
            rate = np.where(st[:, SECONDS] > 0, st[:, TRIALS] / st[:, SECONDS], 0.0)
        return p0, p1, design_h(d, rate, p0, p1)
