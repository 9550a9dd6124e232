"""``channel-health drill``: inject a fault, watch the verdicts, print expected vs actual (SPEC §7, issue #22).

Registered in :mod:`pipeline.cli.main`; the work is in :mod:`pipeline.tools.drill`.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Optional

import typer

from pipeline.config import ConfigError, load_settings, parse_duration_ms
from pipeline.redaction import redact_secrets

#: Exit code of a drill that ran but whose timings did not match the expected timeline.
EXIT_MISMATCH = 3


def _fail(msg: str, code: int = 2) -> None:
    typer.secho(redact_secrets(msg), fg="red", err=True)
    raise typer.Exit(code)


def drill(
    fault: str = typer.Option(..., "--fault", help="Fault kind: errors, latency, hollow, stream_stall, quota_drain, "
                              "quality_drift."),
    channel: str = typer.Option(..., "--channel", help="Drill channel. With --shadow any name (the drill makes its "
                                "traffic); without, an existing channel whose name contains 'drill'."),
    shadow: bool = typer.Option(False, "--shadow", help="Run on shadow topics drill.<run_id>.* with the drill's own "
                                "worker (and embedded broker when CHANNEL_HEALTH_KAFKA_BOOTSTRAP is unset)."),
    duration: Optional[str] = typer.Option(None, "--duration", help="Fault length of event time, e.g. 60s, 10m "
                                           "(default per kind: errors 60s, latency/hollow/stream_stall 10m, ...)."),
    speed: float = typer.Option(0.0, "--speed", help="Shadow: event-time seconds per wall second from the fault on "
                                "(0: as fast as possible). Live drills run in real time."),
    policy: Optional[Path] = typer.Option(None, "--policy", help="Policy TOML the expected timeline (and the shadow "
                                          "worker) use; default: the built-in policy."),
    offline: bool = typer.Option(False, "--offline", help="No Kafka, no worker: replay the drill through the engine "
                                 "in this process (checks the policy's own timeline; stores nothing)."),
    yes_production: bool = typer.Option(False, "--yes-production", help="Without --shadow: confirm that extra events "
                                        "go to the production topic."),
    data_dir: Optional[Path] = typer.Option(None, "--data-dir", help="Shadow with chDB: where chDB and the worker "
                                            "log go (default data/drill-<run_id>)."),
    timeout_s: float = typer.Option(300.0, "--timeout", help="Seconds to wait for the verdicts after the last event."),
    as_json: bool = typer.Option(False, "--json", help="End with one JSON line: run id, rows, passed, incident id."),
) -> None:
    """Inject a fault on a drill channel, watch the verdicts, and print expected vs actual timings.

    The expected timeline comes from the policy (detection bound, open, half_open at +cooldown, recovering
    after the half-open observation, ramp steps every 120 s, healthy); each actual transition is shown with
    its difference, tolerance one evaluation round (30 s). The run goes to channel_health.drill_runs and
    its fault window to channel_incidents (source drill). Exit 0 when every step matched, 3 when the drill
    ran but did not match (e.g. a detector is missing), 2 on bad input.

    Example:  channel-health drill --fault errors --channel drill/errors --shadow
    """
    from pipeline.policy.defaults import load_policy
    from pipeline.tools.drill.kinds import KINDS
    from pipeline.tools.drill.runner import new_run_id, plan_drill

    if fault not in KINDS:
        _fail(f"unknown fault kind {fault!r}; valid kinds: {', '.join(KINDS)}")
    kind = KINDS[fault]
    if kind.needs_scorer:
        import importlib.util

        if importlib.util.find_spec("torch") is None:
            _fail(f"--fault {fault} needs the quality scorer (torch): pip install -r requirements-quality.txt")
    try:
        settings = load_settings()
        pol = load_policy(policy)
        dur_s = None if duration is None else parse_duration_ms(duration, "--duration") / 1000
    except (ConfigError, ValueError, OSError) as exc:
        _fail(f"configuration error: {exc}")
    if dur_s is not None and dur_s <= 0:
        _fail(f"--duration must be a positive duration such as 60s or 10m, got {duration!r}")
    if speed < 0:
        _fail(f"--speed must be >= 0, got {speed:g}")
    live = not shadow and not offline
    if live:
        _check_live(channel, yes_production, settings)
    run_id = new_run_id(time.time())
    say = typer.echo
    try:
        if live:
            route = _channel_route(settings, channel)
            plan = plan_drill(fault, channel, pol, duration_s=dur_s, fault_start_ms=int(time.time() * 1000) + 5_000,
                              route=route, run_id=run_id, alone=route_channels(settings, route) <= 1)
        else:
            plan = plan_drill(fault, channel, pol, duration_s=dur_s, run_id=run_id)
    except ValueError as exc:
        _fail(str(exc))
    say(f"Drill {run_id}: {kind.name} ({kind.fault_kind}) on {channel} for {plan.duration_s:g} s; expected "
        f"{kind.state} ({kind.reason})" + (" — no detector for this reason yet" if kind.detector_missing else ""))
    if offline:
        from pipeline.tools.drill.runner import run_in_process

        result = run_in_process(plan, pol)
    elif shadow:
        result = _run_shadow(plan, settings, policy, data_dir, speed, timeout_s)
    else:
        result = _run_live(plan, settings, timeout_s)
    say("")
    say("Expected vs actual (event time from the fault start):")
    say(result.table())
    expected = [r for r in result.rows if r.status != "unexpected"]
    say(f"{'PASSED' if result.passed else 'NOT PASSED'}: {sum(r.status == 'ok' for r in expected)} of "
        f"{len(expected)} expected transitions on time; {len(result.rows) - len(expected)} unexpected")
    if as_json:
        say(json.dumps(result.summary(), sort_keys=True))
    if not result.passed:
        raise typer.Exit(EXIT_MISMATCH)


def _check_live(channel: str, yes_production: bool, settings) -> None:
    """Refuse a live drill unless the channel looks like a drill channel, is confirmed and exists."""
    if "drill" not in channel.lower():
        _fail(f"refusing a live drill on {channel!r}: without --shadow the channel name must contain 'drill' "
              "(a channel set aside for drills); use --shadow for any other name")
    if not yes_production:
        _fail(f"without --shadow the drill publishes extra {channel} events to the production topic "
              f"{settings.topics.requests}; confirm with --yes-production, or use --shadow")
    if not settings.kafka_bootstrap:
        _fail("a live drill needs CHANNEL_HEALTH_KAFKA_BOOTSTRAP (the deployment's Kafka); or use --shadow")
    _channel_route(settings, channel)


def _channel_route(settings, channel: str) -> str:
    """The route of ``channel``'s newest stored request event; a clear error when it has none."""
    from pipeline.storage.client import open_client
    from pipeline.storage.errors import StorageError

    try:
        client = open_client(settings, create_database=False)
        res = client.query("SELECT route FROM channel_health.request_events WHERE channel = {c:String} "
                           "ORDER BY ts DESC LIMIT 1", parameters={"c": channel})
    except StorageError as exc:
        _fail(f"ClickHouse: {exc}")
    if not res.result_rows:
        _fail(f"unknown channel {channel!r}: no request events of it in channel_health.request_events "
              "(a live drill needs an existing drill channel; --shadow makes its own)")
    return str(res.result_rows[0][0])


#: Channels of a route are those with request events this long before the route's newest one (ms): a live
#: drill expects the route's panic floor (SPEC §4.2) only when its channel is the route's only one.
ROUTE_CHANNELS_WINDOW_MS = 3_600_000


def route_channels(settings, route: str) -> int:
    """How many channels sent request events on ``route`` within :data:`ROUTE_CHANNELS_WINDOW_MS` of its newest
    one (``channel_health.request_events``); exits 2 with the ClickHouse error when it cannot be read."""
    from pipeline.storage.client import open_client
    from pipeline.storage.errors import StorageError

    try:
        client = open_client(settings, create_database=False)
        res = client.query("SELECT uniqExact(channel) FROM channel_health.request_events WHERE route = {r:String} "
                           "AND ts > (SELECT max(ts) FROM channel_health.request_events WHERE route = {r:String}) "
                           f"- toIntervalMillisecond({ROUTE_CHANNELS_WINDOW_MS})", parameters={"r": route})
    except StorageError as exc:
        _fail(f"ClickHouse: {exc}")
    return int(res.result_rows[0][0]) if res.result_rows else 0


def _run_shadow(plan, settings, policy: Path | None, data_dir: Path | None, speed: float, timeout_s: float):
    import asyncio

    from pipeline.tools.drill.runner import drive, judge
    from pipeline.tools.drill.stack import ShadowStack, WorkerDied

    folder = data_dir or Path("data") / f"drill-{plan.run_id}"
    stack = ShadowStack(settings, plan.run_id, folder, policy, say=typer.echo)
    try:
        with stack:
            events = plan.events()
            verdicts = asyncio.run(drive(plan, stack.settings, events, speed=speed, timeout_s=timeout_s,
                                         check=stack.check, say=typer.echo))
    except WorkerDied as exc:
        _fail(str(exc), 1)
    result = judge(plan, verdicts, shadow=True, topic_prefix=stack.prefix)
    _store(stack.settings, result)
    return result


def _run_live(plan, settings, timeout_s: float):
    import asyncio

    from pipeline.tools.drill.runner import drive, judge

    events = [e for e in plan.events() if plan.fault_start_ms <= e["ts_ms"] < plan.fault_end_ms]
    wait_s = max(0.0, (plan.end_ms - time.time() * 1000) / 1000) + timeout_s
    verdicts = asyncio.run(drive(plan, settings, events, speed=1.0, timeout_s=wait_s, until_ms=plan.end_ms,
                                 say=typer.echo))
    result = judge(plan, verdicts, shadow=False, topic_prefix=settings.topic_prefix)
    _store(settings, result)
    return result


def _store(settings, result) -> None:
    from pipeline.storage.client import open_client
    from pipeline.tools.drill.store import store_run

    client = open_client(settings)
    result.incident_id = store_run(client, result, int(time.time() * 1000))
    typer.echo(f"Stored run {result.plan.run_id} in channel_health.drill_runs at {settings.clickhouse_url_redacted}"
               + (f"; incident {result.incident_id} in channel_incidents" if result.incident_id else
                  "; incident NOT stored: pipeline.tools.history.incidents is not installed"))
