"""``channel-health backtest``, ``tune`` and ``incident mark|list`` (issue #22). Registered in :mod:`pipeline.cli.main`.

The tools (:mod:`pipeline.tools.history`) are imported inside the commands only, so loading the CLI for
``channel-health worker`` imports none of them (issue #15).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, Optional

import typer

from pipeline.config import ConfigError, load_settings
from pipeline.redaction import redact_secrets

TIME_HELP = "ISO 8601 with a zone (2026-03-01T12:00:00Z), epoch ms, or relative (-24h, -90m, now)."

incident_app = typer.Typer(no_args_is_help=True, help=(
    "Labelled incidents and clean periods (table channel_incidents): the ground truth of backtest and tune.\n\n"
    "Example:  channel-health incident mark --channel lepton/llama-70b@free --from 2026-03-01T10:00Z "
    "--to 2026-03-01T10:40Z --kind latency"))


def _fail(message: str, code: int = 2) -> None:
    typer.secho(redact_secrets(message), fg="red", err=True)
    raise typer.Exit(code)


def _client(create: bool = True) -> Any:
    """The configured ClickHouse client (exit 2 with the reason otherwise).

    No DDL is applied: the reading commands work for read-only users; ``incident mark`` creates its own
    table (:func:`pipeline.tools.history.incidents.mark_incident`).
    """
    from pipeline.storage.client import open_client
    from pipeline.storage.errors import StorageError

    try:
        return open_client(load_settings(), create_database=create)
    except (ConfigError, StorageError) as exc:
        _fail(f"storage: {exc}")


def _storage_failed(exc: Exception) -> None:
    """Exit 1 with a driver error's message (no traceback), and where to point when a table is missing."""
    from pipeline.storage.client import POINT_AT_DATA

    message = f"query failed: {type(exc).__name__}: {exc}"
    if "UNKNOWN_TABLE" in message or "Unknown table" in message or "UNKNOWN_DATABASE" in message:
        message += f"\n(no channel-health tables there; {POINT_AT_DATA})"
    _fail(message, 1)


def _span(from_: str, to: str) -> tuple[int, int]:
    from pipeline.tools.history.timeparse import TimeParseError, parse_time_ms

    now = time.time_ns() // 1_000_000
    try:
        return parse_time_ms(from_, now), parse_time_ms(to, now)
    except TimeParseError as exc:
        _fail(f"time: {exc}")
    raise AssertionError  # unreachable: _fail raises


def _channels(values: list[str]) -> list[str]:
    return [c.strip() for v in values for c in v.split(",") if c.strip()]


def _warmup(text: Optional[str]) -> Optional[int]:
    if text is None:
        return None
    if text.strip() in ("0", "0s"):
        return 0
    from pipeline.config import parse_duration_ms

    try:
        return parse_duration_ms(text, "--warmup")
    except ConfigError as exc:
        _fail(str(exc))
    raise AssertionError


def _fmt_ms(ms: Optional[int]) -> str:
    return "missed" if ms is None else f"{ms / 1000:.0f} s"


def backtest(
    from_: str = typer.Option(..., "--from", help=TIME_HELP),
    to: str = typer.Option(..., "--to", help=TIME_HELP),
    channels: list[str] = typer.Option([], "--channels", help="Only these channels (repeat or comma-separate)."),
    policy: Optional[Path] = typer.Option(None, "--policy", help="Candidate policy.toml (default: built-in SPEC policy)."),
    warmup: Optional[str] = typer.Option(None, "--warmup", help="Event time replayed before --from and not compared, "
                                         "e.g. 24h (default: the baseline window, 24 h; 0: none)."),
    as_json: bool = typer.Option(False, "--json", help="Print the report as one JSON object on the last line."),
    html: Optional[Path] = typer.Option(None, "--html", help="Also write the report as one self-contained HTML file "
                                        "(tables and recorded-vs-replayed state bands; no network)."),
) -> None:
    """Replay stored request events through the engine with a candidate policy and compare with the recorded
    verdicts.

    Offline (no Kafka): events come from ClickHouse in event-time order, so data older than
    CHANNEL_HEALTH_MAX_EVENT_AGE works. A warm-up before --from rebuilds the 24 h baseline and each channel's
    state; only verdicts in [--from, --to) are compared. Per channel: transitions recorded, replayed and
    matching (same channel, state and 30 s evaluation round), transitions gained and lost, time in each state;
    first detection of each labelled incident and non-healthy verdicts on clean periods (channel-health
    incident). With the policy the worker ran, every transition matches.

    Example:  channel-health backtest --from -24h --to now --policy stricter.toml --html backtest.html
    """
    from pipeline.policy.defaults import load_policy
    from pipeline.storage.errors import StorageError
    from pipeline.tools.history.backtest import BacktestError, run_backtest

    start, end = _span(from_, to)
    warm = _warmup(warmup)
    try:
        candidate = load_policy(policy)
    except (OSError, ValueError) as exc:
        _fail(f"policy {policy}: {exc}")
    client = _client(create=False)
    try:
        report = run_backtest(client, candidate, start, end, _channels(channels) or None, warm,
                              keep_timelines=html is not None)
    except (BacktestError, StorageError) as exc:
        _fail(f"backtest: {exc}")
    except Exception as exc:  # driver errors have no common base across backends
        _storage_failed(exc)
    _print_backtest(report)
    if html is not None:
        from pipeline.tools.history.backtest_html import write_backtest_html

        try:
            path = write_backtest_html(report, html, policy, _channels(channels) or None)
        except OSError as exc:
            _fail(f"--html {html}: {exc}", 1)
        typer.echo(f"HTML report: {path}")
    report.pop("timelines", None)
    if as_json:
        typer.echo(json.dumps(report, sort_keys=True))


def _print_backtest(report: dict[str, Any]) -> None:
    from pipeline.storage.query import format_table

    rows = []
    for ch, d in report["channels"].items():
        rec, rep = d["time_in_state_ms_recorded"], d["time_in_state_ms_replayed"]
        states = sorted(set(rec) | set(rep))
        rows.append([ch, d["transitions_recorded"], d["transitions_replayed"], d["transitions_matching"],
                     len(d["gained"]), len(d["lost"]),
                     ", ".join(f"{s} {rec.get(s, 0) / 60000:.0f}/{rep.get(s, 0) / 60000:.0f}" for s in states)])
    typer.echo(format_table(["channel", "recorded", "replayed", "matching", "gained", "lost",
                             "minutes in state (recorded/replayed)"], rows))
    if report["incidents"]:
        typer.echo(format_table(["incident", "channel", "kind", "detected (recorded)", "detected (replayed)"],
                                [[i["incident_id"][:8], i["channel"], i["kind"], _fmt_ms(i["delay_recorded_ms"]),
                                  _fmt_ms(i["delay_replayed_ms"])] for i in report["incidents"]]))
    if report["clean_periods"]:
        typer.echo(format_table(["clean period", "channel", "non-healthy verdicts (recorded/replayed)"],
                                [[c["incident_id"][:8], c["channel"],
                                  f'{c["non_healthy_verdicts_recorded"]}/{c["non_healthy_verdicts_replayed"]}']
                                 for c in report["clean_periods"]]))
    typer.echo(f'transitions: {report["transitions_recorded"]} recorded, {report["transitions_replayed"]} replayed, '
               f'{report["transitions_matching"]} matching; {report["events"]} events replayed in '
               f'{report["replay_s"]} s ({report["events_per_s"]} events/s)')


def tune(
    from_: str = typer.Option(..., "--from", help=TIME_HELP),
    to: str = typer.Option(..., "--to", help=TIME_HELP),
    bounds: Path = typer.Option(..., "--bounds", help='TOML: [bounds] "latency.trip_ratio" = [1.3, 2.0, 0.1] '
                                "(low, high, step); keys: aliases, policy.KEY, tier.NAME.KEY, tier.*.KEY, route_wide.KEY "
                                "(the global [route_wide] table only); see pipeline/tools/history/tune.py."),
    policy: Optional[Path] = typer.Option(None, "--policy", help="Current policy.toml the proposal starts from."),
    warmup: Optional[str] = typer.Option(None, "--warmup", help="Replayed before --from (default 24 h)."),
    as_json: bool = typer.Option(False, "--json", help="Print the report as one JSON object on the last line."),
) -> None:
    """Propose thresholds within bounds from labelled history; never applies them.

    Replays the stored events of the channels with labelled incidents or clean periods (channel-health
    incident) once per candidate and picks the setting that detects every incident earliest (sum of
    delays) with no non-healthy verdict on the clean periods. Prints the proposed policy.toml with the
    evidence: per-incident delays and clean-period verdicts, proposed vs current. Exit 2 with the evidence
    when no setting within the bounds can.

    Example:  channel-health tune --from -7d --to now --bounds bounds.toml --policy policy.toml > proposal.toml
    """
    from pipeline.storage.errors import StorageError
    from pipeline.tools.history.incidents import list_incidents
    from pipeline.tools.history.tune import TuneError, TuneRefused
    from pipeline.tools.history.tune import tune as run_tune

    start, end = _span(from_, to)
    warm = _warmup(warmup)
    client = _client(create=False)
    try:
        report = run_tune(client, start, end, bounds, policy, list_incidents(client, start, end), warm)
    except TuneRefused as exc:
        _print_tune(exc.report)
        if as_json:
            typer.echo(json.dumps({**exc.report, "refused": str(exc)}, sort_keys=True))
        _fail(f"tune: {exc}")
    except (TuneError, StorageError) as exc:
        _fail(f"tune: {exc}")
    except Exception as exc:  # driver errors have no common base across backends
        _storage_failed(exc)
    _print_tune(report)
    typer.echo("# proposed policy.toml (not applied):")
    typer.echo(report["policy_toml"])
    if as_json:
        typer.echo(json.dumps(report, sort_keys=True))


def _print_tune(report: dict[str, Any]) -> None:
    from pipeline.storage.query import format_table

    cur = report["current_values"]
    typer.echo(format_table(["threshold", "current", "proposed"],
                            [[k, cur.get(k), v] for k, v in report["values"].items()]), err=True)
    typer.echo(format_table(["incident", "channel", "kind", "delay (current)", "delay (proposed)"],
                            [[i["incident_id"][:8], i["channel"], i["kind"], _fmt_ms(i["delay_ms_current"]),
                              _fmt_ms(i["delay_ms"])] for i in report["incidents"]]), err=True)
    typer.echo(format_table(["clean period", "channel", "non-healthy verdicts (current)", "(proposed)"],
                            [[c["incident_id"][:8], c["channel"], c["non_healthy_verdicts_current"],
                              c["non_healthy_verdicts"]] for c in report["clean_periods"]]), err=True)
    typer.echo(f'{report["evaluations"]} candidate policies replayed', err=True)


@incident_app.command("mark")
def incident_mark(
    channel: str = typer.Option(..., "--channel", help="Channel name as in the events."),
    from_: str = typer.Option(..., "--from", help=TIME_HELP),
    to: str = typer.Option(..., "--to", help=TIME_HELP),
    kind: str = typer.Option(..., "--kind", help="latency, errors, hollow, stream_stall, quota_drain, quality_drift, "
                             "other; or clean for a period that must stay healthy."),
    note: str = typer.Option("", "--note", help="Free text (what happened, ticket)."),
    route: str = typer.Option("", "--route", help="The channel's route (optional)."),
) -> None:
    """Mark an incident (or a clean period) on a channel by hand.

    Example:  channel-health incident mark --channel openai/gpt-4o --from 2026-03-01T10:00Z --to 2026-03-01T10:40Z
    --kind errors --note "upstream 503s, INC-123"
    """
    from pipeline.tools.history.incidents import IncidentError, mark_incident, validate

    start, end = _span(from_, to)
    try:
        validate(channel, start, end, kind, "manual")  # before opening storage
    except IncidentError as exc:
        _fail(f"incident: {exc}")
    client = _client()
    try:
        inc = mark_incident(client, channel, start, end, kind, source="manual", note=note, route=route)
    except Exception as exc:  # driver errors have no common base across backends
        _storage_failed(exc)
    typer.echo(f"marked {inc.kind} {inc.incident_id} on {inc.channel}")


@incident_app.command("list")
def incident_list(
    from_: Optional[str] = typer.Option(None, "--from", help=TIME_HELP),
    to: Optional[str] = typer.Option(None, "--to", help=TIME_HELP),
    channels: list[str] = typer.Option([], "--channels", help="Only these channels (repeat or comma-separate)."),
    kind: list[str] = typer.Option([], "--kind", help="Only these kinds (repeatable)."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object per line."),
) -> None:
    """List incidents and clean periods overlapping a span (all when no span is given).

    Example:  channel-health incident list --from -7d --kind clean
    """
    from pipeline.storage.query import format_table
    from pipeline.tools.history.incidents import list_incidents
    from pipeline.tools.history.timeparse import format_time_ms

    start = _span(from_, "now")[0] if from_ else None
    end = _span("now", to)[1] if to else None
    client = _client(create=False)
    try:
        rows = list_incidents(client, start, end, _channels(channels) or None, kind or None)
    except Exception as exc:  # driver errors have no common base across backends
        _storage_failed(exc)
    if as_json:
        for i in rows:
            typer.echo(json.dumps(i.__dict__, sort_keys=True))
        return
    typer.echo(format_table(["id", "channel", "kind", "from", "to", "source", "note"],
                            [[i.incident_id, i.channel, i.kind, format_time_ms(i.from_ms), format_time_ms(i.to_ms),
                              i.source, i.note] for i in rows]))


def register(app: typer.Typer) -> None:
    """Add ``backtest``, ``tune`` and the ``incident`` group to the ``channel-health`` app."""
    app.command("backtest")(backtest)
    app.command("tune")(tune)
    app.add_typer(incident_app, name="incident")
