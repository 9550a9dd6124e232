"""Issue #30 item 1, SPEC §8: one gateway's clock (or one hostile timestamp) cannot move other channels' clock.

:class:`BatchProcessor` is driven as the worker drives it: per input partition, every partition caught up
(:meth:`BatchProcessor.set_partition_status`, so the low watermark is the newest event time delivered), and
an injected wall clock that follows the honest traffic. Channels A (paid; 10 % failures from ``FAIL_AT``) and
B are honest; the reference is the same traffic without the hostile channel: A's and B's verdicts must be
exactly the reference's.

Rule for a slow clock (test (b)): a channel whose events keep arriving stamped behind the low watermark is
evaluated on its own event time and does not hold the others back at all (the low watermark of caught-up
partitions is the newest event time delivered, at most the clock plus ``max_clock_skew_ms``); once nothing
of it has arrived for ``no_data_after_ms`` of low watermark it is reported ``no_data``.
"""

from __future__ import annotations

import json
import logging

import pytest
from hypothesis import given, settings, strategies as st

from pipeline.config import ConfigError, load_settings
from pipeline.contracts import encode
from pipeline.engine.batch import BatchProcessor

T0 = 1_780_000_200_000 - 1_780_000_200_000 % 30_000  # a round boundary
#: One batch per 30 s of wall clock, ending on a round boundary: an event up to the 5 s skew ahead may move
#: the low watermark that far (the contract), which then crosses no round boundary before honest input does.
STEP_MS = 30_000
PER_BATCH = 300  # events per channel and batch (10/s)
MIN = 60_000
A, B, X = "acme/gpt-a@paid", "acme/gpt-b@paid", "evil/fast-x@paid"
FAIL_AT = T0 + 2 * MIN  # A fails 10 % of its requests from here on
PARTS = {A: 0, B: 1, X: 0}


def _ev(i: str, ts: int, channel: str, status: str = "ok") -> dict:
    return {"event_id": i, "ts_ms": ts, "channel": channel, "route": "r-" + channel, "status": status,
            "latency_ms": 200.0}


def _honest(k: int, shift_ms: int = 0, channels: tuple[str, ...] = (A, B)) -> list[dict]:
    """The honest events of batch ``k``: per channel 10 per second over ``(wall - 30 s, wall]``."""
    out = []
    end = T0 + (k + 1) * STEP_MS
    for c in channels:
        for j in range(PER_BATCH):
            ts = end - STEP_MS + (j + 1) * (STEP_MS // PER_BATCH)
            bad = c == A and ts >= FAIL_AT and j % 10 == 0
            out.append(_ev(f"{c}-{k}-{j}", ts + shift_ms, c, "error" if bad else "ok"))
    return out


def _run(n_batches: int, extra=lambda k, wall: [], event_clock: bool = False, base_ms: int = 0,
         wall_ms: int | None = None, proc: BatchProcessor | None = None):
    """Drive ``n_batches`` batches; ``extra(k, wall)`` -> [(event dict, partition)] added to batch ``k``.
    ``base_ms`` shifts all honest traffic (a replay of old data); ``wall_ms`` fixes the wall clock."""
    wall = [0]
    p = proc or BatchProcessor(clock_ms=lambda: wall[0] if wall_ms is None else wall_ms, event_clock=event_clock)
    verdicts, dead = [], []
    for k in range(n_batches):
        wall[0] = T0 + (k + 1) * STEP_MS + base_ms
        evs = [(e, PARTS[e["channel"]]) for e in _honest(k, base_ms)] + list(extra(k, wall[0]))
        raws = [json.dumps(e).encode() for e, _ in evs]
        parts = [q for _, q in evs]
        p.set_partition_status({q: True for q in set(parts) | {0, 1}})
        out = p.process(raws, parts, list(range(k * 1000, k * 1000 + len(raws))))
        verdicts += out.verdicts
        dead += out.dead_letters
    return p, verdicts, dead


def _timeline(verdicts, channel: str) -> list[bytes]:
    return [encode(v) for v in sorted(verdicts, key=lambda v: v.seq) if v.channel == channel]


_REFERENCE: dict[tuple, list] = {}


def _reference(n_batches: int, event_clock: bool = False, base_ms: int = 0, wall_ms: int | None = None):
    key = (n_batches, event_clock, base_ms, wall_ms)
    if key not in _REFERENCE:
        _REFERENCE[key] = _run(n_batches, event_clock=event_clock, base_ms=base_ms, wall_ms=wall_ms)[1]
    return _REFERENCE[key]


def _assert_on_time(verdicts, base_ms: int = 0) -> None:
    """A and B evaluated every 30 s of event time, never ``no_data``; A opens on its error rate by 1 min."""
    for c in (A, B):
        ts = [v.ts_ms for v in verdicts if v.channel == c]
        assert ts == list(range(T0 + base_ms + 30_000, T0 + base_ms + 30_000 * (len(ts) + 1), 30_000))
        assert len(ts) >= 10
        assert {v.state for v in verdicts if v.channel == c} & {"no_data"} == set()
    opened = [v for v in verdicts if v.channel == A and v.state == "open"]
    assert opened and opened[0].ts_ms - (FAIL_AT + base_ms) <= MIN and "error_rate" in opened[0].reasons


def test_a_one_event_an_hour_ahead_moves_no_other_channel():
    """(a) one ``ok`` event at now + 59 min on X among healthy A, B (A then fails 10 %)."""
    hostile = lambda k, wall: [(_ev("x-1", wall + 59 * MIN, X), 0)] if k == 3 else []
    p, verdicts, dead = _run(12, hostile)
    _assert_on_time(verdicts)
    assert _timeline(verdicts, A) == _timeline(_reference(12), A)
    assert _timeline(verdicts, B) == _timeline(_reference(12), B)
    assert dead == [] and p.ahead_of_clock == 1
    # X is kept with its own ts_ms and evaluated on its own rounds
    assert p.engine.store.last_ts_ms[p.engine.channel_rows[X]] == T0 + 4 * STEP_MS + 59 * MIN
    assert [v for v in verdicts if v.channel == X] == []  # its first round is the boundary after its event
    assert p.engine.low_watermark_ms == T0 + 12 * STEP_MS


def test_b_a_gateway_ten_minutes_slow_keeps_its_channel_and_holds_back_no_one():
    """(b) S's events all come 10 min behind (own partition 2); then S stops at wall T0 + 7 min."""
    slow = "slow/gw-s@paid"
    PARTS[slow] = 2
    try:
        extra = lambda k, wall: ([(e, 2) for e in _honest(k, -10 * MIN, (slow,))] if k < 14 else [])
        _, verdicts, dead = _run(30, extra)
    finally:
        del PARTS[slow]
    assert dead == []
    assert _timeline(verdicts, A) == _timeline(_reference(30), A)
    assert _timeline(verdicts, B) == _timeline(_reference(30), B)
    s = [v for v in verdicts if v.channel == slow]
    # every round of its own event time (T0 - 10 min + 30 s .. its last event at T0 - 3 min), all healthy
    assert [(v.ts_ms, v.state) for v in s[:-1]] == [(t, "healthy") for t in range(T0 - 10 * MIN + 30_000,
                                                                                 T0 - 3 * MIN + 1, 30_000)]
    # its last events arrived at low watermark T0 + 6.5 min: no_data once the low watermark passed
    # T0 + 11.5 min, stamped at the one catch-up round 5 min before (the engine's rule for a channel far behind)
    assert (s[-1].state, s[-1].ts_ms) == ("no_data", T0 + 13 * STEP_MS)


def test_c_a_gateway_59_minutes_fast_on_its_own_partition():
    """(c) F's events all come 59 min ahead, on partition 2 alone."""
    fast = "fast/gw-f@paid"
    PARTS[fast] = 2
    try:
        extra = lambda k, wall: [(e, 2) for e in _honest(k, 59 * MIN, (fast,))]
        p, verdicts, dead = _run(12, extra)
    finally:
        del PARTS[fast]
    _assert_on_time(verdicts)
    assert _timeline(verdicts, A) == _timeline(_reference(12), A)
    assert _timeline(verdicts, B) == _timeline(_reference(12), B)
    assert dead == [] and p.ahead_of_clock == 12 * PER_BATCH
    f = [v for v in verdicts if v.channel == fast]  # F runs on its own rounds, an hour ahead
    assert f and {v.state for v in f} == {"healthy"} and f[-1].ts_ms > T0 + 59 * MIN
    assert p.engine.low_watermark_ms == T0 + 12 * STEP_MS + 5_000  # F's partition: the clock + skew


def test_d_a_replay_on_its_own_clock_with_one_far_future_event():
    """(d) a replay of a year-old day (CHANNEL_HEALTH_CLOCK=event): X stamped at the real wall clock."""
    year = 365 * 86_400_000
    wall = T0 + year
    hostile = lambda k, at: [(_ev("x-1", wall, X), 0)] if k == 3 else []
    p, verdicts, dead = _run(12, hostile, event_clock=True, base_ms=-year, wall_ms=wall)
    assert dead == []  # the replay's age bound did not jump a year ahead
    ref = _reference(12, event_clock=True, base_ms=-year, wall_ms=wall)
    _assert_on_time(verdicts, -year)
    assert _timeline(verdicts, A) == _timeline(ref, A)
    assert _timeline(verdicts, B) == _timeline(ref, B)
    assert p.event_time_ms == T0 + 12 * STEP_MS - year and p.ahead_of_clock == 1


def test_ahead_events_are_counted_and_named_in_one_log_line(caplog):
    flood = lambda k, wall: [(_ev(f"x-{k}-{j}", wall + 30 * MIN + j, X), 0) for j in range(25)] if k < 4 else []
    with caplog.at_level(logging.WARNING, logger="pipeline.engine.batch"):
        p, _, dead = _run(6, flood)
    lines = [r.getMessage() for r in caplog.records if "ahead of the wall clock" in r.getMessage()]
    assert p.ahead_of_clock == 100 and dead == []
    assert len(lines) == 1 and "'evil/fast-x@paid'" in lines[0] and "'x-0-24'" in lines[0]
    assert lines[0].startswith("25 events stamped more than 5 s ahead of the wall clock")


def test_future_events_do_not_age_out_the_dedup_memory():
    """Two hostile events 10 and 59 min ahead must not retire the ``event_id`` memory of honest events."""
    p = BatchProcessor(clock_ms=lambda: T0)
    first = _ev("e-1", T0 - 1_000, A)
    for e in (first, _ev("x-1", T0 + 10 * MIN, X), _ev("x-2", T0 + 59 * MIN, X), _ev("e-2", T0, A), first):
        out = p.process([json.dumps(e).encode()], [0], [0])
    assert (p.duplicates, out.stored) == (1, [])
    assert p.engine.store.watermark_ms == T0 + 5_000


@settings(max_examples=25, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 11), st.one_of(st.integers(5_001, 60 * MIN),
                                                         st.integers(-6 * 24 * 60 * MIN, 0))),
                min_size=1, max_size=6))
def test_hostile_timestamps_leave_the_other_channels_verdicts_unchanged(hostile):
    """Whatever X's timestamps (up to 6 days behind the wall clock, or more than the 5 s skew ahead of it,
    up to the decoder's 1 h bound), A's and B's verdicts are exactly those of the run without X."""
    by_batch: dict[int, list[int]] = {}
    for k, off in hostile:
        by_batch.setdefault(k, []).append(off)
    extra = lambda k, wall: [(_ev(f"x-{k}-{j}", wall + off, X), 0) for j, off in enumerate(by_batch.get(k, []))]
    _, verdicts, _ = _run(12, extra)
    assert _timeline(verdicts, A) == _timeline(_reference(12), A)
    assert _timeline(verdicts, B) == _timeline(_reference(12), B)


def test_max_clock_skew_setting_reaches_the_processor_and_bad_values_are_refused():
    assert load_settings({}).max_clock_skew_ms == 5_000
    settings_ = load_settings({"CHANNEL_HEALTH_MAX_CLOCK_SKEW": "30s"})
    assert BatchProcessor.for_settings(settings_).max_clock_skew_ms == 30_000
    for bad in ("0", "-5s", "soon", "2h"):
        with pytest.raises(ConfigError, match="CHANNEL_HEALTH_MAX_CLOCK_SKEW"):
            load_settings({"CHANNEL_HEALTH_MAX_CLOCK_SKEW": bad})
