"""The scorecard's gateway peers (issues #32 and #33) on tiny hand-built streams: each right answer
follows from the peer's default rule as read in its source (cited in each module)."""

from __future__ import annotations

from pipeline.tools.scorecard.baseline import Call, to_call
from pipeline.tools.scorecard.helicone_monitor import HeliconePool
from pipeline.tools.scorecard.higress_failover import HigressFailoverPool
from pipeline.tools.scorecard.linkerd_accrual import LinkerdAccrual, backoff_ms
from pipeline.tools.scorecard.newapi_autodisable import NewApiAutoDisable
from pipeline.tools.scorecard.oneapi_metric import OneApiMetric


def ok(t: int, ttft_ms: float = 300.0) -> Call:
    return Call(t, False, 200, 2000.0, ttft_ms)


def fail(t: int, http: int = 502, message: str | None = None, retry_after_s: float | None = None) -> Call:
    return Call(t, True, http, 100.0, None, retry_after_s, message)


def feed(breaker, calls: list[Call]) -> list[int]:
    """Times of the calls that opened the breaker (calls it holds off are skipped)."""
    return [c.ts_ms for c in calls if breaker.allows(c.ts_ms) and breaker.record(c)]


def offer_all(pool, channel: str, calls: list[Call]) -> list[int]:
    return [c.ts_ms for c in calls if pool.offer(channel, c)]


def test_to_call_carries_ttft_retry_after_and_message():
    c = to_call({"ts_ms": 5, "status": "rate_limited", "latency_ms": 9.0, "ttft_ms": 4,
                 "retry_after_s": 20, "error_message": "slow down"})
    assert c == Call(5, True, 429, 9.0, 4.0, 20.0, "slow down")


# --- new-api: 401 or a keyword disables at once; a 10-minute test re-enables; > 5 s test disables --

def test_newapi_first_401_disables_but_5xx_429_and_timeouts_never_do():
    calls = [fail(1000 + i, http) for i, http in enumerate([502, 503, 500, 429, 504] * 20)]
    assert feed(NewApiAutoDisable(), calls) == []
    assert feed(NewApiAutoDisable(), [fail(1000, 502), fail(1001, 401), fail(1002, 401)]) == [1001]


def test_newapi_keywords_in_english_and_chinese_disable_any_status():
    assert feed(NewApiAutoDisable(), [fail(1, 429, "You exceeded your current QUOTA, check your plan")]) == [1]
    assert feed(NewApiAutoDisable(), [fail(1, 500, "上游返回：账户余额不足")]) == [1]
    assert feed(NewApiAutoDisable(), [fail(1, 429, "Rate limit reached for requests")]) == []


def test_newapi_reenabled_only_by_the_next_10_minute_test():
    b = NewApiAutoDisable()
    assert feed(b, [fail(1000, 401)]) == [1000]
    assert not b.allows(599_999)
    assert b.allows(600_000) and b.record(ok(600_000, ttft_ms=5_001)) is False  # a slow test fails
    assert not b.allows(600_001) and not b.allows(1_199_999)
    assert b.allows(1_200_000) and b.record(ok(1_200_000, ttft_ms=5_000)) is False
    assert b.allows(1_200_001) and not b.disabled


def test_newapi_test_slower_than_5_s_disables_an_enabled_channel():
    b = NewApiAutoDisable()
    assert feed(b, [ok(1000), ok(600_000, ttft_ms=5_000), ok(1_200_000, ttft_ms=5_001)]) == [1_200_000]
    # between tests a slow call is just a call
    assert feed(NewApiAutoDisable(), [ok(1000, ttft_ms=60_000)]) == []


# --- one-api metric mode: last 10 calls (11 once full) under 80 % success disables for good --------

def test_oneapi_trips_at_70_percent_of_10_not_at_80():
    assert feed(OneApiMetric(), [ok(i) for i in range(7)] + [fail(7), fail(8), fail(9)]) == [9]
    assert feed(OneApiMetric(), [ok(i) for i in range(8)] + [fail(8), fail(9)]) == []
    # fewer than 10 calls stored: never judged, even at 0 %
    assert feed(OneApiMetric(), [fail(i, 429) for i in range(9)]) == []
    assert feed(OneApiMetric(), [fail(i, 429) for i in range(10)]) == [9]


def test_oneapi_full_store_holds_11_and_nothing_reenables():
    b = OneApiMetric()
    assert feed(b, [ok(i) for i in range(10)] + [fail(10), fail(11)]) == []  # 9/11 = 0.82
    assert feed(b, [fail(12)]) == [12]  # 8/11 = 0.73
    assert not b.allows(10**13)


# --- Linkerd: 7 consecutive 5xx or success rate < 0.8 over 10 s with >= 5 responses; shut 1 s x 2^k
# to 60 s (+ jitter <= 50 %); one probation call -----------------------------------------------------

def spaced(n: int, t0: int = 0, http: int = 502) -> list[Call]:
    """``n`` failures 11 s apart: each alone in the 10 s success-rate window (only the count can trip)."""
    return [fail(t0 + 11_000 * i, http) for i in range(n)]


def test_linkerd_trips_on_the_seventh_consecutive_5xx_and_429_is_not_a_5xx():
    assert feed(LinkerdAccrual(jitter=0), spaced(6)) == []
    assert feed(LinkerdAccrual(jitter=0), spaced(7)) == [66_000]
    calls = spaced(6) + [fail(66_000, 429)] + spaced(6, 77_000)
    assert feed(LinkerdAccrual(jitter=0), calls) == []


def test_linkerd_success_rate_under_0_8_over_10_s_with_5_responses_trips():
    # 4 ok then 1 failure: 4/5 = 0.8 is not below 0.8; the 2nd failure makes 4/6 < 0.8
    calls = [ok(i * 100) for i in range(4)] + [fail(400), fail(500)]
    assert feed(LinkerdAccrual(jitter=0), calls) == [500]
    assert feed(LinkerdAccrual(jitter=0), calls[:5]) == []
    # a 429 counts as a failure of the success rate (unified.rs), not of the count
    calls = [ok(i * 100) for i in range(3)] + [fail(300, 429), fail(400, 429)]
    assert feed(LinkerdAccrual(jitter=0), calls) == [400]
    # responses older than 10 s leave the window: 3 failures then 3 ok 10 s later never trip
    calls = [fail(0), fail(1), fail(2)] + [ok(10_000 + i) for i in range(3)] + [fail(10_004)]
    assert feed(LinkerdAccrual(jitter=0), calls) == []


def test_linkerd_backoff_doubles_to_60_s_and_a_good_probe_resets_it():
    b = LinkerdAccrual(jitter=0)
    assert feed(b, spaced(7)) == [66_000]
    assert not b.allows(66_999) and b.allows(67_000) and not b.serving(67_000)
    assert b.record(fail(67_000)) is True  # failed probe: shut 2 s
    assert not b.allows(68_999) and b.allows(69_000)
    assert b.record(fail(69_000, 429)) is True  # a 429 fails the probe too: shut 4 s
    assert not b.allows(72_999) and b.allows(73_000)
    assert b.record(ok(73_000)) is False and b.allows(73_001) and b.serving(73_001)
    assert feed(b, spaced(7, 100_000)) == [166_000]
    assert not b.allows(166_999) and b.allows(167_000)  # 1 s again
    assert [backoff_ms(k) for k in (0, 1, 5, 6, 12)] == [1_000, 2_000, 32_000, 60_000, 60_000]
    # jitter: whole seconds of base_s * U * 0.5 (none for 1 s and 2 s), capped at 60 s in all
    assert backoff_ms(0, 0.999) == 1_000 and backoff_ms(2, 0.999) == 5_000 and backoff_ms(5, 0.999) == 47_000
    assert backoff_ms(6, 0.9) == 60_000


def test_linkerd_jitter_stays_within_half_the_base():
    b = LinkerdAccrual(seed=3)
    feed(b, spaced(7))
    assert b.until_ms == 67_000  # 1 s: no whole second of jitter
    for k, t in enumerate(range(67_000, 460_000, 70_000)):
        b.allows(t)
        b.record(fail(t))
        assert 0 <= b.until_ms - t - backoff_ms(k + 1) <= backoff_ms(k + 1) // 2


# --- Helicone: every 5 s, >= 20 requests and > 10 % 5xx in the current 60 s lap removes ----------

def lap_calls(n: int, errors: int) -> list[Call]:
    return [fail(60_000 + 100 * i, 503) if i < errors else ok(60_000 + 100 * i) for i in range(n)]


def test_helicone_removes_at_the_check_after_20_requests_over_10_percent():
    pool = HeliconePool(["a"])
    assert offer_all(pool, "a", lap_calls(20, 3) + [ok(64_999)]) == []  # no check yet
    assert offer_all(pool, "a", [ok(65_000)]) == [65_000]
    pool = HeliconePool(["a"])
    assert offer_all(pool, "a", lap_calls(20, 2) + [ok(65_000)]) == []  # 10 % is not > 10 %
    pool = HeliconePool(["a"])
    assert offer_all(pool, "a", lap_calls(19, 19) + [ok(65_000)]) == []  # grace: 19 requests


def test_helicone_readds_at_full_weight_at_the_first_check_of_the_next_lap():
    pool = HeliconePool(["a"])
    offer_all(pool, "a", lap_calls(20, 3) + [ok(65_000)])
    m = pool.monitors["a"]
    m.advance(119_999)
    assert not m.serving(119_999)
    m.advance(120_000)
    assert m.serving(120_000)


def test_helicone_429_removes_for_retry_after_or_30_s_plus_30_s():
    pool = HeliconePool(["a"])
    assert offer_all(pool, "a", [fail(1_000, 429, retry_after_s=20.0)]) == [1_000]
    m = pool.monitors["a"]
    assert not m.serving(50_999) and m.serving(51_000)
    pool = HeliconePool(["a"])
    assert offer_all(pool, "a", [fail(1_000, 429)]) == [1_000]
    assert not pool.monitors["a"].serving(60_999) and pool.monitors["a"].serving(61_000)


# --- Higress: 3 consecutive 4xx/5xx remove a key; a 200 health check every 5 s re-adds ----------

def test_higress_removes_on_the_third_consecutive_4xx_or_5xx():
    pool = HigressFailoverPool(["a", "b"])
    assert offer_all(pool, "a", [fail(1), fail(2, 400), ok(3), fail(4, 429), fail(5, 500)]) == []
    assert offer_all(pool, "a", [fail(6, 504)]) == [6]
    assert not pool.serving("a", 7) and pool.serving("b", 7)


def test_higress_health_check_every_5_s_readds_after_one_success():
    pool = HigressFailoverPool(["a", "b"])
    offer_all(pool, "a", [fail(1_000), fail(1_001), fail(1_002)])
    pool.offer("a", ok(4_999))  # before the 5 s tick: not a check
    assert not pool.serving("a", 4_999)
    pool.offer("a", ok(5_000, ttft_ms=5_001))  # check times out
    assert not pool.serving("a", 5_000)
    pool.offer("a", fail(10_000))  # failed check
    pool.offer("a", ok(14_999))
    assert not pool.serving("a", 14_999)
    pool.offer("a", ok(15_000))
    assert pool.serving("a", 15_000)


def test_higress_all_keys_removed_serves_a_random_one_without_counting():
    pool = HigressFailoverPool(["a", "b"])
    assert offer_all(pool, "a", [fail(1), fail(2), fail(3)]) == [3]
    assert offer_all(pool, "b", [fail(4), fail(5), fail(6)]) == [6]
    assert pool.serving("a", 7) and pool.serving("b", 7)
    assert offer_all(pool, "a", [fail(7), fail(8), fail(9)]) == []  # served, not counted
    pool.offer("b", ok(5_000))
    assert pool.serving("b", 5_001) and not pool.serving("a", 5_001)
