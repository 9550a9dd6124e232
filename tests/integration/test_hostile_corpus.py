"""No poison pill, and a 10,000-message hostile corpus, against a live ``channel-health worker`` (issue #16).

Item 2: a 200 KB message of ``0x01`` bytes and a 20 MB message are
dead-lettered (their DLQ records bounded: :mod:`pipeline.ingest.dead_letter`)
and a worker restarted on top of them reads them again and goes on. The
embedded broker (Tansu) accepts a 20 MB record from a producer configured
for it (``max_request_size``), so the 20 MB path runs live here; the
decode/dead-letter level is in ``tests/unit/test_dead_letter_bound.py``.

Item 9: the seeded corpus of :mod:`hostile_corpus` (>= 10,000 messages,
~22,000 inputs, ~85 MB) through one worker: it never crashes, and every
input is either stored or dead-lettered with a reason -- stored rows plus
DLQ records equal the inputs sent. Reasons are read from the DLQ, not
hard-coded, so new reasons (a per-worker channel limit, event_id dedup, a
maximum event age) keep the invariant.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
from collections import Counter
from pathlib import Path

import pytest

from pipeline.ingest.reasons import INTERNAL_ERROR
from hostile_corpus import build_corpus
from workers import Stack, count_rows, publish, query_chdb, steady_events, stored_event_ids

pytestmark = pytest.mark.integration

CHANNELS = {"prov0/model@paid": "chat", "prov1/model@free": "chat"}
BIG_REQUEST = 25_000_000  # the test producer's max_request_size: room for the 20 MB message


@pytest.fixture
def stack(tmp_path):
    s = Stack(tmp_path, partitions=1).start()
    try:
        yield s
    finally:
        s.close()


async def _send(settings, messages) -> None:
    """Send ``(key, value)`` pairs in order (``value`` None: a tombstone) and wait for every ack."""
    from aiokafka import AIOKafkaProducer

    p = AIOKafkaProducer(bootstrap_servers=settings.kafka_bootstrap, acks="all", max_request_size=BIG_REQUEST,
                         linger_ms=5)
    await p.start()
    try:
        futures = [await p.send(settings.topics.requests, value, key=key) for key, value in messages]
        await asyncio.gather(*futures)
    finally:
        await p.stop()


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _metric(port: int, name: str) -> float:
    """One unlabelled sample of the worker's Prometheus endpoint (``CHANNEL_HEALTH_METRICS_PORT``)."""
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    return next(s.value for fam in text_string_to_metric_families(text) for s in fam.samples if s.name == name)


async def _read_dlq(settings, at_least: int = 0, timeout_s: float = 60.0) -> list[dict]:
    """Every record of the DLQ topic up to its end offsets (waiting up to ``timeout_s`` for ``at_least``)."""
    from aiokafka import AIOKafkaConsumer, TopicPartition

    c = AIOKafkaConsumer(bootstrap_servers=settings.kafka_bootstrap, group_id=None, enable_auto_commit=False,
                         fetch_max_bytes=64 * 1024 * 1024)
    await c.start()
    try:
        parts = c.partitions_for_topic(settings.topics.dlq) or set()
        if not parts:
            await c.force_metadata_update()
            parts = c.partitions_for_topic(settings.topics.dlq) or set()
        tps = [TopicPartition(settings.topics.dlq, p) for p in sorted(parts)]
        c.assign(tps)
        await c.seek_to_beginning(*tps)
        deadline = time.monotonic() + timeout_s
        out: list[dict] = []
        while True:
            ends = await c.end_offsets(tps)
            while [tp for tp in tps if await c.position(tp) < ends[tp]]:
                for msgs in (await c.getmany(*tps, timeout_ms=500)).values():
                    out += [json.loads(m.value) for m in msgs]
            if len(out) >= at_least or time.monotonic() > deadline:
                return out
            await asyncio.sleep(0.2)  # the worker has not published them all yet: poll the end offsets again
    finally:
        await c.stop()


def _verdict_channels(chdb_dir: Path) -> set[str]:
    (rows,) = query_chdb(chdb_dir, "SELECT DISTINCT channel FROM channel_health.channel_verdicts")
    return {r[0] for r in rows}


def test_poison_messages_and_a_restart_on_top_of_them_never_stop_the_worker(stack, tmp_path):
    """The 0x01 message of issue #16 and a 20 MB message, read twice: by a worker killed before it could
    commit anything (ClickHouse down, so no snapshot and no ack), then by its restart, which goes on to
    store and judge the traffic after them."""
    settings = stack.settings
    now = int(time.time() * 1000)
    start = now - now % 30_000 - 600_000
    first = {"event_id": "first", "ts_ms": start, "channel": "prov0/model@paid", "route": "chat", "status": "ok",
             "latency_ms": 100.0}
    flood, huge = b"\x01" * 200_000, b"\x01" * 20_000_000
    asyncio.run(_send(settings, [(b"prov0/model@paid", json.dumps(first).encode()), (b"k", flood), (b"k", huge)]))
    sink_down = tmp_path / "clickhouse-down"
    sink_down.write_text("down")
    w = stack.worker("w1", CHANNEL_HEALTH_FAULT_SINK_DOWN_FILE=str(sink_down))
    w.start()
    assert len(asyncio.run(_read_dlq(settings, at_least=2, timeout_s=90))) == 2, w.log_tail()
    assert w.alive, w.log_tail()
    w.kill()  # nothing acked: the restart reads all three messages again

    sink_down.unlink()
    w.start()
    after = steady_events(CHANNELS, start + 1_000, 120, per_s=1, seed=5)
    publish(settings, after)
    w.wait_drained(max(e["ts_ms"] for e in after), 120)
    dead = asyncio.run(_read_dlq(settings))
    assert w.alive and "stream agent failed" not in w.log(), w.log_tail()

    # Each poison message dead-lettered once per run, its record far under the producer's 1 MB limit.
    assert sorted((d["reason"], d["raw_size"]) for d in dead) == [
        ("invalid_json", 200_000), ("invalid_json", 200_000), ("too_large", 20_000_000), ("too_large", 20_000_000)]
    for d in dead:
        raw = flood if d["raw_size"] == 200_000 else huge
        assert (d["raw_encoding"], d["raw_truncated"]) == ("base64", True)
        assert d["raw_sha256"] == hashlib.sha256(raw).hexdigest()
        assert len(json.dumps(d)) < 300_000
    assert w.stop() == 0, w.log_tail()
    assert count_rows(w.chdb_dir)["final"] == 1 + len(after)
    assert _verdict_channels(w.chdb_dir) == set(CHANNELS)


WHOLE_BAD_KINDS = {"0x01 200 KB (issue #16)", "huge 0x01", "5 MB body", "binary", "control flood", "deep array",
                   "wrong shape", "empty", "invalid json"}


@pytest.mark.parametrize("messages,new_channels", [
    (10_000, 2_000),
    pytest.param(40_000, 20_000, marks=pytest.mark.slow, id="full-20000-new-channels"),
])
def test_hostile_corpus_every_input_stored_or_dead_lettered(stack, messages, new_channels):
    """>= 10,000 hostile messages through a live worker: no crash, inputs = stored rows + dead letters.

    The default form has 2,000 one-event channels; the slow one the issue's 20,000 among 40,000 messages."""
    settings = stack.settings
    now = int(time.time() * 1000)
    built = build_corpus(seed=16, now_ms=now, messages=messages, new_channels=new_channels)
    corpus = built.messages
    sentinel = {"event_id": "sentinel", "ts_ms": built.last_ts_ms + 1_000, "channel": "corpus0/model@free",
                "route": "chat", "status": "ok", "latency_ms": 100.0}
    assert len(corpus) >= 10_000
    port = _free_port()
    w = stack.worker("w1", CHANNEL_HEALTH_METRICS_PORT=str(port))
    w.start()
    started = time.monotonic()
    asyncio.run(_send(settings, [(m.key, m.value) for m in corpus] + [(b"s", json.dumps(sentinel).encode())]))
    w.wait_drained(sentinel["ts_ms"], 240)
    dead = asyncio.run(_read_dlq(settings))
    took_s = time.monotonic() - started
    dropped = _metric(port, "channel_health_duplicates_dropped_total")
    log = w.log()
    assert w.alive and "stream agent failed" not in log and "Traceback" not in log, w.log_tail()
    assert "refused by Kafka" not in log, w.log_tail()  # every dead letter fit the producer's limit
    assert w.stop() == 0, w.log_tail()
    rows = count_rows(w.chdb_dir)

    inputs = sum(m.elements for m in corpus) + 1
    by_reason = Counter(d["reason"] for d in dead)
    # A re-sent event_id within the dedup horizon is dropped (stored and counted once, issue #16 item 4): the
    # worker counts those; each was a "re-sent event_id" message of the corpus.
    resent = sum(1 for m in corpus if m.kind == "re-sent event_id")
    assert 0 < dropped <= resent, (dropped, resent)
    assert rows["final"] + len(dead) + dropped == inputs, (rows, by_reason, dropped, inputs)
    assert all(isinstance(d["reason"], str) and d["reason"].strip() and d["detail"].strip() for d in dead)
    assert INTERNAL_ERROR not in by_reason, [d["detail"] for d in dead if d["reason"] == INTERNAL_ERROR][:5]
    # Whole messages that cannot be an event are each one dead letter carrying their hash.
    whole = Counter(d["raw_sha256"] for d in dead if d["index"] is None)
    want = Counter(hashlib.sha256(m.value or b"").hexdigest() for m in corpus if m.kind in WHOLE_BAD_KINDS)
    assert not (want - whole), f"{sum((want - whole).values())} undecodable messages without a dead letter"
    # No bad event is ever stored.
    bad_ids = {i for m in corpus for i in m.bad_ids}
    assert not bad_ids & set(stored_event_ids(w.chdb_dir))
    print(f"corpus: {len(corpus)} messages, {inputs} inputs, {rows['final']} stored, {len(dead)} dead letters "
          f"{dict(by_reason)}, {took_s:.0f} s from first send to drained")

