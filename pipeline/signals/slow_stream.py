"""SPEC §4.6 slow stream and cancel cascade: TTFT and stream-gap P95 vs baseline, and the stall share.

Three rules over the channel's streams (:mod:`pipeline.windows.streams`):

1. ``ttft_p95_ratio`` = P95(``ttft_ms`` of ``ok`` streams, 5 min) /
   P95(same, the 24 complete hours before the current hour);
2. ``stream_gap_p95_ratio``: the same for ``max_stream_gap_ms``.
   Both trip at ``stream_ratio_trip`` (1.8) and hold until
   ``stream_ratio_clear`` (1.2), the latency rule of SPEC §4.3; each needs
   ``stream_min_samples`` samples in 5 min, ``stream_baseline_min_samples``
   in the baseline and ``stream_baseline_min_hours`` hours of it.
3. ``stall_share_1m`` / ``stall_share_5m`` = stalled / judged streams over
   the last 1 min / 5 min (as ``error_rate``'s two windows), where a stream
   is stalled when it went ``stall_gap_ms`` (8 s) or longer without a chunk
   (first token or gap) and judged streams are the ``ok`` ones plus the
   stalled ``cancelled`` ones: a cancel that followed a stall counts against
   the channel (the client gave up on a stalled upstream), a cancel without
   one is neutral (an impatient client says nothing about the upstream).
   Trips when the exact (Clopper-Pearson 1934) lower bound (99.99 %
   one-sided) of either window exceeds ``stall_share_trip`` with
   ≥ ``stall_min_streams`` judged streams and ≥ ``stall_min_stalls`` stalls
   in it: a window at the line trips with probability <= 1e-4 at every count
   (``tests/unit/test_rate_bounds.py``). The lower bound (NaN where the 5 min
   window is too thin or at or under the line) and the stalled cancels in the metrics are the 5 min
   window's.

The finding fires when a rule with enough data trips; once fired it holds
while a rule with enough data still holds (ratio above the clear line, or
the stall share's lower bound above its line), and while no rule has
enough data (no evidence either way, as ``latency_p95_ratio``). Channels that
send no ``ttft_ms`` / ``max_stream_gap_ms`` have no streams: NaN metrics,
never fired. Soft signal: it degrades.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pipeline.signals.base import Examples, Finding, Signal, ThresholdArrays
from pipeline.stats import alpha_for, exact_lower_gate, safe_ratio
from pipeline.windows.view import WindowView
from pipeline.windows.streams import STALL_LADDER_MS, StreamWindows, stall_label, window_features


@dataclass(frozen=True)
class SlowStreamParams:
    """Thresholds of ``slow_stream`` (policy table ``[tier.X.slow_stream]``)."""

    #: SPEC §4.6 (the §4.3 rule): P95 ratio of TTFT or stream gap that degrades (dimensionless, > clear) ...
    stream_ratio_trip: float = 1.8
    #: ... and the ratio at or below which that rule clears (hysteresis; >= 1).
    stream_ratio_clear: float = 1.2
    #: Minimum ``ok`` streams with the field in 5 min for its P95 (>= 1); a P95 of 100 rests on its top 5.
    stream_min_samples: int = 100
    #: Minimum streams with the field in the 24 h baseline (>= 1), as ``baseline_min_requests``.
    stream_baseline_min_samples: int = 500
    #: Minimum whole hours of stream history before the baseline is trusted (>= 1).
    stream_baseline_min_hours: int = 1
    #: SPEC §4.6: a stream that went this long (ms) without a chunk stalled; one of 4000, 8000, 12000.
    stall_gap_ms: float = 8_000.0
    #: Share in (0, 1) of judged streams stalled over 1 or 5 min that degrades (exact lower bound above it).
    stall_share_trip: float = 0.02
    #: Minimum judged streams in a window before its stall share is tested (>= 1).
    stall_min_streams: int = 50
    #: Minimum stalled streams in a window before its stall share may trip (>= 1).
    stall_min_stalls: int = 5

    def __post_init__(self) -> None:
        if not 1.0 <= self.stream_ratio_clear < self.stream_ratio_trip:
            raise ValueError(f"need 1 <= stream_ratio_clear < stream_ratio_trip, got "
                             f"{self.stream_ratio_clear} and {self.stream_ratio_trip}")
        if self.stall_gap_ms not in STALL_LADDER_MS:
            raise ValueError(f"stall_gap_ms must be one of {STALL_LADDER_MS} (the lines the windows count), "
                             f"got {self.stall_gap_ms}")
        if not 0.0 < self.stall_share_trip < 1.0:
            raise ValueError(f"stall_share_trip must be in (0, 1), got {self.stall_share_trip}")
        for name in ("stream_min_samples", "stream_baseline_min_samples", "stream_baseline_min_hours",
                     "stall_min_streams", "stall_min_stalls"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")


def _at_line(view: WindowView, prefix: str, line_ms: np.ndarray, window: str) -> np.ndarray:
    """Per channel, feature ``<prefix>_<line>_<window>`` at the channel's ``stall_gap_ms`` (NaN off the ladder)."""
    labels = [stall_label(x) for x in STALL_LADDER_MS]
    return np.select([line_ms == x for x in STALL_LADDER_MS],
                     [getattr(view, f"{prefix}_{lab}_{window}") for lab in labels], np.nan)


class SlowStream:
    """Soft signal ``slow_stream`` (degrades); see the module docstring."""

    reason = "slow_stream"

    def __init__(self, confidence: float = 0.9999):
        self.alpha = alpha_for(confidence)

    def detect(self, view: WindowView, th: ThresholdArrays, active: np.ndarray) -> Finding:
        """Apply the three rules with their hysteresis to every channel."""
        hours_ok = view.stream_base_hours >= th.stream_baseline_min_hours
        valid, on = [], []
        ratios = {}
        for q in ("ttft", "stream_gap"):
            ratio = safe_ratio(getattr(view, f"{q}_p95_ms"), getattr(view, f"{q}_base_p95_ms"))
            ratios[q] = ratio
            valid.append(hours_ok & np.isfinite(ratio) & (getattr(view, f"{q}_n_5m") >= th.stream_min_samples)
                         & (getattr(view, f"{q}_base_n") >= th.stream_baseline_min_samples))
            on.append(np.where(active, ratio > th.stream_ratio_clear, ratio >= th.stream_ratio_trip))
        share = {}
        for w in ("1m", "5m"):
            cancels = _at_line(view, "stream_cancel_stalls", th.stall_gap_ms, w)
            stalls = _at_line(view, "stream_stalls", th.stall_gap_ms, w) + cancels
            streams = getattr(view, f"streams_ok_{w}") + cancels
            judged = (streams >= th.stall_min_streams) & (stalls >= th.stall_min_stalls)
            valid.append(judged)
            above, lo = exact_lower_gate(np.nan_to_num(stalls), np.nan_to_num(streams), th.stall_share_trip,
                                         self.alpha, judged)
            on.append(above)
            share[w] = safe_ratio(stalls, streams)
        v, o = np.array(valid), np.array(on)
        fired = np.where(v.any(axis=0), (v & o).any(axis=0), active)
        return Finding(self.reason, fired, {
            "ttft_p95_ms": view.ttft_p95_ms,
            "ttft_baseline_p95_ms": view.ttft_base_p95_ms,
            "ttft_p95_ratio": ratios["ttft"],
            "stream_gap_p95_ms": view.stream_gap_p95_ms,
            "stream_gap_baseline_p95_ms": view.stream_gap_base_p95_ms,
            "stream_gap_p95_ratio": ratios["stream_gap"],
            "stall_share_1m": share["1m"],
            "stall_share_5m": share["5m"],
            "stall_share_lower_5m": lo,
            "stalled_cancels_5m": cancels,
            "streams_5m": streams,
        })


_THIN_RATIO = {"ttft_p95_ms": 9_000.0, "ttft_n_5m": 500, "ttft_base_p95_ms": 500.0, "ttft_base_n": 10_000,
               "stream_base_hours": 24}

SIGNAL = Signal(
    name="slow_stream", kind="soft", params=SlowStreamParams, detector=SlowStream(), windows=StreamWindows,
    features=window_features(),
    metrics=("ttft_p95_ms", "ttft_baseline_p95_ms", "ttft_p95_ratio", "stream_gap_p95_ms",
             "stream_gap_baseline_p95_ms", "stream_gap_p95_ratio", "stall_share_1m", "stall_share_5m", "stall_share_lower_5m",
             "stalled_cancels_5m", "streams_5m"),
    examples=Examples(
        firing={"streams_ok_5m": 3_000, "stream_stalls_8s_5m": 600},
        thin=({"streams_ok_5m": 49, "stream_stalls_8s_5m": 49, "streams_ok_1m": 49, "stream_stalls_8s_1m": 49},
              {"streams_ok_5m": 3_000, "stream_stalls_8s_5m": 4, "streams_ok_1m": 600, "stream_stalls_8s_1m": 4},
              {**_THIN_RATIO, "ttft_n_5m": 99},
              {**_THIN_RATIO, "ttft_base_n": 499},
              {**_THIN_RATIO, "stream_base_hours": 0})),
    rule="P95 of `ttft_ms` and of `max_stream_gap_ms` (`ok` streams) over 5 min ÷ their P95 over the 24 "
         "complete hours before the current hour; exact lower bound (99.99 % one-sided) of streams with a "
         "pause ≥ `stall_gap_ms` over 1 min and 5 min (a `cancelled` stream counts only when it stalled first), with "
         "≥ 50 streams and ≥ 5 stalls",
    default="degrade at ratio ≥ 1.8, clear ≤ 1.2; stall line 8 s, share 2 %",
)
