"""pipeline.policy.backoff and the schedules of PolicyConfig.backoff (SPEC §4.1 probes, §4.2 repeated trips)."""

from __future__ import annotations

import dataclasses

import pytest

from pipeline.policy.backoff import Backoff, jitter_fraction
from pipeline.policy.defaults import PolicyConfig
from pipeline.policy.rules import PolicyRuleError, check_policy

CFG = PolicyConfig()


def test_reopen_schedule_doubles_90s_to_15min_without_jitter():
    assert [Backoff(90_000, 900_000).delay_ms(k) for k in range(7)] == [
        90_000, 180_000, 360_000, 720_000, 900_000, 900_000, 900_000]


def test_jitter_only_lengthens_by_at_most_its_share_and_is_reproducible():
    b = Backoff(90_000, 900_000, jitter=0.1)
    assert b.delay_ms(0, seed=123) == 90_000  # the first cooldown is the plain SPEC §4 one
    got = [b.delay_ms(k, seed=1_780_000_000_000 + 977 * s) for k in (1, 2, 3) for s in range(200)]
    assert all(180_000 <= d <= 198_000 for d in got[:200])
    assert all(360_000 <= d <= 396_000 for d in got[200:400])
    assert len(set(got[:200])) > 150  # seeds spread the probes (no herd)
    assert b.delay_ms(2, seed=42) == b.delay_ms(2, seed=42) == round(360_000 * (1 + 0.1 * jitter_fraction(42, 2)))
    assert b.delay_ms(9, seed=42) == 900_000  # the cap holds after jitter


def test_policy_schedules_and_their_defaults():
    assert (CFG.reopen_backoff_max_ms, CFG.backoff_jitter) == (900_000, 0.1)
    assert (CFG.hard_fault_probe_ms, CFG.hard_fault_probe_max_ms) == (300_000, 1_800_000)
    assert (CFG.rate_limit_cooldown_ms, CFG.rate_limit_max_ms) == (30_000, 300_000)
    assert CFG.backoff("") == Backoff(90_000, 900_000, 2.0, 0.1)
    assert CFG.backoff("credential") == CFG.backoff("quota_exhausted") == Backoff(300_000, 1_800_000, 2.0, 0.1)
    assert CFG.backoff("rate_limited") == Backoff(30_000, 300_000, 2.0, 0.1)
    # credential probes: at most one per 5 min, doubling to 30 min (before jitter)
    plain = dataclasses.replace(CFG.backoff("credential"), jitter=0.0)
    assert [plain.delay_ms(k) // 60_000 for k in (0, 1, 2, 3, 4)] == [5, 10, 20, 30, 30]


@pytest.mark.parametrize("kw", [{"base_ms": 0, "max_ms": 10}, {"base_ms": 10, "max_ms": 5},
                                {"base_ms": 1, "max_ms": 2, "factor": 0.5}, {"base_ms": 1, "max_ms": 2, "jitter": 1.5}])
def test_bad_backoff_is_refused(kw):
    with pytest.raises(ValueError):
        Backoff(**kw)


@pytest.mark.parametrize("key", ["hard_fault_probe_ms", "rate_limit_trip_events", "caller_errors_min"])
def test_bad_policy_numbers_name_the_key(key):
    with pytest.raises(ValueError, match=key):
        PolicyConfig(**{key: 0})


@pytest.mark.parametrize("cap,base", [("reopen_backoff_max_ms", "open_cooldown_ms"),
                                      ("hard_fault_probe_max_ms", "hard_fault_probe_ms"),
                                      ("rate_limit_max_ms", "rate_limit_cooldown_ms")])
def test_rule_backoff_cap_not_below_its_first_cooldown(cap, base):
    bad = dataclasses.replace(CFG, **{cap: getattr(CFG, base) - 1})
    with pytest.raises(PolicyRuleError) as err:
        check_policy(bad)
    assert (err.value.key, err.value.rule) == (f"[policy] {cap}", "backoff-cap-above-base")
    check_policy(dataclasses.replace(CFG, **{cap: getattr(CFG, base)}))  # equal is fine
