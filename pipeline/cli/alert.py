"""``channel-health alert``: the alert process (SPEC §7, issue #20). Registered in :mod:`pipeline.cli.main`."""

from __future__ import annotations

import asyncio
import logging
import signal
from pathlib import Path

import typer

from pipeline.config import ConfigError
from pipeline.cli.settings import require_kafka, settings_or_exit
from pipeline.redaction import redact_secrets


def alert(
    config: Path = typer.Option(..., "--config", help="alerts.toml: routes, severity rules, grouping, heartbeat, "
                                "silences (see infra/alerts.example.toml)."),
    once: bool = typer.Option(False, "--once", help="Read what is waiting, send every pending alert at once, exit."),
    loglevel: str = typer.Option("info", help="Log level: debug, info, warning, error."),
) -> None:
    """Send alerts from channel.health to people: IM webhooks and a pager, with a backup route.

    Reads channel.health with its own consumer group; needs neither the worker nor ClickHouse, so it may run
    on another host. `open` -> critical, `degraded` -> warning, back to `healthy` -> resolve. Channels of one
    route that change together become one message (group_wait 30 s, group_interval 5 min); repeats are
    suppressed; a route that fails after its retries hands the alert to its `backup`. When no verdict arrives
    for `[heartbeat] silent_after_s` (300 s), a critical "pipeline silent" alert goes out. Secrets in URLs come
    from `${ENV}` or `url_file` and are never logged. SIGTERM or Ctrl-C stops it after pending sends (<= 10 s).

    Example:  CHANNEL_HEALTH_KAFKA_BOOTSTRAP=127.0.0.1:9092 channel-health alert --config alerts.toml
    """
    from pipeline.alert.config import load_alert_config
    from pipeline.alert.runner import run_alerts

    from pipeline.escape import install_log_escaping

    install_log_escaping()  # channel names in log lines: one line each, no terminal escape (SPEC §8)
    logging.basicConfig(level=loglevel.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    settings = settings_or_exit()
    try:
        cfg = load_alert_config(config)
    except ConfigError as exc:
        typer.secho(redact_secrets(f"configuration error: {exc}"), fg="red", err=True)
        raise typer.Exit(2) from None
    require_kafka(settings)

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        service = await run_alerts(cfg, settings, stop, once=once)
        typer.echo(f"alert: {service.messages} verdicts read, {service.bad_messages} bad, "
                   f"{service.silenced} silenced", err=True)

    asyncio.run(main())
