"""A re-sent ``event_id`` is stored once in ``request_events`` (issue #16 item 4), against chDB."""

from __future__ import annotations

import time

import msgspec
import pytest

from pipeline.sinks.clickhouse import ClickHouseSink
from pipeline.engine.batch import BatchProcessor

pytest.importorskip("chdb", reason="chdb (embedded ClickHouse) not installed")
pytestmark = pytest.mark.integration

NOW_MS = int(time.time() * 1000)
T0 = NOW_MS - 3_600_000


def _ev(eid: str, ts: int) -> dict:
    return {"event_id": eid, "ts_ms": ts, "channel": "prov/m@paid", "route": "chat", "status": "ok",
            "latency_ms": 100.0}


def test_a_resent_event_is_one_row_with_and_without_final(ch) -> None:
    enc = msgspec.json.Encoder()
    proc = BatchProcessor(clock_ms=lambda: NOW_MS)
    sink = ClickHouseSink(ch)
    batches = [
        [enc.encode({"events": [_ev("dup", T0), _ev("e1", T0 + 1)]}),
         enc.encode({"events": [_ev("dup", T0 + 7_000), _ev("e2", T0 + 7_001)]})],  # same batch, another ts_ms
        [enc.encode(_ev("dup", T0 + 3_000_000))],  # a later batch, 50 min later
    ]
    for raws in batches:
        out = proc.process(raws)
        sink.add_event_batches(out.envelopes)
        sink.add_events(out.stored)
        sink.flush()
    assert proc.duplicates == 2
    rows = "SELECT count() FROM channel_health.request_events {} WHERE event_id = 'dup'"
    assert ch.query(rows.format("FINAL")).result_rows[0][0] == 1
    assert ch.query(rows.format("")).result_rows[0][0] == 1
    assert ch.query("SELECT toUnixTimestamp64Milli(ts) FROM channel_health.request_events "
                    "WHERE event_id = 'dup'").result_rows == [(T0,)]
    assert ch.query("SELECT count() FROM channel_health.request_events").result_rows[0][0] == 3
