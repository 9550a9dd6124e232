"""One module per SPEC §4 signal, listed in :mod:`pipeline.detectors.registry`.

Every signal follows the plug-in contract of :mod:`pipeline.detectors.signal`;
every detector the same ``detect`` contract (:mod:`pipeline.detectors.base`):
it reads a :class:`~pipeline.windows.view.WindowView` and per-channel
threshold arrays, and returns a :class:`Finding` with a per-channel
``fired`` mask and the numbers behind it."""

from pipeline.detectors.base import Detector, Finding, ThresholdArrays
from pipeline.detectors.consecutive import ConsecutiveFailures
from pipeline.detectors.error_rate import ErrorRate
from pipeline.detectors.latency import LatencyRatio
from pipeline.detectors.quality import QualityDrop
from pipeline.detectors.registry import SIGNALS
from pipeline.detectors.signal import Examples, Signal
from pipeline.detectors.structure import MissingFields

#: Hard signals open the circuit; soft signals degrade (SPEC §4 states); advisory ones are reported
#: (and degrade only where their ``Signal.degrades`` parameter is true, SPEC §4.8).
HARD_DETECTORS: tuple[Detector, ...] = tuple(s.detector for s in SIGNALS if s.kind == "hard")
SOFT_DETECTORS: tuple[Detector, ...] = tuple(s.detector for s in SIGNALS if s.kind == "soft")
ADVISORY_DETECTORS: tuple[Detector, ...] = tuple(s.detector for s in SIGNALS if s.kind == "advisory")

__all__ = ["Detector", "Finding", "ThresholdArrays", "HARD_DETECTORS", "SOFT_DETECTORS", "ADVISORY_DETECTORS", "SIGNALS", "Signal",
           "Examples", "ConsecutiveFailures", "ErrorRate", "LatencyRatio", "MissingFields", "QualityDrop"]
