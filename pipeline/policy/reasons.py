"""A verdict's reasons: every active finding, hard ones first (issue #17).

The state machine (:mod:`pipeline.policy.state_machine`) remembers why a
channel is in its state (the trip reasons of ``open``, the soft reasons of
``degraded``); the detectors keep running underneath. An operator reading a
verdict wants both: an open channel whose P95 also tripped says
``["error_rate", "latency_p95_ratio"]``, not only the trip.
"""

from __future__ import annotations

from typing import Sequence

from pipeline.signals import ADVISORY_DETECTORS, SOFT_DETECTORS
from pipeline.policy.state_machine import NO_DATA

#: Soft reasons in detector order (latency, missing fields, quality), then the advisory ones (cost):
#: published after the hard ones.
SOFT_ORDER: dict[str, int] = {d.reason: k for k, d in enumerate(SOFT_DETECTORS + ADVISORY_DETECTORS)}


def published_reasons(state: str, state_reasons: Sequence[str], hard_now: Sequence[str],
                      soft_now: Sequence[str]) -> list[str]:
    """The ``reasons`` list of a verdict in ``state``.

    ``state_reasons``: what the state machine holds (trip reasons in
    ``open``/``half_open``, soft reasons of ``degraded``/``recovering``,
    ``["no_data"]``); ``hard_now``: hard findings that fired this round
    (empty for a pre-trip between rounds); ``soft_now``: soft findings in
    force (the detectors' hysteresis state). Order: the held non-soft reasons,
    then new hard ones, then the soft ones in :data:`SOFT_ORDER`; no
    duplicates. In ``no_data`` the soft findings are stale (no events behind
    them) and only the held ones are kept. Never raises for unknown reason
    codes: a non-soft code counts as hard.
    """
    out = list(dict.fromkeys([*(r for r in state_reasons if r not in SOFT_ORDER), *hard_now]))
    soft = set(soft_now) if state != NO_DATA else set()
    soft.update(r for r in state_reasons if r in SOFT_ORDER)
    return out + sorted(soft, key=lambda r: (SOFT_ORDER.get(r, len(SOFT_ORDER)), r))  # unregistered soft: last
