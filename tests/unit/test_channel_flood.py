"""No lockout (issue #34 part 2, SPEC §8 "Scale"): a flood of new channel names never locks out a real channel.

Over ``max_channels`` resident channels, a new channel evicts the least-recently-seen channels idle for
``evict_horizon_ms`` to snapshots first (they return exactly); only a table full of channels active within
the horizon, or ``held_limit`` channels held in all, refuses it, counted per name prefix.
"""

from __future__ import annotations

import logging

import msgspec
import pytest

from pipeline.config import ConfigError, StateLimits, load_settings
from pipeline.contracts import RequestEvent
from pipeline.engine import Engine
from pipeline.engine.batch import BatchProcessor
from pipeline.ingest.prefix_counts import OTHER_PREFIX, PrefixCounts
from pipeline.policy.defaults import PolicyConfig

T0 = 1_780_000_000_000 - 1_780_000_000_000 % 3_600_000
S = 1_000
MIN = 60_000
ENC = msgspec.json.Encoder()


def _ev(i: int, ts: int, channel: str, route: str = "r", latency: float = 100.0) -> RequestEvent:
    return RequestEvent(event_id=f"{channel}-{i}", ts_ms=ts, channel=channel, route=route, status="ok",
                        latency_ms=latency)


def _traffic(channel: str, start: int, end: int, every_ms: int, latency: float) -> list[RequestEvent]:
    return [_ev(k, t, channel, "r-" + channel, latency + (k % 7) * 10) for k, t in
            enumerate(range(start, end, every_ms))]


def _run(limits: StateLimits) -> tuple[Engine, list]:
    """x: 20 min of traffic, 15 min quiet, 20 min back; y keeps sending throughout; z (new) arrives while x is
    quiet. With ``max_channels=2``, z evicts x (quiet 10 min > the 5 min horizon); x, held, comes back although
    y and z are active (a held channel is never refused: one over the limit until room is made)."""
    engine = Engine(PolicyConfig(no_data_heartbeat_ms=0), limits)
    x = _traffic("x", T0, T0 + 20 * MIN, 2 * S, 100.0) + _traffic("x", T0 + 35 * MIN, T0 + 55 * MIN, 2 * S, 400.0)
    z = _traffic("z", T0 + 30 * MIN, T0 + 55 * MIN, 5 * S, 90.0)
    events = sorted(x + z + _traffic("y", T0, T0 + 55 * MIN, 5 * S, 80.0), key=lambda e: e.ts_ms)
    verdicts = []
    for k in range(0, len(events), 50):
        batch = events[k:k + 50]
        verdicts += engine.process(batch, low_watermark_ms=batch[-1].ts_ms, fields=engine.read_fields(batch)).verdicts
    return engine, verdicts


def test_a_channel_evicted_to_make_room_returns_with_identical_verdicts() -> None:
    free, free_verdicts = _run(StateLimits())
    tight, tight_verdicts = _run(StateLimits(max_channels=2))
    assert free.residency.evictions == 0 and tight.residency.pressure_evictions == 1  # x, quiet for 10 min
    assert tight.residency.returns == 1 and not tight.residency.evicted and not tight.residency.refused_count
    for name in ("x", "y", "z"):
        got = [msgspec.to_builtins(v) for v in tight_verdicts if v.channel == name]
        want = [msgspec.to_builtins(v) for v in free_verdicts if v.channel == name]
        if name == "x":  # while evicted (30..35 min) x is not evaluated: its no_data rounds there are missing
            gap = [v for v in want if T0 + 30 * MIN < v["ts_ms"] < T0 + 35 * MIN]
            assert [v["state"] for v in gap] == ["no_data"] * len(gap)
            want = [v for v in want if v not in gap]
            assert len([v for v in got if v["ts_ms"] >= T0 + 35 * MIN]) == 39  # back: rounds 35.5 .. 54.5 min
        assert got == want


@pytest.mark.parametrize("flood", [2_000, pytest.param(20_000, marks=pytest.mark.slow, id="full-20000-names")])
def test_a_real_channel_arriving_after_a_flood_of_names_gets_its_verdict(caplog: pytest.LogCaptureFixture,
                                                                           flood: int) -> None:
    """3 real channels, then ``flood`` junk names in one minute, with room for ``flood`` channels in memory
    (the full form: the default limits, 20,000; the reduced one 2,000, ~10x faster). During the flood the
    table is full of channels active within the 5 min horizon: the last 3 junk names are refused and counted
    under their prefix. A real channel new 6 min later takes the place of the least recently seen junk
    channel and gets its verdict at its first round. (On main it was refused: the flood's names held the
    table for good.)"""
    now = T0 + 2 * 3_600_000
    limits = StateLimits() if flood == 20_000 else StateLimits(max_channels=flood)
    proc = BatchProcessor(Engine(limits=limits), clock_ms=lambda: now)
    real = [msgs for name in ("openai/a", "openai/b", "anthropic/c") for msgs in
            [ENC.encode({"events": [_ev(k, T0 + k * S, name) for k in range(60)]})]]
    out = proc.process(real, [0] * 3, [0, 1, 2])
    junk = [_ev(i, T0 + 60 * S + i * 60 * S // flood, f"junk-{i:05d}", "junk") for i in range(flood)]
    offset = 3
    with caplog.at_level(logging.WARNING, logger="pipeline.engine.batch"):
        for k in range(0, flood, flood // 10):
            out = proc.process([ENC.encode({"events": junk[k:k + flood // 10]})], [0], [offset])
            offset += 1
    assert proc.refused == 3 and proc.refused_by_prefix.counts == {"junk": 3}
    assert [d.event_id for d in out.dead_letters] == [f"junk-{i:05d}-{i}" for i in range(flood - 3, flood)]
    assert "refused by name prefix, top 5: 'junk': 3" in caplog.text
    assert proc.engine.n_resident == flood and proc.engine.residency.pressure_evictions == 0
    # 5 min after the flood the real channels send again; 10 s later a new real one arrives (room is made at
    # the event time the input reached before its batch: the flood's channels are quiet for the horizon then)
    t1 = T0 + 7 * MIN
    later = [_ev(1000 + k, t1 + k * S, name) for k in range(45) for name in ("openai/a", "openai/b", "anthropic/c",
                                                                             "mistral/new")[:3 + (k >= 10)]]
    verdicts = []
    for k in range(0, len(later), 20):
        res = proc.process([ENC.encode({"events": later[k:k + 20]})], [0], [offset])
        offset += 1
        assert not res.dead_letters
        verdicts += res.verdicts
    assert proc.engine.residency.pressure_evictions == 1
    assert proc.engine.residency.evicted.keys() == {"junk-00000"}  # the least recently seen
    new = [v for v in verdicts if v.channel == "mistral/new"]
    assert [(v.ts_ms, v.state) for v in new] == [(t1 + 30 * S, "healthy")]  # its first round
    assert proc.refused == 3  # nothing more refused


def test_a_table_of_active_channels_refuses_and_the_held_limit_bounds_the_evicted() -> None:
    limits = StateLimits(max_channels=2, evict_horizon_ms=MIN, max_held_channels=3)
    proc = BatchProcessor(Engine(limits=limits), clock_ms=lambda: T0 + 3_600_000)
    proc.process([ENC.encode(_ev(0, T0, "a/1")), ENC.encode(_ev(1, T0 + S, "b/1"))])
    out = proc.process([ENC.encode(_ev(2, T0 + 30 * S, "c/1"))])  # a/1 quiet 30 s < 1 min: active, no room
    assert [d.reason for d in out.dead_letters] == ["too_many_channels"] and "limit of 2 channels" in \
        out.dead_letters[0].detail
    out = proc.process([ENC.encode(_ev(3, T0 + 2 * MIN, "c/1"))])  # a/1 and b/1 quiet 2 min: a/1 evicted
    assert not out.dead_letters and proc.engine.residency.evicted.keys() == {"a/1"}
    out = proc.process([ENC.encode(_ev(4, T0 + 5 * MIN, "d/1"))])  # room in memory, but 3 held in all
    assert [d.event_id for d in out.dead_letters] == ["d/1-4"] and proc.engine.store.n_channels == 3
    assert proc.refused_by_prefix.counts == {"c": 1, "d": 1}


def test_prefix_counts_are_bounded() -> None:
    c = PrefixCounts(max_prefixes=3)
    c.add([f"p{i}/m" for i in range(10)] + ["p0/x"])
    assert c.counts == {"p0": 2, "p1": 1, "p2": 1, OTHER_PREFIX: 7}
    with pytest.raises(ValueError):
        PrefixCounts(0)


def test_the_horizon_and_held_limit_are_read_from_the_environment() -> None:
    env = {"CHANNEL_HEALTH_EVICT_HORIZON_S": "120", "CHANNEL_HEALTH_MAX_HELD_CHANNELS": "30000"}
    got = load_settings(env).state_limits
    assert (got.evict_horizon_ms, got.max_held_channels, got.held_limit) == (120_000, 30_000, 30_000)
    assert StateLimits().held_limit == 60_000 and StateLimits().evict_horizon_ms == 300_000
    with pytest.raises(ConfigError, match="MAX_HELD_CHANNELS must be >= CHANNEL_HEALTH_MAX_CHANNELS"):
        load_settings({"CHANNEL_HEALTH_MAX_HELD_CHANNELS": "100"})
    with pytest.raises(ConfigError, match="EVICT_HORIZON_S must be an integer >= 0"):
        load_settings({"CHANNEL_HEALTH_EVICT_HORIZON_S": "-1"})
