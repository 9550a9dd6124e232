"""``channel-health scorecard``: detection delays and false verdicts, beside common breakers' defaults."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Optional

import typer

from pipeline.cli.help import PlainHelpCommand


def scenario_epilog() -> str:
    """The ``scorecard --help`` scenario lists (markdown), read from :mod:`pipeline.tools.scorecard.scenarios`
    when help shows (the CLI module imports no tools): the default list, the ones run by name only
    (``LONG_SCENARIOS``) and the unsupported ones with their reason."""
    from pipeline.tools.scorecard.scenarios import DEFAULT_SCENARIOS, LONG_SCENARIOS, UNSUPPORTED

    lines = ["**Scenarios** (`--scenarios A,B`): by default " + ", ".join(f"`{n}`" for n in DEFAULT_SCENARIOS) + "."]
    if LONG_SCENARIOS:
        lines.append("By name only (long replays): " + ", ".join(f"`{n}`" for n in LONG_SCENARIOS) + ".")
    lines += [f"Not supported: `{n}` ({why})." for n, why in UNSUPPORTED.items()]
    return "\n\n".join(lines)


class ScorecardHelpCommand(PlainHelpCommand):
    """``scorecard``: its scenario lists (the epilog) come from the scorecard's own tuples when help shows."""

    @property
    def epilog(self):  # noqa: D102 (click API)
        return scenario_epilog()

    @epilog.setter
    def epilog(self, value) -> None:  # click's __init__ assigns None
        pass


def scorecard(
    seeds: int = typer.Option(5, min=1, help="Seeds per scenario (0..N-1); the median is reported."),
    scenarios: Optional[str] = typer.Option(
        None, help="Comma-separated scenario names (default: the list below)."),
    json_path: Optional[Path] = typer.Option(None, "--json", help="Also write the full figures as JSON here."),
    policy: Optional[Path] = typer.Option(None, "--policy", help="policy.toml for channel-health (thresholds, "
                                          "error-class patterns, [route_wide] numbers; default: the built-in "
                                          "policy)."),
) -> None:
    """Replay the scenarios offline through the engine and score channel-health against the
    default rules of LiteLLM's router cooldown, Envoy outlier detection, resilience4j and pybreaker
    on the same event streams.

    Per scenario and policy: the median detection delay over the seeds (first non-healthy verdict,
    open, cooldown or ejection on the faulted channel after the fault starts) and the false verdicts
    (non-healthy on clean channels or before the fault). A second table shows channel-health's
    first reasons, the injected fault strength at detection, open cycles and the recovery timeline
    against SPEC §4. A third shows the outcome (docs/SCORECARD.md "Goodput"): the share of the
    requests a router following each policy would have served, with each channel's capacity from the
    scenario, the seconds a route had no channel in service, and an oracle router as the ceiling. No Kafka, no ClickHouse; seconds per scenario and seed (clean-day: minutes).

    Example:  channel-health scorecard --seeds 3 --scenarios error-creep,latency-swap --json card.json
    """
    from pipeline.policy.defaults import load_policy
    from pipeline.tools.simulate.traces import DataNotFoundError
    from pipeline.tools.scorecard.report import detail, outcome_table, table
    from pipeline.tools.scorecard.run import run_scorecard
    from pipeline.tools.scorecard.scenarios import DEFAULT_SCENARIOS

    names = [n.strip() for n in scenarios.split(",") if n.strip()] if scenarios else list(DEFAULT_SCENARIOS)
    try:
        cfg = load_policy(policy)
    except (OSError, ValueError) as exc:  # a refused policy names the key: one line, no traceback
        typer.secho(f"policy {policy}: {exc}", fg="red", err=True)
        raise typer.Exit(2) from None
    try:
        doc = run_scorecard(names, seeds, progress=lambda line: print(line, file=sys.stderr, flush=True),
                            policy=cfg)
    except (ValueError, DataNotFoundError) as exc:
        typer.secho(f"scorecard: {exc}", fg="red", err=True)
        raise typer.Exit(2) from None
    typer.echo(f"Median over {seeds} seed(s); FV = false verdicts, summed over the seeds.\n")
    typer.echo(table(doc))
    typer.echo("\nchannel-health detail (primary faulted channel):\n")
    typer.echo(detail(doc))
    typer.echo("\nOutcome: goodput (share of the requests a router following the policy serves; median over "
               "the seeds) and route blackout (seconds with no channel in service), beside the oracle:\n")
    typer.echo(outcome_table(doc))
    if json_path is not None:
        json_path.write_text(json.dumps(doc, indent=1))
        typer.echo(f"\nfigures written to {json_path}")
