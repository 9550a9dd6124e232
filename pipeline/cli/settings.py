"""Settings for a CLI command: read once from the environment, or a one-line error and exit code 2.

Every command that needs settings calls :func:`settings_or_exit`, and the ones
that talk to Kafka :func:`kafka_settings_or_exit`, so a bad variable reads the
same everywhere (the message names the variable, secrets redacted, no traceback).
"""

from __future__ import annotations

import typer

from pipeline.config import ConfigError, Settings, load_settings
from pipeline.redaction import redact_secrets


def settings_or_exit() -> Settings:
    """:func:`pipeline.config.load_settings`; on ``ConfigError`` prints it in red and exits 2."""
    try:
        return load_settings()
    except ConfigError as exc:
        typer.secho(redact_secrets(f"configuration error: {exc}"), fg="red", err=True)
        raise typer.Exit(2) from None


def require_kafka(settings: Settings) -> Settings:
    """``settings``; prints an error and exits 2 when ``CHANNEL_HEALTH_KAFKA_BOOTSTRAP`` is unset."""
    if not settings.kafka_bootstrap:
        typer.secho("CHANNEL_HEALTH_KAFKA_BOOTSTRAP is not set.", fg="red", err=True)
        raise typer.Exit(2)
    return settings


def kafka_settings_or_exit() -> Settings:
    """:func:`settings_or_exit` then :func:`require_kafka`."""
    return require_kafka(settings_or_exit())
