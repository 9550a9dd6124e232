"""Acceptance for issue #32's must-holds (SPEC §4.1) on its scenarios: dead-key, quota-hard, retry-after,
caller-storm (:mod:`pipeline.tools.simulate.scenarios_errors`). Before issue #32 the classes were never read:
each of these fails there (a 401 opened only its own channel after a failure run and cycled every 90 s; a
Retry-After cooldown lasted 90 s; the caller storm opened the channel within seconds)."""

from __future__ import annotations

from pipeline.policy.defaults import PolicyConfig
from pipeline.tools.simulate.scenario import WARMUP_S
from pipeline.tools.simulate.scenarios_errors import DEAD_KEY_S, RETRY_AFTER_S, RETRY_STORM_S

from .test_scenarios import check_expected

BIG, MINI, OTHER = "openai/gpt-4o@paid", "openai/gpt-4o-mini@paid", "azure/gpt-4o@paid"


def test_dead_key_opens_the_channel_and_its_account_sibling_at_the_first_401(scenario_run):
    run = scenario_run("dead-key")
    check_expected(run)
    first = min(e["ts_ms"] for e in run.events if e.get("http_status") == 401)
    for ch in (BIG, MINI):
        v = next(v for v in run.of(ch) if v.state == "open")
        assert v.ts_ms == first  # within one evaluation: at the very event, for both channels of acct-a
        assert v.reasons == ["credential_invalid"] and v.metrics["account"] == "acct-a"
        assert v.metrics["account_channels"] == 2
    assert {v.state for v in run.of(OTHER)} <= {"healthy"}


def test_dead_key_probes_follow_the_backoff_schedule(scenario_run):
    """Probes (half_open) at the first round after 5 min, then after 10 and 20 min (+ <= 10 % jitter):
    4 probes in the 40 min of dead key instead of a 90 s open/half_open cycle (~13 probes)."""
    run = scenario_run("dead-key")
    sched = PolicyConfig().backoff("credential")
    trips = []
    for v in run.of(BIG):
        if v.state == "open" and all(t.metrics["next_probe_ts_ms"] != v.metrics["next_probe_ts_ms"] for t in trips):
            trips.append(v)
    dead = [v for v in trips if run.t(v.ts_ms) < WARMUP_S + DEAD_KEY_S]
    assert len(dead) == 4
    for k, v in enumerate(dead):
        assert v.metrics["next_probe_ts_ms"] == v.ts_ms + sched.delay_ms(k, seed=v.ts_ms)
    probes = [v for v in run.transitions(BIG) if v.state == "half_open"]
    for v, p in zip(dead, probes):  # each probe at the first 30 s round at or after the scheduled time
        assert 0 <= p.ts_ms - v.metrics["next_probe_ts_ms"] < 30_000
    gaps_s = [(b.ts_ms - a.ts_ms) / 1000 for a, b in zip(dead, dead[1:])]
    assert 300 <= gaps_s[0] < 330 and 600 <= gaps_s[1] < 690 and 1200 <= gaps_s[2] < 1350


def test_quota_hard_chinese_wording_opens_at_once_on_403_and_429(scenario_run):
    run = scenario_run("quota-hard")
    check_expected(run)
    for ch, status in (("zhipu/glm-4@paid", 403), ("relay/glm-4@paid", 429)):
        first = min(e["ts_ms"] for e in run.events if e["channel"] == ch and e.get("http_status") == status)
        v = next(v for v in run.of(ch) if v.state == "open")
        assert (v.ts_ms, v.reasons, v.metrics["error_class"]) == (first, ["quota_exhausted"], "quota_exhausted")
        assert "余额不足" in v.metrics["error_message"] or "额度已用尽" in v.metrics["error_message"]


def test_retry_after_cooldown_lasts_what_the_provider_said(scenario_run):
    run = scenario_run("retry-after")
    check_expected(run)
    ch = BIG
    first = next(v for v in run.of(ch) if v.state == "open")
    assert first.reasons == ["rate_limited"] and first.metrics["retry_after_s"] == RETRY_AFTER_S
    assert first.metrics["next_probe_ts_ms"] - first.ts_ms == 20_000  # not 90 s
    probe = next(v for v in run.of(ch) if v.state == "half_open")
    assert 20_000 <= probe.ts_ms - first.ts_ms < 50_000  # the first round after the 20 s
    end = WARMUP_S + RETRY_STORM_S
    full = next(v for v in run.of(ch) if run.t(v.ts_ms) > end and v.weight == 1.0)
    assert run.t(full.ts_ms) - end <= 300  # back at full weight within 5 min of the last 429
    assert not [v for v in run.of(ch) if run.t(v.ts_ms) > end + 60 and v.state == "open"]


def test_caller_storm_never_leaves_healthy(scenario_run):
    run = scenario_run("caller-storm")
    check_expected(run)
    vs = run.of(BIG)
    assert {v.state for v in vs} == {"healthy"}
    storm = [v for v in vs if WARMUP_S + 300 <= run.t(v.ts_ms) <= WARMUP_S + 1200]
    assert storm and all("caller_errors" in v.reasons for v in storm)
    n400 = sum(e.get("http_status") == 400 for e in run.events if e["channel"] == BIG)
    assert 0.25 < n400 / (1200 * 4) < 0.35  # the storm is the stated 30 % of 4 req/s for 20 min
