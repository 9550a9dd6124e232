"""The registered signals, in publication order: hard signals first, then soft, then advisory (SPEC §4).

Adding a signal = one module declaring a :class:`~pipeline.signals.base.Signal`
(see ``docs/ADDING_A_SIGNAL.md``) + one line here + its tests. The order
is the order of reasons in a verdict among signals of the same kind.
"""

from __future__ import annotations

from pipeline.signals import (consecutive_failures, cost, error_rate, latency_p95_ratio, missing_fields, quality, quota,
                              slow_stream)
from pipeline.signals.base import Signal, check_registry

SIGNALS: tuple[Signal, ...] = (
    consecutive_failures.SIGNAL,
    error_rate.SIGNAL,
    latency_p95_ratio.SIGNAL,
    missing_fields.SIGNAL,
    quality.SIGNAL,
    slow_stream.SIGNAL,
    quota.SIGNAL,
    cost.SIGNAL,
)
check_registry(SIGNALS)


def signal(name: str) -> Signal:
    """The registered signal ``name``; raises ``KeyError`` naming the known ones."""
    for s in SIGNALS:
        if s.name == name:
            return s
    raise KeyError(f"unknown signal {name!r}; registered: {[s.name for s in SIGNALS]}")


def policy_table() -> str:
    """The README's "Detection policy" table (Markdown), one row per registered signal.

    ``tests/unit/test_readme_policy.py`` checks that README.md holds exactly this.
    """
    rows = ["| signal | rule | default |", "|---|---|---|"]
    rows += [f"| `{s.name}` ({s.kind}) | {s.rule} | {s.default} |" for s in SIGNALS]
    return "\n".join(rows)
