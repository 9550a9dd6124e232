"""One module per SPEC §4 signal, listed in :mod:`pipeline.signals.registry`.

Every signal follows the plug-in contract of :mod:`pipeline.signals.base`,
and every detector the same ``detect`` contract (same module): it reads a :class:`~pipeline.windows.view.WindowView` and per-channel
threshold arrays, and returns a :class:`Finding` with a per-channel
``fired`` mask and the numbers behind it."""

from pipeline.signals.base import Detector, Examples, Finding, Signal, ThresholdArrays
from pipeline.signals.consecutive_failures import ConsecutiveFailures
from pipeline.signals.error_rate import ErrorRate
from pipeline.signals.latency_p95_ratio import LatencyRatio
from pipeline.signals.quality import QualityDrop
from pipeline.signals.missing_fields import MissingFields
from pipeline.signals.registry import SIGNALS

#: Hard signals open the circuit; soft signals degrade (SPEC §4 states); advisory ones are reported
#: (and degrade only where their ``Signal.degrades`` parameter is true, SPEC §4.8).
HARD_DETECTORS: tuple[Detector, ...] = tuple(s.detector for s in SIGNALS if s.kind == "hard")
SOFT_DETECTORS: tuple[Detector, ...] = tuple(s.detector for s in SIGNALS if s.kind == "soft")
ADVISORY_DETECTORS: tuple[Detector, ...] = tuple(s.detector for s in SIGNALS if s.kind == "advisory")

__all__ = ["Detector", "Finding", "ThresholdArrays", "HARD_DETECTORS", "SOFT_DETECTORS", "ADVISORY_DETECTORS", "SIGNALS", "Signal",
           "Examples", "ConsecutiveFailures", "ErrorRate", "LatencyRatio", "MissingFields", "QualityDrop"]
