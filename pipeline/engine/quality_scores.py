"""Quality scores (SPEC §4.5) into an :class:`~pipeline.engine.Engine`'s windows.

:class:`QualityScores` (the engine's ``quality``) is the engine's part that files sampled answers'
quality scores, computed elsewhere (the worker's quality agent or a replay's
scorer), in the per-channel quality windows the ``quality`` detector reads.
"""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

from pipeline.signals.quality import QualityScoreWindows
from pipeline.windows.store import WindowStore


class QualityScores:
    """The engine's quality scores (``engine.quality``): scores in, counted by outcome.

    Files scores in ``store``'s quality windows (those of the ``quality`` signal,
    :class:`~pipeline.signals.quality.QualityScoreWindows`); calls ``mark_changed(rows)`` for
    the channels that got scores.
    """

    def __init__(self, store: WindowStore, mark_changed: Callable[[np.ndarray], None]):
        self.store = store
        self.mark_changed = mark_changed
        #: Scores counted in the windows; not counted, by reason (``unknown_channel``, ``not_finite``,
        #: ``too_old``); channels whose quality windows restarted for another model version.
        self.added = 0
        self.dropped: dict[str, int] = {}
        self.resets = 0

    def windows(self) -> QualityScoreWindows:
        """The ``quality`` signal's windows; raises ``LookupError`` when the engine does not evaluate it."""
        w = self.store.extensions.get("quality")
        if not isinstance(w, QualityScoreWindows):
            raise LookupError("the engine's signals keep no quality windows")
        return w

    def add(self, channels: Sequence[str], ts_ms: Sequence[int], scores: Sequence[float],
                           model_version: str | None = None) -> int:
        """File sampled answers' quality scores (P(good) in [0, 1]) at their events' time.

        The engine holds no model: scoring happens elsewhere (the worker's quality
        agent, :mod:`pipeline.stream.quality_agent`, or :func:`pipeline.engine.replay.replay` with a
        scorer); this only adds the numbers to the per-channel quality windows that
        the ``quality`` detector reads. A score counts in every later round whose
        5 min window covers its event time. ``channels`` are channel names the
        engine has seen; scores are clipped to [0, 1].

        ``model_version``: when a channel's windows hold scores of another version,
        they are cleared first (scores of two model versions are not comparable,
        so that channel's quality baseline restarts).

        Not counted, by reason in :attr:`dropped`: ``unknown_channel``,
        ``not_finite``, ``too_old`` (older than the 5 min ring; still in the
        baseline when its hour is held). Returns the number counted.
        """
        n = len(scores)
        if not (len(channels) == len(ts_ms) == n):
            raise ValueError(f"{len(channels)} channels, {len(ts_ms)} times and {n} scores")
        if n == 0:
            return 0
        index = self.store.index
        idx = np.fromiter((index.get(c, -1) for c in channels), np.int64, n)
        s = np.asarray(scores, dtype=np.float64).reshape(n)
        keep = (idx >= 0) & np.isfinite(s)
        drops = {"unknown_channel": int((idx < 0).sum()), "not_finite": int(((idx >= 0) & ~np.isfinite(s)).sum())}
        if keep.any():
            self.mark_changed(idx[keep])
            too_old, reset = self.windows().add_scores(idx[keep], np.asarray(ts_ms, dtype=np.int64).reshape(n)[keep],
                                                       np.clip(s[keep], 0.0, 1.0), model_version)
            drops["too_old"] = int(too_old.sum())
            self.resets += len(reset)
        for k, v in drops.items():
            if v:
                self.dropped[k] = self.dropped.get(k, 0) + v
        added = int(keep.sum()) - drops.get("too_old", 0)
        self.added += added
        return added
