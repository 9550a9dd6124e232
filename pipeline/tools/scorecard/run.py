"""Run the scorecard: scenarios x seeds -> the JSON document (see :mod:`.report`)."""

from __future__ import annotations

import time
from typing import Callable, Sequence

from pipeline.policy.defaults import PolicyConfig

from .report import aggregate
from .goodput import Truth
from .runner import run_seed
from .scenarios import DEFAULT_SCENARIOS, scorecard_scenario


def run_scorecard(names: Sequence[str] = DEFAULT_SCENARIOS, seeds: int = 5,
                  progress: Callable[[str], None] | None = None, policy: PolicyConfig | None = None) -> dict:
    """Every scenario in ``names`` with seeds ``0..seeds-1``; returns the JSON-ready document.

    ``policy``: channel-health's policy (default :class:`PolicyConfig`), its thresholds and its
    ``[error_classes.<provider>]`` patterns alike (the peers keep their own defaults).

    ``seeds`` >= 1. Raises ``ValueError`` for an unknown or unsupported scenario (before any run)
    or ``seeds`` < 1; :class:`~pipeline.tools.simulate.traces.DataNotFoundError` when the traces are missing.
    ``progress`` gets one line per finished scenario (name, seeds, seconds).
    """
    if seeds < 1:
        raise ValueError(f"seeds must be >= 1, got {seeds}")
    scenarios = [scorecard_scenario(n) for n in names]
    doc = {"seeds": list(range(seeds)), "scenarios": []}
    for sc in scenarios:
        t0 = time.monotonic()
        truth = Truth(sc)
        runs = [run_seed(sc, s, policy, truth=truth) for s in range(seeds)]
        doc["scenarios"].append(aggregate(sc, runs))
        if progress:
            progress(f"{sc.name}: {seeds} seed(s) in {time.monotonic() - t0:.0f} s")
    return doc
