"""BatchProcessor over partitioned input: a backlog read from several
partitions at different speeds gives the same verdicts as the in-order replay.

During a backlog replay Kafka partitions drift apart by hours of event time;
event time is kept per channel and the low watermark across partitions only
drives idle channels, so the interleaving must not change any verdict.
"""

from __future__ import annotations

import random
import zlib
from collections import defaultdict

import msgspec
import pytest

from pipeline.engine.replay import replay
from pipeline.tools.simulate.scenarios import get_scenario
from pipeline.tools.simulate.traces import DataNotFoundError
from pipeline.engine.batch import BatchProcessor

START_MS = 1_780_000_000_000 - 1_780_000_000_000 % 3_600_000
_enc = msgspec.json.Encoder()


def _messages_by_partition(events: list[dict], n_partitions: int, span_ms: int = 10_000) -> dict[int, list[bytes]]:
    """Batch envelopes as :class:`pipeline.kafka.producer.BatchingProducer` makes them, keyed by channel."""
    parts: dict[int, list[bytes]] = defaultdict(list)
    bufs: dict[str, list[dict]] = defaultdict(list)
    first = None

    def publish(ch: str) -> None:
        batch = bufs.pop(ch, [])
        if batch:
            parts[zlib.crc32(ch.encode()) % n_partitions].append(_enc.encode({"events": batch}))

    for e in events:
        if first is None:
            first = e["ts_ms"]
        elif e["ts_ms"] - first >= span_ms:
            for ch in list(bufs):
                publish(ch)
            first = e["ts_ms"]
        bufs[e["channel"]].append(e)
        if len(bufs[e["channel"]]) >= 500:
            publish(e["channel"])
    for ch in list(bufs):
        publish(ch)
    return parts


def _transitions(verdicts) -> dict[str, list[tuple[str, int]]]:
    out: dict[str, list[tuple[str, int]]] = defaultdict(list)
    for v in sorted(verdicts, key=lambda v: (v.channel, v.seq)):
        if not out[v.channel] or out[v.channel][-1][0] != v.state:
            out[v.channel].append((v.state, v.ts_ms))
    return dict(out)


@pytest.mark.parametrize("seed", [1, 2])
def test_skewed_partitions_give_the_in_order_verdicts(seed):
    try:
        events = list(get_scenario("recovery").events(start_ms=START_MS, seed=0))
    except DataNotFoundError as exc:
        pytest.skip(f"shared data folder absent: {exc}")
    _, reference = replay(events)
    parts = _messages_by_partition(events, 4)
    assert len(parts) >= 2
    rng = random.Random(seed)
    bp = BatchProcessor(clock_ms=lambda: START_MS + 3 * 3_600_000)
    pos = {p: 0 for p in parts}
    verdicts = []
    while any(pos[p] < len(parts[p]) for p in parts):
        raws, owners = [], []
        for p in parts:  # each fetch takes a random, uneven share of every partition
            n = rng.choice([0, 0, 5, 50, 300])
            chunk = parts[p][pos[p]:pos[p] + n]
            pos[p] += len(chunk)
            raws += chunk
            owners += [p] * len(chunk)
        bp.set_partition_status({p: pos[p] >= len(parts[p]) for p in parts})
        verdicts += bp.process(raws, owners).verdicts
    assert bp.engine.late_count == 0
    assert bp.counters.snapshot().get("dead_letters", 0) == 0
    got, want = _transitions(verdicts), _transitions(reference)
    assert got == want
    # The outage channel really went through the breaker.
    assert [s for s, _ in got["together/llama-8b@paid"]][:3] == ["healthy", "open", "half_open"]


def test_tombstones_are_dead_lettered_as_empty_messages_and_partitions_are_noted():
    def ev(i: int, channel: str, ts: int) -> bytes:
        return _enc.encode({"event_id": f"e{i}", "ts_ms": ts, "channel": channel, "route": "r", "status": "ok",
                            "latency_ms": 100.0})

    bp = BatchProcessor(clock_ms=lambda: START_MS)
    out = bp.process([ev(1, "a", START_MS - 5_000), None, ev(2, "b", START_MS - 1_000), ev(3, "a", START_MS - 2_000)],
                     [2, 0, 3, 2], [10, 4, 7, 11])
    assert [d.reason for d in out.dead_letters] == ["empty_message"]
    assert [row[0].event_id for row in out.stored] == ["e1", "e2", "e3"]  # arrival order within a round
    assert bp.input_partition == {"a": 2, "b": 3}
    assert {p: ts for p, (ts, _) in bp.partition_wm.items()} == {2: START_MS - 2_000, 3: START_MS - 1_000}
    assert [(name, part) for name, _, _, part in bp.snapshot_records({2: 11, 3: 7})] == [("a", 2), ("b", 3)]


def _env(*events: dict) -> bytes:
    return _enc.encode({"events": list(events)})


def _ev(i: int, ts_ms: int, **extra) -> dict:
    return {"event_id": f"e{i}", "ts_ms": ts_ms, "channel": f"c{i % 3}", "route": "r", "status": "ok",
            "latency_ms": 10.0, **extra}


def test_clean_envelopes_are_stored_as_they_came_and_the_rest_as_rows():
    """Only envelopes whose every event is accepted unchanged and none late go to ``envelopes``; every
    other accepted event is a row of ``stored``, and each event is stored exactly once."""
    now = 1_780_000_000_000
    proc = BatchProcessor(clock_ms=lambda: now)
    t = now - 3_600_000
    proc.process([_env(*(_ev(i, t + i) for i in range(3)))])  # channels c0..c2 seen at t
    clean = _env(_ev(10, t + 100), _ev(11, t + 101, missing_fields=[], expected_fields=["a"]))
    bad_element = _env(_ev(12, t + 102), {"event_id": "e13"})                       # e13 is dead-lettered
    texts = _env(_ev(14, t + 103, response_text='{"a": 1}', expected_fields=["a"]))  # checked here: as rows
    escaped = _enc.encode({"events": [_ev(15, t + 104, gateway_id="gé")]}).replace("é".encode(), b"\\u00e9")
    late = _env(_ev(16, t + 105), _ev(18, t - 200_000))                             # e18: 200 s behind c0
    single = _enc.encode(_ev(17, t + 106))
    out = proc.process([clean, bad_element, texts, escaped, late, single])
    assert out.envelopes == [(clean, 2)]
    assert sorted(row[0].event_id for row in out.stored) == ["e12", "e14", "e15", "e16", "e17"]
    assert [(d.reason, d.event_id) for d in out.dead_letters] == [("missing_field", "e13"), ("late_event", "e18")]
    assert next(row[1:] for row in out.stored if row[0].event_id == "e14") == (True, [])


def test_no_envelope_is_passed_while_restored_state_may_cover_input():
    """Right after a restore some events of a message may be in a snapshot already (stored as rows
    without counting): the batch's envelopes are then all stored as rows."""
    now = 1_780_000_000_000
    t = now - 3_600_000
    warm = BatchProcessor(clock_ms=lambda: now)
    warm.process([_env(_ev(0, t))], [0], [5])
    from pipeline.state.snapshot import export_channel

    proc = BatchProcessor(clock_ms=lambda: now)
    proc.load_snapshots({"c0": (export_channel(warm.engine, warm.engine.store.index["c0"]), {0: 5}, 0)}, {0})
    msg = _env(_ev(3, t + 10), _ev(6, t + 11))
    out = proc.process([msg], [0], [5])  # offset 5: covered by the snapshot
    assert out.envelopes == [] and sorted(row[0].event_id for row in out.stored) == ["e3", "e6"]
    later = _env(_ev(7, t + 12), _ev(8, t + 13))  # new event ids: a message's ids are counted once
    out = proc.process([later], [0], [6])
    assert out.envelopes == [(later, 2)] and out.stored == []


def test_a_snapshot_capture_encodes_the_state_at_capture_time_whatever_is_processed_after():
    """Issue #15: the worker encodes snapshots in a thread from a copy taken between batches; the bytes
    must be those of the state at the copy, not of the state the engine has moved on to meanwhile."""
    from pipeline.state.snapshot import decode_snapshot

    now = 1_780_000_000_000
    t = now - 3_600_000
    proc = BatchProcessor(clock_ms=lambda: now)
    proc.process([_env(*(_ev(i, t + i, status="ok" if i % 2 else "error") for i in range(30)))], [1], [5])
    expected = proc.snapshot_records({1: 5})
    encode = proc.snapshot_capture({1: 5})
    proc.process([_env(*(_ev(i, t + 60_000 + i, status="error", latency_ms=900.0) for i in range(100, 160)))],
                 [1], [6])
    later = proc.snapshot_records({1: 6})
    got = encode()
    assert got == expected
    assert [(name, cov, part) for name, _, cov, part in got] == [(f"c{i}", {1: 5}, 1) for i in range(3)]
    assert [blob for _, blob, _, _ in later] != [blob for _, blob, _, _ in got]  # the engine did move on
    assert [decode_snapshot(blob).last_ts_ms for _, blob, _, _ in got] == [t + 27, t + 28, t + 29]
