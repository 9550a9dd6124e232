"""Severity of a verdict (SPEC §7) and silences.

Defaults: ``open`` -> critical, ``degraded`` -> warning, ``healthy`` ->
resolve; ``half_open``, ``recovering`` and ``no_data`` keep the channel's
alert as it is (a channel probing after a trip is not yet healthy, and an idle
channel is not news). ``[[severity]]`` rules in ``alerts.toml`` override this
per state, route, tier and reason; the first matching rule wins.
"""

from __future__ import annotations

from fnmatch import fnmatchcase
from typing import Iterable, Sequence

from pipeline.alert.config import SeverityRule, Silence
from pipeline.contracts import Verdict

#: State -> outcome without rules (see the module docstring).
DEFAULT_OUTCOME = {"open": "critical", "degraded": "warning", "healthy": "resolve",
                   "half_open": "keep", "recovering": "keep", "no_data": "keep"}


def tier_of(verdict: Verdict) -> str | None:
    """``metrics["tier"]`` if a string, else ``free``/``paid`` from a ``...@free`` channel name, else None."""
    tier = verdict.metrics.get("tier")
    if isinstance(tier, str):
        return tier
    suffix = verdict.channel.rpartition("@")[2]
    return suffix if suffix in ("free", "paid") and "@" in verdict.channel else None


def outcome(verdict: Verdict, rules: Sequence[SeverityRule] = ()) -> str:
    """``info``/``warning``/``critical`` (firing), ``resolve`` or ``keep`` for ``verdict``.

    A rule matches when each of its set fields does: ``state`` equal,
    ``route`` glob, ``tier`` equal to :func:`tier_of`, ``reason`` among the
    verdict's reasons.
    """
    for rule in rules:
        if rule.state is not None and rule.state != verdict.state:
            continue
        if rule.route is not None and not fnmatchcase(verdict.route, rule.route):
            continue
        if rule.tier is not None and rule.tier != tier_of(verdict):
            continue
        if rule.reason is not None and rule.reason not in verdict.reasons:
            continue
        return rule.outcome
    return DEFAULT_OUTCOME[verdict.state]


def silenced_by(verdict: Verdict, silences: Iterable[Silence], wall_s: float) -> Silence | None:
    """The first silence in force at ``wall_s`` (UTC epoch seconds) matching the verdict's channel and route."""
    for s in silences:
        if wall_s < s.until_s and fnmatchcase(verdict.channel, s.channel) and fnmatchcase(verdict.route, s.route):
            return s
    return None
