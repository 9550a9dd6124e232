"""One module per SPEC §4 signal. Every detector has the same contract
(:mod:`pipeline.detectors.base`): it reads a :class:`~pipeline.windows.store.WindowView`
and per-channel threshold arrays, and returns a :class:`Finding` with a
per-channel ``fired`` mask and the numbers behind it."""

from pipeline.detectors.base import Detector, Finding, ThresholdArrays
from pipeline.detectors.consecutive import ConsecutiveFailures
from pipeline.detectors.error_rate import ErrorRate
from pipeline.detectors.latency import LatencyRatio
from pipeline.detectors.quality import QualityDrop
from pipeline.detectors.structure import MissingFields

#: Hard signals open the circuit; soft signals degrade (SPEC §4 states).
HARD_DETECTORS: tuple[Detector, ...] = (ConsecutiveFailures(), ErrorRate())
SOFT_DETECTORS: tuple[Detector, ...] = (LatencyRatio(), MissingFields(), QualityDrop())

__all__ = ["Detector", "Finding", "ThresholdArrays", "HARD_DETECTORS", "SOFT_DETECTORS",
           "ConsecutiveFailures", "ErrorRate", "LatencyRatio", "MissingFields", "QualityDrop"]
