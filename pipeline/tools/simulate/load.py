"""Day/night load curve and trace-derived burstiness (SPEC §5: "day/night load").

Scenario time ``t_s`` (seconds since the scenario start, event time) maps to
an hour of day through the scenario's ``start_hour``, so a scenario behaves
the same whatever ``start_ms`` a caller picks.

Load: ``load_factor(t) = night + (1 - night) * (1 - cos(2*pi*(h - 4)/24)) / 2``
with ``h`` the hour of day: the trough (``night``, default 0.35 of the peak)
is at 04:00, the peak (1.0) at 16:00, mid-level at 10:00 and 22:00.

Latency swings with the load: ``latency_multiplier(t) = 1 - swing * cos(...)``,
i.e. ``1 - swing`` at the 04:00 trough, ``1 + swing`` at the 16:00 peak
(default ``swing`` 0.15: +-15 %), exactly 1.0 at 10:00 and 22:00.

Burstiness: the smoothed per-second arrival envelope of an Azure trace
(:meth:`AzureTrace.burst_envelope`, mean 1.0) multiplies the rate, blended
towards 1.0 by ``burstiness`` in [0, 1].
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass

import numpy as np

from .traces import AzureTrace

#: Hour of day of the load trough (the peak is 12 h later, at 16:00).
TROUGH_HOUR = 4.0
#: Night load as a share of the day peak (brief: "night at ~35 % of the day peak").
DEFAULT_NIGHT_FRACTION = 0.35
#: Latency day/night swing, +-share (brief: "e.g. +-15 %").
DEFAULT_LATENCY_SWING = 0.15


@dataclass(frozen=True)
class DiurnalCurve:
    """Smooth 24 h load and latency curves.

    ``start_hour`` in [0, 24): hour of day at scenario time 0.
    ``night_fraction`` in (0, 1]: load at the trough relative to the peak.
    ``latency_swing`` in [0, 1): latency multiplier amplitude.
    Raises ``ValueError`` for values out of range.
    """

    start_hour: float = 10.0
    night_fraction: float = DEFAULT_NIGHT_FRACTION
    latency_swing: float = DEFAULT_LATENCY_SWING

    def __post_init__(self) -> None:
        if not 0.0 <= self.start_hour < 24.0:
            raise ValueError(f"start_hour must be in [0, 24), got {self.start_hour}")
        if not 0.0 < self.night_fraction <= 1.0:
            raise ValueError(f"night_fraction must be in (0, 1], got {self.night_fraction}")
        if not 0.0 <= self.latency_swing < 1.0:
            raise ValueError(f"latency_swing must be in [0, 1), got {self.latency_swing}")

    def hour_of_day(self, t_s: np.ndarray | float) -> np.ndarray | float:
        """Hour of day in [0, 24) at scenario time ``t_s`` (seconds)."""
        return (self.start_hour + np.asarray(t_s, dtype=np.float64) / 3600.0) % 24.0

    def _cos(self, t_s: np.ndarray | float) -> np.ndarray:
        h = self.hour_of_day(t_s)
        return np.cos(2.0 * math.pi * (h - TROUGH_HOUR) / 24.0)

    def load_factor(self, t_s: np.ndarray | float) -> np.ndarray:
        """Arrival-rate factor in [night_fraction, 1] (1.0 at 16:00)."""
        night = self.night_fraction
        return night + (1.0 - night) * 0.5 * (1.0 - self._cos(t_s))

    def latency_multiplier(self, t_s: np.ndarray | float) -> np.ndarray:
        """Latency factor in [1 - swing, 1 + swing], rising with the load."""
        return 1.0 - self.latency_swing * self._cos(t_s)

    @property
    def mean_load_factor(self) -> float:
        """Average of :meth:`load_factor` over 24 h: ``(1 + night) / 2``."""
        return (1.0 + self.night_fraction) / 2.0


@dataclass(frozen=True, eq=False)
class BurstEnvelope:
    """A cyclic per-second rate multiplier with mean 1.0.

    ``envelope``: float64, shape (n,), n >= 1 seconds, mean 1.0 (from
    :meth:`AzureTrace.burst_envelope`). ``burstiness`` in [0, 1]: 0 gives a
    flat 1.0, 1 the full trace envelope. ``offset_s``: where scenario second
    0 starts in the envelope (fixed per scenario and route).
    """

    envelope: np.ndarray
    burstiness: float = 1.0
    offset_s: int = 0

    def __post_init__(self) -> None:
        if not 0.0 <= self.burstiness <= 1.0:
            raise ValueError(f"burstiness must be in [0, 1], got {self.burstiness}")
        if len(self.envelope) < 1:
            raise ValueError("envelope must not be empty")

    @classmethod
    def from_trace(cls, trace: AzureTrace, burstiness: float, key: str) -> "BurstEnvelope":
        """Envelope of ``trace`` starting at a second derived from ``key``.

        The offset is a stable hash of ``key`` (e.g. ``"<scenario>/<route>"``),
        not of the run's seed, so the burst pattern of a route is known in
        advance and the scenario's injected-truth helpers can include it.
        """
        env = trace.burst_envelope()
        digest = hashlib.blake2b(key.encode(), digest_size=8).digest()
        return cls(envelope=env, burstiness=burstiness, offset_s=int.from_bytes(digest, "big") % len(env))

    def factor(self, seconds: np.ndarray) -> np.ndarray:
        """Multiplier for integer scenario seconds ``seconds`` (shape kept), >= 0."""
        idx = (np.asarray(seconds, dtype=np.int64) + self.offset_s) % len(self.envelope)
        raw = self.envelope[idx]
        return 1.0 + self.burstiness * (raw - 1.0)
