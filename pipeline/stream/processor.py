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
        self.restored = 0
        self.bad_snapshots = 0

    def process(self, raws: Sequence[bytes | None]) -> ProcessedBatch:
        """Process raw message values in arrival order. Never raises on bad input."""
        out = ProcessedBatch()
        now = self.clock_ms()
        events: list[RequestEvent] = []
        for raw in raws:
            res = self.decoder.decode(raw if raw is not None else b"", now)
            events.extend(res.events)
            out.dead_letters.extend(res.dead_letters)
        for d in out.dead_letters:
            self.counters.add_dead_letter(d.reason)
        self.events_in += len(events)
        if self.pending_snapshots:
            self._restore_channels(events)
        late: list[RequestEvent] = []
        result = self.engine.process(events)
        out.verdicts.extend(result.verdicts)
        late.extend(result.late)
        out.stored.extend((e, s[0], s[1]) for e, s in zip(result.accepted, result.structure))
        for e in late:
            lateness_s = ((self.engine.store.watermark_ms or e.ts_ms) - e.ts_ms) / 1000
            out.dead_letters.append(DeadLetter(
                reason="late_event",
                detail=f"ts_ms is {lateness_s:.0f} s behind the watermark; allowed lateness is "
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

    def advance_idle(self, wall_elapsed_ms: int) -> list[Verdict]:
        """Advance event time by ``wall_elapsed_ms`` when no events arrive.

        An idle source would otherwise freeze event time and no channel
        could ever be reported ``no_data``; this is the usual idle-source
        watermark advance.
        """
        wm = self.engine.store.watermark_ms
        if wm is None or wall_elapsed_ms <= 0:
            return []
        new = wm + wall_elapsed_ms
        self.engine.store.watermark_ms = new
        verdicts = self.engine.advance(new)
        self.verdicts_out += len(verdicts)
        return verdicts
