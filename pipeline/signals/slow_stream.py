"""SPEC §4.6 slow stream and cancel cascade: TTFT and stream-gap P95 vs baseline, and the stall share.

Three rules over the channel's streams (:class:`StreamWindows`, below):

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

The signal's own windows (SPEC §4.6): TTFT, stream gaps and stalls per channel.

Per channel two :class:`~pipeline.windows.ring.IntervalRing` s of histograms
over :data:`STREAM_BUCKETS` (DDSketch bucket mapping, relative accuracy 5 %,
:mod:`pipeline.windows.histogram`):

- ``short``: 10 × 30 s (the 5 min window, 30 s = the round interval, as the
  store's latency ring): ``ttft_ms`` of ``ok`` streams | ``max_stream_gap_ms``
  of ``ok`` streams | 8 stall classes (below);
- ``base``: 25 × 1 h (the 24 complete hours before the current hour plus the
  hour being filled, SPEC §4.3): ``ttft_ms`` | ``max_stream_gap_ms`` of
  ``ok`` streams.

A *stream* is an event with ``ttft_ms`` or ``max_stream_gap_ms``; channels
that send neither add nothing here and their features are NaN / 0. A
stream's *stall length* is its longest pause between chunks,
``max_stream_gap_ms``, and for a ``cancelled`` stream that never got its
first token its whole ``latency_ms`` (it waited that long for nothing). A
slow first token of an ``ok`` stream is not a stall: some providers start
slowly as a rule (cold starts: replicate's real TTFTs pass 8 s in over a
third of its llmperf requests), and the TTFT P95 against the channel's own
baseline judges it. Its *stall class* is the number of lines of
:data:`STALL_LADDER_MS` the stall length reaches (0..3), plus 4 when the
stream was ``cancelled``; only ``ok`` and ``cancelled`` streams get one.
Classes make the stall line a per-channel policy value
(``stall_gap_ms``, one of the ladder's lines) while the windows count each
event once, without knowing the policy.

Memory per busy channel: short 10 × (2 × 95 + 8) × 4 B = 7 920 B, base
25 × 2 × 95 × 4 B = 19 000 B, slot ids 35 × 8 B = 280 B, baseline cache
48 B: about 27 KB (the store's latency rings hold ~47 KB).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

import numpy as np

from pipeline.signals.base import Examples, Finding, Order, Params, Signal, ThresholdArrays, param
from pipeline.stats import alpha_for, exact_lower_gate, safe_ratio
from pipeline.windows.extension import RingWindows, WindowSpec
from pipeline.windows.features import EventColumns
from pipeline.windows.histogram import LatencyBuckets
from pipeline.windows.ring import IntervalRing, masked_sums
from pipeline.windows.view import WindowView

#: Buckets of TTFT and stream gaps: 5 % relative accuracy (a P95 ratio is off by at most ~10 %),
#: 5 ms .. 60 s (below: one bucket; above: the top bucket, still a stall). 95 buckets.
STREAM_BUCKETS = LatencyBuckets(alpha=0.05, min_ms=5.0, max_ms=60_000.0)
#: Stall lines (ms) the windows count streams against; SPEC §4.6's seed is 8 s. ``stall_gap_ms`` picks one.
STALL_LADDER_MS: tuple[float, ...] = (4_000.0, 8_000.0, 12_000.0)
#: Stall classes per state (ok / cancelled): 0 .. len(ladder) lines reached.
N_LEVELS = len(STALL_LADDER_MS) + 1
N_CLASSES = 2 * N_LEVELS
SHORT_SLOT_MS = 30_000
BASE_SLOT_MS = 3_600_000


def stall_label(line_ms: float) -> str:
    """Feature-name label of a ladder line: ``8000.0 -> "8s"``."""
    return f"{line_ms / 1000:g}s"


def stall_classes(cols: EventColumns) -> tuple[np.ndarray, np.ndarray]:
    """``(judged, cls)`` of a batch: bool (n,) ok/cancelled streams, int (n,) their stall class (see module doc).

    Reads the optional columns ``ttft_ms`` and ``max_stream_gap_ms`` (cached in
    ``cols``), and ``cancelled`` only when the batch holds a stream.
    """
    ttft, gap = cols.column("ttft_ms"), cols.column("max_stream_gap_ms")
    stream = ~(np.isnan(ttft) & np.isnan(gap))
    if not stream.any():
        return stream, np.zeros(len(cols), np.int64)
    cancelled = cols.column("cancelled")
    wait = np.where(cancelled & np.isnan(ttft), cols.latency_ms, np.nan)
    length = np.fmax(gap, wait)  # fmax ignores NaN
    cls = np.zeros(len(cols), np.int64)
    for line in STALL_LADDER_MS:
        cls += length >= line
    return stream & (cols.ok | cancelled), cls + N_LEVELS * cancelled


class StreamWindows(RingWindows):
    """``slow_stream`` windows (module doc); features at event time ``now_ms``, arrays (len(rows),):

    ``ttft_p95_ms`` / ``stream_gap_p95_ms``: P95 over the 5 min window of ``ok``
    streams (NaN without samples), ``ttft_n_5m`` / ``stream_gap_n_5m`` their
    sample counts; ``ttft_base_p95_ms`` / ``stream_gap_base_p95_ms`` and
    ``ttft_base_n`` / ``stream_gap_base_n``: the same over the 24 complete
    hours before the current hour (cached per hour); ``stream_base_hours``:
    hours with streams in that baseline; ``streams_ok_5m``: ``ok`` streams;
    ``stream_stalls_<L>_5m`` / ``stream_cancel_stalls_<L>_5m``: ``ok`` /
    ``cancelled`` streams whose stall length reached line ``L`` of
    :data:`STALL_LADDER_MS` (``4s``, ``8s``, ``12s``); ``streams_ok_1m`` and
    ``stream_[cancel_]stalls_<L>_1m``: the same over the last minute (the
    short window of SPEC §4.1). Windows start no earlier than ``since_ms``
    (rounded up to 30 s) when given.
    """

    name = "slow_stream"
    columns = ("ttft_ms", "max_stream_gap_ms")

    def __init__(self, spec: WindowSpec):
        self.k = STREAM_BUCKETS.n_buckets
        self.window_ms = spec.window_ms
        self.short_window_ms = spec.short_window_ms
        self.baseline_hours = spec.baseline_hours
        slot = SHORT_SLOT_MS if spec.window_ms % SHORT_SLOT_MS == 0 else 10_000
        self.rings: dict[str, IntervalRing] = {
            "short": IntervalRing(slot, spec.window_ms // slot, 0, 2 * self.k + N_CLASSES),
            "base": IntervalRing(BASE_SLOT_MS, spec.baseline_hours + 1, 0, 2 * self.k),
        }
        self._hour = np.full(16, -1, np.int64)  # event-time hour of each row's cached baseline
        self._base = np.full((16, 5), np.nan)  # ttft p95, ttft n, gap p95, gap n, hours

    def ensure_capacity(self, n_channels: int) -> None:
        super().ensure_capacity(n_channels)
        grow = self.rings["short"].capacity - self._hour.shape[0]
        if grow > 0:
            self._hour = np.concatenate([self._hour, np.full(grow, -1, np.int64)])
            self._base = np.concatenate([self._base, np.full((grow, 5), np.nan)])

    def clear_rows(self, rows: np.ndarray) -> None:
        super().clear_rows(rows)
        self._hour[np.asarray(rows, dtype=np.int64)] = -1

    def import_row(self, i: int, arrays: Mapping[str, np.ndarray] | None) -> None:
        super().import_row(i, arrays)
        self._hour[i] = -1

    def add(self, cols: EventColumns, late: np.ndarray) -> None:
        """:meth:`add_learning` with every stream learning."""
        self.add_learning(cols, late, None)

    def add_learning(self, cols: EventColumns, late: np.ndarray, learn: np.ndarray | None) -> None:
        """Count the streams of a batch (``late`` is unused: each ring knows what is too old for it); the
        baseline only those where ``learn`` (bool (n,); None: all; SPEC §4.2 healthy time only)."""
        judged, cls = stall_classes(cols)
        if not judged.any():
            return
        ttft, gap = cols.column("ttft_ms"), cols.column("max_stream_gap_ms")
        ic = np.flatnonzero(judged)  # every ok stream is judged: the short ring's events
        ok, ch, ts = cols.ok[ic], cols.channel[ic], cols.ts_ms[ic]
        # (bucket key, mask) of the TTFT and gap histograms, for the fields some stream has
        hists = []
        for values, offset in ((ttft[ic], 0), (gap[ic], self.k)):
            has = ok & ~np.isnan(values)
            if has.any():
                hists.append((STREAM_BUCKETS.key_of(values) + offset, has))
        self.rings["short"].add(ch, ts, hist_key=[key for key, _ in hists] + [cls[ic] + 2 * self.k],
                                hist_mask=[has for _, has in hists] + [None])
        if not hists:
            return
        base = hists[0][1] | hists[-1][1]  # the baseline's events: ok streams of learning channels
        if learn is not None:
            base = base & learn[ic]
            if not base.any():
                return
        if not base.all():
            ib = np.flatnonzero(base)
            ch, ts, hists = ch[ib], ts[ib], [(key[ib], has[ib]) for key, has in hists]
        self.rings["base"].add(ch, ts, hist_key=[key for key, _ in hists], hist_mask=[has for _, has in hists])
        stale = ts // BASE_SLOT_MS < self._hour[ch]
        if stale.any():  # a late stream landed in an hour a cached baseline covers
            self._hour[ch[stale]] = -1

    def _baseline(self, rows: np.ndarray, now_ms: int) -> np.ndarray:
        """float64 (len(rows), 5) baseline numbers, recomputed once per event-time hour."""
        hour = now_ms // BASE_SLOT_MS
        stale = rows[self._hour[rows] != hour]
        if stale.size:
            base, k = self.rings["base"], self.k
            ids = base.slot_id[stale]
            mask = ((ids >= max(hour - self.baseline_hours, 0)) & (ids < hour)).astype(np.float32)
            h = base.sum_hist(mask, stale)
            self._base[stale, 0] = STREAM_BUCKETS.quantile(h[:, :k], 0.95)
            self._base[stale, 1] = h[:, :k].sum(axis=1)
            self._base[stale, 2] = STREAM_BUCKETS.quantile(h[:, k:], 0.95)
            self._base[stale, 3] = h[:, k:].sum(axis=1)
            self._base[stale, 4] = mask.sum(axis=1)
            self._hour[stale] = hour
        base_rows: np.ndarray = self._base[rows]
        return base_rows

    def features(self, rows: np.ndarray, now_ms: int, since_ms: np.ndarray | None) -> dict[str, np.ndarray]:
        rows = np.asarray(rows, dtype=np.int64)
        short, k = self.rings["short"], self.k
        lo = np.full(rows.shape[0], now_ms - self.window_ms, np.int64)
        if since_ms is not None:
            lo = np.maximum(lo, np.asarray(since_ms, dtype=np.int64))
        h = short.sum_hist(self.window_mask(short, rows, lo, now_ms), rows)
        lo1 = np.maximum(lo, now_ms - self.short_window_ms)
        cls1 = masked_sums(self.window_mask(short, rows, lo1, now_ms), short.hist[:, :, 2 * k:], rows)
        base = self._baseline(rows, now_ms)
        cls = h[:, 2 * k:]
        out = {
            "ttft_p95_ms": STREAM_BUCKETS.quantile(h[:, :k], 0.95), "ttft_n_5m": h[:, :k].sum(axis=1),
            "ttft_base_p95_ms": base[:, 0], "ttft_base_n": base[:, 1],
            "stream_gap_p95_ms": STREAM_BUCKETS.quantile(h[:, k:2 * k], 0.95),
            "stream_gap_n_5m": h[:, k:2 * k].sum(axis=1),
            "stream_gap_base_p95_ms": base[:, 2], "stream_gap_base_n": base[:, 3],
            "stream_base_hours": base[:, 4],
            "streams_ok_5m": cls[:, :N_LEVELS].sum(axis=1),
        }
        out["streams_ok_1m"] = cls1[:, :N_LEVELS].sum(axis=1)
        for w, c in (("5m", cls), ("1m", cls1)):
            for j, line in enumerate(STALL_LADDER_MS, 1):
                out[f"stream_stalls_{stall_label(line)}_{w}"] = c[:, j:N_LEVELS].sum(axis=1)
                out[f"stream_cancel_stalls_{stall_label(line)}_{w}"] = c[:, N_LEVELS + j:].sum(axis=1)
        return out


def window_features() -> tuple[str, ...]:
    """Names of the features :class:`StreamWindows` adds to the view, in order."""
    return tuple(StreamWindows(WindowSpec()).features(np.zeros(0, np.int64), 0, None))


@dataclass(frozen=True)
class SlowStreamParams(Params):
    """Thresholds of ``slow_stream`` (policy table ``[tier.X.slow_stream]``)."""

    #: SPEC §4.6 (the §4.3 rule): P95 ratio of TTFT or stream gap that degrades (dimensionless, > clear) ...
    stream_ratio_trip: float = 1.8
    #: ... and the ratio at or below which that rule clears (hysteresis; >= 1).
    stream_ratio_clear: float = 1.2
    #: Minimum ``ok`` streams with the field in 5 min for its P95 (>= 1); a P95 of 100 rests on its top 5.
    stream_min_samples: int = param(100, ge=1)
    #: Minimum streams with the field in the 24 h baseline (>= 1), as ``baseline_min_requests``.
    stream_baseline_min_samples: int = param(500, ge=1)
    #: Minimum whole hours of stream history before the baseline is trusted (>= 1).
    stream_baseline_min_hours: int = param(1, ge=1)
    #: SPEC §4.6: a stream that went this long (ms) without a chunk stalled; one of 4000, 8000, 12000.
    stall_gap_ms: float = param(8_000.0, one_of=STALL_LADDER_MS, says=f"one of {STALL_LADDER_MS} (the lines the windows count)")
    #: Share in (0, 1) of judged streams stalled over 1 or 5 min that degrades (exact lower bound above it).
    stall_share_trip: float = param(0.02, gt=0, lt=1)
    #: Minimum judged streams in a window before its stall share is tested (>= 1).
    stall_min_streams: int = param(50, ge=1)
    #: Minimum stalled streams in a window before its stall share may trip (>= 1).
    stall_min_stalls: int = param(5, ge=1)

    ORDER = (Order("stream_ratio_clear", "stream_ratio_trip", floor=1),)


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
