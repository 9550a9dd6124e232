"""``channel-health report``: an HTML incident report from ClickHouse (issue #21). Registered in :mod:`pipeline.cli.main`."""

from __future__ import annotations

import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Optional

import typer

from pipeline.config import ConfigError, load_settings
from pipeline.escape import terminal_text
from pipeline.redaction import redact_secrets


def _when(text: Optional[str], flag: str, now_ms: int) -> Optional[datetime]:
    """``--from``/``--to`` as an aware UTC datetime: the forms of ``backtest`` (ISO 8601 with a zone, a date,
    epoch ms, ``-2h``, ``now``: :func:`~pipeline.tools.history.timeparse.parse_time_ms`); an ISO time without
    a zone is read as UTC, as this command always did. Exits 2 with the accepted forms otherwise."""
    from pipeline.tools.history.timeparse import TimeParseError, parse_time_ms

    if text is None:
        return None
    value = text.strip()
    try:
        ms = parse_time_ms(value, now_ms)
    except TimeParseError as exc:
        if "has no time zone" not in str(exc):
            typer.secho(f"{flag}: {exc}", fg="red", err=True)
            raise typer.Exit(2) from None
        ms = parse_time_ms(value + "Z", now_ms)
    return datetime.fromtimestamp(ms / 1000, tz=timezone.utc)


def window_line(data: object) -> str:
    """The report's window in its one notation (ISO 8601 UTC, ``Z``), with where the data stops and the
    incident's time to detect and recover when it has one."""
    from pipeline.tools.report.data import iso_utc
    from pipeline.tools.report.impact import impacts

    line = (f"window {iso_utc(data.t0)} to {iso_utc(data.t1)} (UTC, event time; data until "  # type: ignore[attr-defined]
            f"{iso_utc(data.data_end())})")  # type: ignore[attr-defined]
    for i in impacts(data):  # type: ignore[arg-type]
        det = "-" if i.detect_s is None else f"{i.detect_s:.0f} s"
        rec = "not recovered" if i.recover_s is None else f"{i.recover_s:.0f} s"
        line += (f"\n{terminal_text(i.channel)}: detected {iso_utc(i.detected)}, time to detect {det}, to recover "
                 f"{rec}; {i.failed:,} of {i.requests:,} requests failed, {i.slowed:,} in slow minutes")
    return line


def _say_window(data: object) -> None:
    typer.echo(window_line(data), err=True)


def report(
    out: Path = typer.Option(..., "--out", help="The HTML file to write (folders are created)."),
    channel: Optional[str] = typer.Option(None, "--channel", help="One channel, e.g. lepton/llama-70b@free."),
    route: Optional[str] = typer.Option(None, "--route", help="Every channel of a route, e.g. chat-70b."),
    start: Optional[str] = typer.Option(None, "--from", help="Window start: ISO 8601 (no zone = UTC), a date, "
                                        "epoch ms, or relative: -2h, -90m, now (as backtest)."),
    end: Optional[str] = typer.Option(None, "--to", help="Window end (exclusive), in the forms of --from."),
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

    now_ms = int(time.time() * 1000)
    t0, t1 = _when(start, "--from", now_ms), _when(end, "--to", now_ms)
    try:
        settings = load_settings()
    except ConfigError as exc:
        typer.secho(redact_secrets(f"configuration error: {exc}"), fg="red", err=True)
        raise typer.Exit(2) from None
    try:
        client = open_client(settings, create_database=False)
        path = write_report(client, out, settings.clickhouse_url_redacted, channel=channel, route=route, t0=t0,
                            t1=t1, incident=incident, limits=settings.query_limits, on_data=_say_window)
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
