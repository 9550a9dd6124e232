"""Run a drill: plan it, drive its events through a pipeline, judge the verdicts.

Three ways to drive it, the same judgement (:func:`judge`):

* :func:`run_in_process` — the engine in this process (:func:`pipeline.engine.replay.replay`),
  no Kafka, no worker: checks the policy's own timeline.
* :class:`ShadowStack` + :func:`drive` — ``--shadow``: every topic under the prefix
  ``drill.<run_id>.``, a worker process the drill starts with its own consumer group, on the
  configured Kafka or, when none is configured, on the embedded broker it starts (as the demo does).
  The whole drill (warm-up, fault, recovery) is published in event time that ends now, as fast as
  possible or at ``speed`` x real time from the fault on.
* :func:`drive` on the production topics — a live deployment's worker sees extra events for an
  existing drill channel, from now, in real time (the deployment's clock is the wall clock).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable

from pipeline.contracts import Verdict
from pipeline.policy.defaults import PolicyConfig

from .kinds import DRILL_ROUTE, DRILL_WARMUP_S, TAIL_S, DrillKind, drill_scenario, get_kind
from .timeline import (Row, Step, Transition, compare, expected_steps, format_rows, latest_recovery_ms, passed,
                       rows_json, steps_json, transitions)

#: Verdicts are waited for until the channel's latest one is this close to its last event (event time, ms).
CAUGHT_UP_MS = 60_000


def new_run_id(now_s: float) -> str:
    """``YYYYmmddTHHMMSSZ-xxxxxx`` (UTC of ``now_s``, epoch s, + 6 random hex digits): sortable, unique."""
    return time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(now_s)) + "-" + uuid.uuid4().hex[:6]


@dataclass(frozen=True)
class DrillPlan:
    """One drill, before it runs. Times are event time, epoch ms: the scenario runs ``[start_ms, end_ms)``,
    the fault ``[fault_start_ms, fault_end_ms)``; ``steps``: the expected transitions."""

    run_id: str
    kind: DrillKind
    channel: str
    route: str
    duration_s: float
    start_ms: int
    fault_start_ms: int
    fault_end_ms: int
    end_ms: int
    steps: tuple[Step, ...]

    def events(self, seed: int = 0) -> list[dict]:
        """The drill's request events (warm-up, fault, recovery), event-time order."""
        total_s = (self.end_ms - self.start_ms) / 1000
        sc = drill_scenario(self.kind, self.channel, self.duration_s, total_s)
        out = list(sc.events(start_ms=self.start_ms, seed=seed))
        if self.route != DRILL_ROUTE:
            for e in out:
                e["route"] = self.route
        return out


def plan_drill(kind: str, channel: str, policy: PolicyConfig, *, duration_s: float | None = None,
               end_ms: int | None = None, fault_start_ms: int | None = None, route: str = DRILL_ROUTE,
               run_id: str | None = None, alone: bool | None = None) -> DrillPlan:
    """Plan a drill of ``kind`` on ``channel`` under ``policy``.

    alone: the channel is the only one of ``route``, so its recovery is published under the route's panic
    floor (:func:`~.timeline.published_ramp`); None: alone on the drill route (a shadow drill's own
    traffic), with siblings on any other route.

    duration_s: fault length (s, > 0; default the kind's). Place it by ``end_ms`` (the last event; shadow
    drills end now) or by ``fault_start_ms`` (live drills start the fault now); default: ends now.
    The scenario lasts :data:`~.kinds.DRILL_WARMUP_S` + the last expected step + its tolerance +
    :data:`~.kinds.TAIL_S`; with a probe cycle, the last step at its latest: one fault length later, or
    after the longest backed-off cooldowns (:func:`~.timeline.latest_recovery_ms`), whichever is later. Raises ``ValueError`` for an unknown kind (listing the valid ones), an empty
    channel name or a non-positive duration.
    """
    k = get_kind(kind)
    if not channel or not channel.strip():
        raise ValueError("the drill channel name is empty")
    dur = float(k.default_duration_s if duration_s is None else duration_s)
    if not dur > 0:
        raise ValueError(f"--duration must be > 0 s, got {dur:g}")
    lone = route == DRILL_ROUTE if alone is None else alone
    steps = tuple(expected_steps(k, policy, int(dur * 1000), route if lone else None))
    dry = compare(steps, [], 0, int(dur * 1000))
    last_ms = max(r.expected_ms or 0 for r in dry) + max(s.tolerance_ms for s in steps)
    if any(s.cycle for s in steps):  # probe cycles while the fault runs push the recovery back by up to the fault,
        # and by the backed-off cooldowns (issue #33 part 3: 90 s doubling to 15 min) when the fault outlasts them
        last_ms = max(last_ms + int(dur * 1000), latest_recovery_ms(k, policy, int(dur * 1000)))
    total_ms = (DRILL_WARMUP_S + TAIL_S) * 1000 + max(last_ms, int(dur * 1000))
    if fault_start_ms is not None:
        start = fault_start_ms - DRILL_WARMUP_S * 1000
    else:
        start = (end_ms if end_ms is not None else int(time.time() * 1000)) - total_ms
    fs = start + DRILL_WARMUP_S * 1000
    return DrillPlan(run_id or new_run_id(time.time()), k, channel, route, dur, start, fs, fs + int(dur * 1000),
                     start + total_ms, steps)


@dataclass
class DrillResult:
    """A finished drill: the plan, the channel's actual transitions and the expected-vs-actual rows."""

    plan: DrillPlan
    shadow: bool
    topic_prefix: str
    actual: list[Transition]
    rows: list[Row]
    verdicts_seen: int
    note: str = ""
    incident_id: str | None = field(default=None)

    @property
    def passed(self) -> bool:
        """Every expected transition within its tolerance and nothing unexpected."""
        return passed(self.rows)

    def table(self) -> str:
        """The expected-vs-actual table (offsets from the fault start)."""
        return format_rows(self.rows)

    def expected_json(self) -> list[dict]:
        """The expected steps, JSON-ready."""
        return steps_json(self.plan.steps)

    def actual_json(self) -> list[dict]:
        """The actual transitions, JSON-ready (``ts_ms`` event time)."""
        return [{"ts_ms": t.ts_ms, "state": t.state, "weight": t.weight, "reasons": list(t.reasons)}
                for t in self.actual]

    def rows_json(self) -> list[dict]:
        """The table rows, JSON-ready."""
        return rows_json(self.rows)

    def summary(self) -> dict:
        """One JSON-ready object: run, channel, kind, shadow, fault window, passed, rows, incident id."""
        p = self.plan
        return {"run_id": p.run_id, "channel": p.channel, "kind": p.kind.name, "shadow": self.shadow,
                "topic_prefix": self.topic_prefix, "fault_from_ms": p.fault_start_ms, "fault_to_ms": p.fault_end_ms,
                "passed": self.passed, "verdicts_seen": self.verdicts_seen, "rows": self.rows_json(),
                "incident_id": self.incident_id, "note": self.note}


def judge(plan: DrillPlan, verdicts: list[Verdict], *, shadow: bool, topic_prefix: str = "",
          note: str = "") -> DrillResult:
    """Compare ``verdicts`` (any channels; only ``plan.channel``'s from one round before the fault to the
    drill's end count) with the plan's expected steps."""
    lead = plan.steps[0].tolerance_ms if plan.steps else 0
    actual = [t for t in transitions(verdicts, plan.channel)
              if plan.fault_start_ms - lead <= t.ts_ms <= plan.end_ms]
    rows = compare(plan.steps, actual, plan.fault_start_ms, plan.fault_end_ms, plan.kind)
    mine = sum(1 for v in verdicts if v.channel == plan.channel)
    return DrillResult(plan, shadow, topic_prefix, actual, rows, mine, note)


def run_in_process(plan: DrillPlan, policy: PolicyConfig, scorer: Any = None) -> DrillResult:
    """Replay the drill through a fresh :class:`~pipeline.engine.Engine` in this process and judge it."""
    from pipeline.engine.replay import replay

    _, verdicts = replay(plan.events(), policy, scorer=scorer)
    return judge(plan, verdicts, shadow=True, note="in process (engine replay)")


async def drive(plan: DrillPlan, settings: Any, events: list[dict], *, speed: float = 0.0,
                timeout_s: float = 300.0, check: Callable[[], None] = lambda: None,
                say: Callable[[str], None] = print, until_ms: int | None = None) -> list[Verdict]:
    """Publish ``events`` to ``settings.topics.requests`` and collect ``plan.channel``'s verdicts from
    ``settings.topics.health`` until they reach ``until_ms`` (default: the last event's time) within
    :data:`CAUGHT_UP_MS`, or ``timeout_s`` (s) passed after the last send.

    speed: event-time seconds per wall second from the fault on (0: as fast as possible; events before
    the fault always go as fast as possible). check: called between sends (raises to stop, e.g. when
    the worker died). Returns the verdicts in arrival order.
    """
    from pipeline.kafka.producer import BatchingProducer
    from pipeline.router.subscriber import HealthSubscriber

    got: list[Verdict] = []
    last_ts = until_ms if until_ms is not None else (events[-1]["ts_ms"] if events else plan.end_ms)

    def on_verdict(v: Verdict) -> None:
        if v.channel == plan.channel:
            got.append(v)

    sec = settings.kafka_security.aiokafka_kwargs()
    async with HealthSubscriber(settings, on_verdict=on_verdict):
        async with BatchingProducer(settings.kafka_bootstrap or "", settings.topics.requests, security=sec,
                                    max_event_span_ms=10_000) as prod:
            wall0, step, said = None, 1_000, False
            for i in range(0, len(events), step):
                ts = events[i]["ts_ms"]
                if speed > 0 and ts >= plan.fault_start_ms:
                    if wall0 is None:
                        wall0 = time.monotonic()
                        say(f"fault {plan.kind.name} starts (event time), paced at {speed:g}x")
                    lag = (ts - plan.fault_start_ms) / 1000 / speed - (time.monotonic() - wall0)
                    if lag > 0:
                        await asyncio.sleep(lag)
                elif not said and ts >= plan.fault_start_ms:
                    said = True
                    say(f"fault {plan.kind.name} starts (event time)")
                await prod.send_many(events[i:i + step])
                await prod.flush()
                check()
            say(f"{len(events):,} events published; waiting for the verdicts to catch up…")
            deadline = time.monotonic() + timeout_s
            while time.monotonic() < deadline:
                check()
                if got and max(v.ts_ms for v in got) >= last_ts - CAUGHT_UP_MS:
                    break
                await asyncio.sleep(0.25)
            else:
                say(f"stopped waiting after {timeout_s:.0f} s: the verdicts are behind the events")
    return got
