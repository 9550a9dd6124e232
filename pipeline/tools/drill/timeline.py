"""Expected transition timeline of a drill, derived from the policy, and its comparison with the verdicts.

All times are event time, ms. A :class:`Step` is one expected transition
(state, and for ``recovering`` the ramp weight) with the time it is due:
``delay_ms`` after its anchor, which is the fault's start, the fault's end,
or the previous step as it actually happened (so one late step does not
shift every later difference). How the delays follow from
:class:`~pipeline.policy.defaults.PolicyConfig` (SPEC §4):

* ``errors`` (every request fails): ``open`` due at the fault start; the
  consecutive-failure run pre-trips within half a second of its fifth
  failure and the error-rate test runs every round, so it is a bound
  (``by``) of one evaluation round. Then ``half_open`` at +``open_cooldown_ms``;
  while the fault still runs its probe fails and the channel opens again
  within a round, after which ``half_open`` is due once more (how many
  times depends on when the first ``open`` came, so :func:`compare`
  expands this cycle from the verdicts). When the channel's own traffic
  still fails at the cooldown's end (SPEC §4.2 probe on evidence: a run of
  its trip threshold with failures in the last round; a drill channel's
  5 req/s always show it), there is no ``half_open``: the channel stays
  ``open`` in that round with the next cooldown (a new ``next_probe_ts_ms``,
  :func:`transitions` lists it), the row ``open (probe answered by its
  traffic, fault on)``, due when the ``half_open`` would have been. Then ``recovering`` at
  +``half_open_observe_ms`` (weight ``ramp_small_step``), each ramp step at
  +``ramp_interval_ms`` (+``ramp_small_step`` below ``ramp_small_until``,
  then +``ramp_large_step``), ``healthy`` at weight 1. Each ``half_open`` is
  due in the first evaluation round (rounds run at event-time multiples of
  ``eval_interval_ms``) at or after the time the ``open`` before it said its
  cooldown ends (``next_probe_ts_ms``: the policy's backoff, longer for each
  re-open and for a spent quota), so it is exact, not off by up to a round. A
  channel alone on its route (the drill route) publishes the ramp steps under
  the route's panic line at the floor weight (``route_panic``, SPEC §4.2):
  one transition for those steps (:func:`published_ramp`). ``quota_drain``:
  ``degraded`` (``quota``) by its scenario bound, ``open`` by the 429 wall
  (earlier 429s may open it sooner), then the same cycle and recovery.
* soft kinds (``degraded``): detection is a bound: the fault's ramp
  (:data:`~.kinds.RAMP_S`) plus the time the 5 min window (``window_ms``)
  needs to hold enough faulty samples to cross the line — 5 % of the window
  for a P95 (latency: every request slower); for a share (missing fields)
  the first second the exact (Clopper-Pearson) lower bound of the expected faulty count
  exceeds the line (:func:`share_detection_ms`) — plus two rounds for the statistical test's
  margin and the round boundary. Kinds without a simple closed form
  (stream stall, quota, quality) use the bound of their SPEC §5 scenario.
  Back to ``healthy``: by the fault's end + ``window_ms`` (faulty samples
  leave the window) + the rounds the weight needs to regain full at
  ``degraded_recovery_step`` per round from at worst ``degraded_floor_weight``,
  + one round.

Every step has a tolerance of one evaluation round (``eval_interval_ms``):
an exact step passes when ``|actual - expected| <= tolerance``, a bound
when ``actual - expected <= tolerance``.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import asdict, dataclass
from typing import Iterable, Sequence

from pipeline.contracts import Verdict
from pipeline.policy.defaults import PolicyConfig
from pipeline.policy.routes import ROUTE_PANIC

from .kinds import DRILL_RPS, MISSING_RATE, RAMP_S, STRUCTURED_SHARE, DrillKind

_EPS = 1e-6


@dataclass(frozen=True)
class Step:
    """One expected transition.

    state: verdict state; weight: the ``recovering`` ramp weight (None: any); reason: a reason code the
    verdict must carry (None: any); anchor: ``fault_start``, ``fault_end`` or ``previous``; delay_ms:
    due this long after the anchor (>= 0); bound: True when ``delay_ms`` is a latest time rather than an
    exact one; tolerance_ms: allowed difference; rule: where the delay comes from (shown in the table).
    """

    state: str
    weight: float | None
    reason: str | None
    anchor: str
    delay_ms: int
    bound: bool
    tolerance_ms: int
    rule: str
    #: A ``half_open`` that may repeat: while the fault still runs, the probe fails and the channel
    #: opens again (within a round); :func:`compare` then expects this step once more.
    cycle: bool = False
    #: Evaluation grid, ms (0: none): a step due at a published time (a cooldown's end) happens at the
    #: first round at or after it; rounds run at event-time multiples of ``eval_interval_ms`` (the engine's
    #: ``ts // eval_interval_ms`` boundaries, :meth:`pipeline.engine.Engine.process`).
    grid_ms: int = 0

    @property
    def label(self) -> str:
        """``state`` with the ramp weight or the reason, e.g. ``recovering 0.30`` or ``degraded (quota)``."""
        if self.weight is not None:
            return f"{self.state} {self.weight:.2f}"
        return f"{self.state} ({self.reason})" if self.reason else self.state


@dataclass(frozen=True)
class Transition:
    """One actual change in a channel's verdicts: a new state, or a new weight while ``recovering``."""

    ts_ms: int
    state: str
    weight: float
    reasons: tuple[str, ...]
    #: An ``open``'s ``next_probe_ts_ms`` (event time its cooldown ends, under the policy's backoff), else None.
    next_probe_ms: int | None = None


@dataclass(frozen=True)
class Row:
    """One line of the expected-vs-actual table; times are offsets from the fault start, ms (None: absent).

    status: ``ok`` (within tolerance), ``late``/``early`` (outside), ``not detected`` (no such
    transition; ``detector missing`` when no signal for its reason exists yet), or ``unexpected``
    (an actual transition no step asked for).
    """

    transition: str
    expected_ms: int | None
    actual_ms: int | None
    diff_ms: int | None
    tolerance_ms: int | None
    status: str
    rule: str
    #: The expected time is a latest time (``<=``), not an exact one.
    bound: bool = False


def ramp_weights(policy: PolicyConfig) -> list[float]:
    """The ``recovering`` weights in order, from entering (``ramp_small_step``) to the last below 1.0
    (SPEC §4: +10 % every 120 s up to 40 %, then +20 % steps), as :class:`ChannelMachine` steps them."""
    w = round(policy.ramp_small_step, 4)
    out = [w]
    while True:
        step = policy.ramp_small_step if w < policy.ramp_small_until - 1e-9 else policy.ramp_large_step
        w = round(min(1.0, w + step), 4)
        if w >= 1.0 - 1e-9:
            return out
        out.append(w)


def _half_open(policy: PolicyConfig) -> Step:
    return Step("half_open", None, None, "previous", policy.open_cooldown_ms, False, policy.eval_interval_ms,
                "cooldown (the open's next_probe_ts_ms, backed off) to the next round", cycle=True,
                grid_ms=policy.eval_interval_ms)


def on_grid(ms: int, grid_ms: int) -> int:
    """The first multiple of ``grid_ms`` (> 0; 0: ``ms`` itself) at or after ``ms``: the evaluation round a
    time-driven transition happens in (e.g. ``on_grid(92_500, 30_000) == 120_000``)."""
    return -(-ms // grid_ms) * grid_ms if grid_ms > 0 else ms


def latest_recovery_ms(kind: DrillKind, policy: PolicyConfig, duration_ms: int) -> int:
    """The latest the last expected step of a drill of ``kind`` with an ``open`` (``errors``, ``quota_drain``)
    can come, ms after the fault start, when the fault outlasts the cooldowns (issue #33 part 3).

    Walks the probe cycle at its longest: the first ``open`` at its bound (:func:`expected_steps`), then
    each cooldown of the kind's schedule (:meth:`PolicyConfig.backoff
    <pipeline.policy.defaults.PolicyConfig.backoff>` of ``kind.open_cause``: ``base × 2**k`` with the
    full jitter, capped) to the next round; a ``half_open`` before the fault's end fails its probe
    within a round and opens again (the next attempt; when the channel's own traffic answers the probe, SPEC
    §4.2 probe on evidence, it stays open in the probe's round instead: a round sooner, so the round
    counted here keeps the bound for both). From the first ``half_open`` at or after the
    end: the recovery of :func:`expected_steps` (observation, ramp steps; the route's floor does not
    change their sum). Returns 0 for kinds without an ``open``.
    """
    steps = expected_steps(kind, policy, duration_ms)
    opener = next((s for s in steps if s.state == "open"), None)
    if opener is None:
        return 0
    rnd = policy.eval_interval_ms
    sched = policy.backoff(kind.open_cause)
    t = opener.delay_ms + rnd  # the open, at its bound
    k = 0
    while True:
        longest = sched.base_ms if k == 0 else min(sched.max_ms, round(sched.base_ms * sched.factor ** min(k, 64)
                                                                        * (1.0 + sched.jitter)))
        t = on_grid(t + longest, rnd)  # the half_open
        if t >= duration_ms:
            break
        t += rnd  # the probe fails while the fault is on: open again within a round
        k += 1
    after = steps[[i for i, s in enumerate(steps) if s.cycle][0] + 1:]
    return t + sum(s.delay_ms for s in after) + max(s.tolerance_ms for s in steps)


def published_ramp(policy: PolicyConfig, alone_on: str | None = None) -> list[tuple[float, bool]]:
    """``(weight, kept)`` the ``recovering`` verdicts publish at each step of :func:`ramp_weights`.

    ``alone_on``: the route where the drilled channel is the only channel (None: it has siblings, whose
    states decide the route's floor, so the plain ramp is expected). Alone, a ramp weight ``w`` under
    the route's panic line (``min(1, w / (1 - max_penalty)) < panic_threshold(route)``, and ``w`` under
    ``route_panic_weight``) is published at ``route_panic_weight`` with reason ``route_panic`` (SPEC §4.2,
    :func:`pipeline.policy.routes.panic_floor` for one channel that answers its requests).
    """
    threshold = policy.panic_threshold(alone_on) if alone_on is not None else 0.0
    full = max(1.0 - policy.max_penalty, 1e-6)
    floor = policy.route_panic_weight
    return [(floor, True) if min(1.0, w / full) < threshold - 1e-12 and w < floor else (w, False)
            for w in ramp_weights(policy)]


def _recovery_steps(policy: PolicyConfig, tol: int, alone_on: str | None = None) -> list[Step]:
    """The ramp as published (:func:`published_ramp`): steps the floor publishes at one weight are one
    transition, due after the sum of their intervals."""
    ramp = published_ramp(policy, alone_on)
    (w0, kept0), rest = ramp[0], ramp[1:]
    steps = [Step("recovering", w0, ROUTE_PANIC if kept0 else None, "previous", policy.half_open_observe_ms,
                  False, tol, "half-open observation (half_open_observe_ms)"
                  + ("; route_panic floor (route alone)" if kept0 else ""))]
    wait, last = 0, w0
    for w, kept in rest:
        wait += policy.ramp_interval_ms
        if abs(w - last) <= _EPS:
            continue
        steps.append(Step("recovering", w, ROUTE_PANIC if kept else None, "previous", wait, False, tol,
                          "ramp step (ramp_interval_ms)" + (f" x {wait // policy.ramp_interval_ms}"
                                                            if wait > policy.ramp_interval_ms else "")))
        wait, last = 0, w
    steps.append(Step("healthy", None, None, "previous", wait + policy.ramp_interval_ms, False, tol,
                      "last ramp step to weight 1 (ramp_interval_ms)"))
    return steps


def expected_steps(kind: DrillKind, policy: PolicyConfig, duration_ms: int,
                   alone_on: str | None = None) -> list[Step]:
    """The expected transitions of a drill of ``kind`` whose fault lasts ``duration_ms`` (> 0) under ``policy``
    (derivation in the module doc); ``alone_on``: the route where the channel is alone (its recovery is
    published with the route's panic floor, :func:`published_ramp`), None when it has siblings.
    Raises ``ValueError`` for a non-positive duration."""
    if duration_ms <= 0:
        raise ValueError(f"drill duration must be > 0 ms, got {duration_ms}")
    rnd = policy.eval_interval_ms
    if kind.name == "errors":
        first = Step("open", None, None, "fault_start", rnd, True, rnd,
                     "failure run pre-trips at once; error-rate test each round (eval_interval_ms)")
        return [first, _half_open(policy)] + _recovery_steps(policy, rnd, alone_on)
    detect = _detection_bound_ms(kind, policy)
    steps = [Step(kind.state, None, kind.reason, "fault_start", detect, True, rnd, _detection_rule(kind))]
    if kind.name == "quota_drain":  # the 429 wall at 4/5 of the window (kinds.drill_fault); 429s may open it sooner
        steps.append(Step("open", None, None, "fault_start", int(0.8 * duration_ms) + rnd, True, rnd,
                          "429 wall at the end of the drain (error-rate test within a round)"))
        return steps + [_half_open(policy)] + _recovery_steps(policy, rnd, alone_on)
    rounds = math.ceil((1.0 - policy.degraded_floor_weight) / policy.degraded_recovery_step - _EPS)
    back = policy.window_ms + (rounds + 1) * rnd
    steps.append(Step("healthy", None, None, "fault_end", back, True, rnd,
                      f"window_ms leaves the fault + {rounds} rounds to regain weight + 1 round"))
    return steps


def _detection_bound_ms(kind: DrillKind, policy: PolicyConfig) -> int:
    rnd, win = policy.eval_interval_ms, policy.window_ms
    if kind.name == "latency":
        fill = 0.05 * win  # P95: 5 % of the window's samples above the line
    elif kind.name == "hollow":
        return int(share_detection_ms(MISSING_RATE, policy.thresholds("", "paid").missing_rate_trip,
                                      DRILL_RPS * STRUCTURED_SHARE, policy) + 2 * rnd)
    elif kind.name == "stream_stall":
        return 120_000  # issue #18 acceptance of SPEC §5.6: degraded with slow_stream within 2 min
    elif kind.name == "quality_drift":
        return 300_000  # SPEC §5.4 scenario: degraded within 5 min
    elif kind.name == "quota_drain":
        return 1_200_000  # SPEC §5.7 scenario: the 30 min forecast reached within 20 min
    else:
        fill = win
    return int(RAMP_S * 1000 + fill + 2 * rnd)


def share_detection_ms(rate: float, trip: float, checked_per_s: float, policy: PolicyConfig) -> float:
    """When a share detector (SPEC §4.4) can first trip, ms after a fault that ramps linearly over
    :data:`~.kinds.RAMP_S` to ``rate`` (in (0, 1]) on a clean channel checking ``checked_per_s`` answers/s:
    the first second at which the exact Clopper-Pearson lower bound (one-sided ``rate_confidence``, as the
    detector: :func:`~pipeline.stats.exact_lower`) of the expected faulty count over the
    ``window_ms`` window exceeds ``trip``. ``ValueError`` when it never can."""
    import numpy as np

    from pipeline.stats import alpha_for, exact_lower

    alpha = alpha_for(policy.rate_confidence)
    win_s = policy.window_ms / 1000
    n = checked_per_s * win_s
    for t in range(1, int(win_s + RAMP_S) + 1):
        faulty_s = t * t / (2 * RAMP_S) if t < RAMP_S else t - RAMP_S / 2  # integral of the linear ramp
        k = rate * checked_per_s * min(faulty_s, win_s)
        lo = exact_lower(np.array([k]), np.array([n]), alpha)
        if lo[0] > trip:
            return t * 1000.0
    raise ValueError(f"a {rate:.1%} share at {checked_per_s:g} checks/s can never trip a {trip:.1%} line")


def _detection_rule(kind: DrillKind) -> str:
    return {"latency": "ramp + 5 % of window_ms (P95) + 2 rounds",
            "hollow": "exact (Clopper-Pearson) bound of the window share > trip + 2 rounds",
            "quota_drain": "SPEC §5.7: forecast within 30 min (scenario bound 20 min)",
            "stream_stall": "issue #18 (SPEC §5.6): degraded within 2 min of the stalls starting"}.get(
        kind.name, "SPEC §5 scenario bound: 5 min")


def transitions(verdicts: Iterable[Verdict], channel: str) -> list[Transition]:
    """The changes in ``channel``'s verdicts (event-time order): each new state, each new weight
    while ``recovering`` (the ramp steps), and each ``open`` that stays ``open`` at or after its published
    probe time with a later one (SPEC §4.2 probe on evidence: its own traffic answered the probe, a
    failed probe without ``half_open``: :meth:`~pipeline.policy.state_machine.ChannelMachine.probe_answered`)."""
    out: list[Transition] = []
    last: tuple[str, float] | None = None
    due: int | None = None  # the published probe time of the open in force
    for v in sorted((v for v in verdicts if v.channel == channel), key=lambda v: (v.ts_ms, v.seq)):
        raw = v.metrics.get("next_probe_ts_ms") if v.state == "open" else None
        probe = int(raw) if isinstance(raw, (int, float)) else None
        answered = (last is not None and last[0] == v.state == "open" and due is not None and probe is not None
                    and v.ts_ms >= due and probe > due)
        if (last is None or v.state != last[0] or answered
                or (v.state == "recovering" and abs(v.weight - last[1]) > _EPS)):
            if last is not None or v.state != "healthy":
                out.append(Transition(v.ts_ms, v.state, round(v.weight, 4), tuple(v.reasons), probe))
        last = (v.state, v.weight)
        due = probe if v.state == "open" and probe is not None else due if v.state == "open" else None
    return out


def _matches(step: Step, tr: Transition) -> bool:
    if tr.state != step.state:
        return False
    if step.weight is not None and abs(tr.weight - step.weight) > _EPS:
        return False
    return step.reason is None or step.reason in tr.reasons


def compare(steps: Sequence[Step], actual: Sequence[Transition], fault_start_ms: int, fault_end_ms: int,
            kind: DrillKind | None = None) -> list[Row]:
    """Match ``steps`` in order with ``actual`` transitions and return the table rows.

    Each step takes the first not yet used transition at or after the previous match that fits it
    (state, ramp weight, reason); a ``half_open`` is due at the ``next_probe_ms`` of the ``open`` before
    it, the cooldown the policy's schedule gave that open (:meth:`PolicyConfig.backoff
    <pipeline.policy.defaults.PolicyConfig.backoff>`: 90 s for a first trip, doubling with jitter for each
    re-open after a failed probe, issue #33 part 3; 5 min for a spent quota, SPEC §4.1), moved to the first
    evaluation round at or after it (:func:`on_grid`, the step's ``grid_ms``), else ``open_cooldown_ms``
    after it; transitions left over become ``unexpected`` rows (a false verdict
    before the fault included). ``kind.detector_missing``: an unmatched step says ``detector missing``.
    """
    rows: list[Row] = []
    used: set[int] = set()
    pos = 0
    prev_ms: int | None = None  # the previous step: actual time, else its expected time
    cooldown_end: int | None = None  # the probe's due time after the matched open, as its verdict published it
    k = 0
    while k < len(steps):
        step = steps[k]
        k += 1
        anchor = {"fault_start": fault_start_ms, "fault_end": fault_end_ms}.get(step.anchor)
        if anchor is None:
            anchor = prev_ms if prev_ms is not None else fault_start_ms
        due = anchor + step.delay_ms
        if step.cycle and cooldown_end is not None:  # the cooldown the open published (backed off, SPEC §4.1/§4.2)
            due = on_grid(cooldown_end, step.grid_ms)  # in the first round at or after it
        if (step.cycle and cooldown_end is not None and pos < len(actual) and pos not in used
                and actual[pos].state == "open" and actual[pos].ts_ms <= fault_end_ms + step.tolerance_ms):
            # SPEC §4.2 probe on evidence: the channel's own traffic still failed at the cooldown's end, so it
            # stayed open with the next cooldown instead of probing (no half_open): then this half_open again
            used.add(pos)
            rows.append(_row("open (probe answered by its traffic, fault on)", due, actual[pos].ts_ms,
                             dataclasses.replace(step, state="open", rule="cooldown's end, its traffic still failing"),
                             fault_start_ms))
            prev_ms = actual[pos].ts_ms
            cooldown_end = actual[pos].next_probe_ms
            pos += 1
            k -= 1
            continue
        cooldown_end = None
        hit = next((i for i in range(pos, len(actual)) if i not in used and _matches(step, actual[i])), None)
        if hit is None:
            missing = kind is not None and kind.detector_missing and step.reason == kind.reason
            rows.append(Row(step.label, due - fault_start_ms, None, None, step.tolerance_ms,
                            "detector missing" if missing else "not detected", step.rule, step.bound))
            prev_ms = due
            continue
        used.add(hit)
        pos = hit + 1
        t = actual[hit].ts_ms
        rows.append(_row(step.label, due, t, step, fault_start_ms))
        prev_ms = t
        cooldown_end = actual[hit].next_probe_ms
        nxt = hit + 1
        if (step.cycle and nxt < len(actual) and actual[nxt].state == "open"
                and actual[nxt].ts_ms <= fault_end_ms + step.tolerance_ms):
            # the probe ran into the fault: open again at once, then this half_open once more
            reopen = Step("open", None, None, "previous", 0, True, step.tolerance_ms, "probe failed: fault still on")
            used.add(nxt)
            pos = nxt + 1
            rows.append(_row("open (probe, fault on)", t, actual[nxt].ts_ms, reopen, fault_start_ms))
            prev_ms = actual[nxt].ts_ms
            cooldown_end = actual[nxt].next_probe_ms
            k -= 1
    for i, tr in enumerate(actual):
        if i not in used:
            label = f"{tr.state} {tr.weight:.2f}" if tr.state == "recovering" else tr.state
            if tr.reasons:
                label += f" ({','.join(tr.reasons)})"
            rows.append(Row(label, None, tr.ts_ms - fault_start_ms, None, None, "unexpected", "not in the timeline"))
    return rows


def _row(label: str, due: int, t: int, step: Step, fault_start_ms: int) -> Row:
    diff = t - due
    if step.bound:
        status = "ok" if diff <= step.tolerance_ms else "late"
    else:
        status = "ok" if abs(diff) <= step.tolerance_ms else ("late" if diff > 0 else "early")
    return Row(label, due - fault_start_ms, t - fault_start_ms, diff, step.tolerance_ms, status, step.rule, step.bound)


def passed(rows: Sequence[Row]) -> bool:
    """True when every expected step is ``ok`` and nothing unexpected happened."""
    return all(r.status == "ok" for r in rows)


def fmt_s(ms: int | None, sign: bool = False) -> str:
    """``ms`` as seconds with one decimal (``+`` sign when ``sign``), ``-`` for None."""
    if ms is None:
        return "-"
    return f"{ms / 1000:+.1f} s" if sign else f"{ms / 1000:.1f} s"


def format_rows(rows: Sequence[Row]) -> str:
    """The expected-vs-actual table as plain text (offsets from the fault start)."""
    head = ("transition", "expected", "actual", "difference", "tolerance", "status", "rule")
    body = [(r.transition, ("<= " if r.bound else "") + fmt_s(r.expected_ms), fmt_s(r.actual_ms), fmt_s(r.diff_ms, sign=True), fmt_s(r.tolerance_ms),
             r.status, r.rule) for r in rows]
    widths = [max(len(h), *(len(b[i]) for b in body)) if body else len(h) for i, h in enumerate(head)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(head, widths)).rstrip()]
    lines.append("  ".join("-" * w for w in widths))
    lines += ["  ".join(c.ljust(w) for c, w in zip(b, widths)).rstrip() for b in body]
    return "\n".join(lines)


def rows_json(rows: Sequence[Row]) -> list[dict]:
    """The rows as JSON-ready dicts."""
    return [asdict(r) for r in rows]


def steps_json(steps: Sequence[Step]) -> list[dict]:
    """The expected steps as JSON-ready dicts."""
    return [asdict(s) for s in steps]
