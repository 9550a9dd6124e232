"""``channel-health topics ensure|check``: every Kafka topic with its configuration (SPEC §7, §8).

Registered in :mod:`pipeline.cli.main`; the work is in :mod:`pipeline.kafka.topics`.
"""

from __future__ import annotations

import asyncio

import typer

from pipeline.cli.settings import kafka_settings_or_exit
from pipeline.redaction import redact_secrets

topics_app = typer.Typer(no_args_is_help=True, rich_markup_mode="markdown",
                         help="Create or verify every Kafka topic with its configuration (SPEC §8).")

_kafka_settings = kafka_settings_or_exit


@topics_app.command("ensure")
def topics_ensure(timeout_s: float = typer.Option(15.0, help="Give up after this many seconds.")) -> None:
    """Create every missing topic with its configuration; existing topics are left as they are.

    Compacted channel.health, channel.control and state topic; DLQ retention from CHANNEL_HEALTH_DLQ_RETENTION;
    partitions, replication factor and min.insync.replicas from CHANNEL_HEALTH_PARTITIONS,
    CHANNEL_HEALTH_REPLICATION_FACTOR and CHANNEL_HEALTH_MIN_INSYNC_REPLICAS. Works with auto-create off.
    """
    from pipeline.kafka.topics import TopicSetupError, ensure

    settings = _kafka_settings()
    try:
        result = asyncio.run(ensure(settings, timeout_s=timeout_s))
    except TopicSetupError as exc:
        typer.secho(redact_secrets(f"topics: {exc}"), fg="red", err=True)
        raise typer.Exit(1) from None
    for name in result["created"]:
        typer.echo(f"created  {name}")
    for name in result["existing"]:
        typer.echo(f"exists   {name}")
    if result["existing"]:
        typer.echo("Existing topics are not changed; `channel-health topics check` compares them.", err=True)


@topics_app.command("check")
def topics_check(timeout_s: float = typer.Option(15.0, help="Give up after this many seconds.")) -> None:
    """Compare the cluster's topics with the configured ones; exit 1 on a mismatch.

    Reports missing topics, partition counts, replication factors and config values (cleanup.policy,
    retention.ms, min.insync.replicas) that differ. Settings the broker does not report are listed as
    UNVERIFIED (exit 0): the embedded broker is one.
    """
    from pipeline.kafka.topics import TopicSetupError, check

    settings = _kafka_settings()
    try:
        report = asyncio.run(check(settings, timeout_s=timeout_s))
    except TopicSetupError as exc:
        typer.secho(redact_secrets(f"topics: {exc}"), fg="red", err=True)
        raise typer.Exit(1) from None
    for line in report.lines():
        typer.echo(line)
    if report.mismatches:
        raise typer.Exit(1)
