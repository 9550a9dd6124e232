"""``channel-health report``: an HTML incident report from ClickHouse (issue #21). Registered in :mod:`pipeline.cli.main`."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import Optional

import typer

from pipeline.config import ConfigError, load_settings
from pipeline.escape import terminal_text
from pipeline.redaction import redact_secrets


def _when(text: Optional[str], flag: str) -> Optional[datetime]:
    if text is None:
        return None
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        typer.secho(f"{flag} needs an ISO 8601 time such as 2026-05-28T22:00:00Z, got {text!r}", fg="red", err=True)
        raise typer.Exit(2) from None


def report(
    out: Path = typer.Option(..., "--out", help="The HTML file to write (folders are created)."),
    channel: Optional[str] = typer.Option(None, "--channel", help="One channel, e.g. lepton/llama-70b@free."),
    route: Optional[str] = typer.Option(None, "--route", help="Every channel of a route, e.g. chat-70b."),
    start: Optional[str] = typer.Option(None, "--from", help="Window start, ISO 8601 (no zone = UTC)."),
    end: Optional[str] = typer.Option(None, "--to", help="Window end (exclusive), ISO 8601 (no zone = UTC)."),
    incident: bool = typer.Option(False, "--incident", help="Window = the first incident (first unhealthy "
                                  "verdict to the return to healthy) with 30 min on each side."),
) -> None:
    """Write one self-contained HTML report (plots embedded, opens without network) for a channel or route.

    Shows state bands over time, traffic, P95 against its baseline with the x1.8 / x1.2 lines, the error rate
    with its trip line and the test's lower bound, missing fields and quality, quota, stream stalls, weight and
    route share, a table of every state change with its reasons and numbers, and the SQL behind it all. Reads
    the configured ClickHouse (CHANNEL_HEALTH_CLICKHOUSE_URL) read-only. Without --from/--to or --incident the
    window is every verdict of the selection.

    Example:  channel-health report --channel lepton/llama-70b@free --incident --out incident.html
    """
    from pipeline.storage.client import POINT_AT_DATA, open_client
    from pipeline.tools.report import write_report
    from pipeline.tools.report.data import ReportError

    t0, t1 = _when(start, "--from"), _when(end, "--to")
    try:
        settings = load_settings()
    except ConfigError as exc:
        typer.secho(redact_secrets(f"configuration error: {exc}"), fg="red", err=True)
        raise typer.Exit(2) from None
    try:
        client = open_client(settings, create_database=False)
        path = write_report(client, out, settings.clickhouse_url_redacted, channel=channel, route=route, t0=t0,
                            t1=t1, incident=incident, limits=settings.query_limits)
    except ReportError as exc:
        typer.secho(f"report: {terminal_text(exc)}", fg="red", err=True)
        raise typer.Exit(2) from None
    except OSError as exc:
        typer.secho(f"report: cannot write {out}: {exc}", fg="red", err=True)
        raise typer.Exit(1) from None
    except Exception as exc:  # storage and query errors: the message, not a traceback
        message = f"report failed: {exc}"
        if "UNKNOWN_TABLE" in message or "Unknown table" in message or "no chDB data directory" in message:
            message += f"\n(read ClickHouse at {settings.clickhouse_url_redacted}; {POINT_AT_DATA})"
        typer.secho(redact_secrets(message), fg="red", err=True)
        raise typer.Exit(1) from None
    typer.echo(str(path))
