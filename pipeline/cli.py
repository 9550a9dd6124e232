"""``channel-health`` command line (SPEC §7). Thin: parse, call, print.

Configuration comes from the environment (see :mod:`pipeline.config`);
flags override it for one run.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Optional

import typer

from pipeline.config import ConfigError, load_settings

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help=(
        "Channel health for LLM gateways: per-channel P95 vs a 24 h baseline, error rates, failure runs and "
        "missing structured fields, turned into circuit-breaker verdicts on Kafka (channel.health) and history "
        "in ClickHouse.\n\nStart with:  channel-health demo"
    ),
)


def _settings():
    try:
        return load_settings()
    except ConfigError as exc:
        typer.secho(f"configuration error: {exc}", fg="red", err=True)
        raise typer.Exit(2) from None


def _scenario_names() -> list[str]:
    from pipeline.simulate.scenarios import SCENARIOS

    return sorted(SCENARIOS)


@app.command()
def demo(
    scenario: str = typer.Option("gradual-degradation", help="Scenario to replay; see `channel-health simulate --help`."),
    data_dir: Path = typer.Option(Path("data"), help="Where chDB keeps the ClickHouse tables and the worker log."),
    seed: int = typer.Option(0, help="Simulator seed (same seed, same events)."),
    timeout_s: float = typer.Option(600.0, help="Give up waiting for the worker after this many seconds."),
    speed: float = typer.Option(200.0, help="Event-time speed-up of the replay (200: 2.4 h in ~45 s); 0 = as fast as possible."),
) -> None:
    """Run the main job on the embedded default: broker + ClickHouse (chDB) + worker + simulator.

    Shows the verdict timeline live (channel, state, weight, reasons) and ends with where the data lives
    and one example SQL query with its result. Set CHANNEL_HEALTH_KAFKA_BOOTSTRAP to use your own Kafka.
    """
    from pipeline.demo import run_demo

    if scenario not in _scenario_names():
        typer.secho(f"unknown scenario {scenario!r}; choose one of: {', '.join(_scenario_names())}", fg="red", err=True)
        raise typer.Exit(2)
    raise typer.Exit(run_demo(_settings(), scenario, data_dir, seed=seed, timeout_s=timeout_s, speed=speed))


@app.command()
def broker(port: Optional[int] = typer.Option(None, help="Loopback port (default: a free one).")) -> None:
    """Start only the embedded Kafka broker (Tansu, memory storage); print its bootstrap; run until Ctrl-C.

    Data is lost when it stops: for development, demos and tests.
    """
    from pipeline.embedded.broker import EmbeddedBroker

    b = EmbeddedBroker(port=port)
    b.start()
    typer.echo(b.bootstrap)
    typer.echo(f"export CHANNEL_HEALTH_KAFKA_BOOTSTRAP={b.bootstrap}", err=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        pass
    finally:
        b.stop()


@app.command()
def worker(
    loglevel: str = typer.Option("warn", help="faust log level: debug, info, warn, error."),
    policy: Optional[Path] = typer.Option(None, help="TOML file with per-tier / per-channel policy overrides."),
) -> None:
    """Run the stream worker against the configured Kafka and ClickHouse.

    Several workers may run in one consumer group (CHANNEL_HEALTH_CONSUMER_GROUP); each owns the channels
    of its partitions. With chDB only one process may open a data directory: use a ClickHouse server
    (CHANNEL_HEALTH_CLICKHOUSE_URL=http://...) for more than one worker.
    """
    from pipeline.policy.defaults import load_policy
    from pipeline.stream.app import run_worker

    settings = _settings()
    if not settings.kafka_bootstrap:
        typer.secho("CHANNEL_HEALTH_KAFKA_BOOTSTRAP is not set (start one with `channel-health broker`).",
                    fg="red", err=True)
        raise typer.Exit(2)
    sys.argv = [sys.argv[0], "worker"]  # faust parses argv
    run_worker(settings, load_policy(policy), loglevel=loglevel)


@app.command()
def simulate(
    scenario: str = typer.Option(..., help="Scenario name (SPEC §5)."),
    speed: float = typer.Option(0.0, help="Event-time speed-up (e.g. 720 = 24 h in 2 min); 0 = as fast as possible."),
    seed: int = typer.Option(0, help="Simulator seed."),
    list_scenarios: bool = typer.Option(False, "--list", help="List scenarios and exit."),
) -> None:
    """Publish a scenario's gateway events to the configured Kafka, in batch envelopes of 500 events.

    Event time ends at the current time; with --speed the publisher paces itself by event time.
    """
    from pipeline.simulate.scenarios import SCENARIOS, get_scenario

    if list_scenarios:
        for name in sorted(SCENARIOS):
            typer.echo(f"{name:<30} {SCENARIOS[name].description}")
        return
    settings = _settings()
    if not settings.kafka_bootstrap:
        typer.secho("CHANNEL_HEALTH_KAFKA_BOOTSTRAP is not set.", fg="red", err=True)
        raise typer.Exit(2)
    try:
        sc = get_scenario(scenario)
    except (KeyError, ValueError) as exc:
        typer.secho(str(exc), fg="red", err=True)
        raise typer.Exit(2) from None

    async def run() -> None:
        from pipeline.producer import BatchingProducer

        start_ms = int(time.time() * 1000) - int(sc.duration_s * 1000)
        wall0 = time.monotonic()
        async with BatchingProducer(settings.kafka_bootstrap or "", settings.topics.requests,
                                    security=settings.kafka_security.aiokafka_kwargs(),
                                    max_event_span_ms=10_000) as prod:
            for e in sc.events(start_ms=start_ms, seed=seed):
                if speed > 0:
                    due = (e["ts_ms"] - start_ms) / 1000 / speed
                    lag = due - (time.monotonic() - wall0)
                    if lag > 0.05:
                        await prod.flush()
                        await asyncio.sleep(lag)
                await prod.send(e)
                if prod.events_sent and prod.events_sent % 100_000 < 500 and prod.messages_sent:
                    typer.echo(f"\r{prod.events_sent:,} events published", nl=False, err=True)
        typer.echo(f"\r{prod.events_sent:,} events in {prod.messages_sent:,} messages published to "
                   f"{settings.topics.requests}", err=True)

    asyncio.run(run())


@app.command()
def query(
    sql: str = typer.Argument(..., help="One read-only statement (SELECT / WITH / SHOW / DESCRIBE / EXPLAIN)."),
    param: list[str] = typer.Option([], "--param", "-p", help="Bound parameter name=value, used as {name:Type}."),
    as_json: bool = typer.Option(False, "--json", help="Print rows as JSON lines."),
) -> None:
    """Run a read-only query against the configured ClickHouse and print a table.

    Example: channel-health query "SELECT state, count() FROM channel_health.channel_verdicts WHERE channel =
    {ch:String} GROUP BY state" -p ch=lepton/llama-70b@free
    """
    from pipeline.storage.client import open_client
    from pipeline.storage.query import QueryRefused, format_table, run_readonly_query

    params = {}
    for p in param:
        if "=" not in p:
            typer.secho(f"--param needs name=value, got {p!r}", fg="red", err=True)
            raise typer.Exit(2)
        k, v = p.split("=", 1)
        params[k] = v
    settings = _settings()
    try:
        cols, rows = run_readonly_query(open_client(settings), sql, params or None)
    except QueryRefused as exc:
        typer.secho(f"refused: {exc}", fg="red", err=True)
        raise typer.Exit(2) from None
    except Exception as exc:  # server-side errors: show the message, not a traceback
        typer.secho(f"query failed: {exc}", fg="red", err=True)
        raise typer.Exit(1) from None
    if as_json:
        for r in rows:
            typer.echo(json.dumps(dict(zip(cols, r)), default=str))
    else:
        typer.echo(format_table(cols, rows))


def _mount_quality() -> None:
    try:
        from pipeline.quality.cli import app as quality_app
    except ImportError:  # quality extras (torch, sentence-transformers) not installed
        return
    app.add_typer(quality_app, name="quality", help="The data team's loop for the quality model: train, evaluate, import-labels.")


_mount_quality()


def main() -> None:
    """Console-script entry point."""
    app()


if __name__ == "__main__":
    main()
