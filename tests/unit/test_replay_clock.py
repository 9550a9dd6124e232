"""CHANNEL_HEALTH_MAX_EVENT_AGE and replay mode (CHANNEL_HEALTH_CLOCK=event): old data on its own clock (SPEC §7)."""

from __future__ import annotations

import json

from pipeline.config import Settings
from pipeline.ingest.decode import Decoder
from pipeline.engine.batch import BatchProcessor

NOW = 1_780_000_000_000  # the wall clock of these tests
DAY = 86_400_000
YEAR_AGO = NOW - 365 * DAY


def _raw(i: int, ts_ms: int, channel: str = "lepton/llama-70b@free") -> bytes:
    return json.dumps({"event_id": f"e{i}", "ts_ms": ts_ms, "channel": channel, "route": "chat-70b", "status": "ok",
                       "latency_ms": 180.5}).encode()


def _batch(first: int, ts_ms: list[int]) -> bytes:
    return json.dumps({"events": [json.loads(_raw(first + k, t)) for k, t in enumerate(ts_ms)]}).encode()


def test_age_clock_replaces_now_for_the_age_bound_only():
    dec = Decoder(max_age_ms=7 * DAY)
    assert dec.decode(_raw(1, YEAR_AGO), NOW).dead_letters[0].reason == "ts_too_old"
    dec.age_clock_ms = YEAR_AGO + DAY
    assert [e.event_id for e in dec.decode(_raw(2, YEAR_AGO), NOW).events] == ["e2"]
    (dead,) = dec.decode(_raw(3, YEAR_AGO - 7 * DAY), NOW).dead_letters
    assert (dead.reason, dead.detail) == ("ts_too_old", f"ts_ms: {YEAR_AGO - 7 * DAY} is 8.0 days behind the event "
                                                        f"clock {YEAR_AGO + DAY} (limit 7.0 days)")
    # the future bound stays on the wall clock
    assert dec.decode(_raw(4, NOW + 2 * 3_600_000), NOW).dead_letters[0].reason == "ts_in_future"


def _processor(**env_like) -> BatchProcessor:
    settings = Settings(kafka_bootstrap=None, clickhouse_url="chdb:///x", **env_like)
    return BatchProcessor.for_settings(settings)


def _replace_clock(p: BatchProcessor) -> BatchProcessor:
    p.clock_ms = lambda: NOW
    return p


def test_wall_clock_worker_dead_letters_a_year_old_hour():
    p = _replace_clock(_processor())
    out = p.process([_batch(0, [YEAR_AGO + k * 60_000 for k in range(60)])])
    assert (len(out.stored) + sum(n for _, n in out.envelopes), {d.reason for d in out.dead_letters}) == (0, {"ts_too_old"})
    assert len(out.dead_letters) == 60


def test_replay_worker_takes_a_year_old_hour_on_its_own_clock():
    p = _replace_clock(_processor(clock="event", max_event_age_ms=2 * DAY))
    assert p.event_time_ms == 0
    out = p.process([_batch(0, [YEAR_AGO + k * 60_000 for k in range(60)])])
    assert out.dead_letters == []
    assert sum(n for _, n in out.envelopes) + len(out.stored) == 60
    assert p.event_time_ms == YEAR_AGO + 59 * 60_000
    # the bound (2 days, CHANNEL_HEALTH_MAX_EVENT_AGE) now runs from the replay's newest event
    out = p.process([_raw(100, YEAR_AGO - 2 * DAY), _raw(101, YEAR_AGO + 3_600_000)])
    assert [(d.reason, d.event_id) for d in out.dead_letters] == [("ts_too_old", "e100")]
    assert p.event_time_ms == YEAR_AGO + 3_600_000


def test_max_event_age_setting_reaches_the_worker_decoder():
    p = _replace_clock(_processor(max_event_age_ms=30 * DAY))
    assert p.decoder.max_age_ms == 30 * DAY and p.event_clock is False
    out = p.process([_raw(1, NOW - 20 * DAY), _raw(2, NOW - 31 * DAY)])
    assert [(d.reason, d.event_id) for d in out.dead_letters] == [("ts_too_old", "e2")]
