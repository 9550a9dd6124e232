"""Error classes (SPEC §4.1): real provider wording → class, precedence, overrides, hostile input."""

from __future__ import annotations

import time

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.contracts import RequestEvent
from pipeline.ingest.error_class import (
    ERROR_CLASSES,
    MAX_MESSAGE_CHARS,
    Classifier,
    ErrorTableError,
    provider_of,
    resolve_errors,
)

C = Classifier()

# (provider, http_status, error_type, error_message, expected class)
REAL = [
    # OpenAI
    ("openai", 401, "invalid_api_key", "Incorrect API key provided: sk-abc***xyz. You can find your API key at ...",
     "credential"),
    ("openai", 429, "insufficient_quota",
     "You exceeded your current quota, please check your plan and billing details.", "quota_exhausted"),
    ("openai", 429, "requests", ("Rate limit reached for gpt-4 in organization org-x on requests per min (RPM): "
     "Limit 3, Used 3, Requested 1. Please try again in 20s."), "rate_limited"),
    ("openai", 400, "context_length_exceeded", ("This model's maximum context length is 8192 tokens. However, "
     "your messages resulted in 9000 tokens."), "caller"),
    ("openai", 500, "server_error", "The server had an error while processing your request.", "transient"),
    # Azure
    ("azure", 429, None, ("Requests to the ChatCompletions_Create Operation under Azure OpenAI API version "
     "2024-02-01 have exceeded call rate limit of your current OpenAI S0 pricing tier."), "rate_limited"),
    ("azure", 401, None, "Access denied due to invalid subscription key or wrong API endpoint.", "credential"),
    # Anthropic
    ("anthropic", 529, "overloaded_error", "Overloaded", "transient"),
    ("anthropic", 401, "authentication_error", "invalid x-api-key", "credential"),
    ("anthropic", 400, "invalid_request_error",
     "Your credit balance is too low to access the Anthropic API.", "quota_exhausted"),
    ("anthropic", 400, "invalid_request_error", "prompt is too long: 210000 tokens > 200000 maximum", "caller"),
    ("anthropic", 429, "rate_limit_error", "Number of request tokens has exceeded your per-minute rate limit",
     "rate_limited"),
    # Gemini: RESOURCE_EXHAUSTED per minute (rate) vs per day (quota)
    ("gemini", 429, "RESOURCE_EXHAUSTED", ("You exceeded your current quota, please check your plan and billing "
     "details. Quota exceeded for metric: generativelanguage.googleapis.com/generate_content_free_tier_requests, "
     "quota_id: GenerateRequestsPerMinutePerProjectPerModel-FreeTier, limit: 2. Please retry in 33s."),
     "rate_limited"),
    ("gemini", 429, "RESOURCE_EXHAUSTED", ("Quota exceeded for metric: generate_content_free_tier_requests, "
     "quota_id: GenerateRequestsPerDayPerProjectPerModel-FreeTier, limit: 50"), "quota_exhausted"),
    ("gemini", 429, "RESOURCE_EXHAUSTED", "Resource has been exhausted (e.g. check quota).", "rate_limited"),
    ("gemini", 400, "INVALID_ARGUMENT", "API key not valid. Please pass a valid API key.", "credential"),
    # DeepSeek
    ("deepseek", 402, None, "Insufficient Balance", "quota_exhausted"),
    ("deepseek", 401, None, "Authentication Fails, Your api key: ****abcd is invalid", "credential"),
    ("deepseek", 422, None, "Invalid Parameters", "caller"),
    ("deepseek", 503, None, "Server Overloaded", "transient"),
    # Moonshot
    ("moonshot", 429, "exceeded_current_quota_error", ("Your account is suspended, please check your plan and "
     "billing details"), "quota_exhausted"),
    ("moonshot", 429, "rate_limit_reached_error", "Your account reached max request", "rate_limited"),
    ("moonshot", 400, "invalid_request_error", "Invalid request: Your request exceeded model token limit: 8192",
     "caller"),
    # Zhipu (codes in error_type, Chinese messages)
    ("zhipu", 429, "1113", "您的账户已欠费，请充值后重试。", "quota_exhausted"),
    ("zhipu", 401, "1002", "Authorization Token非法，请确认Authorization Token正确传递。", "credential"),
    ("zhipu", 429, "1302", "您当前使用该API的并发数过高，请降低并发，或联系客服增加限额。", "rate_limited"),
    ("zhipu", 400, "1261", "Prompt 超长", "caller"),
    # Qwen / DashScope
    ("dashscope", 400, "Arrearage", "Access denied, please make sure your account is in good standing.",
     "quota_exhausted"),
    ("dashscope", 401, "InvalidApiKey", "Invalid API-key provided.", "credential"),
    ("dashscope", 429, "Throttling.RateQuota", "Requests rate limit exceeded, please try again later.",
     "rate_limited"),
    ("dashscope", 400, "InvalidParameter", "Range of input length should be [1, 30720]", "caller"),
    # Baidu Qianfan (HTTP 200 with an error code in the body: the gateway reports status error)
    ("baidu", None, "17", "Open api daily request limit reached", "quota_exhausted"),
    ("baidu", None, "18", "Open api qps request limit reached", "rate_limited"),
    ("baidu", None, "110", "Access token invalid or no longer valid", "credential"),
    ("baidu", None, "336103", "the max input characters is 20000", "caller"),
    # new-api / one-api relays
    ("relay", 403, "insufficient_user_quota", "用户额度不足, 剩余额度: ＄0.000000", "quota_exhausted"),
    ("relay", 403, None, "该令牌额度已用尽", "quota_exhausted"),
    ("relay", 401, None, "该令牌已过期", "credential"),
    ("relay", 401, None, "无效的令牌", "credential"),
    ("relay", 500, None, "余额不足", "quota_exhausted"),
    ("relay", 429, None, "当前分组上游负载已饱和，请稍后再试", "rate_limited"),
    # issue #32 part 1, from the sources (new-api AutomaticDisableKeywords / ignore list, one-api
    # ShouldDisableChannel, LiteLLM exception names): each would be transient by its status alone
    ("relay", 500, None, "Permission denied", "credential"),
    ("relay", 503, None, "Operation not allowed", "credential"),
    ("relay", 500, None, "Your access was terminated due to violation of our policies", "credential"),
    ("relay", 500, None, "insufficient credit to complete this request", "quota_exhausted"),
    ("relay", None, None, "Requests are too frequent, please wait a short moment", "rate_limited"),
    ("litellm", None, "AuthenticationError", "litellm.AuthenticationError: OpenAIException - bad key",
     "credential"),
    ("litellm", None, "RateLimitError", "litellm.RateLimitError: try again later", "rate_limited"),
    ("litellm", None, "ContextWindowExceededError", "litellm.ContextWindowExceededError: too long", "caller"),
]


@pytest.mark.parametrize(("provider", "http", "etype", "message", "expected"), REAL)
def test_real_provider_messages(provider: str, http: int | None, etype: str | None, message: str,
                                expected: str) -> None:
    assert C.classify("error", http, etype, message, provider) == expected


@pytest.mark.parametrize(("http", "message", "expected"), [
    (429, "You exceeded your current quota", "quota_exhausted"),
    (403, "余额不足", "quota_exhausted"),
    (403, "Forbidden", "credential"),
    (401, "", "credential"),
    (402, "", "quota_exhausted"),
    (429, "", "rate_limited"),
    (400, "", "caller"), (404, "", "caller"), (413, "", "caller"), (422, "", "caller"),
    (500, "", "transient"), (502, "bad gateway", "transient"), (503, "invalid_request_error", "transient"),
    (None, "", "transient"), (418, "something odd", "transient"),
])  # fmt: skip
def test_precedence_by_status_and_wording(http: int | None, message: str, expected: str) -> None:
    assert C.classify("error", http, None, message, "someprovider") == expected


def test_explicit_class_wins_and_non_failures_have_none() -> None:
    assert C.classify("error", 401, "invalid_api_key", "Incorrect API key", explicit="caller") == "caller"
    assert C.classify("error", 401, None, None, explicit="bogus") == "credential"  # not a class: ignored
    assert C.classify("ok", 401, "invalid_api_key", None) is None
    assert C.classify("cancelled", 500, None, None, explicit="transient") is None
    assert C.classify("timeout", None, None, None) == "transient"
    assert C.classify("rate_limited", None, None, None) == "rate_limited"
    assert C.classify("timeout", None, None, "Incorrect API key provided") == "credential"


def test_provider_of_channel_names() -> None:
    assert provider_of("lepton/llama-70b@free") == "lepton"
    assert provider_of("OpenAI/gpt-4o") == "openai"
    assert provider_of("deepseek@paid") == "deepseek"
    assert provider_of("") == ""


def test_per_provider_override_beats_defaults_only_for_that_provider() -> None:
    c = Classifier.from_table({"lepton": {"transient": [r"insufficient_quota"], "caller": [r"bad\s+prompt \d+"]}})
    assert c.classify("error", 429, "insufficient_quota", None, "lepton") == "transient"
    assert c.classify("error", 429, "insufficient_quota", None, "openai") == "quota_exhausted"
    assert c.classify("error", 200, None, "BAD   prompt 42", "lepton") == "caller"
    plain = Classifier({"lepton": {"credential": ["a.b"]}})  # constructor: plain phrases, not regexes
    assert plain.classify("error", 500, None, "aXb", "lepton") == "transient"
    assert plain.classify("error", 500, None, "A.B", "lepton") == "credential"


@pytest.mark.parametrize(("table", "key"), [
    ({"lepton": {"caller": ["("]}}, "error_classes.lepton.caller[0]"),
    ({"lepton": {"caller": ["ok", "(a+)+$"]}}, "error_classes.lepton.caller[1]"),
    ({"lepton": {"fatal": ["x"]}}, "error_classes.lepton.fatal"),
    ({"lepton": {"caller": "x"}}, "error_classes.lepton.caller"),
    ({"lepton": {"caller": [""]}}, "error_classes.lepton.caller[0]"),
    ({"lepton": ["x"]}, "error_classes.lepton"),
    ({"lepton": {"caller": ["x" * 300]}}, "error_classes.lepton.caller[0]"),
])  # fmt: skip
def test_bad_override_table_refused_naming_the_key(table: dict, key: str) -> None:
    with pytest.raises(ErrorTableError) as info:
        Classifier.from_table(table)
    assert str(info.value).startswith(key + ":")


@pytest.mark.parametrize("message", [
    "a" * 5_000_000,
    "\x00\x1b[31m\r\n\u202e" * 100_000,
    ("(" * 50_000) + "x" * 50_000 + (")" * 50_000),
    "invalid " * 200_000 + "api key",
])  # fmt: skip
def test_hostile_messages_classify_in_bounded_time(message: str) -> None:
    c = Classifier(cache_size=0)
    start = time.perf_counter()
    for _ in range(20):
        assert c.classify("error", 400, message[:100_000], message, "openai") == "caller"
    assert time.perf_counter() - start < 1.0  # each call reads 2 KiB at most


def test_only_the_first_kib_is_read() -> None:
    late = "x" * 2000 + "invalid_api_key"
    assert C.classify("error", 500, None, late, "openai") == "transient"
    assert C.classify("error", 500, None, late[-1000:], "openai") == "credential"


@settings(max_examples=200, deadline=None)
@given(status=st.sampled_from(["error", "timeout", "rate_limited"]),
       http=st.one_of(st.none(), st.integers(0, 999)),
       etype=st.one_of(st.none(), st.text(max_size=50)),
       message=st.one_of(st.none(), st.text(max_size=2000)),
       provider=st.sampled_from(["", "openai", "gemini", "x"]))
def test_any_failure_gets_one_of_the_five_classes(status: str, http: int | None, etype: str | None,
                                                  message: str | None, provider: str) -> None:
    assert C.classify(status, http, etype, message, provider) in ERROR_CLASSES


def _event(**kw: object) -> RequestEvent:
    base = {"event_id": "e", "ts_ms": 0, "channel": "openai/gpt-4o", "route": "r", "status": "error",
            "latency_ms": 1.0}
    base.update(kw)
    return msgspec.convert(base, RequestEvent)


def test_resolve_errors_sets_the_class_cuts_the_message_and_counts_cuts() -> None:
    dead = _event(http_status=401, error_message="Incorrect API key provided " + "x" * 1000)
    ok = _event(status="ok", error_class="credential")
    explicit = _event(http_status=401, error_class="caller")
    plain_ok = _event(status="ok")
    assert resolve_errors([dead, ok, explicit, plain_ok]) == 1  # one message cut
    assert dead.error_class == "credential"
    assert len(dead.error_message or "") == MAX_MESSAGE_CHARS
    assert ok.error_class is None
    assert explicit.error_class == "caller"
    assert resolve_errors([dead, ok, explicit, plain_ok]) == 0  # idempotent
