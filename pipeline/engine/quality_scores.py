"""Quality scores (SPEC §4.5) into an :class:`~pipeline.engine.Engine`'s windows.

:class:`QualityScores` is the engine's part that files sampled answers'
quality scores, computed elsewhere (the worker's quality agent or a replay's
scorer), in the per-channel quality windows the ``quality`` detector reads.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from pipeline.windows.store import WindowStore


class QualityScores:
    """Mixin of :class:`~pipeline.engine.Engine`: quality scores in, counted by outcome.

    Reads ``store`` and ``changed``; keeps ``quality_added``, ``quality_dropped``
    and ``quality_resets`` (set by the engine).
    """

    store: WindowStore
    changed: np.ndarray
    quality_added: int
    quality_dropped: dict[str, int]
    quality_resets: int

    def add_quality_scores(self, channels: Sequence[str], ts_ms: Sequence[int], scores: Sequence[float],
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

        Not counted, by reason in :attr:`quality_dropped`: ``unknown_channel``,
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
            self.changed[idx[keep]] = True
            too_old, reset = self.store.quality.add(idx[keep], np.asarray(ts_ms, dtype=np.int64).reshape(n)[keep],
                                                    np.clip(s[keep], 0.0, 1.0), model_version)
            drops["too_old"] = int(too_old.sum())
            self.quality_resets += len(reset)
        for k, v in drops.items():
            if v:
                self.quality_dropped[k] = self.quality_dropped.get(k, 0) + v
        added = int(keep.sum()) - drops.get("too_old", 0)
        self.quality_added += added
        return added
