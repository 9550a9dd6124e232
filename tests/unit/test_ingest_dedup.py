"""``event_id`` is the identity (issue #16 item 4, SPEC §8): a re-sent event is counted and stored once
within the dedup horizon, and the memory for it is bounded."""

from __future__ import annotations

import msgspec

from pipeline.contracts import RequestEvent
from pipeline.ingest.dedup import EventIdDedup
from pipeline.engine.batch import BatchProcessor
from pipeline.windows.store import JUDGED

NOW = 1_780_000_000_000
T = NOW - 3_600_000
_enc = msgspec.json.Encoder()


def _ev(eid: str, ts: int, channel: str = "c0") -> dict:
    return {"event_id": eid, "ts_ms": ts, "channel": channel, "route": "r", "status": "ok", "latency_ms": 10.0}


def _judged(proc: BatchProcessor) -> int:
    return int(proc.engine.store.short.counts[..., JUDGED].sum())


def _stored_ids(out) -> list[str]:
    ids = [row[0].event_id for row in out.stored]
    for raw, _ in out.envelopes:
        ids += [e["event_id"] for e in msgspec.json.decode(raw)["events"]]
    return sorted(ids)


def test_a_resent_event_with_another_ts_is_counted_and_stored_once() -> None:
    proc = BatchProcessor(clock_ms=lambda: NOW)
    first = _enc.encode({"events": [_ev("a", T), _ev("b", T + 1)]})
    again = _enc.encode({"events": [_ev("a", T + 5_000), _ev("c", T + 5_001)]})  # "a" re-sent, same batch
    out = proc.process([first, again])
    assert _stored_ids(out) == ["a", "b", "c"] and _judged(proc) == 3
    assert out.envelopes == [(first, 2)]  # the envelope holding the copy is not stored as it came
    out = proc.process([_enc.encode(_ev("a", T + 9_000)), _enc.encode(_ev("d", T + 9_001))])  # a later batch
    assert _stored_ids(out) == ["d"] and _judged(proc) == 4
    assert proc.duplicates == 2 and proc.dedup.dropped == 2 and out.dead_letters == []


def test_only_later_copies_are_dropped_and_the_first_is_kept() -> None:
    d = EventIdDedup()
    events = [RequestEvent(event_id=e, ts_ms=T + k, channel="c", route="r", status="ok", latency_ms=1.0)
              for k, e in enumerate(["x", "y", "x", "z", "y", "x"])]
    assert d.filter(events, None) == [2, 4, 5]
    assert d.filter(events[:1], None) == [0] and d.filter(events[3:4], None) == [0]
    assert len(d) == 3
    given = EventIdDedup()  # the ids already read (the processor's EventFields) give the same answer
    assert given.filter(events, None, [e.event_id for e in events]) == [2, 4, 5] and len(given) == 3


def test_the_memory_is_bounded_by_ids_and_by_event_time() -> None:
    ev = [RequestEvent(event_id=f"e{k}", ts_ms=T + k, channel="c", route="r", status="ok", latency_ms=1.0)
          for k in range(100)]
    d = EventIdDedup(horizon_ms=600_000, max_ids=20)
    for k in range(100):
        assert d.filter(ev[k:k + 1], T + k) is None
        assert len(d) <= 20
    assert d.filter(ev[95:96], T) == [0]  # within max_ids / 2 = 10 ids: caught
    assert d.filter(ev[70:71], T) is None  # 30 ids back: forgotten (beyond the horizon)
    d = EventIdDedup(horizon_ms=60_000, max_ids=1_000)
    d.filter(ev[:1], T)
    d.filter(ev[1:2], T + 29_000)
    assert d.filter(ev[:1], T + 29_500) == [0]  # 29.5 s < horizon / 2
    d.filter(ev[2:3], T + 30_000)  # a generation spans horizon / 2: retired
    d.filter(ev[3:4], T + 61_000)  # retired again: e0 and e1 forgotten
    assert d.filter(ev[:2], T + 61_000) is None
    assert len(d) == 4
