"""The ``slow_stream`` signal's own windows (SPEC §4.6): TTFT, stream gaps and stalls per channel.

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

from typing import Mapping

import numpy as np

from pipeline.windows.extension import RingWindows, WindowSpec
from pipeline.windows.features import EventColumns
from pipeline.windows.histogram import LatencyBuckets
from pipeline.windows.ring import IntervalRing, masked_sums

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
        """Count the streams of a batch (``late`` is unused: each ring knows what is too old for it)."""
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
        base = hists[0][1] | hists[-1][1]  # the baseline's events: ok streams
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
        return self._base[rows]

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
