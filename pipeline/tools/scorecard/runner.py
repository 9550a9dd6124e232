"""One scenario x seed, offline: events -> the engine (channel-health) and the baseline breakers.

No services: events come from the simulator in event time, verdicts from
:func:`pipeline.engine.replay.replay` (open loop: traffic follows the scenario's static shares, so
every policy sees the same stream). Times are scenario seconds.

Definitions (the same for every policy):

* target: a channel with an expectation to go non-healthy (``state_in`` of a bad state) in the
  scenario's ``expected``; its fault starts at that expectation's ``from_s``. The first target is the
  scenario's primary one.
* detection delay: first non-healthy verdict (channel-health: ``degraded``/``open``/``half_open``/
  ``recovering``; a breaker: open, cooldown, ejection) on a target at or after its start, minus the start.
* false verdicts: entries into a non-healthy state (a breaker: opens) on channels that are not targets,
  and on targets before their start. Every trip counts, a re-trip from ``half_open`` too (for
  channel-health and the breakers alike), so a false open that probes and re-opens twice counts 3.
* open cycles: entries into ``open`` (a breaker: opens) on the primary target after its start.
* goodput, route blackout: what a router following the policy would have served (:mod:`.goodput`),
  summed over the scenario's routes; the ``oracle`` (a router that knows the truth) is the ceiling.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from pipeline.contracts import SUSPECT_METRIC
from pipeline.engine.replay import replay
from pipeline.policy.defaults import PolicyConfig
from pipeline.tools.simulate.scenario import BAD_STATES, Scenario

from .baseline import PerChannel, to_call
from .envoy_outlier import EnvoyOutlierPool
from .goodput import Truth, oracle_shares, outcome, peer_shares, step_shares
from .helicone_monitor import HeliconePool
from .higress_failover import HigressFailoverPool
from .linkerd_accrual import LinkerdAccrual
from .litellm_cooldown import LiteLLMCooldown
from .newapi_autodisable import NewApiAutoDisable
from .oneapi_metric import OneApiMetric
from .pybreaker_breaker import PyBreaker
from .resilience4j_breaker import Resilience4jBreaker

#: Scenario time 0 of every run: a fixed whole hour (reproducible event ids and times).
START_MS = 1_780_000_000_000 - 1_780_000_000_000 % 3_600_000
CHANNEL_HEALTH = "channel-health"
ORACLE = "oracle"
BASELINES: dict[str, Callable[[list[str]], object]] = {
    "litellm": lambda chans: PerChannel(lambda: LiteLLMCooldown(single=len(chans) == 1), chans),
    "envoy": EnvoyOutlierPool,
    "resilience4j": lambda chans: PerChannel(Resilience4jBreaker, chans),
    "pybreaker": lambda chans: PerChannel(PyBreaker, chans),
    "new-api": lambda chans: PerChannel(NewApiAutoDisable, chans),
    "one-api": lambda chans: PerChannel(OneApiMetric, chans),
    "linkerd": lambda chans: PerChannel(LinkerdAccrual, chans),
    "helicone": HeliconePool,
    "higress": HigressFailoverPool,
}
POLICIES: tuple[str, ...] = (CHANNEL_HEALTH, *BASELINES)
_BAD = frozenset(BAD_STATES)
_ERROR_KINDS = {"error_ramp", "outage", "consecutive_failures", "overload"}


@dataclass(frozen=True)
class Target:
    """A channel expected to go non-healthy from ``start_s``; ``kinds``: its faults' kinds."""

    channel: str
    start_s: float
    kinds: tuple[str, ...]


def targets(sc: Scenario) -> list[Target]:
    """The scenario's targets in ``expected`` order (see the module doc)."""
    out: dict[str, Target] = {}
    for exp in sc.expected:
        if "state_in" in exp and set(exp["state_in"]) & _BAD and exp["channel"] not in out:
            ch = exp["channel"]
            out[ch] = Target(ch, float(exp.get("from_s", 0)), tuple(f.kind for f in sc.faults if f.channel == ch))
    return list(out.values())


@dataclass
class PolicyRun:
    """One policy on one seed: ``delays_s`` per target (None: missed), ``detect_s`` (scenario time),
    ``false_verdicts``, ``open_cycles`` (primary target), ``reasons`` (channel-health: reasons of the
    first non-healthy verdict on the primary), ``recovery`` (channel-health: see :func:`recovery_timeline`)."""

    delays_s: dict[str, float | None] = field(default_factory=dict)
    detect_s: dict[str, float | None] = field(default_factory=dict)
    false_verdicts: int = 0
    open_cycles: int = 0
    reasons: list[str] = field(default_factory=list)
    recovery: dict[str, float | None] | None = None
    injected: dict[str, float] = field(default_factory=dict)
    goodput: float | None = None
    route_blackout_s: float = 0.0


def _score(entries: list[tuple[str, float, bool, list[str]]], tg: list[Target]) -> PolicyRun:
    """``entries``: (channel, t_s, is_open, reasons) of entries into a non-healthy state, time order."""
    by = {t.channel: t for t in tg}
    run = PolicyRun(delays_s={t.channel: None for t in tg}, detect_s={t.channel: None for t in tg})
    primary = tg[0].channel if tg else None
    for ch, t, is_open, reasons in entries:
        target = by.get(ch)
        if target is None or t < target.start_s:
            run.false_verdicts += 1
            continue
        if run.delays_s[ch] is None:
            run.delays_s[ch], run.detect_s[ch] = t - target.start_s, t
            if ch == primary:
                run.reasons = list(reasons)
        if ch == primary and is_open:
            run.open_cycles += 1
    return run


def spec_ramp_s(cfg: PolicyConfig) -> float:
    """SPEC §4 ``recovering`` -> ``healthy`` time: +small steps every interval up to the knee, then large steps."""
    w, steps = cfg.ramp_small_step, 0
    while w < 1.0 - 1e-9:
        w = min(1.0, w + (cfg.ramp_small_step if w < cfg.ramp_small_until - 1e-9 else cfg.ramp_large_step))
        steps += 1
    return steps * cfg.ramp_interval_ms / 1000


def recovery_timeline(states: list[tuple[float, str]], fault_end_s: float, cfg: PolicyConfig) -> dict | None:
    """The last open -> half_open -> recovering -> healthy cycle ending after ``fault_end_s``.

    ``states``: (t_s, state) of the channel's verdicts in order. Returns measured and SPEC §4 seconds
    (``open_to_half_open_s`` vs ``open_cooldown_ms``, ``half_open_to_recovering_s`` vs
    ``half_open_observe_ms``, ``recovering_to_healthy_s`` vs :func:`spec_ramp_s`) and
    ``fault_end_to_healthy_s``; None when the channel never opened.
    """
    trans, prev = [], None
    for t, s in states:
        if s != prev:
            trans.append((t, s))
            prev = s
    if not any(s == "open" for _, s in trans):
        return None
    out: dict[str, float | None] = {
        "open_to_half_open_s": None, "half_open_to_recovering_s": None, "recovering_to_healthy_s": None,
        "fault_end_to_healthy_s": None, "spec_open_to_half_open_s": cfg.open_cooldown_ms / 1000,
        "spec_half_open_to_recovering_s": cfg.half_open_observe_ms / 1000,
        "spec_recovering_to_healthy_s": spec_ramp_s(cfg)}
    healthy = next((i for i, (t, s) in enumerate(trans) if s == "healthy" and t >= fault_end_s), None)
    end = healthy if healthy is not None else len(trans)
    if healthy is not None:
        out["fault_end_to_healthy_s"] = trans[healthy][0] - fault_end_s

    def last(state: str, before: int) -> int | None:
        return next((i for i in range(before - 1, -1, -1) if trans[i][1] == state), None)

    r = last("recovering", end)
    h = last("half_open", r if r is not None else end)
    o = last("open", h if h is not None else end)
    if o is not None and h is not None:
        out["open_to_half_open_s"] = trans[h][0] - trans[o][0]
    if h is not None and r is not None:
        out["half_open_to_recovering_s"] = trans[r][0] - trans[h][0]
    if r is not None and healthy is not None:
        out["recovering_to_healthy_s"] = trans[healthy][0] - trans[r][0]
    return out


def injected_at(sc: Scenario, target: Target, t_s: float) -> dict[str, float]:
    """The fault's injected strength at ``t_s``: ``error_rate``, ``missing_rate`` and/or ``p95_ratio``
    (P95 at ``t_s`` / P95 just before the start), by the target's fault kinds (error rate if none)."""
    kinds = set(target.kinds)
    out: dict[str, float] = {}
    if kinds & _ERROR_KINDS or not kinds:
        out["error_rate"] = float(sc.injected_error_rate(target.channel, t_s))
    if "missing_fields" in kinds:
        out["missing_rate"] = float(sc.injected_missing_rate(target.channel, t_s))
    if "latency_ramp" in kinds:
        before = float(sc.injected_p95_ms(target.channel, max(0.0, target.start_s - 1)))
        out["p95_ratio"] = float(sc.injected_p95_ms(target.channel, t_s)) / before
    return {k: round(v, 5) for k, v in out.items()}


def _route_outcome(truth: Truth, shares: dict[str, np.ndarray]) -> tuple[float | None, float]:
    """(goodput over all routes, blackout seconds summed over routes) for per-route shares (k, n)."""
    served = demand = dark = 0.0
    for r, s in shares.items():
        a, b, c = outcome(truth, r, s)
        served, demand, dark = served + a, demand + b, dark + c
    return (round(served / demand, 5) if demand > 0 else None), dark


def _engine_shares(truth: Truth, verdicts: list, t_of: Callable[[int], float]) -> dict[str, np.ndarray]:
    """Per route, the shares a router following the engine's verdicts uses over the grid: each channel's
    latest ``route_share`` where its weight is above 0 (:mod:`pipeline.router.table`); when every share is 0,
    the suspects' weights (:func:`pipeline.router.table.route_shares`: a suspicion never darkens a route)."""
    changes: dict[str, list[tuple[float, dict[str, float]]]] = {}
    latest: dict[str, dict[str, float]] = {}
    suspects: dict[str, dict[str, float]] = {}
    for v in verdicts:  # time order
        snap = latest.setdefault(v.route, {})
        share = v.metrics.get("route_share")
        snap[v.channel] = float(share) if v.weight > 0 and isinstance(share, (int, float)) else 0.0
        sus = suspects.setdefault(v.route, {})
        if SUSPECT_METRIC in v.metrics and v.weight > 0:
            sus[v.channel] = float(v.weight)
        else:
            sus.pop(v.channel, None)
        now = snap if sum(snap.values()) > 0 or not sus else {c: sus.get(c, 0.0) for c in snap}
        seq = changes.setdefault(v.route, [])
        t = t_of(v.ts_ms)
        if seq and seq[-1][0] == t:
            seq[-1] = (t, dict(now))
        else:
            seq.append((t, dict(now)))
    return {r: step_shares(rt, changes.get(r, [])) for r, rt in truth.routes.items()}


def run_seed(sc: Scenario, seed: int, policy: PolicyConfig | None = None,
             truth: Truth | None = None,
             shares_out: dict[str, dict[str, np.ndarray]] | None = None) -> dict[str, PolicyRun]:
    """Replay ``sc`` with ``seed`` through the engine and every baseline; one :class:`PolicyRun` each,
    and an :data:`ORACLE` run (goodput and blackout only). ``truth``: the scenario's
    :class:`~.goodput.Truth` when the caller has it (it does not depend on the seed). ``shares_out``:
    when given, filled with policy -> route -> the shares (k, n) on the grid its goodput was computed
    from (:mod:`.timeline` reads them)."""
    cfg = policy or PolicyConfig()
    truth = truth or Truth(sc)
    events = list(sc.events(start_ms=START_MS, seed=seed))
    _, verdicts = replay(events, policy=cfg)
    tg = targets(sc)

    def t_of(ts_ms: int) -> float:
        return (ts_ms - START_MS) / 1000

    # channel-health: entries into a non-healthy state, per channel in seq order
    entries, states, prev = [], {}, {}
    for v in sorted(verdicts, key=lambda v: (v.ts_ms, v.seq)):
        t = t_of(v.ts_ms)
        states.setdefault(v.channel, []).append((t, v.state))
        p = prev.get(v.channel, "healthy")
        if v.state in _BAD and (p not in _BAD or (v.state == "open" and p != "open")):
            entries.append((v.channel, t, v.state == "open", list(v.reasons)))
        prev[v.channel] = v.state
    out = {CHANNEL_HEALTH: _score(entries, tg)}
    ordered = sorted(verdicts, key=lambda v: (v.ts_ms, v.seq))
    engine_shares = _engine_shares(truth, ordered, t_of)
    out[CHANNEL_HEALTH].goodput, out[CHANNEL_HEALTH].route_blackout_s = _route_outcome(truth, engine_shares)
    if shares_out is not None:
        shares_out[CHANNEL_HEALTH] = engine_shares
    if tg:
        ends = [f.end_s for f in sc.faults if f.channel == tg[0].channel]
        out[CHANNEL_HEALTH].recovery = recovery_timeline(states.get(tg[0].channel, []),
                                                         max(ends) if ends else sc.duration_s, cfg)
    # baselines: one pool per route, calls in event-time order
    routes: dict[str, list[str]] = {}
    for e in events:
        chans = routes.setdefault(e["route"], [])
        if e["channel"] not in chans:
            chans.append(e["channel"])
    calls = [(e["route"], e["channel"], c) for e in sorted(events, key=lambda e: e["ts_ms"])
             if (c := to_call(e)) is not None]
    del events
    grid_ms = [START_MS + round(1000 * t) for t in next(iter(truth.routes.values())).t_s.tolist()] \
        if truth.routes else []
    for name, make in BASELINES.items():
        pools = {r: make(chans) for r, chans in routes.items()}
        serving = {r: np.ones((len(rt.channels), len(grid_ms)), bool) for r, rt in truth.routes.items()}
        probes = [(r, j, ch) for r, rt in truth.routes.items() if r in pools for j, ch in enumerate(rt.channels)
                  if ch in routes[r]]
        g, opens = 0, []
        for r, ch, c in calls:
            while g < len(grid_ms) and grid_ms[g] <= c.ts_ms:  # the pools' state at each grid second
                for pr, j, pch in probes:
                    serving[pr][j, g] = pools[pr].in_service(pch, grid_ms[g])
                g += 1
            if pools[r].offer(ch, c):
                opens.append((ch, t_of(c.ts_ms), True, []))
        for rest in range(g, len(grid_ms)):
            for pr, j, pch in probes:
                serving[pr][j, rest] = pools[pr].in_service(pch, grid_ms[rest])
        out[name] = _score(opens, tg)
        peer = {r: peer_shares(rt, serving[r]) for r, rt in truth.routes.items()}
        out[name].goodput, out[name].route_blackout_s = _route_outcome(truth, peer)
        if shares_out is not None:
            shares_out[name] = peer
    out[ORACLE] = PolicyRun()
    oracle = {r: oracle_shares(truth, r) for r in truth.routes}
    out[ORACLE].goodput, out[ORACLE].route_blackout_s = _route_outcome(truth, oracle)
    if shares_out is not None:
        shares_out[ORACLE] = oracle
    for run in out.values():
        if tg and run.detect_s.get(tg[0].channel) is not None:
            run.injected = injected_at(sc, tg[0], run.detect_s[tg[0].channel])
    return out
