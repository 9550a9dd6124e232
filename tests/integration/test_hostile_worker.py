"""Hostile input through a real ``channel-health worker`` process (SPEC §3), end to end.

The property test (``tests/unit/test_hostile_input.py``) covers the batch
stage exhaustively; this one checks the wiring around it on the embedded
broker: bad messages -- invalid JSON, bytes that are not UTF-8, a 5 MB body,
a tombstone, a batch with good and bad elements, duplicate ids, timestamps
years off, ``NaN``, ``1e999``, an event later than the allowed lateness --
all land on ``gateway.requests.dlq`` as readable dead letters with their
reason, the worker keeps running and processing the good events after them,
and the stored rows are exactly the good events.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter

import pytest

from pipeline.ingest import reasons as R
from workers import Stack, count_rows, publish, steady_events

pytestmark = pytest.mark.integration

CHANNELS = {"prov0/model@paid": "chat", "prov1/model@free": "chat"}
FIVE_MB = 5 * 1024 * 1024


@pytest.fixture
def stack(tmp_path):
    s = Stack(tmp_path, partitions=2).start()
    try:
        yield s
    finally:
        s.close()


def _ev(eid: str, ts: int, channel: str = "prov0/model@paid", **extra: object) -> dict:
    return {"event_id": eid, "ts_ms": ts, "channel": channel, "route": CHANNELS[channel], "status": "ok",
            "latency_ms": 120.0, **extra}


async def _send_raw(settings, messages: list[tuple[bytes, bytes | None]]) -> None:
    from aiokafka import AIOKafkaProducer

    p = AIOKafkaProducer(bootstrap_servers=settings.kafka_bootstrap, acks="all", max_request_size=8 * 1024 * 1024)
    await p.start()
    try:
        for key, value in messages:
            await p.send_and_wait(settings.topics.requests, value, key=key)
    finally:
        await p.stop()


async def _read_dlq(settings, want: int, timeout_s: float) -> list[dict]:
    from aiokafka import AIOKafkaConsumer

    c = AIOKafkaConsumer(settings.topics.dlq, bootstrap_servers=settings.kafka_bootstrap, group_id=None,
                         auto_offset_reset="earliest", enable_auto_commit=False)
    await c.start()
    out: list[dict] = []
    try:
        deadline = time.monotonic() + timeout_s
        while len(out) < want and time.monotonic() < deadline:
            for msgs in (await c.getmany(timeout_ms=500)).values():
                out += [json.loads(m.value) for m in msgs]
        await asyncio.sleep(1.0)  # anything beyond the expected count would show up here
        for msgs in (await c.getmany(timeout_ms=500)).values():
            out += [json.loads(m.value) for m in msgs]
    finally:
        await c.stop()
    return out


def test_worker_dead_letters_hostile_input_and_keeps_processing(stack):
    now = int(time.time() * 1000)
    start = now - now % 30_000 - 3_600_000
    good = steady_events(CHANNELS, start, 600, per_s=1, seed=3)  # 1,200 events over 10 min
    last = max(e["ts_ms"] for e in good)
    key = b"prov0/model@paid"
    mixed_batch = {"events": [_ev("mix-ok-1", last - 5_000), _ev("mix-ok-2", last - 3_000), {"event_id": "mix-bad"},
                              _ev("mix-neg", last - 5_000, latency_ms=-1), _ev("mix-ok-1", last - 4_000),
                              _ev("mix-future", last + 10 * 365 * 86_400_000), 42]}
    hostile: list[tuple[bytes, bytes | None, set[str]]] = [
        (key, b"{not json", {R.INVALID_JSON}),
        (key, b'{"event_id": "u", "channel": "\xff\xfe"}', {R.NOT_UTF8}),
        (key, json.dumps(_ev("huge", last, response_text="x" * FIVE_MB)).encode(), {R.TOO_LARGE}),
        (key, None, {R.EMPTY_MESSAGE}),  # a tombstone
        (key, b"[1, 2, 3]", {R.WRONG_TYPE}),
        (key, b'{"events": []}', {R.BAD_BATCH}),
        (key, json.dumps(_ev("old", now - 3 * 365 * 86_400_000)).encode(), {R.TS_TOO_OLD}),
        (key, json.dumps(_ev("nan", last)).replace('"latency_ms": 120.0', '"latency_ms": NaN').encode(),
         {R.INVALID_JSON}),
        (key, json.dumps(_ev("inf", last)).replace('"latency_ms": 120.0', '"latency_ms": 1e999').encode(),
         {R.OUT_OF_RANGE}),
        (key, json.dumps(_ev("tokens", last, input_tokens=2**40)).encode(), {R.OUT_OF_RANGE}),
        (key, json.dumps(mixed_batch).encode(), set()),  # 2 good elements, 4 dead letters (below)
    ]
    batch_dead = Counter({R.MISSING_FIELD: 1, R.OUT_OF_RANGE: 1, R.DUPLICATE_IN_BATCH: 1, R.TS_IN_FUTURE: 1,
                          R.WRONG_TYPE: 1})
    w = stack.worker("w1")
    w.start()
    publish(stack.settings, good)
    w.wait_drained(last, 120)
    asyncio.run(_send_raw(stack.settings, [(k, v) for k, v, _ in hostile]))
    # Later than the allowed lateness (120 s) behind its channel's newest event: dead-lettered as late.
    late = _ev("late", last - 600_000)
    after = steady_events(CHANNELS, last + 1_000, 120, per_s=1, seed=4)
    asyncio.run(_send_raw(stack.settings, [(key, json.dumps(late).encode())]))
    publish(stack.settings, after)
    final_ts = max(e["ts_ms"] for e in after)
    status = w.wait_drained(final_ts, 120)
    assert w.alive, w.log_tail()

    expected = len(hostile) - 1 + sum(batch_dead.values()) + 1
    dead = asyncio.run(_read_dlq(stack.settings, expected, 60))
    assert len(dead) == expected, [(d["reason"], d["detail"]) for d in dead]
    for d in dead:
        assert d["reason"] in R.ALL_REASONS and d["reason"] != R.INTERNAL_ERROR, d
        assert isinstance(d["detail"], str) and d["detail"].strip() and d["detail"].isprintable(), d
        assert isinstance(d["raw"], str) and d["raw_encoding"] in ("utf-8", "base64") and d["raw_size"] >= 0, d
    got = Counter(d["reason"] for d in dead)
    for _, _, reasons in sorted(hostile, key=lambda h: len(h[2])):  # exact expectations first
        if reasons:
            hit = next((r for r in sorted(reasons) if got[r] > 0), None)
            assert hit is not None, (reasons, got)
            got[hit] -= 1
    got.subtract(batch_dead)
    got[R.LATE_EVENT] -= 1
    assert +got == Counter() and -got == Counter(), got
    big = next(d for d in dead if d["reason"] == R.TOO_LARGE)
    assert big["raw_size"] > FIVE_MB and big["raw_truncated"] is True  # the DLQ copy is bounded
    late_dl = next(d for d in dead if d["reason"] == R.LATE_EVENT)
    assert late_dl["event_id"] == "late" and "allowed lateness" in late_dl["detail"]
    assert status["events_in"] >= len(good) + len(after) + 2

    assert w.stop() == 0, w.log_tail()
    rows = count_rows(w.chdb_dir)
    assert rows["final"] == len(good) + len(after) + 2  # the good events and the 2 good batch elements
