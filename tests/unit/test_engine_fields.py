"""Fields read once per message (:class:`pipeline.engine.columns.EventFields`, joined per batch) change
nothing the engine does: the same verdicts byte for byte, the same late and refused events and the same
window state as fields read per batch (``Engine.process`` takes them from its caller, issue #31), on seeded streams that cross round boundaries out of order,
carry late events, optional fields present and absent, structure flags, and channels that are
evicted and restored or refused over the limit."""

from __future__ import annotations

import msgspec
import numpy as np
import pytest

from pipeline.config import StateLimits
from pipeline.contracts import RequestEvent
from pipeline.engine import Engine
from pipeline.engine.columns import EventFields
from pipeline.ingest.structure import resolve_onto
from pipeline.state.snapshot import export_channel
from pipeline.tools.bench import workload as W

START = 1_767_000_000_000 - 1_767_000_000_000 % 3_600_000


def _events(seed: int) -> list[RequestEvent]:
    """4 min of 30 channels, shuffled within ~40 s (rounds arrive out of order) and 1 % delayed 200 s
    (late), with failure bursts,
    optional fields dropped, structure flags, a silent stretch for a few channels (idle eviction) and
    late events."""
    rng = np.random.default_rng(seed)
    ch = W.Channels.make(30, seed=seed)
    raw = W.stream(ch, 9_000, START, 1.25, seed=seed + 1, id_prefix="f")
    out = []
    for e in raw:
        if e["channel"] in ch.names[:3] and rng.random() < 0.5:
            e["status"] = str(rng.choice(["error", "timeout", "rate_limited", "cancelled"]))
        if rng.random() < 0.2:
            for key in ("ttft_ms", "cost_usd", "output_tokens"):
                e.pop(key, None)
        if rng.random() < 0.1:
            e["quota_remaining"] = float(rng.random())
            e["max_stream_gap_ms"] = float(rng.integers(0, 40_000))
        if rng.random() < 0.1:
            e["expected_fields"] = ["a", "b"]
            e["missing_fields"] = ["b"] if rng.random() < 0.5 else []
            e["parse_ok"] = bool(rng.random() < 0.9)
        if e["channel"] in ch.names[3:6] and START + 60_000 < e["ts_ms"] < START + 200_000:
            continue  # silent long enough to be evicted (evict_idle_ms below), then back
        out.append(e)
    delay = rng.integers(0, 40_000, len(out))
    delay[rng.random(len(out)) < 0.01] = 200_000  # arrive after the allowed lateness (120 s): late
    order = np.argsort(np.array([e["ts_ms"] for e in out]) + delay, kind="stable")
    events = [msgspec.convert(out[i], RequestEvent) for i in order.tolist()]
    resolve_onto(events)  # what the decoder does before anything reads the events
    return events


def _run(events: list[RequestEvent], sizes: list[int], with_fields: bool) -> tuple[list[bytes], list, Engine]:
    eng = Engine(limits=StateLimits(max_channels=28, evict_idle_ms=90_000))
    verdicts: list[bytes] = []
    other: list = []
    i = 0
    for size in sizes:
        batch = events[i:i + size]
        # per batch, or per message and joined (as the stream processor reads them while decoding)
        fields = eng.read_fields(batch) if with_fields else EventFields.concat([eng.read_fields([e]) for e in batch])
        res = eng.process(batch, fields=fields)  # one stream: each round boundary reached advances all
        verdicts.extend(msgspec.json.encode(v) for v in res.verdicts)
        other.append(([e.event_id for e in res.late], [e.event_id for e in res.refused],
                      [e.event_id for e in res.accepted], res.structure))
        i += size
    return verdicts, other, eng


@pytest.mark.parametrize("seed", range(3))
def test_fields_read_once_give_the_same_verdicts_and_state(seed):
    events = _events(seed)
    rng = np.random.default_rng(seed + 10)
    sizes, left = [], len(events)
    while left:
        sizes.append(min(left, int(rng.choice([1, 7, 300, 2500]))))
        left -= sizes[-1]
    plain, plain_other, eng_p = _run(events, sizes, False)
    read, read_other, eng_r = _run(events, sizes, True)
    assert sum(b'"open"' in v for v in plain) >= 2 and len(plain) > 60
    assert read == plain and read_other == plain_other
    late = sum(len(o[0]) for o in plain_other)
    refused = sum(len(o[1]) for o in plain_other)
    assert late > 0 and refused > 0 and eng_p.residency.returns > 0  # late events, refusals and restores were exercised
    assert eng_r.residency.returns == eng_p.residency.returns
    assert [export_channel(eng_r, i) for i in range(eng_r.store.n_channels)] == \
        [export_channel(eng_p, i) for i in range(eng_p.store.n_channels)]


def test_fields_concat_and_take_keep_every_column_aligned():
    events = _events(5)[:50]
    whole = EventFields.read(events, ("cost_usd", "quota_remaining"))
    parts = EventFields.concat([EventFields.read(events[:20], ("cost_usd", "quota_remaining")),
                                EventFields.read(events[20:], ("cost_usd", "quota_remaining"))])
    index = np.array([7, 3, 49, 0])
    for got in (parts, whole.take(np.arange(50))):
        for name in ("ts_ms", "code", "latency_ms"):
            assert np.array_equal(getattr(got, name), getattr(whole, name))
        assert (got.event_id, got.channel, got.route, got.tier, got.parse_ok) == \
            (whole.event_id, whole.channel, whole.route, whole.tier, whole.parse_ok)
        assert got.optional.keys() == {"cost_usd", "quota_remaining"}
        for k, v in got.optional.items():
            assert np.array_equal(v, whole.optional[k], equal_nan=True)
    picked = whole.take(index)
    assert picked.event_id == [events[i].event_id for i in index.tolist()]
    assert picked.ts_ms.tolist() == [events[i].ts_ms for i in index.tolist()]
    assert np.array_equal(picked.optional["cost_usd"],
                          np.array([np.nan if events[i].cost_usd is None else events[i].cost_usd
                                    for i in index.tolist()]), equal_nan=True)
    one = whole.take(np.array([12]))
    assert (one.channel, one.event_id, len(one)) == ([events[12].channel], [events[12].event_id], 1)
    assert len(whole.take(np.array([], np.int64))) == 0 and whole.take(np.array([], np.int64)).route == []


def test_fields_refuse_unknown_columns_mismatched_parts_and_lengths():
    events = _events(6)[:10]
    with pytest.raises(ValueError, match="unknown optional columns"):
        EventFields.read(events, ("cost",))
    with pytest.raises(ValueError, match="at least one part"):
        EventFields.concat([])
    with pytest.raises(ValueError, match="different optional columns"):
        EventFields.concat([EventFields.read(events, ("cost_usd",)), EventFields.read(events, ())])
    with pytest.raises(ValueError, match="fields hold 9 events, the batch 10"):
        Engine().process(events, fields=EventFields.read(events[:9]))
