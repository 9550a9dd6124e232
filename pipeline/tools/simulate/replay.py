"""Replay of real per-request provider measurements as channels (SPEC §5.10).

Each llmperf-leaderboard file (``<provider>_<size>.json``, 150 requests) is
one channel ``<provider>/<size>`` on route ``llama-<size>``. Its requests
are replayed in file order, one every ``spacing_s`` seconds starting at
``offset_s``; each finishes ``end_to_end_latency_s`` later with the status
the provider really gave (``error_code`` 429 -> ``rate_limited``, other
codes -> ``error``, null -> ``ok``; :func:`~pipeline.tools.simulate.traces.status_for_error_code`),
its measured TTFT and token counts. No synthetic traffic is added.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .traces import LlmperfTrace, load_llmperf

#: HTTP status reported per replayed status (llmperf's -100 / -1 codes are
#: client-side failures without an HTTP status: ``None``).
REPLAY_HTTP: dict[str, int | None] = {"ok": 200, "rate_limited": 429, "error": None}


@dataclass(frozen=True)
class ReplayChannel:
    """A channel that replays one llmperf file.

    name: ``<provider>/<size>``; route: ``llama-<size>``; source: file stem;
    tier: ``free`` | ``paid``; offset_s (>= 0) and spacing_s (> 0): arrival
    of request i at ``offset_s + i * spacing_s`` (scenario seconds).
    Raises ``ValueError`` for a bad offset or spacing.
    """

    name: str
    route: str
    source: str
    tier: str = "paid"
    offset_s: float = 0.0
    spacing_s: float = 4.8

    def __post_init__(self) -> None:
        if self.offset_s < 0 or not self.spacing_s > 0:
            raise ValueError(f"{self.name}: need offset_s >= 0 and spacing_s > 0")
        if self.tier not in ("free", "paid"):
            raise ValueError(f"{self.name}: tier must be 'free' or 'paid'")

    def trace(self, data_dir: str | Path | None = None) -> LlmperfTrace:
        """The llmperf file behind this channel."""
        return load_llmperf(self.source, data_dir)

    def arrivals_s(self, n: int) -> np.ndarray:
        """Arrival times of the first ``n`` requests, seconds, shape (n,)."""
        return self.offset_s + self.spacing_s * np.arange(n, dtype=np.float64)

    def finish_s(self, data_dir: str | Path | None = None) -> np.ndarray:
        """Finish time of each replayed request (arrival + measured latency), seconds."""
        tr = self.trace(data_dir)
        return self.arrivals_s(len(tr)) + tr.e2e_latency_s

    def failed(self, data_dir: str | Path | None = None) -> np.ndarray:
        """Boolean (n,): the request's status is not ``ok``."""
        return np.array([s != "ok" for s in self.trace(data_dir).status])


def replay_channel_name(stem: str) -> tuple[str, str]:
    """``"groq_70b"`` -> ``("groq/70b", "llama-70b")``: channel name and route.

    >>> replay_channel_name("together_13b")
    ('together/13b', 'llama-13b')
    """
    provider, _, size = stem.rpartition("_")
    if not provider or not size:
        raise ValueError(f"llmperf file stem must look like <provider>_<size>, got {stem!r}")
    return f"{provider}/{size}", f"llama-{size}"
