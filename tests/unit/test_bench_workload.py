"""Synthetic traffic and topic filling of the benchmark (pipeline.tools.bench.workload / fill / run options)."""

from __future__ import annotations

import msgspec
import numpy as np
import pytest
from aiokafka.partitioner import DefaultPartitioner

from pipeline.tools.bench import workload as W
from pipeline.tools.bench.fill import PartitionBatcher, partition_of, single_messages
from pipeline.tools.bench.run import BenchOptions, measure_start_ms, median_run
from pipeline.contracts import RequestEvent
from pipeline.ingest.decode import Decoder

H = 3_600_000


def test_events_are_valid_contract_events():
    ch = W.Channels.make(50)
    start = measure_start_ms()
    evs = W.stream(ch, 2_000, start, 10.0)
    assert [e["ts_ms"] for e in evs] == sorted(e["ts_ms"] for e in evs)
    assert len({e["event_id"] for e in evs}) == len(evs)
    batcher = PartitionBatcher(4, 500)
    msgs = batcher.add(evs) + batcher.flush()
    dec = Decoder()
    got = [dec.decode(v, start + 60_000) for _, v in msgs]
    assert sum(len(r.events) for r in got) == len(evs)
    assert not any(r.dead_letters for r in got)
    assert {e["channel"] for e in evs} <= set(ch.names)


def test_stream_chunks_equal_one_stream():
    ch = W.Channels.make(10)
    whole = W.stream(ch, 250, 0, 5.0)
    parts = [e for c in W.stream_chunks(ch, 250, 0, 5.0, chunk=100) for e in c]
    assert [e["event_id"] for e in whole] == [e["event_id"] for e in parts]
    assert W.span_ms(1_000_000, 1_000, 10.0) == 100_000.0


def test_partition_matches_kafka_default_partitioner():
    for name in W.Channels.make(40).names:
        assert partition_of(name, 4) == DefaultPartitioner()(name.encode(), [0, 1, 2, 3], [0, 1, 2, 3])


def test_batcher_keeps_a_channel_in_one_partition_in_order():
    ch = W.Channels.make(30)
    evs = W.stream(ch, 3_000, 0, 10.0)
    b = PartitionBatcher(3, 100)
    msgs = b.add(evs) + b.flush()
    assert all(len(msgspec.json.decode(v)["events"]) <= 100 for _, v in msgs)
    seen: dict[str, tuple[int, int]] = {}
    for p, v in msgs:
        for e in msgspec.json.decode(v)["events"]:
            prev = seen.get(e["channel"])
            assert prev is None or (prev[0] == p and prev[1] <= e["ts_ms"])
            seen[e["channel"]] = (p, e["ts_ms"])
    assert sum(b.events_per_partition) == 3_000
    singles = list(single_messages(evs[:50], 3))
    assert all(p == seen[msgspec.json.decode(v, type=RequestEvent).channel][0] for p, _k, v in singles)


def test_warmup_day_fills_24_hours_then_a_lead_in():
    ch = W.Channels.make(5)
    end = 100 * H + 300_000
    batches = list(W.warmup_day(ch, end, per_hour=3, lead_in=2))
    assert len(batches) == 25
    hours = [{e["ts_ms"] // H for e in b} for b in batches[:24]]
    assert hours == [{100 - h} for h in range(24, 0, -1)]
    lead = [e["ts_ms"] for e in batches[24]]
    assert all(end - 60_000 <= t < end for t in lead) and len(lead) == 10
    assert all(len(b) == 15 for b in batches[:24])
    with pytest.raises(ValueError):
        list(W.warmup_day(ch, 100 * H + 1_000))


def test_options_validate():
    BenchOptions().validate()
    BenchOptions.quick().validate()
    with pytest.raises(ValueError):
        BenchOptions(single_events=10, events=5).validate()
    with pytest.raises(ValueError):
        BenchOptions(rps_per_channel=0).validate()
    with pytest.raises(ValueError, match="--repeat must be 1..9, got 0"):
        BenchOptions(repeat=0).validate()
    BenchOptions(paced_rate=20_000.0).validate()
    with pytest.raises(ValueError):
        BenchOptions(paced_rate=0.0).validate()
    assert measure_start_ms(10 * H + 5) == 8 * H + 300_000


def test_channels_are_deterministic():
    a, b = W.Channels.make(20, seed=3), W.Channels.make(20, seed=3)
    assert a.names == b.names and np.array_equal(a.median_ms, b.median_ms)
    assert len(set(a.routes)) == 4 and set(a.tiers) == {"free", "paid"}



def test_median_run_of_the_ceiling_keeps_the_median_batched_run_and_every_rate():
    runs = [{"batched": {"events_per_s": r}, "single": {"events_per_s": r / 2}} for r in (5.0, 9.0, 7.0)]
    kept = median_run(runs)
    assert kept["batched"] == {"events_per_s": 7.0, "runs_events_per_s": [5.0, 9.0, 7.0]}
    assert kept["single"] == {"events_per_s": 3.5, "runs_events_per_s": [2.5, 4.5, 3.5]}


def test_median_run_keeps_every_runs_peak_rss():
    runs = [{"events_per_s": r, "peak_rss_mb": m} for r, m in ((5.0, 700.0), (9.0, 650.0), (7.0, 760.0))]
    kept = median_run(runs)
    assert (kept["events_per_s"], kept["peak_rss_mb"], kept["runs_peak_rss_mb"]) == (7.0, 760.0, [700.0, 650.0, 760.0])
