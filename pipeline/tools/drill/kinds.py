"""Drill kinds: what each ``--fault KIND`` injects and which signal must see it (issue #22, SPEC §4/§5).

A drill runs on one channel with its own synthetic traffic (a
:class:`~pipeline.tools.simulate.scenario.Scenario` of one channel on the
route ``drill``): :data:`DRILL_WARMUP_S` of healthy traffic (so the 1 h
baselines of SPEC §4.3 exist), then the fault for ``duration_s``, then healthy
traffic until the expected recovery is over (plus :data:`TAIL_S`).

Kinds (fault of :mod:`pipeline.tools.simulate.faults`, SPEC signal):

``errors``     ``outage``: every request fails (HTTP 503) -> ``open`` (§4.1/§4.2), then the recovery of §4.
``latency``    ``latency_ramp`` x3 within 30 s -> ``degraded`` (``latency_p95_ratio``, §4.3).
``hollow``     ``missing_fields`` 8 % of structured answers -> ``degraded`` (``missing_fields``, §4.4).
``stream_stall`` ``stream_stall`` as §5.6 -> ``degraded`` (``slow_stream``, §4.6).
``quota_drain``  ``quota_drain`` as §5.7 -> ``degraded`` (``quota``, §4.7), ``open`` at the 429 wall.
``quality_drift`` ``quality_drift`` as §5.4 -> ``degraded`` (``quality``, §4.5); needs the quality scorer.
"""

from __future__ import annotations

from dataclasses import dataclass

from pipeline.tools.simulate.channels import ChannelProfile, RouteSpec
from pipeline.tools.simulate.faults import Fault
from pipeline.tools.simulate.scenario import Scenario

#: Healthy traffic before the fault, event-time seconds: the 1 h minimum of the latency and
#: quality baselines (``baseline_min_hours``) plus 5 min of margin.
DRILL_WARMUP_S = 3900
#: Healthy traffic after the last expected transition, event-time seconds (one 5 min window).
TAIL_S = 300
#: Route of a shadow drill's channel.
DRILL_ROUTE = "drill"
#: Arrival rate of a drill channel, req/s: enough for every minimum sample of SPEC §4 within a round
#: (50 successes in 5 min, 30 requests per 1 min window) at a few thousand events per event-time hour.
DRILL_RPS = 5.0


@dataclass(frozen=True)
class DrillKind:
    """One drill kind.

    name: the ``--fault`` value. fault_kind / params: the simulator fault (params may use
    ``duration_s``-dependent values, see :func:`drill_fault`). state / reason: the verdict state and
    reason code that must show the fault. default_duration_s: fault length when ``--duration`` is not
    given (s). needs_scorer: the quality scorer (torch, ``requirements-quality.txt``) must run.
    detector_missing: no signal for this reason exists yet: the expected timeline still names it and
    the actual shows "not detected" (no fake pass). open_cause: see the field.
    """

    name: str
    fault_kind: str
    state: str
    reason: str
    default_duration_s: int
    needs_scorer: bool = False
    detector_missing: bool = False
    #: The cause its ``open`` carries, whose backoff schedule spaces the probes (SPEC §4.1, §4.2;
    #: :meth:`~pipeline.policy.defaults.PolicyConfig.backoff`): "" for the §4 detectors.
    open_cause: str = ""


#: Every drill kind by name (issue #22: at least latency, errors, hollow fields, stream stall,
#: quota drain, quality drift).
KINDS: dict[str, DrillKind] = {k.name: k for k in (
    # errors: shorter than the 90 s cooldown, so the half-open probe sees a healthy channel
    DrillKind("errors", "outage", "open", "consecutive_failures", 60),
    DrillKind("latency", "latency_ramp", "degraded", "latency_p95_ratio", 600),
    DrillKind("hollow", "missing_fields", "degraded", "missing_fields", 600),
    DrillKind("stream_stall", "stream_stall", "degraded", "slow_stream", 600),
    DrillKind("quota_drain", "quota_drain", "degraded", "quota", 1800, open_cause="quota_exhausted"),
    DrillKind("quality_drift", "quality_drift", "degraded", "quality", 900, needs_scorer=True),
)}

#: Ramp of the ramped kinds, s (a step within one evaluation round).
RAMP_S = 30.0
LATENCY_FACTOR = 3.0
MISSING_RATE = 0.08
#: Share of the drill channel's answers that are structured (checked for fields) in a ``hollow`` drill.
STRUCTURED_SHARE = 0.6


def get_kind(name: str) -> DrillKind:
    """The kind called ``name``; ``ValueError`` listing the valid kinds otherwise."""
    try:
        return KINDS[name]
    except KeyError:
        raise ValueError(f"unknown drill kind {name!r}; valid: {', '.join(KINDS)}") from None


def drill_fault(kind: DrillKind, channel: str, start_s: float, duration_s: float) -> Fault:
    """The simulator fault of ``kind`` on ``channel`` for ``[start_s, start_s + duration_s)`` (s, > 0).

    Raises ``ValueError`` for a duration the fault cannot have (e.g. shorter than its ramp).
    """
    if not duration_s > 0:
        raise ValueError(f"drill duration must be > 0 s, got {duration_s}")
    end = start_s + duration_s
    ramp = min(RAMP_S, duration_s)
    params: dict = {
        "errors": {"status": "error", "http_status": 503, "error_type": "upstream_unavailable", "latency_ms": 40.0},
        "latency": {"factor": LATENCY_FACTOR, "ramp_s": ramp},
        "hollow": {"to_rate": MISSING_RATE, "ramp_s": ramp},
        # SPEC §5.6 numbers (scenario slow-failure)
        "stream_stall": {"to_rate": 0.6, "ramp_s": ramp, "stall_ms": 8000.0, "repeat": 0.5,
                         "before_first_token": 0.25, "client_timeout_ms": 15000.0},
        # SPEC §5.7 numbers (scenario quota-exhaustion): drained over 4/5 of the window, then the 429 wall
        "quota_drain": {"drain_s": 0.8 * duration_s, "slow_below": 0.15, "slow_factor": 2.5, "pre_429_share": 0.1},
        "quality_drift": {"to_rate": 1.0, "ramp_s": min(60.0, duration_s)},
    }[kind.name]
    return Fault(channel, kind.fault_kind, start_s, end, params)


def drill_profile(kind: DrillKind, channel: str, route: str = DRILL_ROUTE) -> ChannelProfile:
    """The drill channel's traffic: a paid channel with real together-70b timings (median 1.5 s),
    0.1 % baseline failures, 60 % structured answers (hollow), chat answers (quality drift) and a
    reported quota (quota drain) where the kind needs them."""
    return ChannelProfile(channel, route, "paid", latency_source="together_70b", latency_ms=1500.0,
                          error_rate=0.001, structured_share=STRUCTURED_SHARE if kind.name == "hollow" else 0.0,
                          chat_share=0.9 if kind.name == "quality_drift" else 0.0,
                          quota_remaining=0.75 if kind.name == "quota_drain" else None,
                          quota_drain_per_h=0.1 if kind.name == "quota_drain" else 0.0,
                          price_in_usd_per_mtok=0.9, price_out_usd_per_mtok=0.9)


def drill_scenario(kind: DrillKind, channel: str, duration_s: float, total_s: float) -> Scenario:
    """The drill as a scenario: ``channel`` alone on route ``drill`` at :data:`DRILL_RPS`, the fault from
    :data:`DRILL_WARMUP_S` for ``duration_s``, ``total_s`` (s, > warm-up + duration) of event time in all."""
    if not total_s > DRILL_WARMUP_S + duration_s:
        raise ValueError("the drill must last longer than its warm-up and fault")
    prof = drill_profile(kind, channel)
    return Scenario(
        name=f"drill-{kind.name}",
        description=f"drill {kind.name} on {channel}: {kind.fault_kind} for {duration_s:g} s after "
                    f"{DRILL_WARMUP_S} s of healthy traffic",
        duration_s=int(total_s),
        channels=(prof,),
        routes=(RouteSpec(DRILL_ROUTE, DRILL_RPS, {channel: 1.0}, burstiness=0.0),),
        faults=(drill_fault(kind, channel, DRILL_WARMUP_S, duration_s),),
        start_hour=10.0,
        latency_swing=0.0,
        night_fraction=1.0,
        warmup_s=DRILL_WARMUP_S,
    )
