"""``channel-health`` command line (SPEC §7). Thin: parse, call, print.

Configuration comes from the environment (see :mod:`pipeline.config`);
flags override it for one run.
"""

from __future__ import annotations

import asyncio
import json
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Optional

import typer

from pipeline.cli.help import PlainHelpCommand, PlainHelpGroup, use_plain_help
from pipeline.cli.settings import settings_or_exit
from pipeline.redaction import redact_secrets

# Tools (pipeline.tools: demo, simulator, bench, broker, quality training) are imported only inside the
# commands that run them, so `channel-health worker` never loads them (issue #15; tests/unit/test_import_graph.py).
QUALITY_HELP = "The data team's loop for the quality model: train, evaluate, import-labels."


class _AppGroup(PlainHelpGroup):
    """The ``channel-health`` group: ``quality`` (:mod:`pipeline.tools.quality.cli`) is built only when named
    or listed, so the worker's start imports no training code."""

    def list_commands(self, ctx):  # noqa: D102 (click API)
        return [*super().list_commands(ctx), "quality"]

    def get_command(self, ctx, name):  # noqa: D102 (click API)
        return _quality_group() if name == "quality" else super().get_command(ctx, name)


def _quality_group():
    """The ``quality`` sub-group as a click group, with the plain help classes."""
    from pipeline.tools.quality.cli import app as quality_app

    holder = typer.Typer()
    holder.add_typer(quality_app, name="quality", help=QUALITY_HELP)
    use_plain_help(holder)
    return typer.main.get_group(holder).commands["quality"]


class _ScenarioHelpCommand(PlainHelpCommand):
    """``demo`` / ``simulate``: the scenario list (the epilog) is read from the simulator only when help shows."""

    @property
    def epilog(self):  # noqa: D102 (click API)
        return _scenario_epilog()

    @epilog.setter
    def epilog(self, value) -> None:  # click's __init__ assigns None
        pass


app = typer.Typer(
    cls=_AppGroup,  # no `--help <bool>` / `{sql}` in help texts (issue #17); `quality` built on use
    add_completion=False,
    no_args_is_help=True,
    # Docstrings are hard-wrapped paragraphs: markdown joins their lines and rewraps them to the terminal.
    rich_markup_mode="markdown",
    # Tracebacks must not print local variables: they hold passwords (typer < 0.15 shows them by default).
    pretty_exceptions_show_locals=False,
    help=(
        "Channel health for LLM gateways: per-channel P95 vs a 24 h baseline, error rates, failure runs and "
        "missing structured fields, turned into circuit-breaker verdicts on Kafka (channel.health) and history "
        "in ClickHouse.\n\nStart with:  channel-health demo"
    ),
)


_settings = settings_or_exit


def _scenario_names() -> list[str]:
    from pipeline.tools.simulate.scenarios import SCENARIOS

    return sorted(SCENARIOS)


def scenario_lines() -> list[str]:
    """One line per scenario: its name padded to 28 characters, then ``SPEC §5.x: what happens``."""
    from pipeline.tools.simulate.scenarios import SCENARIOS, headline

    return [f"{name:<28} {headline(name)}" for name in sorted(SCENARIOS)]


def _scenario_epilog() -> str:
    """The scenario list for ``demo --help`` and ``simulate --help`` (markdown)."""
    from pipeline.tools.simulate.scenarios import SCENARIOS, headline

    items = "\n".join(f"- `{name}`: {headline(name)}" for name in sorted(SCENARIOS))
    return f"**Scenarios** (`--scenario NAME`; also `channel-health simulate --list`):\n\n{items}"


@app.command(cls=_ScenarioHelpCommand)
def demo(
    scenario: str = typer.Option("gradual-degradation", help="Scenario to replay (listed below)."),
    data_dir: Optional[Path] = typer.Option(
        None, help="Where chDB keeps the ClickHouse tables and the worker log (kept across runs). "
                   "Default: a new `data/demo-<UTC time>` per run."),
    seed: int = typer.Option(0, help="Simulator seed (same seed, same events)."),
    timeout_s: float = typer.Option(600.0, help="Give up waiting for the worker after this many seconds."),
    speed: float = typer.Option(200.0, help="Event-time speed-up of the replay (200: 2.4 h in ~45 s); 0 = as fast as possible."),
    keep: bool = typer.Option(False, "--keep", help="After the replay, keep broker and worker up until Ctrl-C and "
                              "print the exports to try watch, override and alert against them."),
) -> None:
    """Run the main job on the embedded default: broker + ClickHouse (chDB) + worker + simulator.

    Shows the verdict timeline live (channel, state, weight, reasons) and ends with where the data lives
    and one example SQL query with its result. Set CHANNEL_HEALTH_KAFKA_BOOTSTRAP to use your own Kafka.
    """
    from pipeline.tools.demo import run_demo
    from pipeline.tools.simulate.traces import DataNotFoundError

    if scenario not in _scenario_names():
        typer.secho(f"unknown scenario {scenario!r}; choose one of: {', '.join(_scenario_names())}", fg="red", err=True)
        raise typer.Exit(2)
    try:
        rc = run_demo(_settings(), scenario, data_dir, seed=seed, timeout_s=timeout_s, speed=speed, keep=keep)
    except DataNotFoundError as exc:  # ../shared/data present but incomplete: one line, not a traceback
        typer.secho(f"traces: {exc}", fg="red", err=True)
        raise typer.Exit(2) from None
    raise typer.Exit(rc)


@app.command()
def broker(port: Optional[int] = typer.Option(None, help="Loopback port (default: a free one).")) -> None:
    """Start only the embedded Kafka broker (Tansu, memory storage); print its bootstrap; run until Ctrl-C
    or SIGTERM (systemd, Kubernetes), which stop the broker.

    Data is lost when it stops: for development, demos and tests.
    """
    from pipeline.tools.embedded.broker import EmbeddedBroker

    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):  # Python's default SIGTERM ends the process without finally blocks
        signal.signal(sig, lambda signum, frame: stop.set())
    b = EmbeddedBroker(port=port)
    try:
        b.start()
        typer.echo(b.bootstrap)
        typer.echo(f"export CHANNEL_HEALTH_KAFKA_BOOTSTRAP={b.bootstrap}", err=True)
        stop.wait()
    finally:
        b.stop()


@app.command()
def worker(
    loglevel: str = typer.Option("warn", help="faust log level: debug, info, warn, error."),
    policy: Optional[Path] = typer.Option(None, help="TOML file with per-tier / per-channel policy overrides."),
    replay: bool = typer.Option(False, "--replay", help="Replay mode (as CHANNEL_HEALTH_CLOCK=event): the event-age "
                                "bound runs from the newest event accepted, so old data runs on its own clock."),
) -> None:
    """Run the stream worker against the configured Kafka and ClickHouse; first creates missing topics (`topics ensure`).

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
    from pipeline.kafka.topics import TopicSetupError
    from pipeline.storage.errors import StorageError

    if replay:
        settings = settings.with_overrides(clock="event")
    try:
        policy_config = load_policy(policy)
    except (OSError, ValueError) as exc:  # a refused policy names the key and the rule: one line, no traceback
        typer.secho(f"policy {policy}: {exc}", fg="red", err=True)
        raise typer.Exit(2) from None
    sys.argv = [sys.argv[0], "worker"]  # faust parses argv
    try:
        from mode.utils.logging import setup_logging

        from pipeline.escape import install_log_escaping

        install_log_escaping()  # names in log lines: one line each, no terminal escape (SPEC §8)
        setup_logging(loglevel=loglevel)  # as faust's worker will (again) at its start: the set-up before logs too
        run_worker(settings, policy_config, loglevel=loglevel)
    except StorageError as exc:  # ClickHouse unreachable or misconfigured at start: fail fast, one line
        typer.secho(redact_secrets(f"ClickHouse: {exc}"), fg="red", err=True)
        raise typer.Exit(1) from None
    except TopicSetupError as exc:  # Kafka unreachable, or a topic it refuses to create
        typer.secho(redact_secrets(f"topics: {exc}"), fg="red", err=True)
        raise typer.Exit(1) from None


def _utc_ms(text: str) -> int:
    """UTC epoch ms of an ISO 8601 time with a time zone (``Z`` or ``+hh:mm``); ValueError otherwise."""
    from datetime import datetime

    try:
        at = datetime.fromisoformat(text)
    except ValueError:
        raise ValueError(f"--start: not an ISO 8601 time: {text!r} (e.g. 2025-12-01T00:00:00Z)") from None
    if at.tzinfo is None:
        raise ValueError(f"--start: give a time zone, e.g. 2025-12-01T00:00:00Z (got {text!r}, which is ambiguous)")
    return int(at.timestamp() * 1000)


@app.command(cls=_ScenarioHelpCommand)
def simulate(
    scenario: Optional[str] = typer.Option(None, help="Scenario name (SPEC §5; listed below)."),
    speed: float = typer.Option(0.0, help="Event-time speed-up (e.g. 720 = 24 h in 2 min); 0 = as fast as possible."),
    seed: int = typer.Option(0, help="Simulator seed."),
    list_scenarios: bool = typer.Option(False, "--list", help="List scenarios and exit."),
    start: Optional[str] = typer.Option(None, "--start", help="Event time of the scenario's start, ISO 8601 with a "
                                        "time zone (e.g. 2025-12-01T00:00:00Z); default: it ends now. Data older "
                                        "than CHANNEL_HEALTH_MAX_EVENT_AGE needs `worker --replay`."),
    traces_dir: Optional[Path] = typer.Option(
        None, "--traces-dir", help="Folder with the full real traces (default: ../shared/data beside the repository "
                                   "if present, else the samples shipped in the package)."),
) -> None:
    """Publish a scenario's gateway events to the configured Kafka, in batch envelopes of 500 events.

    Event time ends at the current time, or starts at --start (a replay of a past day); with --speed the
    publisher paces itself by event time.
    """
    from pipeline.tools.simulate.scenarios import get_scenario
    from pipeline.tools.simulate.traces import DataNotFoundError, describe_data_source

    if list_scenarios:
        for line in scenario_lines():
            typer.echo(line)
        return
    if scenario is None:
        typer.secho("give --scenario NAME (see `channel-health simulate --list`) or --list", fg="red", err=True)
        raise typer.Exit(2)
    settings = _settings()
    if not settings.kafka_bootstrap:
        typer.secho("CHANNEL_HEALTH_KAFKA_BOOTSTRAP is not set.", fg="red", err=True)
        raise typer.Exit(2)
    try:
        sc = get_scenario(scenario, data_dir=traces_dir)
        typer.echo(describe_data_source(traces_dir), err=True)
        start_ms = _utc_ms(start) if start else int(time.time() * 1000) - int(sc.duration_s * 1000)
    except (KeyError, ValueError, DataNotFoundError) as exc:
        typer.secho(str(exc), fg="red", err=True)
        raise typer.Exit(2) from None

    async def run() -> None:
        from pipeline.kafka.producer import BatchingProducer

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

    try:
        asyncio.run(run())
    except DataNotFoundError as exc:  # a file missing from --traces-dir or ../shared/data
        typer.secho(f"traces: {exc}", fg="red", err=True)
        raise typer.Exit(2) from None


@app.command()
def query(
    sql: str = typer.Argument(..., help="One read-only statement (SELECT / WITH / SHOW / DESCRIBE / EXPLAIN)."),
    param: list[str] = typer.Option([], "--param", "-p", help="Bound parameter name=value, used as {name:Type}."),
    as_json: bool = typer.Option(False, "--json", help="Print rows as JSON lines (the same as --format json)."),
    fmt: str = typer.Option("table", "--format", "-f", help="table (numbers right-aligned; columns too wide for "
                            "the terminal are named, never cut silently), csv, tsv or json (JSON lines)."),
) -> None:
    """Run a read-only query against the configured ClickHouse and print a table, CSV, TSV or JSON lines.

    ClickHouse enforces it: readonly=1, no file/network/process functions, one statement, limits
    (CHANNEL_HEALTH_QUERY_MAX_EXECUTION_TIME_S, _MAX_MEMORY_BYTES, _MAX_RESULT_ROWS, _MAX_RESULT_BYTES).

    Example: channel-health query "SELECT state, count() FROM channel_health.channel_verdicts WHERE channel =
    {ch:String} GROUP BY state" -p ch=lepton/llama-70b@free
    """
    from pipeline.storage.client import POINT_AT_DATA, open_client
    from pipeline.storage.query import QueryLimitExceeded, QueryRefused, check_readonly_sql, run_readonly_query

    from pipeline.cli.output import FORMATS, format_rows

    fmt = "json" if as_json else fmt.lower()
    if fmt not in FORMATS:
        typer.secho(f"--format must be one of {', '.join(FORMATS)}, got {fmt!r}", fg="red", err=True)
        raise typer.Exit(2)
    params = {}
    for p in param:
        if "=" not in p:
            typer.secho(f"--param needs name=value, got {p!r}", fg="red", err=True)
            raise typer.Exit(2)
        k, v = p.split("=", 1)
        params[k] = v
    settings = _settings()
    try:
        check_readonly_sql(sql)  # refuse a write before connecting to anything
        client = open_client(settings, create_database=False)  # read-only: create no directory or database
        cols, rows = run_readonly_query(client, sql, params or None, settings.query_limits)
    except QueryRefused as exc:
        typer.secho(f"refused: {exc}", fg="red", err=True)
        raise typer.Exit(2) from None
    except QueryLimitExceeded as exc:  # names the limit and its variable
        typer.secho(redact_secrets(str(exc)), fg="red", err=True)
        raise typer.Exit(1) from None
    except Exception as exc:  # server-side errors: show the message, not a traceback
        message = f"query failed: {exc}"
        if "UNKNOWN_TABLE" in message or "Unknown table" in message:
            message += f"\n(queried ClickHouse at {settings.clickhouse_url_redacted}; {POINT_AT_DATA})"
        typer.secho(redact_secrets(message), fg="red", err=True)
        raise typer.Exit(1) from None
    typer.echo(format_rows(cols, rows, fmt), nl=False)


@app.command()
def bench(
    json_path: Optional[Path] = typer.Option(None, "--json", help="Also write the figures as JSON to this file."),
    quick: bool = typer.Option(False, "--quick", help="Smaller run: 150k batched / 10k single events, 10 s paced."),
    events: Optional[int] = typer.Option(None, "--events", help="Events in 500-event envelopes (default 500,000)."),
    single_events: Optional[int] = typer.Option(None, "--single-events",
                                                help="Single-event messages (default 30,000; the first events)."),
    channels: int = typer.Option(1_000, "--channels", help="Channels (each with a full 24 h baseline)."),
    partitions: int = typer.Option(4, "--partitions", help="Partitions of the benchmark topics."),
    batch_size: int = typer.Option(500, "--batch-size", help="Events per batch envelope."),
    rps_per_channel: float = typer.Option(10.0, "--rps-per-channel", help="Event-time rate per channel."),
    paced_seconds: Optional[float] = typer.Option(None, "--paced-seconds", help="Length of the half-load run (s)."),
    paced_rate: Optional[float] = typer.Option(None, "--paced-rate",
                                               help="Input rate of the paced runs (events/s) instead of half of each "
                                                    "driver's batched pipeline rate; then the paced stage runs "
                                                    "without the pipeline stage (--skip ceiling,bare,pipeline,"
                                                    "workers,profile)."),
    repeat: int = typer.Option(1, "--repeat", help="Run each throughput stage (ceiling, bare faust, pipeline) this "
                                                   "many times (1-9) and report the median-rate run with the spread."),
    skip: list[str] = typer.Option([], "--skip", help="Skip a stage: ceiling, bare, pipeline, workers, paced, profile "
                                                      "(or a full stage name, e.g. pipeline_aiokafka_single); "
                                                      "comma-separated or repeated."),
    workdir: Optional[Path] = typer.Option(None, "--workdir", help="Keep stage logs and results here."),
    sink_in_process: bool = typer.Option(False, "--sink-in-process",
                                         help="Write ClickHouse from the worker's own process "
                                              "(as CHANNEL_HEALTH_SINK_PROCESS=off), not from a sink process."),
    quality: bool = typer.Option(False, "--quality", help="Instead: quality scorer vs bare SentenceTransformer.encode."),
    quality_texts: int = typer.Option(256, "--quality-texts", help="Texts for --quality."),
) -> None:
    """Throughput benchmark on the embedded broker, in one run on the same pre-filled topics.

    Measures (a) a bare aiokafka consumer that only decodes (the ceiling), (b) a bare faust agent, (c) the
    full pipeline (validate → detectors → verdicts → ClickHouse) as the faust worker and as a plain aiokafka
    driver, each on 500-event envelopes and on single-event messages, with 1,000 channels holding full 24 h
    baselines; then 1 vs 2 workers, the verdict delay at half the batched rate, peak RSS, and the CPU per
    event of each step. Prints events/s and the ratios; see docs/THROUGHPUT.md.
    """
    from pipeline.tools.bench import report
    from pipeline.tools.bench.run import BenchOptions, run_bench

    if quality:
        from pipeline.tools.bench.quality import run_quality, table

        result = run_quality(quality_texts, workdir)
        typer.echo(table(result))
        if json_path is not None:
            json_path.write_text(json.dumps({"quality": result}, indent=2))
        return
    given = {k: v for k, v in dict(events=events, single_events=single_events, paced_seconds=paced_seconds,
                                   paced_rate=paced_rate).items()
             if v is not None}
    common = dict(channels=channels, partitions=partitions, batch_size=batch_size, rps_per_channel=rps_per_channel,
                  repeat=repeat, skip=list(skip), workdir=str(workdir) if workdir else None,
                  sink_process=not sink_in_process, **given)
    try:
        opts = BenchOptions.quick(**common) if quick else BenchOptions(**common)
        opts.validate()
    except ValueError as exc:
        typer.secho(str(exc), fg="red", err=True)
        raise typer.Exit(2) from None
    doc = run_bench(opts, echo=typer.echo)
    typer.echo("")
    typer.echo(report.table(doc))
    if json_path is not None:
        json_path.write_text(json.dumps(doc, indent=2, default=str))
        typer.echo(f"\nfigures written to {json_path}")


from pipeline.cli.topics import topics_app  # noqa: E402  (the topics ensure|check group)
app.add_typer(topics_app, name="topics")
from pipeline.cli.scorecard import ScorecardHelpCommand, scorecard as _scorecard  # noqa: E402  (issue #19)
app.command("scorecard", cls=ScorecardHelpCommand)(_scorecard)
from pipeline.cli.alert import alert as _alert  # noqa: E402  (issue #20: the alert process)
app.command("alert")(_alert)
from pipeline.cli.override import override_app as _override_app  # noqa: E402  (issue #20: manual switches)
app.add_typer(_override_app, name="override")
from pipeline.cli.watch import watch as _watch  # noqa: E402  (issue #20: the operator board)
app.command("watch")(_watch)
from pipeline.cli.report import report as _report  # noqa: E402  (issue #21: the HTML report)
app.command("report")(_report)
from pipeline.cli.drill import drill as _drill  # noqa: E402  (issue #22: drills)
app.command("drill")(_drill)
from pipeline.cli.history import register as _register_history  # noqa: E402  (issue #22: backtest, tune, incident)
_register_history(app)
from pipeline.cli.ingest import ingest_app as _ingest_app  # noqa: E402  (issue #36: ingest otlp)
app.add_typer(_ingest_app, name="ingest")
use_plain_help(app)


def main() -> None:
    """Console-script entry point."""
    app()


if __name__ == "__main__":
    main()
