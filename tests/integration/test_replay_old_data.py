"""Issue #16 item 7: a scenario from a year ago goes simulate → worker → verdicts on its own clock (SPEC §7).

``channel-health simulate --start <a year ago>`` publishes the
sparse-consecutive-failures scenario (2.6 h of event time, 40k events). A
worker on the wall clock dead-letters every event as ``ts_too_old``
(CHANNEL_HEALTH_MAX_EVENT_AGE, 7 days); a worker in replay mode
(CHANNEL_HEALTH_CLOCK=event, another consumer group) turns the same events
into verdicts stamped a year ago that meet the scenario's own expectations
(the failure run opens the channel).
"""

from __future__ import annotations

import asyncio
import json
import time
from datetime import datetime, timezone

import pytest
from typer.testing import CliRunner

from pipeline.cli.main import app
from pipeline.tools.simulate import traces
from pipeline.tools.simulate.scenarios import get_scenario
from workers import Stack, VerdictTap

pytestmark = pytest.mark.integration

SCENARIO = "sparse-consecutive-failures"
DAY_MS = 86_400_000


@pytest.fixture
def stack(tmp_path):
    if not traces.DEFAULT_DATA_DIR.is_dir():
        pytest.skip(f"shared data folder absent: {traces.DEFAULT_DATA_DIR}")
    s = Stack(tmp_path, partitions=1).start()
    try:
        yield s
    finally:
        s.close()


async def _count_dlq(settings, want: int, timeout_s: float) -> dict[str, int]:
    """Reasons of the dead letters on the DLQ, once ``want`` have arrived (or at the timeout)."""
    from aiokafka import AIOKafkaConsumer

    c = AIOKafkaConsumer(settings.topics.dlq, bootstrap_servers=settings.kafka_bootstrap, group_id=None,
                         auto_offset_reset="earliest", enable_auto_commit=False)
    await c.start()
    reasons: dict[str, int] = {}
    try:
        deadline = time.monotonic() + timeout_s
        while sum(reasons.values()) < want and time.monotonic() < deadline:
            for msgs in (await c.getmany(timeout_ms=500, max_records=10_000)).values():
                for m in msgs:
                    r = json.loads(m.value)["reason"]
                    reasons[r] = reasons.get(r, 0) + 1
    finally:
        await c.stop()
    return reasons


async def _send_raw(settings, value: bytes) -> None:
    from aiokafka import AIOKafkaProducer

    p = AIOKafkaProducer(bootstrap_servers=settings.kafka_bootstrap)
    await p.start()
    try:
        await p.send_and_wait(settings.topics.requests, value, key=b"sentinel")
    finally:
        await p.stop()


def _t_s(v, start_ms: int) -> float:
    return (v.ts_ms - start_ms) / 1000


def test_a_day_from_a_year_ago_replays_on_its_own_clock(stack):
    sc = get_scenario(SCENARIO)
    now_ms = int(time.time() * 1000)
    start_ms = now_ms - 365 * DAY_MS
    start_ms -= start_ms % 3_600_000
    start = datetime.fromtimestamp(start_ms / 1000, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    s = stack.settings
    env = {"CHANNEL_HEALTH_KAFKA_BOOTSTRAP": s.kafka_bootstrap, "CHANNEL_HEALTH_TOPIC_PREFIX": s.topic_prefix}
    published = CliRunner().invoke(app, ["simulate", "--scenario", SCENARIO, "--start", start], env=env)
    assert published.exit_code == 0, published.output
    n_events = sum(1 for _ in sc.events(start_ms=start_ms))
    assert f"{n_events:,} events in" in published.stderr

    wall = stack.worker("wall")
    wall.start()
    assert asyncio.run(_count_dlq(s, n_events, 120)) == {"ts_too_old": n_events}
    assert wall.stop() == 0

    tap = VerdictTap(s)
    try:
        replay = stack.worker("replay", CHANNEL_HEALTH_CLOCK="event", CHANNEL_HEALTH_CONSUMER_GROUP=f"{s.consumer_group}-r")
        replay.start()
        end_ms = start_ms + sc.duration_s * 1000
        tap.wait_for(lambda rx: any(v.ts_ms >= end_ms - 60_000 for _, v in rx), 180, "verdicts up to the scenario end",
                     on_fail=replay.log_tail)
        verdicts = tap.verdicts()
        # A sentinel the replay worker must dead-letter after everything before it: once it is on the DLQ, the
        # replay's dead letters are all there (awaited, not slept), and they must be this one alone.
        asyncio.run(_send_raw(s, b"not json: replay sentinel"))
        dlq = asyncio.run(_count_dlq(s, n_events + 1, 120))
    finally:
        tap.close()
    assert replay.stop() == 0
    assert dlq == {"ts_too_old": n_events, "invalid_json": 1}  # the replay dead-lettered nothing of the scenario
    assert all(start_ms <= v.ts_ms <= now_ms - 364 * DAY_MS for v in verdicts), "verdicts run on the replay's clock"
    for exp in sc.expected:
        mine = [v for v in verdicts if v.channel == exp["channel"] and _t_s(v, start_ms) >= exp.get("from_s", 0)]
        if "state_in" in exp:
            hit = [v for v in mine if _t_s(v, start_ms) <= exp["by_s"] and v.state in exp["state_in"]
                   and (not exp.get("reasons_any") or set(exp["reasons_any"]) & set(v.reasons))]
            assert hit, f"{exp}: no such verdict"
        if "never_in" in exp:
            assert not [v for v in mine if _t_s(v, start_ms) < exp["to_s"] and v.state in exp["never_in"]], exp
