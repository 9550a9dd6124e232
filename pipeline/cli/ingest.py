"""``channel-health ingest otlp``: OpenTelemetry GenAI spans from a Collector's Kafka exporter (SPEC §7).

Registered in :mod:`pipeline.cli.main`; the work is in :mod:`pipeline.gateways.otlp_ingest`.
"""

from __future__ import annotations

import asyncio
import signal

import typer

from pipeline.cli.settings import kafka_settings_or_exit
from pipeline.redaction import redact_secrets

ingest_app = typer.Typer(no_args_is_help=True, rich_markup_mode="markdown",
                         help="Turn other telemetry into request events on gateway.requests.")


@ingest_app.command("otlp")
def ingest_otlp(
    topic: str = typer.Option("otlp_spans", "--topic", help="Topic the Collector's kafka exporter writes spans to."),
    encoding: str = typer.Option("auto", "--encoding",
                                 help="otlp_proto, otlp_json, or auto (JSON when a message starts with '{')."),
    group: str = typer.Option("channel-health-otlp", "--group", help="Kafka consumer group of the ingest processes."),
) -> None:
    """Read OpenTelemetry GenAI spans (gen_ai.*, error.type, http.response.status_code) from Kafka and publish
    one request event per span to gateway.requests; bad spans go to gateway.requests.dlq. Runs until Ctrl-C or
    SIGTERM. docs/CONNECTING.md has the Collector config and the field mapping.
    """
    if encoding not in ("auto", "otlp_proto", "otlp_json"):
        typer.secho(f"--encoding: one of auto, otlp_proto, otlp_json (got {encoding!r})", fg="red", err=True)
        raise typer.Exit(2)
    settings = kafka_settings_or_exit()
    try:
        from pipeline.gateways.otlp_ingest import run_otlp_ingest
    except ImportError as exc:  # the [otel] extra is missing: one line naming the pip command
        typer.secho(str(exc), fg="red", err=True)
        raise typer.Exit(2) from None

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        counts = await run_otlp_ingest(settings, topic, encoding, group, stop)  # type: ignore[arg-type]
        typer.echo(f"{counts.messages} messages: {counts.events} events, {counts.dead_letters} dead letters, "
                   f"{counts.skipped} spans without gen_ai.* skipped", err=True)

    typer.echo(f"ingest otlp: {topic} -> {settings.topics.requests} (dead letters: {settings.topics.dlq})", err=True)
    try:
        asyncio.run(main())
    except Exception as exc:  # Kafka unreachable at start: one line, no traceback
        typer.secho(redact_secrets(f"ingest otlp: {type(exc).__name__}: {exc}"), fg="red", err=True)
        raise typer.Exit(1) from None
