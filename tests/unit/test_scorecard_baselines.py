"""The scorecard's baseline breakers on tiny hand-built streams: each right answer follows from the
breaker's documented default rule (sources cited in each module)."""

from __future__ import annotations

from pipeline.tools.scorecard.baseline import Call, PerChannel, to_call
from pipeline.tools.scorecard.envoy_outlier import EnvoyOutlierPool
from pipeline.tools.scorecard.litellm_cooldown import LiteLLMCooldown
from pipeline.tools.scorecard.pybreaker_breaker import PyBreaker
from pipeline.tools.scorecard.resilience4j_breaker import Resilience4jBreaker


def ok(t: int, latency_ms: float = 100.0) -> Call:
    return Call(t, False, 200, latency_ms)


def fail(t: int, http: int = 502) -> Call:
    return Call(t, True, http, 100.0)


def feed(breaker, calls: list[Call]) -> list[int]:
    """Times of the calls that opened the breaker (calls it holds off are skipped)."""
    return [c.ts_ms for c in calls if breaker.allows(c.ts_ms) and breaker.record(c)]


def test_status_mapping():
    assert to_call({"ts_ms": 5, "status": "timeout", "latency_ms": 1.0}) == Call(5, True, 504, 1.0)
    assert to_call({"ts_ms": 5, "status": "rate_limited", "latency_ms": 1.0, "http_status": 503}).http_status == 429
    assert to_call({"ts_ms": 5, "status": "error", "latency_ms": 1.0, "http_status": 503}) == Call(5, True, 503, 1.0)
    assert to_call({"ts_ms": 5, "status": "cancelled", "latency_ms": 1.0}) is None
    assert to_call({"ts_ms": 5, "status": "ok", "latency_ms": 1.0}) == Call(5, False, 200, 1.0)


# --- pybreaker: fail_max 5 consecutive, reset_timeout 60 s -------------------------------------

def test_pybreaker_opens_on_the_fifth_consecutive_failure_not_the_fourth():
    assert feed(PyBreaker(), [fail(i) for i in range(4)]) == []
    assert feed(PyBreaker(), [fail(i) for i in range(5)]) == [4]


def test_pybreaker_success_resets_the_count():
    calls = [fail(0), fail(1), fail(2), fail(3), ok(4), fail(5), fail(6), fail(7), fail(8)]
    assert feed(PyBreaker(), calls) == []


def test_pybreaker_half_open_after_60_s_one_trial_decides():
    b = PyBreaker()
    assert feed(b, [fail(i) for i in range(5)]) == [4]
    assert not b.allows(4 + 59_999)
    assert feed(b, [fail(60_004)]) == [60_004]  # trial failed: open again at once
    assert feed(b, [ok(120_004), fail(120_005)]) == []  # trial succeeded: closed, count restarts


# --- resilience4j: 100-call window, minimum 100 calls, >= 50 % ----------------------------------

def test_resilience4j_needs_100_calls_then_50_percent():
    assert feed(Resilience4jBreaker(), [fail(i) for i in range(99)]) == []
    assert feed(Resilience4jBreaker(), [fail(i) for i in range(100)]) == [99]
    half = [fail(i) if i % 2 else ok(i) for i in range(100)]  # 50 failures of 100: >= 50 %
    assert feed(Resilience4jBreaker(), half) == [99]
    below = [fail(i) if i % 2 and i > 1 else ok(i) for i in range(100)]  # 49 of 100
    assert feed(Resilience4jBreaker(), below) == []


def test_resilience4j_window_slides_and_slow_calls_count():
    # 100 successes, then failures: the 50th failure makes the last 100 calls 50 % failures
    calls = [ok(i) for i in range(100)] + [fail(100 + i) for i in range(60)]
    assert feed(Resilience4jBreaker(), calls) == [149]
    assert feed(Resilience4jBreaker(), [ok(i, latency_ms=60_000.0) for i in range(100)]) == [99]
    assert feed(Resilience4jBreaker(), [ok(i, latency_ms=59_999.0) for i in range(100)]) == []


def test_resilience4j_half_open_judges_10_calls_after_60_s():
    b = Resilience4jBreaker()
    feed(b, [fail(i) for i in range(100)])
    assert not b.allows(99 + 59_999)
    t = 99 + 60_000
    probe = [fail(t + i) if i < 5 else ok(t + i) for i in range(10)]  # 5 of 10 fail: reopen
    assert feed(b, probe) == [t + 9]
    t2 = t + 9 + 60_000
    assert feed(b, [fail(t2 + i) if i < 4 else ok(t2 + i) for i in range(10)]) == []  # 4 of 10: closed
    assert b.state == "closed"


# --- LiteLLM: any 429; > 50 % of >= 5 requests in the minute; 5 s cooldown ---------------------

def test_litellm_a_single_429_cools_down_for_5_s():
    b = LiteLLMCooldown()
    assert feed(b, [ok(0), fail(1_000, 429)]) == [1_000]
    assert not b.allows(5_999) and b.allows(6_000)
    assert feed(LiteLLMCooldown(single=True), [ok(0), fail(1_000, 429)]) == []  # a group of one: no


def test_litellm_failure_share_needs_five_requests_in_the_minute():
    assert feed(LiteLLMCooldown(), [ok(0), fail(1), fail(2), fail(3)]) == []  # 75 % of 4
    assert feed(LiteLLMCooldown(), [ok(0), fail(1), fail(2), fail(3), fail(4)]) == [4]  # 80 % of 5
    assert feed(LiteLLMCooldown(), [ok(0), ok(1), ok(2), fail(3), fail(4), fail(5)]) == []  # 50 %: not > 50 %
    assert feed(LiteLLMCooldown(), [ok(0), ok(1), ok(2), fail(3), fail(4), fail(5), fail(6)]) == [6]


def test_litellm_minute_buckets_and_non_cooldown_statuses():
    # 3 failures at the end of one minute and 2 at the start of the next: two buckets, no cooldown
    assert feed(LiteLLMCooldown(), [fail(59_000), fail(59_500), fail(59_900), fail(60_000), fail(60_100)]) == []
    assert feed(LiteLLMCooldown(), [fail(i, 400) for i in range(10)]) == []  # a 400 is never cooled down


# --- Envoy: 5 consecutive 5xx, max ejection 10 % of the hosts -----------------------------------

def test_envoy_two_host_pool_never_ejects():
    pool = EnvoyOutlierPool(["a", "b"])
    assert [i for i in range(20) if pool.offer("a", fail(i, 503))] == []
    assert pool.refused == 4  # detected every 5th failure, refused by max_ejection_percent


def test_envoy_ten_host_pool_ejects_on_the_fifth_consecutive_5xx():
    hosts = [f"h{i}" for i in range(10)]
    pool = EnvoyOutlierPool(hosts)
    assert [i for i in range(4) if pool.offer("h0", fail(i, 503))] == []
    assert not pool.offer("h0", fail(4, 429))  # a 429 is not a 5xx: the run restarts
    assert [i for i in range(5, 10) if pool.offer("h0", fail(i, 504))] == [9]
    assert not pool.offer("h0", fail(29_999, 503))  # ejected: the call goes elsewhere
    # a second host may not be ejected while one is (2 of 10 > 10 %)
    assert [i for i in range(10, 15) if pool.offer("h1", fail(i, 503))] == []
    # back at the first 10 s sweep after 30 s; the next ejection lasts 60 s
    assert not pool.offer("h0", ok(40_000)) and "h0" not in pool.ejected_until
    assert [t for t in range(40_001, 40_006) if pool.offer("h0", fail(t, 503))] == [40_005]
    assert pool.ejected_until["h0"] == 110_000


def test_per_channel_pool_keeps_channels_apart():
    pool = PerChannel(PyBreaker, ["a", "b"])
    opened = [(ch, i) for i, ch in enumerate(["a", "b"] * 5) if pool.offer(ch, fail(i))]
    assert opened == [("a", 8), ("b", 9)]
