"""Issue #32 part 4 / SPEC §4.1: scenarios whose failures are not all the same failure.

Registered in :data:`pipeline.tools.simulate.scenarios.SCENARIOS` (so the scorecard runs them too). Flat
load (no day curve, no bursts) at the stated rates, 2 h healthy warm-up, real llmperf latency shapes.
Provider wordings are the providers' own (sources in :mod:`pipeline.ingest.error_patterns`).

* ``dead-key``: the key of account ``acct-a`` is revoked; both of its channels answer 401 for 40 min.
* ``quota-hard``: two channels run out of balance, one answering 429 and one 403, both in Chinese.
* ``retry-after``: 90 s of 429 with ``Retry-After: 20``.
* ``caller-storm``: for 20 min, 30 % of a channel's requests are the client's context-length 400s.
"""

from __future__ import annotations

from .background import never_bad
from .channels import ChannelProfile, RouteSpec
from .faults import Fault
from .scenario import WARMUP_S, Scenario

#: OpenAI's 401 for a revoked key (platform.openai.com/docs/guides/error-codes), key masked as OpenAI does.
DEAD_KEY_MESSAGE = ("Incorrect API key provided: sk-proj-****************************abcd. You can find your "
                    "API key at https://platform.openai.com/account/api-keys.")
#: Zhipu 1113 (open.bigmodel.cn 错误码) and a one-api/new-api relay's token quota wording.
QUOTA_403_MESSAGE = "余额不足或无可用资源包,请充值。"
QUOTA_429_MESSAGE = "该令牌额度已用尽 (账户余额不足)"
#: OpenAI's 429 wording with the wait it asks for.
RATE_LIMIT_MESSAGE = ("Rate limit reached for gpt-4o in organization org-demo on requests per min (RPM): "
                      "Limit 500, Used 500, Requested 1. Please try again in 20s.")
#: OpenAI's context-length 400 (``context_length_exceeded``).
CONTEXT_MESSAGE = ("This model's maximum context length is 128000 tokens. However, your messages resulted in "
                   "131072 tokens. Please reduce the length of the messages.")

#: dead-key: how long the key stays revoked (then it is rotated and the probes pass).
DEAD_KEY_S = 2400
#: retry-after: the 429 storm's length and the provider's Retry-After.
RETRY_STORM_S, RETRY_AFTER_S = 90, 20.0


#: List prices, USD per million tokens (in, out): OpenAI gpt-4o / gpt-4o-mini, Zhipu glm-4 at ~0.7 and
#: Moonshot at ~1.7 USD (their CNY list prices); every synthetic channel has prices (ok events carry a cost).
_PRICE = {"gpt-4o": (2.5, 10.0), "gpt-4o-mini": (0.15, 0.6), "glm-4": (0.7, 0.7), "kimi": (1.7, 1.7)}


def _priced(name: str, route: str, **kw) -> ChannelProfile:
    """A paid channel ``provider/model@paid`` with its model's list prices."""
    pin, pout = _PRICE[name.split("/", 1)[1].split("@", 1)[0]]
    return ChannelProfile(name, route, "paid", price_in_usd_per_mtok=pin, price_out_usd_per_mtok=pout, **kw)


def _flat(name: str, description: str, channels: tuple[ChannelProfile, ...], routes: tuple[RouteSpec, ...],
          faults: tuple[Fault, ...], expected: tuple[dict, ...], duration: int) -> Scenario:
    return Scenario(name=name, description=description, duration_s=duration, channels=channels, routes=routes,
                    faults=faults, expected=expected, start_hour=8.0, night_fraction=1.0, latency_swing=0.0)


def dead_key() -> Scenario:
    """Issue #32: account acct-a's key is revoked: both of its channels answer 401 for 40 min, then it is rotated.

    openai/gpt-4o@paid (route chat-4o, 4 req/s) and openai/gpt-4o-mini@paid (route chat-mini, 1 req/s)
    share the account; azure/gpt-4o@paid (acct-b, 4 req/s) is the healthy other channel of chat-4o.
    """
    t0, end = WARMUP_S, WARMUP_S + DEAD_KEY_S
    duration = end + 3600
    big = _priced("openai/gpt-4o@paid", "chat-4o", latency_source="fireworks_70b",
                         latency_ms=2400.0, error_rate=0.0, account="acct-a")
    mini = _priced("openai/gpt-4o-mini@paid", "chat-mini", latency_source="together_7b",
                          latency_ms=900.0, error_rate=0.0, account="acct-a")
    other = _priced("azure/gpt-4o@paid", "chat-4o", latency_source="together_70b",
                           latency_ms=2600.0, error_rate=0.0, account="acct-b")
    revoked = {"status": "error", "http_status": 401, "error_type": "invalid_api_key",
               "error_message": DEAD_KEY_MESSAGE, "latency_ms": 30.0}
    return _flat(
        "dead-key",
        "Account acct-a (openai/gpt-4o@paid 4 req/s, openai/gpt-4o-mini@paid 1 req/s) has its key revoked "
        "at 10:00: every request answers HTTP 401 invalid_api_key for 40 min, then the key is rotated. "
        "azure/gpt-4o@paid (acct-b) stays healthy.",
        (big, mini, other),
        (RouteSpec("chat-4o", 8.0, {big.name: 0.5, other.name: 0.5}, burstiness=0.0),
         RouteSpec("chat-mini", 1.0, {mini.name: 1.0}, burstiness=0.0)),
        (Fault(big.name, "outage", t0, end, revoked), Fault(mini.name, "outage", t0, end, revoked)),
        (never_bad(big.name, t0), never_bad(mini.name, t0), never_bad(other.name, duration),
         {"channel": big.name, "state_in": ["open"], "from_s": t0, "by_s": t0 + 5,
          "reasons_any": ["credential_invalid"]},
         {"channel": mini.name, "state_in": ["open"], "from_s": t0, "by_s": t0 + 5,
          "reasons_any": ["credential_invalid"]},
         {"channel": big.name, "state_in": ["healthy"], "from_s": end, "by_s": duration}),
        duration)


def quota_hard() -> Scenario:
    """Issue #32: two channels run out of balance for 30 min, in Chinese: one answers 429, one 403.

    zhipu/glm-4@paid answers 403 "余额不足或无可用资源包,请充值。" (Zhipu 1113); relay/glm-4@paid, a
    one-api/new-api relay, answers 429 "该令牌额度已用尽" (a 429 that is no rate limit). moonshot/kimi@paid
    stays healthy. 3 req/s each.
    """
    t0, end = WARMUP_S, WARMUP_S + 1800
    duration = end + 3600
    zhipu = _priced("zhipu/glm-4@paid", "chat-cn", latency_source="together_70b",
                           latency_ms=2000.0, error_rate=0.0)
    relay = _priced("relay/glm-4@paid", "chat-cn", latency_source="fireworks_70b",
                           latency_ms=2200.0, error_rate=0.0)
    kimi = _priced("moonshot/kimi@paid", "chat-cn", latency_source="anyscale_13b",
                          latency_ms=1800.0, error_rate=0.0)
    return _flat(
        "quota-hard",
        "Route chat-cn (3 x 3 req/s). From 10:00 for 30 min zhipu/glm-4@paid answers HTTP 403 "
        "'余额不足或无可用资源包,请充值。' and relay/glm-4@paid HTTP 429 '该令牌额度已用尽 (账户余额不足)'; "
        "then both are topped up. moonshot/kimi@paid stays healthy.",
        (zhipu, relay, kimi),
        (RouteSpec("chat-cn", 9.0, {c.name: 1 / 3 for c in (zhipu, relay, kimi)}, burstiness=0.0),),
        (Fault(zhipu.name, "outage", t0, end, {"status": "error", "http_status": 403, "error_type": "1113",
                                                 "error_message": QUOTA_403_MESSAGE, "latency_ms": 30.0}),
         Fault(relay.name, "outage", t0, end, {"status": "rate_limited", "http_status": 429,
                                                 "error_type": "insufficient_user_quota",
                                                 "error_message": QUOTA_429_MESSAGE, "latency_ms": 30.0})),
        (never_bad(zhipu.name, t0), never_bad(relay.name, t0), never_bad(kimi.name, duration),
         *({"channel": c.name, "state_in": ["open"], "from_s": t0, "by_s": t0 + 5,
            "reasons_any": ["quota_exhausted"]} for c in (zhipu, relay)),
         *({"channel": c.name, "state_in": ["healthy"], "from_s": end, "by_s": duration} for c in (zhipu, relay))),
        duration)


def retry_after() -> Scenario:
    """Issue #32: 90 s of HTTP 429 with Retry-After 20 s on openai/gpt-4o@paid (4 req/s), then none.

    The cooldown must last what the provider said (20 s), and the channel be back at full weight within
    minutes. azure/gpt-4o@paid (4 req/s) stays healthy.
    """
    t0, end = WARMUP_S, WARMUP_S + RETRY_STORM_S
    duration = end + 1800
    limited = _priced("openai/gpt-4o@paid", "chat-4o", latency_source="fireworks_70b",
                             latency_ms=2400.0, error_rate=0.0)
    other = _priced("azure/gpt-4o@paid", "chat-4o", latency_source="together_70b",
                           latency_ms=2600.0, error_rate=0.0)
    return _flat(
        "retry-after",
        "Route chat-4o (2 x 4 req/s). From 10:00 for 90 s every request of openai/gpt-4o@paid answers HTTP "
        "429 rate_limit_exceeded with Retry-After: 20; then the limit lifts. azure/gpt-4o@paid stays healthy.",
        (limited, other),
        (RouteSpec("chat-4o", 8.0, {limited.name: 0.5, other.name: 0.5}, burstiness=0.0),),
        (Fault(limited.name, "outage", t0, end, {"status": "rate_limited", "http_status": 429,
                                                   "error_type": "rate_limit_exceeded",
                                                   "error_message": RATE_LIMIT_MESSAGE,
                                                   "retry_after_s": RETRY_AFTER_S, "latency_ms": 20.0}),),
        (never_bad(limited.name, t0), never_bad(other.name, duration),
         {"channel": limited.name, "state_in": ["open"], "from_s": t0, "by_s": t0 + 5,
          "reasons_any": ["rate_limited"]},
         {"channel": limited.name, "state_in": ["healthy"], "from_s": end, "by_s": end + 600}),
        duration)


def caller_storm() -> Scenario:
    """Issue #32: for 20 min, 30 % of openai/gpt-4o@paid's requests are context-length 400s (the client's fault).

    The channel itself is fine: it must never leave ``healthy``. azure/gpt-4o@paid is its healthy sibling.
    4 req/s each.
    """
    t0, end = WARMUP_S, WARMUP_S + 1200
    duration = end + 1200
    storm = _priced("openai/gpt-4o@paid", "chat-4o", latency_source="fireworks_70b",
                           latency_ms=2400.0)
    other = _priced("azure/gpt-4o@paid", "chat-4o", latency_source="together_70b",
                           latency_ms=2600.0)
    return _flat(
        "caller-storm",
        "Route chat-4o (2 x 4 req/s). From 10:00 for 20 min a client sends prompts over the context length: "
        "30 % of openai/gpt-4o@paid's requests answer HTTP 400 context_length_exceeded. The channel is fine.",
        (storm, other),
        (RouteSpec("chat-4o", 8.0, {storm.name: 0.5, other.name: 0.5}, burstiness=0.0),),
        (Fault(storm.name, "caller_errors", t0, end, {"share": 0.3, "http_status": 400,
                                                        "error_type": "context_length_exceeded",
                                                        "error_message": CONTEXT_MESSAGE}),),
        (never_bad(storm.name, duration), never_bad(other.name, duration)),
        duration)
