"""The SPEC §5 scenario catalogue: one builder per scenario, ``SCENARIOS`` and
:func:`get_scenario`. The :class:`~pipeline.tools.simulate.scenario.Scenario` type
(traffic, faults, expected timeline, injected truth) lives in
:mod:`pipeline.tools.simulate.scenario`.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Callable

from .channels import ChannelProfile, RouteSpec
from .faults import Fault
from .background import chat_8b as _chat_8b, never_bad as _never_bad
from .replay import ReplayChannel, replay_channel_name
from .scenario import WARMUP_S, Scenario  # noqa: F401  (WARMUP_S and Scenario are re-exported)
from .scenarios_errors import caller_storm, dead_key, quota_hard, retry_after
from .scenarios_usage import quota_exhaustion, slow_failure
from .scenarios_route import peer_creep, route_wide

#: gradual-degradation: the failures of its saturating upstream, 502 ``upstream_error`` and 504 timeouts
#: (SPEC §5.1 "its error rate 0.2 % -> 4.6 %": the channel breaking, SPEC §4.1 class ``transient``). An
#: upstream that sheds load answers 5xx (OpenAI 503 "engine overloaded", Anthropic 529
#: ``overloaded_error``); a 429 is the provider refusing the caller over its limit (SPEC §4.1
#: ``rate_limited``: a cooldown, not a breakage), so it is not part of this story. (Until issue #32 the
#: mix had 20 % 429s, all counted as plain failures; with the 429 rule their chance clusters, 3 in 10 s,
#: opened the channel as rate_limited ~95 s before its error-rate trip and hid the SPEC's timeline.)
GRADUAL_FAILURE_MIX: dict[str, float] = {"error": 0.8, "timeout": 0.2}




def gradual_degradation() -> Scenario:
    """SPEC §5.1: over 13 min a free channel's P95 goes 180 -> 800 ms and its
    error rate 0.2 % -> 4.6 %; then holds for 10 min.

    The P95 climbs linearly; failures grow as the square of the ramp's
    progress (``curve`` 2: 1.3 % half-way, 4.6 % at the end), as on a
    saturating backend whose queues, hence latency, build up before timeouts
    and load shedding set in. With both linear the story could not be told:
    the free line (0.35 %) is crossed 27 s into the ramp, P95 x 1.8 only
    after 181 s, so any detector would trip on errors first.
    """
    t0, ramp, hold = WARMUP_S, 780, 600
    faulty = ChannelProfile("lepton/llama-70b@free", "chat-70b", "free", latency_source="together_70b",
                            latency_ms=180.0, latency_quantile=0.95, structured_share=0.1,
                            price_in_usd_per_mtok=0.8, price_out_usd_per_mtok=0.8)
    sibling = ChannelProfile("fireworks/llama-70b@paid", "chat-70b", "paid", latency_source="fireworks_70b",
                             latency_ms=210.0, latency_quantile=0.95, structured_share=0.1,
                             price_in_usd_per_mtok=0.9, price_out_usd_per_mtok=0.9)
    r8, c8 = _chat_8b(6.0)
    duration = t0 + ramp + hold
    return Scenario(
        name="gradual-degradation",
        description=(
            "Free channel lepton/llama-70b@free (~16 req/s at the fault) degrades over 13 min from 10:00: "
            "P95 climbs 180 -> 800 ms, then failures accelerate 0.2 % -> 4.6 % (1.3 % half-way); holds 10 min. "
            "2 h healthy warm-up; paid sibling and chat-8b stay healthy."
        ),
        duration_s=duration,
        channels=(faulty, sibling) + c8,
        routes=(RouteSpec("chat-70b", 40.0, {faulty.name: 0.6, sibling.name: 0.4}, burstiness=0.5), r8),
        faults=(
            Fault(faulty.name, "latency_ramp", t0, duration, {"factor": 800.0 / 180.0, "ramp_s": ramp}),
            Fault(faulty.name, "error_ramp", t0, duration,
                  {"to_rate": 0.046, "ramp_s": ramp, "curve": 2.0,
                   "mix": GRADUAL_FAILURE_MIX}),
        ),
        expected=(
            _never_bad(faulty.name, t0),
            {"channel": faulty.name, "state_in": ["degraded", "open"], "from_s": t0, "by_s": t0 + 480,
             "reasons_any": ["error_rate", "latency_p95_ratio"]},
            {"channel": faulty.name, "state_in": ["open"], "from_s": t0, "by_s": t0 + ramp,
             "reasons_any": ["error_rate", "consecutive_failures"]},
            {"channel": faulty.name, "state_sequence": ["healthy", "degraded", "open"], "from_s": t0 - 60,
             "by_s": t0 + ramp},
            _never_bad(sibling.name, duration),
            *(_never_bad(c.name, duration) for c in c8),
        ),
        start_hour=8.0,
    )


def backup_overload() -> Scenario:
    """SPEC §5.2: the primary fails hard for 15 min; the backup takes its load
    (retries, or a router's shares) and degrades above its capacity."""
    t0, outage = WARMUP_S, 900
    primary = ChannelProfile("fireworks/llama-70b@paid", "chat-70b", "paid", latency_source="fireworks_70b",
                             latency_ms=2400.0, price_in_usd_per_mtok=0.9, price_out_usd_per_mtok=0.9)
    backup = ChannelProfile("together/llama-70b@paid", "chat-70b", "paid", latency_source="together_70b",
                            latency_ms=2200.0, capacity_rps=10.0, overload_latency_gain=2.0,
                            overload_error_gain=0.06, price_in_usd_per_mtok=0.88, price_out_usd_per_mtok=0.88)
    r8, c8 = _chat_8b(6.0)
    duration = t0 + outage + 1800
    return Scenario(
        name="backup-overload",
        description=(
            "Route chat-70b (~13.5 req/s at 10:00, 50/50): the primary fireworks/llama-70b@paid answers "
            "every request with HTTP 503 for 15 min. The gateway retries failures on the backup "
            "together/llama-70b@paid (capacity 10 req/s), which under ~2x load (~15 req/s) gets "
            "~2x latency and ~+3 % failures. 30 min after the outage ends."
        ),
        duration_s=duration,
        channels=(primary, backup) + c8,
        routes=(RouteSpec("chat-70b", 20.0, {primary.name: 0.5, backup.name: 0.5}, burstiness=0.5,
                          retry_failures=True), r8),
        faults=(
            Fault(primary.name, "outage", t0, t0 + outage,
                  {"status": "error", "http_status": 503, "error_type": "upstream_unavailable", "latency_ms": 40.0}),
        ),
        expected=(
            _never_bad(primary.name, t0),
            _never_bad(backup.name, t0),
            {"channel": primary.name, "state_in": ["open"], "from_s": t0, "by_s": t0 + 60,
             "reasons_any": ["error_rate", "consecutive_failures"]},
            {"channel": backup.name, "state_in": ["degraded", "open"], "from_s": t0, "by_s": t0 + 420},
            {"channel": backup.name, "max_state_changes": 6, "from_s": t0, "to_s": duration},
            {"channel": primary.name, "state_in": ["healthy"], "from_s": t0 + outage, "by_s": t0 + outage + 1500},
            *(_never_bad(c.name, duration) for c in c8),
        ),
        start_hour=8.0,
    )


def content_hollowing() -> Scenario:
    """SPEC §5.3: all requests ``ok`` at normal latency, but structured answers
    of one channel start missing required fields (0 -> 4 % over 10 min)."""
    t0, ramp, hold = WARMUP_S, 600, 1200
    hollow = ChannelProfile("fireworks/mixtral-8x7b@paid", "extract", "paid", latency_source="fireworks_7b",
                            latency_ms=1300.0, error_rate=0.0, structured_share=0.6,
                            price_in_usd_per_mtok=0.5, price_out_usd_per_mtok=0.5)
    sibling = ChannelProfile("together/mixtral-8x7b@paid", "extract", "paid", latency_source="anyscale_13b",
                             latency_ms=1100.0, error_rate=0.0, structured_share=0.6,
                             price_in_usd_per_mtok=0.6, price_out_usd_per_mtok=0.6)
    r8, c8 = _chat_8b(6.0, error_rate=0.0)
    duration = t0 + ramp + hold
    return Scenario(
        name="content-hollowing",
        description=(
            "Route extract (60 % structured answers: real BFCL tool calls and JSON objects). From 10:00 "
            "the share of fireworks/mixtral-8x7b@paid answers missing a required field rises 0 -> 4 % "
            "over 10 min and holds 20 min; every request is ok with normal latency."
        ),
        duration_s=duration,
        channels=(hollow, sibling) + c8,
        routes=(RouteSpec("extract", 16.0, {hollow.name: 0.5, sibling.name: 0.5}), r8),
        faults=(Fault(hollow.name, "missing_fields", t0, duration, {"to_rate": 0.04, "ramp_s": ramp}),),
        expected=(
            _never_bad(hollow.name, t0),
            {"channel": hollow.name, "state_in": ["degraded"], "from_s": t0, "by_s": t0 + ramp,
             "reasons_any": ["missing_fields"]},
            {"channel": hollow.name, "never_in": ["open"], "from_s": 0, "to_s": duration},
            _never_bad(sibling.name, duration),
            *(_never_bad(c.name, duration) for c in c8),
        ),
        start_hour=8.0,
    )


def quality_drift() -> Scenario:
    """SPEC §5.4: answers keep their status, latency and fields but turn useless.

    The expectations need quality scoring (the worker's quality agent, or
    :func:`pipeline.engine.replay.replay` with a scorer): without it no signal sees
    anything, which is the point of the scenario.
    """
    t0, fault, after = WARMUP_S, 1200, 1200
    drift = ChannelProfile("deepinfra/llama-70b@free", "chat-70b", "free", latency_source="together_70b",
                           latency_ms=2600.0, chat_share=0.9, price_in_usd_per_mtok=0.35, price_out_usd_per_mtok=0.4)
    sib = ChannelProfile("fireworks/llama-70b@paid", "chat-70b", "paid", latency_source="fireworks_70b",
                         latency_ms=2400.0, chat_share=0.9, price_in_usd_per_mtok=0.9, price_out_usd_per_mtok=0.9)
    c8 = (
        ChannelProfile("together/llama-8b@paid", "chat-8b", "paid", latency_source="together_7b",
                       latency_ms=900.0, chat_share=0.5, price_in_usd_per_mtok=0.18, price_out_usd_per_mtok=0.18),
        ChannelProfile("groq/llama-8b@free", "chat-8b", "free", latency_source="groq_70b", latency_ms=450.0,
                       chat_share=0.5, price_in_usd_per_mtok=0.05, price_out_usd_per_mtok=0.08),
    )
    end = t0 + fault
    duration = end + after
    return Scenario(
        name="quality-drift",
        description=(
            "Chat routes whose answers carry response_text + prompt_text (good MT-bench answers, rated >= 8). "
            "From 10:00, all of deepinfra/llama-70b@free's answers turn useless within 1 min and stay so "
            "for 20 min: canned refusals, answers cut off after ~10 %, answers to other questions; status "
            "ok, latency and fields unchanged. Its sibling and the chat-8b channels stay good. Needs quality "
            "scoring (worker quality agent or replay with a scorer)."
        ),
        duration_s=duration,
        channels=(drift, sib) + c8,
        routes=(RouteSpec("chat-70b", 3.0, {drift.name: 0.5, sib.name: 0.5}),
                RouteSpec("chat-8b", 2.0, {c8[0].name: 0.5, c8[1].name: 0.5})),
        faults=(Fault(drift.name, "quality_drift", t0, end, {"to_rate": 1.0, "ramp_s": 60}),),
        expected=(
            _never_bad(drift.name, t0),
            {"channel": drift.name, "state_in": ["degraded"], "from_s": t0, "by_s": t0 + 300,
             "reasons_any": ["quality"]},
            {"channel": drift.name, "never_in": ["open"], "from_s": 0, "to_s": duration},
            {"channel": drift.name, "state_in": ["healthy"], "from_s": end, "by_s": duration},
            _never_bad(sib.name, duration),
            *(_never_bad(c.name, duration) for c in c8),
        ),
        start_hour=8.0,
    )


def sparse_consecutive_failures() -> Scenario:
    """SPEC §5.5: 7 failures in a row on a low-traffic channel, 75 s apart, with
    no traffic on that channel in between."""
    t0, count, gap = WARMUP_S, 7, 75.0
    last = t0 + (count - 1) * gap
    low = ChannelProfile("replicate/llama-13b@free", "chat-13b", "free", latency_source="replicate_13b",
                         latency_ms=2500.0, price_in_usd_per_mtok=0.1, price_out_usd_per_mtok=0.5)
    sib = ChannelProfile("together/llama-13b@paid", "chat-13b", "paid", latency_source="anyscale_13b",
                         latency_ms=1200.0, price_in_usd_per_mtok=0.3, price_out_usd_per_mtok=0.3)
    r8, c8 = _chat_8b(4.0)
    end = last + 1.0
    duration = int(end) + 1800
    return Scenario(
        name="sparse-consecutive-failures",
        description=(
            "Low-traffic replicate/llama-13b@free (~1 request / 30 s) fails 7 times in a row, "
            "one failure every 75 s from 10:00, with no other traffic on it in between "
            "(so any 60 s window sees at most one failure). Healthy again afterwards."
        ),
        duration_s=duration,
        channels=(low, sib) + c8,
        routes=(RouteSpec("chat-13b", 3.0, {low.name: 0.015, sib.name: 0.985}), r8),
        faults=(
            Fault(low.name, "consecutive_failures", t0, end,
                  {"count": count, "gap_s": gap, "status": "error", "http_status": 502,
                   "error_type": "upstream_error", "latency_ms": 250.0}),
        ),
        expected=(
            _never_bad(low.name, t0),
            {"channel": low.name, "state_in": ["open"], "from_s": t0, "by_s": last + 1.0,
             "reasons_any": ["consecutive_failures"]},
            _never_bad(sib.name, duration),
            *(_never_bad(c.name, duration) for c in c8),
        ),
        start_hour=8.0,
    )


def recovery() -> Scenario:
    """SPEC §5.8: a 4 min hard outage, then healthy for 30 min so the
    half-open probe and the weight ramp of SPEC §4 can be followed."""
    t0, outage = WARMUP_S, 240
    chan = ChannelProfile("together/llama-8b@paid", "chat-8b", "paid", latency_source="together_7b",
                          latency_ms=900.0, price_in_usd_per_mtok=0.18, price_out_usd_per_mtok=0.18)
    free = ChannelProfile("groq/llama-8b@free", "chat-8b", "free", latency_source="groq_70b", latency_ms=450.0,
                          price_in_usd_per_mtok=0.05, price_out_usd_per_mtok=0.08)
    p70 = ChannelProfile("fireworks/llama-70b@paid", "chat-70b", "paid", latency_source="fireworks_70b",
                         latency_ms=2400.0, price_in_usd_per_mtok=0.9, price_out_usd_per_mtok=0.9)
    f70 = ChannelProfile("lepton/llama-70b@free", "chat-70b", "free", latency_source="together_70b",
                         latency_ms=3000.0, price_in_usd_per_mtok=0.8, price_out_usd_per_mtok=0.8)
    end = t0 + outage
    duration = end + 1800
    return Scenario(
        name="recovery",
        description=(
            "together/llama-8b@paid (~4.5 req/s) answers HTTP 503 to everything for 4 min from 10:00, "
            "then is fully healthy for 30 min: open -> half_open (after the 90 s cooldown) -> "
            "recovering -> healthy per SPEC §4."
        ),
        duration_s=duration,
        channels=(chan, free, p70, f70),
        routes=(RouteSpec("chat-8b", 12.0, {chan.name: 0.5, free.name: 0.5}),
                RouteSpec("chat-70b", 8.0, {p70.name: 0.6, f70.name: 0.4})),
        faults=(
            Fault(chan.name, "outage", t0, end,
                  {"status": "error", "http_status": 503, "error_type": "upstream_unavailable", "latency_ms": 40.0}),
        ),
        expected=(
            _never_bad(chan.name, t0),
            {"channel": chan.name, "state_in": ["open"], "from_s": t0, "by_s": t0 + 60,
             "reasons_any": ["error_rate", "consecutive_failures"]},
            {"channel": chan.name, "state_sequence": ["open", "half_open", "recovering", "healthy"],
             "from_s": t0, "by_s": end + 1500},
            {"channel": chan.name, "state_in": ["healthy"], "from_s": end, "by_s": end + 1500},
            # issue #18: no re-open once the fault ended (an open entered before the end lasts
            # at most the 90 s cooldown plus one 30 s round)
            {"channel": chan.name, "never_in": ["open"], "from_s": end + 120, "to_s": duration},
            *(_never_bad(c.name, duration) for c in (free, p70, f70)),
        ),
        start_hour=8.0,
    )


def clean_day() -> Scenario:
    """SPEC §5.9: 2 h warm-up + 24 h of healthy traffic, 3 routes, free and paid
    channels, day/night load (night 35 % of the peak) and +-15 % latency swing."""
    duration = WARMUP_S + 24 * 3600
    chans = (
        ChannelProfile("fireworks/llama-70b@paid", "chat-70b", "paid", latency_source="fireworks_70b",
                       latency_ms=2400.0, structured_share=0.2,
                       price_in_usd_per_mtok=0.9, price_out_usd_per_mtok=0.9),
        ChannelProfile("lepton/llama-70b@free", "chat-70b", "free", latency_source="together_70b",
                       latency_ms=3000.0, structured_share=0.2, price_in_usd_per_mtok=0.8, price_out_usd_per_mtok=0.8),
        ChannelProfile("together/llama-8b@paid", "chat-8b", "paid", latency_source="together_7b",
                       latency_ms=900.0, price_in_usd_per_mtok=0.18, price_out_usd_per_mtok=0.18),
        ChannelProfile("groq/llama-8b@free", "chat-8b", "free", latency_source="groq_70b", latency_ms=450.0,
                       price_in_usd_per_mtok=0.05, price_out_usd_per_mtok=0.08),
        ChannelProfile("anyscale/codellama-34b@paid", "code", "paid", latency_source="anyscale_13b",
                       latency_ms=1200.0, price_in_usd_per_mtok=1.0, price_out_usd_per_mtok=1.0),
        ChannelProfile("deepinfra/codellama-34b@free", "code", "free", latency_source="fireworks_13b",
                       latency_ms=1500.0, price_in_usd_per_mtok=0.6, price_out_usd_per_mtok=0.6),
    )
    return Scenario(
        name="clean-day",
        description=(
            "26 h of healthy traffic (2 h warm-up from 00:00, then a full day): chat-70b (peak 9 req/s, "
            "20 % structured answers), chat-8b (peak 7), code (peak 4, bursty Azure code trace); "
            "night load 35 % of the 16:00 peak, latency +-15 % with the load. No faults."
        ),
        duration_s=duration,
        channels=chans,
        routes=(
            RouteSpec("chat-70b", 9.0, {chans[0].name: 0.6, chans[1].name: 0.4}),
            RouteSpec("chat-8b", 7.0, {chans[2].name: 0.5, chans[3].name: 0.5}),
            RouteSpec("code", 4.0, {chans[4].name: 0.7, chans[5].name: 0.3}, trace="code", burstiness=0.5),
        ),
        faults=(),
        expected=tuple(_never_bad(c.name, duration) for c in chans),
        start_hour=0.0,
    )


#: The 19 llmperf-leaderboard files (``../shared/data/llmperf-leaderboard``).
REAL_PROVIDER_SOURCES: tuple[str, ...] = (
    "anyscale_13b", "anyscale_70b", "anyscale_7b", "bedrock_13b", "bedrock_70b",
    "fireworks_13b", "fireworks_70b", "fireworks_7b", "groq_70b", "lepton_13b",
    "lepton_70b", "lepton_7b", "perplexity_70b", "replicate_13b", "replicate_70b",
    "replicate_7b", "together_13b", "together_70b", "together_7b",
)
#: Files where >= 30 % of the requests really failed (lepton: 130/150 HTTP 429
#: after 10 successes; bedrock 13b: 97/150 and 70b: 49/150 error -100).
REAL_PROVIDER_FAILING: tuple[str, ...] = ("bedrock_13b", "bedrock_70b", "lepton_13b", "lepton_70b", "lepton_7b")
#: Files whose requests all succeeded.
REAL_PROVIDER_CLEAN: tuple[str, ...] = (
    "anyscale_13b", "anyscale_70b", "anyscale_7b", "fireworks_13b", "fireworks_70b",
    "fireworks_7b", "groq_70b", "replicate_13b", "replicate_70b", "replicate_7b",
    "together_70b", "together_7b",
)
#: Replay pacing: 150 requests over 720 s per channel (one every 4.8 s).
REPLAY_SPAN_S = 720.0


def real_providers(sources: tuple[str, ...] = REAL_PROVIDER_SOURCES) -> Scenario:
    """SPEC §5.10: every llmperf file replayed as channel ``provider/size``."""
    n = len(sources)
    spacing = REPLAY_SPAN_S / 150
    chans = []
    for k, stem in enumerate(sources):
        name, route = replay_channel_name(stem)
        chans.append(ReplayChannel(name, route, stem, "paid", offset_s=round(k * spacing / n, 3), spacing_s=spacing))
    expected: list[dict] = []
    for c in chans:
        if c.source in REAL_PROVIDER_FAILING:
            expected.append({"channel": c.name, "state_in": ["open"], "from_s": 0, "by_s": REPLAY_SPAN_S})
        elif c.source in REAL_PROVIDER_CLEAN:
            expected.append({"channel": c.name, "never_in": ["open"], "from_s": 0, "to_s": 900})
    return Scenario(
        name="real-providers",
        description=(
            "Each llmperf-leaderboard file is a channel provider/size on route llama-<size>; its 150 real "
            "requests are replayed in order, one every 4.8 s (~12 min), with the measured latencies, "
            "TTFT, tokens and outcomes (lepton: 429 after 10 requests; bedrock: error -100). "
            "No synthetic traffic, no injected faults."
        ),
        duration_s=900,
        channels=tuple(chans),
        expected=tuple(expected),
        warmup_s=0,
    )


_BUILDERS: dict[str, Callable[[], Scenario]] = {
    "gradual-degradation": gradual_degradation,
    "backup-overload": backup_overload,
    "content-hollowing": content_hollowing,
    "quality-drift": quality_drift,
    "sparse-consecutive-failures": sparse_consecutive_failures,
    "slow-failure": slow_failure,
    "quota-exhaustion": quota_exhaustion,
    "recovery": recovery,
    "clean-day": clean_day,
    "real-providers": real_providers,
    "dead-key": dead_key,
    "quota-hard": quota_hard,
    "retry-after": retry_after,
    "caller-storm": caller_storm,
    "route-wide": route_wide,
    "peer-creep": peer_creep,
}

#: All scenarios by name (configuration only; no data is read until ``events``).
SCENARIOS: dict[str, Scenario] = {name: build() for name, build in _BUILDERS.items()}


def get_scenario(name: str, data_dir: str | Path | None = None) -> Scenario:
    """The scenario called ``name``, optionally bound to another data folder.

    Raises ``ValueError`` naming the valid scenarios for an unknown name.
    """
    try:
        sc = SCENARIOS[name]
    except KeyError:
        raise ValueError(f"unknown scenario {name!r}; valid: {', '.join(SCENARIOS)}") from None
    if data_dir is not None:
        sc = dataclasses.replace(sc, data_dir=Path(data_dir))
    return sc


def headline(name: str) -> str:
    """One line on scenario ``name``: the first paragraph of its builder's docstring
    (``SPEC §5.x: what happens``), for ``--help`` and ``--list``.

    Raises ``ValueError`` naming the valid scenarios for an unknown name.
    """
    if name not in _BUILDERS:
        raise ValueError(f"unknown scenario {name!r}; valid: {', '.join(SCENARIOS)}")
    doc = (_BUILDERS[name].__doc__ or "").strip().split("\n\n")[0]
    return " ".join(doc.replace("``", "").split())
