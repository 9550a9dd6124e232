"""The paced stage's pre-built feed (pipeline.tools.bench.schedule): the live feeder's events and timing."""

from __future__ import annotations

import msgspec
import pytest

from pipeline.tools.bench import workload as W
from pipeline.tools.bench.fill import partition_of
from pipeline.tools.bench.schedule import paced_schedule

START = 1_700_000_000_000


def _events(v: bytes) -> list[dict]:
    return msgspec.json.decode(v)["events"]


def test_schedule_offers_rate_times_elapsed_events_at_speed():
    ch = W.Channels.make(40)
    # 2,000 events/s for 1 s, event time 20x: ticks every 20 ms (0.00 .. 0.98 s), flushes every 100 ms
    ticks = paced_schedule(ch, START, 2_000.0, 1.0, 20.0, partitions=4, batch_size=50)
    offsets = [t.offset_s for t in ticks]
    assert offsets == sorted(offsets) and offsets[0] == pytest.approx(0.02) and offsets[-1] == pytest.approx(0.98)
    assert sum(t.events for t in ticks) == int(2_000.0 * 0.98)  # int(rate * t) at the last tick: 1,960
    for t in ticks:  # each tick builds the events due by int(rate * t) (40 per 20 ms)
        assert t.events == 40
    sent = [e for t in ticks for _, v, _ in t.messages for e in _events(v)]
    ids = [int(e["event_id"].split("-")[1]) for e in sent]
    assert len(set(ids)) == len(ids)
    # the events after the last flush (0.90 s) stay unsent, as the live feeder left them: at most 4 ticks' worth
    assert 1_960 - 4 * 40 <= len(sent) <= 1_960
    for t in ticks:
        ev_now = START + int(t.offset_s * 20.0 * 1000)
        for p, v, mts in t.messages:
            evs = _events(v)
            assert mts == max(e["ts_ms"] for e in evs) and mts < max(ev_now, START + 1)
            assert {partition_of(e["channel"], 4) for e in evs} == {p}
            assert len(evs) <= 50


def test_schedule_flushes_every_100_ms_and_sends_full_envelopes_at_once():
    ch = W.Channels.make(40)
    ticks = paced_schedule(ch, START, 2_000.0, 1.0, 20.0, partitions=4, batch_size=50)
    # partly filled envelopes (< 50 events) only at the flush ticks 0.1, 0.2, ... 0.9 s
    partial_at = {round(t.offset_s, 2) for t in ticks for _, v, _ in t.messages if len(_events(v)) < 50}
    assert partial_at == {0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9}
    # per partition, event times never go back (a channel's events stay in order)
    last = [0] * 4
    for t in ticks:
        for p, v, _ in t.messages:
            ts = [e["ts_ms"] for e in _events(v)]
            assert ts == sorted(ts) and ts[0] >= last[p]
            last[p] = ts[-1]


def test_schedule_is_deterministic_and_checks_its_arguments():
    ch = W.Channels.make(10)
    a = paced_schedule(ch, START, 500.0, 0.5, 20.0, partitions=2, batch_size=20)
    b = paced_schedule(ch, START, 500.0, 0.5, 20.0, partitions=2, batch_size=20)
    assert a == b
    with pytest.raises(ValueError, match="rate"):
        paced_schedule(ch, START, 0.0, 0.5, 20.0, partitions=2, batch_size=20)
