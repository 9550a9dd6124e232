"""What the windows hand out: the per-round :class:`WindowView` and one channel's rows, :class:`ChannelWindows`.

:meth:`pipeline.windows.store.WindowStore.view` builds the view every
detector reads; :meth:`~pipeline.windows.store.WindowStore.export_channel` /
:meth:`~pipeline.windows.store.WindowStore.import_channel` move a channel's
rows (eviction, snapshots: :mod:`pipeline.state.snapshot`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

import numpy as np


@dataclass(frozen=True)
class WindowView:
    """Per-channel aggregates at event time ``now_ms`` (arrays shape (C,)).

    Counts are float64. ``*_1m`` cover the last minute, ``*_5m`` the last
    5 min, both starting no earlier than the channel's ``since`` time (state
    entry) when one was given. ``p95_ms`` is the P95 latency of ``ok``
    requests over 5 min (NaN below ``min_latency``), ``base_p95_ms`` the P95
    over the 24 complete hours before the current hour (NaN without enough
    history), ``base_n`` its sample count and ``base_hours`` the number of
    hours present. ``run`` is the trailing consecutive-failure run.
    ``p95_lower_ms``: a 99 % distribution-free lower confidence bound of the
    5 min P95 (order statistic, :meth:`LatencyBuckets.quantile_bound`; NaN
    below ``min_latency`` samples); ``p95_lower_30s_ms`` / ``n_latency_30s``:
    the same bound and the sample count over the last complete 30 s latency
    slot (the round just ended), for shifts a 5 min window sees too late;
    ``p95_30s_ms`` that slot's P95 point estimate (NaN below ``min_latency``)
    and ``n_shift_30s`` its samples certainly above 1.2 × ``base_p95_ms``
    (:meth:`LatencyBuckets.count_above`; 0 without a baseline), the evidence
    of :mod:`pipeline.signals.latency_p95_ratio`'s one-round shift rule.

    Quality scores (SPEC §4.5, :mod:`pipeline.windows.quality`):
    ``quality_n_5m`` / ``quality_mean_5m`` / ``quality_var_5m`` are the
    count, mean and sample variance of the scores of the last 5 min (same
    ``since`` rule; NaN mean below 1 sample, NaN variance below 2);
    ``base_quality_*`` the same over the 24 complete hours before the
    current hour, ``base_quality_hours`` the hours with scores in it. Scores
    lag their events, so the quality window ends at the channel's newest
    scored 10 s slot (never after now) and the baseline before that slot's
    hour; ``quality_lag_ms`` is the event time from the window's end to now
    (NaN without scores; over 10 min the window counts as empty).

    ``extra``: ``<name>_5m`` / ``<name>_1m`` sums of the counters a signal
    added (:class:`~pipeline.windows.features.Counter`) and the features of
    the signals' own windows (:mod:`pipeline.windows.extension`), also
    readable as attributes; :meth:`feature` reads any feature by name.
    """

    now_ms: int
    judged_1m: np.ndarray
    failures_1m: np.ndarray
    judged_5m: np.ndarray
    failures_5m: np.ndarray
    ok_5m: np.ndarray
    checked_5m: np.ndarray
    missing_5m: np.ndarray
    rate_limited_5m: np.ndarray
    p95_ms: np.ndarray
    n_latency_5m: np.ndarray
    p95_lower_ms: np.ndarray
    p95_lower_30s_ms: np.ndarray
    n_latency_30s: np.ndarray
    p95_30s_ms: np.ndarray
    n_shift_30s: np.ndarray
    base_p95_ms: np.ndarray
    base_n: np.ndarray
    base_hours: np.ndarray
    run: np.ndarray
    quality_n_5m: np.ndarray
    quality_mean_5m: np.ndarray
    quality_var_5m: np.ndarray
    base_quality_n: np.ndarray
    base_quality_mean: np.ndarray
    base_quality_var: np.ndarray
    base_quality_hours: np.ndarray
    quality_lag_ms: np.ndarray
    extra: Mapping[str, np.ndarray] = field(default_factory=dict)

    def __getattr__(self, name: str) -> np.ndarray:
        try:
            return self.__dict__["extra"][name]
        except KeyError:
            raise AttributeError(name) from None

    def feature(self, name: str) -> np.ndarray:
        """The feature ``name`` (a field or an ``extra`` counter sum); raises ``KeyError`` if absent."""
        try:
            return getattr(self, name)
        except AttributeError:
            raise KeyError(f"window feature {name!r} is not in this view") from None


@dataclass
class ChannelWindows:
    """One channel's rows of every window, counters by name (what a snapshot carries).

    ``short_slot_id`` int64 (30,), ``counters`` name → float32 (30,): the
    10 s ring; ``short_hist`` float32 (10, n_buckets) with
    ``short_lat_slot_id`` int64 (10,): the 30 s latency ring (or, from an
    older snapshot, ``short_hist`` (30, n_buckets) in the 10 s slots and
    ``short_lat_slot_id`` None: summed into 30 s slots on import); ``base_slot_id``
    int64 (25,), ``base_hist`` float32 (25, n_buckets): the 1 h ring;
    ``quality_*``: the quality rings (:mod:`pipeline.windows.quality`; None =
    empty) and the model version of their scores; ``run``: trailing failure
    run; ``last_ts_ms``: the channel's newest event time; ``extensions``:
    signal name → its windows' arrays (:meth:`SignalWindows.export_row`).
    """

    n_buckets: int
    short_slot_id: np.ndarray
    counters: dict[str, np.ndarray]
    short_hist: np.ndarray
    base_slot_id: np.ndarray
    base_hist: np.ndarray
    run: int
    last_ts_ms: int
    quality_short_slot_id: np.ndarray | None = None
    quality_short_counts: np.ndarray | None = None
    quality_base_slot_id: np.ndarray | None = None
    quality_base_counts: np.ndarray | None = None
    quality_model: str | None = None
    short_lat_slot_id: np.ndarray | None = None
    extensions: dict[str, dict[str, np.ndarray]] = field(default_factory=dict)
