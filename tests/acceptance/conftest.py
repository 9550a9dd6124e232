"""Scenario replays through the in-process engine (no services): SPEC §5.

The scenarios read the full sets in ``../shared/data`` when present, else the
samples shipped in the package (the same events), so a plain clone runs them
too. ``CHANNEL_HEALTH_TEST_TRACES_DIR`` (a test-only knob) names another
folder, e.g. ``pipeline/tools/simulate/samples`` to force the samples beside the
full sets.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import pytest

from pipeline.contracts import Verdict
from pipeline.engine import Engine
from pipeline.engine.replay import replay
from pipeline.tools.simulate.scenarios import Scenario, get_scenario
from pipeline.tools.simulate.traces import DataNotFoundError

#: Scenario time 0: a fixed whole hour so runs are reproducible.
START_MS = 1_780_000_000_000 - 1_780_000_000_000 % 3_600_000
#: The traces folder of the replays (``None``: ../shared/data if present, else the shipped samples).
TRACES_DIR: Path | None = Path(os.environ["CHANNEL_HEALTH_TEST_TRACES_DIR"]) if os.environ.get(
    "CHANNEL_HEALTH_TEST_TRACES_DIR") else None


def scenario(name: str) -> Scenario:
    """Scenario ``name`` bound to :data:`TRACES_DIR`."""
    return get_scenario(name, data_dir=TRACES_DIR)


@dataclass
class Run:
    """A replayed scenario: its events, the engine after the run, and all verdicts."""

    scenario: Scenario
    events: list[dict]
    engine: Engine
    verdicts: list[Verdict]

    def t(self, ts_ms: int) -> float:
        """Scenario time in seconds of an event-time stamp."""
        return (ts_ms - START_MS) / 1000

    def of(self, channel: str) -> list[Verdict]:
        """The channel's verdicts in seq order."""
        return sorted((v for v in self.verdicts if v.channel == channel), key=lambda v: v.seq)

    def transitions(self, channel: str) -> list[Verdict]:
        """Verdicts where the channel's state changed (first verdict included)."""
        out, prev = [], None
        for v in self.of(channel):
            if v.state != prev:
                out.append(v)
                prev = v.state
        return out


def run_scenario(name: str, closed_loop: bool = False, seed: int = 0) -> Run:
    """Replay scenario ``name``; with ``closed_loop`` the simulated router follows the published shares."""
    sc = scenario(name)
    events: list[dict] = []
    holder: dict[str, Engine] = {}

    def shares(route: str, ts_ms: int):
        eng = holder.get("engine")
        return eng.routes.shares_by_route.get(route, {}) if eng is not None else {}

    def gen():
        for e in sc.events(start_ms=START_MS, seed=seed, shares=shares if closed_loop else None):
            events.append(e)
            yield e

    engine = Engine()
    holder["engine"] = engine
    try:
        engine, verdicts = replay(gen(), engine=engine)
    except DataNotFoundError as exc:  # only where CHANNEL_HEALTH_TEST_TRACES_DIR names a missing folder
        pytest.fail(f"traces folder missing: {exc}")
    return Run(sc, events, engine, verdicts)


@pytest.fixture(scope="session")
def scenario_run():
    """Session cache: each scenario is replayed once."""
    cache: dict[tuple[str, bool], Run] = {}

    def get(name: str, closed_loop: bool = False) -> Run:
        key = (name, closed_loop)
        if key not in cache:
            cache[key] = run_scenario(name, closed_loop)
        return cache[key]

    return get
