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
    entry) when one was given: judged requests, upstream failures, ``ok``
    answers, answers checked for structure and those missing fields, and
    rate-limited answers (the store's 10 s counters).

    ``extra``: ``<name>_5m`` / ``<name>_1m`` sums of the counters a signal
    added (:class:`~pipeline.windows.features.Counter`) and the features of
    the signals' windows (:mod:`pipeline.windows.extension`), also readable
    as attributes; :meth:`feature` reads any feature by name. Each signal
    module documents its windows' features, e.g. ``p95_ms`` / ``base_p95_ms``
    (:class:`pipeline.signals.latency_p95_ratio.LatencyWindows`), ``run``
    (:class:`pipeline.signals.consecutive_failures.FailureRuns`) and
    ``quality_*`` (:class:`pipeline.signals.quality.QualityScoreWindows`).
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
    """One channel's rows of every window, by name (what a snapshot carries).

    ``short_slot_id`` int64 (30,), ``counters`` name → float32 (30,): the
    store's 10 s ring; ``last_ts_ms``: the channel's newest event time;
    ``extensions``: signal name → its windows' arrays
    (:meth:`SignalWindows.export_row`), every signal's the same way (the
    latency histograms, failure run and quality rings too);
    ``held_since_ms``: event time (ms) its baselines' current hold started
    (:attr:`WindowStore.held_since_ms <pipeline.windows.store.WindowStore.held_since_ms>`,
    SPEC §4.2), -1 while they learn.
    """

    short_slot_id: np.ndarray
    counters: dict[str, np.ndarray]
    last_ts_ms: int
    extensions: dict[str, dict[str, np.ndarray]] = field(default_factory=dict)
    held_since_ms: int = -1
