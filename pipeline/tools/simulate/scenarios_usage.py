"""SPEC §5.6 ``slow-failure`` and §5.7 ``quota-exhaustion``: scenarios whose
faults hide from the error rate (stalled streams, a draining quota).

Registered in :data:`pipeline.tools.simulate.scenarios.SCENARIOS`. Their effects
live in :mod:`.usage_faults`; their detectors are the ``slow_stream``,
``quota`` and ``cost`` signals (issue #18).
"""

from __future__ import annotations

from .background import chat_8b as _chat_8b, never_bad as _never_bad
from .channels import ChannelProfile, RouteSpec
from .faults import Fault
from .scenario import WARMUP_S, Scenario



def slow_failure() -> Scenario:
    """SPEC §5.6: streams stall ~8 s and clients cancel at 15 s, with no upstream error at all.

    The stalling channel keeps the real timings of its llmperf file
    (fireworks 70b: median 3.8 s end to end, TTFT 0.5 s, 24 ms between
    tokens); from 10:00, within 2 min, 60 % of its streams pause for ~8 s
    (lognormal, median 8 s), half of those twice, a quarter before the first
    token. A stream still running at 15 s is cancelled by the client
    (``cancelled``, HTTP 499): the twice-stalled ones, about 30 % of all
    streams. Its error rate stays 0 (``error_rate`` 0.0), so only the
    ``slow_stream`` signal (SPEC §4.6) can see it; the P95 of successful
    requests rises too. Holds 15 min, then 15 min healthy.

    The control: on the sibling (deepinfra/llama-70b@free) impatient clients
    cancel as many streams (30 % at full strength, same ramp) mid-generation
    without any stall; it must stay healthy (SPEC §4.6: client cancels
    without a stall are neutral).
    """
    t0, ramp, hold, after = WARMUP_S, 120, 900, 900
    stalled = ChannelProfile("fireworks/llama-70b@paid", "chat-70b", "paid", latency_source="fireworks_70b",
                             latency_ms=3770.0, error_rate=0.0, price_in_usd_per_mtok=0.9,
                             price_out_usd_per_mtok=0.9)
    sibling = ChannelProfile("deepinfra/llama-70b@free", "chat-70b", "free", latency_source="together_70b",
                             latency_ms=2440.0, price_in_usd_per_mtok=0.35, price_out_usd_per_mtok=0.4)
    r8, c8 = _chat_8b(6.0)
    end = t0 + ramp + hold
    duration = end + after
    return Scenario(
        name="slow-failure",
        description=(
            "Route chat-70b (~8 req/s at 10:00, 50/50). From 10:00, 60 % of fireworks/llama-70b@paid's streams "
            "stall ~8 s (half of them twice); clients cancel what still runs at 15 s (~30 % of its requests "
            "end cancelled, HTTP 499). No upstream errors; real llmperf TTFT and inter-token timings "
            "otherwise. 15 min, then 15 min healthy. Control: deepinfra/llama-70b@free's clients cancel as "
            "many streams without any stall."
        ),
        duration_s=duration,
        channels=(stalled, sibling) + c8,
        routes=(RouteSpec("chat-70b", 10.0, {stalled.name: 0.5, sibling.name: 0.5}, burstiness=0.5), r8),
        faults=(
            Fault(stalled.name, "stream_stall", t0, end,
                  {"to_rate": 0.6, "ramp_s": ramp, "stall_ms": 8000.0, "repeat": 0.5,
                   "before_first_token": 0.25, "client_timeout_ms": 15000.0}),
            Fault(sibling.name, "stream_stall", t0, end, {"to_rate": 0.0, "ramp_s": ramp, "impatient": 0.3}),
        ),
        expected=(
            _never_bad(stalled.name, t0),
            {"channel": stalled.name, "never_in": ["open"], "from_s": 0, "to_s": duration},
            # issue #18: degraded with slow_stream within 2 min of the stalls starting
            {"channel": stalled.name, "state_in": ["degraded"], "from_s": t0, "by_s": t0 + 120,
             "reasons_any": ["slow_stream"]},
            {"channel": stalled.name, "state_in": ["healthy"], "from_s": end, "by_s": duration},
            _never_bad(sibling.name, duration),
            *(_never_bad(c.name, duration) for c in c8),
        ),
        start_hour=8.0,
    )


#: quota-exhaustion: seconds from the fault's start to the 429 wall, and the wall's length.
QUOTA_DRAIN_S, QUOTA_WALL_S = 2400, 900


def quota_exhaustion() -> Scenario:
    """SPEC §5.7: a free channel drains its daily quota, slows, then answers 429.

    groq/llama-70b@free reports ``quota_remaining``: 0.75 at 08:00, using
    10 % an hour, so 0.55 at 10:00. From 10:00 a batch job drains the rest
    in 40 min (0.83 / h); below 15 % its answers slow (x2.5 at empty) and a
    share of requests rising to 10 % is refused with 429; at 10:40 the quota
    is gone and every request gets 429 ``quota_exhausted`` for 15 min.
    Timings otherwise the real groq 70b llmperf ones (median 0.81 s).
    """
    t0 = WARMUP_S
    wall = t0 + QUOTA_DRAIN_S
    end = wall + QUOTA_WALL_S
    free = ChannelProfile("groq/llama-70b@free", "chat-70b", "free", latency_source="groq_70b",
                          latency_ms=810.0, price_in_usd_per_mtok=0.59, price_out_usd_per_mtok=0.79,
                          quota_remaining=0.75, quota_drain_per_h=0.1)
    paid = ChannelProfile("fireworks/llama-70b@paid", "chat-70b", "paid", latency_source="fireworks_70b",
                          latency_ms=3770.0, price_in_usd_per_mtok=0.9, price_out_usd_per_mtok=0.9)
    r8, c8 = _chat_8b(6.0)
    return Scenario(
        name="quota-exhaustion",
        description=(
            "Route chat-70b (~8 req/s at 10:00, 50/50). groq/llama-70b@free reports its daily quota: 0.55 left "
            "at 10:00, then drained to 0 within 40 min; below 15 % it slows (x2.5 at empty) and refuses up to "
            "10 % with 429; from 10:40 every request gets 429 quota_exhausted for 15 min."
        ),
        duration_s=end,
        channels=(free, paid) + c8,
        routes=(RouteSpec("chat-70b", 10.0, {free.name: 0.5, paid.name: 0.5}, burstiness=0.5), r8),
        faults=(
            Fault(free.name, "quota_drain", t0, end,
                  {"drain_s": QUOTA_DRAIN_S, "slow_below": 0.15, "slow_factor": 2.5, "pre_429_share": 0.1}),
        ),
        expected=(
            _never_bad(free.name, t0),
            # SPEC §4.7: the forecast (0.83 / h) reaches empty within 30 min from ~10:10 (0.41 left)
            {"channel": free.name, "state_in": ["degraded"], "from_s": t0, "by_s": t0 + 1200,
             "reasons_any": ["quota"]},
            {"channel": free.name, "state_in": ["open"], "from_s": wall, "by_s": wall + 60,
             "reasons_any": ["error_rate", "consecutive_failures"]},
            _never_bad(paid.name, end),
            *(_never_bad(c.name, end) for c in c8),
        ),
        start_hour=8.0,
    )
