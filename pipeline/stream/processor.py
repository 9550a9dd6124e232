"""One batch of raw ``gateway.requests`` messages → everything it produces.

Kafka-free and synchronous so it is tested directly; the faust agent in
:mod:`pipeline.stream.app` only moves bytes in and out of it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

from pipeline.contracts import RequestEvent, Verdict, encode
from pipeline.engine import Engine
from pipeline.ingest.counters import DecodeCounters
from pipeline.ingest.dead_letter import DeadLetter
from pipeline.ingest.decode import Decoder

#: A partition that delivered nothing for this long (wall clock) no longer
#: holds the low watermark back (the usual idle-source rule).
PARTITION_IDLE_S = 10.0


@dataclass
class ProcessedBatch:
    """Outputs of one batch.

    ``verdicts`` in publication order; ``dead_letters`` (invalid or late
    input); ``stored`` rows ``(event, parse_ok, missing_fields)`` for the
    ``request_events`` table.
    """

    verdicts: list[Verdict] = field(default_factory=list)
    dead_letters: list[DeadLetter] = field(default_factory=list)
    stored: list[tuple[RequestEvent, bool | None, list[str] | None]] = field(default_factory=list)


class BatchProcessor:
    """Decode → engine → outputs, with counters.

    ``clock_ms`` returns wall-clock UTC epoch ms (used only to reject
    timestamps absurdly far from now; windows run on event time).
    """

    def __init__(self, engine: Engine | None = None, decoder: Decoder | None = None,
                 clock_ms: Callable[[], int] = lambda: int(time.time() * 1000)):
        self.engine = engine or Engine()
        self.decoder = decoder or Decoder()
        self.clock_ms = clock_ms
        self.counters = DecodeCounters()
        self.events_in = 0
        self.verdicts_out = 0
        #: channel → snapshot bytes not yet loaded (restored lazily on the
        #: channel's first event, so a worker only takes the channels of its partitions).
        self.pending_snapshots: dict[str, bytes] = {}
        #: partition → (newest event time delivered, monotonic wall time of delivery)
        self.partition_wm: dict[int, tuple[int, float]] = {}
        #: assigned input partition → consumed to its end (see :meth:`set_partition_status`)
        self.caught_up: dict[int, bool] = {}
        self.restored = 0
        self.bad_snapshots = 0

    def process(self, raws: Sequence[bytes | None], partitions: Sequence[int] | None = None) -> ProcessedBatch:
        """Process raw message values in arrival order. Never raises on bad input.

        ``partitions`` (same length as ``raws``) names each message's input
        partition; the low watermark handed to the engine is then the
        minimum over partitions that delivered within the last
        ``PARTITION_IDLE_S`` seconds of the newest event time each has
        delivered (partitions drift apart when a backlog is replayed). Without
        it the messages are taken as one stream in event-time order.
        """
        out = ProcessedBatch()
        now = self.clock_ms()
        events: list[RequestEvent] = []
        for k, raw in enumerate(raws):
            res = self.decoder.decode(raw if raw is not None else b"", now)
            events.extend(res.events)
            out.dead_letters.extend(res.dead_letters)
            if partitions is not None and res.events:
                p = partitions[k]
                hi = max(e.ts_ms for e in res.events)
                prev = self.partition_wm.get(p)
                self.partition_wm[p] = (max(hi, prev[0]) if prev else hi, time.monotonic())
        for d in out.dead_letters:
            self.counters.add_dead_letter(d.reason)
        self.events_in += len(events)
        if self.pending_snapshots:
            self._restore_channels(events)
        late: list[RequestEvent] = []
        if partitions is None:
            result = self.engine.process(events)
        else:  # 0: not known yet — channels advance only with their own events
            result = self.engine.process(events, low_watermark_ms=self.low_watermark_ms() or 0)
        out.verdicts.extend(result.verdicts)
        late.extend(result.late)
        out.stored.extend((e, s[0], s[1]) for e, s in zip(result.accepted, result.structure))
        for e in late:
            idx = self.engine.store._index.get(e.channel)
            newest = int(self.engine.store.last_ts_ms[idx]) if idx is not None else e.ts_ms
            lateness_s = (newest - e.ts_ms) / 1000
            out.dead_letters.append(DeadLetter(
                reason="late_event",
                detail=f"ts_ms is {lateness_s:.0f} s behind the channel's newest event; allowed lateness is "
                       f"{self.engine.policy.allowed_lateness_ms / 1000:.0f} s",
                raw=encode(e), event_id=e.event_id))
            self.counters.add_dead_letter("late_event")
        self.verdicts_out += len(out.verdicts)
        return out

    def _restore_channels(self, events: Sequence[RequestEvent]) -> None:
        from pipeline.state.snapshot import SnapshotError, decode_snapshot, import_channel

        known = self.engine.store._index
        for name in {e.channel for e in events if e.channel not in known}:
            raw = self.pending_snapshots.pop(name, None)
            if raw is None:
                continue
            try:
                import_channel(self.engine, decode_snapshot(raw))
                self.restored += 1
            except SnapshotError:
                self.bad_snapshots += 1  # start that channel fresh; never crash on a bad snapshot

    def snapshots(self) -> list[tuple[str, bytes]]:
        """``(channel, snapshot bytes)`` for every channel this worker holds."""
        from pipeline.state.snapshot import export_channel

        return [(name, export_channel(self.engine, i)) for i, name in enumerate(self.engine.store.names)]

    def set_partition_status(self, caught_up: dict[int, bool]) -> None:
        """Record, per assigned input partition, whether it has been consumed to its end."""
        self.caught_up = dict(caught_up)

    def low_watermark_ms(self) -> int | None:
        """Event time up to which all input of this worker has been seen; None while unknown.

        With partition status (:meth:`set_partition_status`): the minimum,
        over partitions that still have a backlog, of the newest event time
        each delivered (None if one of them has delivered nothing yet);
        when every partition is caught up, the newest event time delivered.
        Without it: the minimum over partitions that delivered within the
        last ``PARTITION_IDLE_S`` seconds (the usual idle-source rule).
        """
        if self.caught_up:
            behind = [p for p, done in self.caught_up.items() if not done]
            if behind:
                if any(p not in self.partition_wm for p in behind):
                    return None
                return min(self.partition_wm[p][0] for p in behind)
            return max((ts for ts, _ in self.partition_wm.values()), default=None)
        now = time.monotonic()
        active = [ts for ts, seen in self.partition_wm.values() if now - seen <= PARTITION_IDLE_S]
        if active:
            return min(active)
        return max((ts for ts, _ in self.partition_wm.values()), default=None)

    def advance_idle(self, wall_elapsed_ms: int) -> list[Verdict]:
        """Advance event time by ``wall_elapsed_ms`` when no events arrive.

        An idle source would otherwise freeze event time and no channel
        could ever be reported ``no_data``; this is the usual idle-source
        watermark advance.
        """
        wm = self.engine.low_watermark_ms
        if wm is None or wall_elapsed_ms <= 0:
            return []
        verdicts = self.engine.advance(wm + wall_elapsed_ms)
        self.verdicts_out += len(verdicts)
        return verdicts
