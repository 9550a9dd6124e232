"""Policy-file rules (SPEC §4 "Policy rules"; issue #18 item 5): what a loaded policy may not say.

:func:`check_policy` runs after :func:`~pipeline.policy.defaults.load_policy`
has parsed and range-checked every key; a policy that breaks a rule is refused
with :class:`PolicyRuleError` (a ``ValueError``) naming the key and the rule:

- ``free-not-above-paid``: the free tier's ``error_rate_trip`` may not exceed
  the paid tier's (SPEC §4.1: free channels run at a lower baseline error
  rate, so their line is the lower one);
- ``long-cooldown-opt-in``: ``[policy] open_cooldown_ms`` above 120 000 ms
  needs ``allow_long_cooldown = true`` (a long cooldown keeps a recovered
  channel out of rotation; SPEC §4 default 90 s);
- ``backoff-cap-above-base``: each backed-off schedule's cap is at least its first cooldown
  (``reopen_backoff_max_ms`` >= ``open_cooldown_ms``, ``hard_fault_probe_max_ms`` >=
  ``hard_fault_probe_ms``, ``rate_limit_max_ms`` >= ``rate_limit_cooldown_ms``; SPEC §4.1, §4.2).
"""

from __future__ import annotations

from typing import Any

#: Longest ``open_cooldown_ms`` accepted without ``allow_long_cooldown = true`` (ms; SPEC §4 seed: 120 s).
MAX_COOLDOWN_MS = 120_000


class PolicyRuleError(ValueError):
    """A policy file broke a rule; ``key`` is the offending key, ``rule`` the rule's name."""

    def __init__(self, key: str, rule: str, message: str):
        super().__init__(f"{key}: {message} (rule {rule})")
        self.key, self.rule = key, rule


def check_policy(policy: Any, allow_long_cooldown: bool = False) -> None:
    """Raise :class:`PolicyRuleError` for the first broken rule of ``policy`` (a ``PolicyConfig``)."""
    tiers = policy.tiers
    if "free" in tiers and "paid" in tiers:
        free, paid = tiers["free"].error_rate_trip, tiers["paid"].error_rate_trip
        if free > paid:
            raise PolicyRuleError("[tier.free] error_rate_trip", "free-not-above-paid",
                                  f"the free tier's trip line {free:g} exceeds the paid line {paid:g}; "
                                  f"a free tier's line may not exceed the paid one")
    if policy.open_cooldown_ms > MAX_COOLDOWN_MS and not allow_long_cooldown:
        raise PolicyRuleError("[policy] open_cooldown_ms", "long-cooldown-opt-in",
                              f"a cooldown of {policy.open_cooldown_ms} ms is above {MAX_COOLDOWN_MS} ms; "
                              f"set allow_long_cooldown = true in [policy] to allow it")
    for cap, base in (("reopen_backoff_max_ms", "open_cooldown_ms"), ("hard_fault_probe_max_ms", "hard_fault_probe_ms"),
                      ("rate_limit_max_ms", "rate_limit_cooldown_ms")):
        if getattr(policy, cap) < getattr(policy, base):
            raise PolicyRuleError(f"[policy] {cap}", "backoff-cap-above-base",
                                  f"the backoff cap {getattr(policy, cap)} ms is below its first cooldown "
                                  f"{base} = {getattr(policy, base)} ms")
