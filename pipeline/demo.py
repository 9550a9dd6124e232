"""``channel-health demo``: the main job on the embedded default, end to end.

Brings up the Tansu broker (unless a bootstrap is configured) and a worker
process writing to chDB, publishes a simulator scenario in batch envelopes,
shows the verdict timeline live, then stops the worker and prints where the
data lives with one example SQL query and its result.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

from rich.console import Console
from rich.live import Live
from rich.table import Table

from pipeline.config import Settings
from pipeline.contracts import Verdict

STATE_STYLE = {"healthy": "green", "degraded": "yellow", "open": "bold red", "half_open": "magenta",
               "recovering": "cyan", "no_data": "dim"}

EXAMPLE_SQL = (
    "SELECT channel, state, count() AS verdicts, arrayStringConcat(groupUniqArrayArray(reasons), ',') AS reasons "
    "FROM channel_health.channel_verdicts FINAL GROUP BY channel, state ORDER BY channel, state"
)


def _fmt_offset(ts_ms: int, start_ms: int) -> str:
    s = max(0, (ts_ms - start_ms) // 1000)
    return f"+{s // 3600:02d}:{s // 60 % 60:02d}:{s % 60:02d}"


def _table(latest: dict[str, Verdict], start_ms: int, events_sent: int, total: int) -> Table:
    t = Table(title=f"channel.health — {events_sent:,}/{total:,} events published", expand=False)
    for col in ("channel", "route", "state", "weight", "share", "reasons", "event time"):
        t.add_column(col)
    for name in sorted(latest):
        v = latest[name]
        share = v.metrics.get("route_share")
        t.add_row(name, v.route, f"[{STATE_STYLE.get(v.state, '')}]{v.state}[/]", f"{v.weight:.2f}",
                  "-" if share is None else f"{share:.2f}", ", ".join(v.reasons) or "-", _fmt_offset(v.ts_ms, start_ms))
    return t


class WorkerDied(RuntimeError):
    """The worker process exited during the demo; the message holds its log tail."""


def _check_worker(worker: subprocess.Popen | None, log_path: Path) -> None:
    if worker is not None and worker.poll() is not None:
        tail = log_path.read_text(errors="replace")[-3000:] if log_path.exists() else ""
        raise WorkerDied(f"the worker exited with code {worker.returncode}; end of {log_path}:\n{tail}")


async def _run(settings: Settings, scenario_name: str, seed: int, timeout_s: float, console: Console,
               check: Callable[[], None] = lambda: None, speed: float = 0.0) -> int:
    from pipeline.producer import BatchingProducer
    from pipeline.router.subscriber import HealthSubscriber
    from pipeline.simulate.scenarios import get_scenario

    scenario = get_scenario(scenario_name)
    now_ms = int(time.time() * 1000)
    start_ms = now_ms - int(scenario.duration_s * 1000)
    console.print(f"[bold]Scenario[/] {scenario.name}: {scenario.description}")
    pace = f"at {speed:g}× real time" if speed > 0 else "as fast as possible"
    console.print(f"Replaying {scenario.duration_s / 3600:.1f} h of event time (ending now) {pace}…")
    events = list(scenario.events(start_ms=start_ms, seed=seed))
    last_ts: dict[str, int] = {}
    for e in events:
        last_ts[e["channel"]] = e["ts_ms"]
    latest: dict[str, Verdict] = {}
    changes: list[str] = []

    def on_verdict(v: Verdict) -> None:
        prev = latest.get(v.channel)
        latest[v.channel] = v
        if prev is not None and prev.state != v.state:
            style = STATE_STYLE.get(v.state, "")
            line = (f"{_fmt_offset(v.ts_ms, start_ms)}  {v.channel:<28} {prev.state:>10} → "
                    f"[{style}]{v.state:<10}[/] weight {v.weight:.2f}  {', '.join(v.reasons)}")
            changes.append(line)
            console.print(line)

    sec = settings.kafka_security.aiokafka_kwargs()
    async with HealthSubscriber(settings, on_verdict=on_verdict):
        async with BatchingProducer(settings.kafka_bootstrap or "", settings.topics.requests, security=sec,
                                    max_event_span_ms=10_000) as prod:
            with Live(_table(latest, start_ms, 0, len(events)), console=console, refresh_per_second=4,
                      transient=False) as live:
                wall0 = time.monotonic()
                step = 2_000
                for i in range(0, len(events), step):
                    if speed > 0:
                        due = (events[i]["ts_ms"] - start_ms) / 1000 / speed
                        lag = due - (time.monotonic() - wall0)
                        if lag > 0:
                            await asyncio.sleep(lag)
                    await prod.send_many(events[i:i + step])
                    await prod.flush()
                    check()
                    live.update(_table(latest, start_ms, prod.events_sent, len(events)))
                deadline = time.monotonic() + timeout_s
                while time.monotonic() < deadline:
                    check()
                    live.update(_table(latest, start_ms, prod.events_sent, len(events)))
                    caught_up = all(name in latest and latest[name].ts_ms >= ts - 60_000
                                    for name, ts in last_ts.items())
                    if caught_up:
                        break
                    await asyncio.sleep(0.5)
                else:
                    console.print(f"[yellow]Stopped waiting after {timeout_s:.0f} s; the worker is behind.[/]")
    console.print(f"{len(events):,} events published; {len(changes)} state changes.")
    return 0


def run_demo(settings: Settings, scenario: str, data_dir: Path, seed: int = 0, timeout_s: float = 600.0,
             speed: float = 0.0) -> int:
    """Run the whole demo; returns a process exit code (130 when stopped by Ctrl-C or SIGTERM).

    Call from the main thread: it handles SIGINT and SIGTERM (:mod:`pipeline.demo_stop`).
    """
    from pipeline.demo_stop import sigterm_interrupts

    with sigterm_interrupts():
        return _run_demo(settings, scenario, data_dir, seed, timeout_s, speed)


def _run_demo(settings: Settings, scenario: str, data_dir: Path, seed: int, timeout_s: float, speed: float) -> int:
    from pipeline.demo_stop import stop_in_order, worker_popen_kwargs
    from pipeline.embedded.broker import EmbeddedBroker
    from pipeline.embedded.topics import ensure_topics

    console = Console()
    data_dir = data_dir.resolve()
    data_dir.mkdir(parents=True, exist_ok=True)
    if "CHANNEL_HEALTH_CLICKHOUSE_URL" not in os.environ:
        settings = settings.with_overrides(clickhouse_url=f"chdb://{data_dir / 'chdb'}")
    broker = None
    worker = None
    try:
        if not settings.kafka_bootstrap:
            console.print("Starting the embedded Kafka broker (Tansu, memory storage)…")
            broker = EmbeddedBroker()
            broker.start()
            settings = settings.with_overrides(kafka_bootstrap=broker.bootstrap)
            console.print(f"Broker at [bold]{broker.bootstrap}[/]")
        t = settings.topics
        asyncio.run(ensure_topics(settings.kafka_bootstrap, [t.requests, t.health, t.dlq, t.state],
                                  settings.partitions, settings.kafka_security.aiokafka_kwargs()))
        log_path = data_dir / "worker.log"
        env = dict(os.environ, CHANNEL_HEALTH_KAFKA_BOOTSTRAP=settings.kafka_bootstrap,
                   CHANNEL_HEALTH_CLICKHOUSE_URL=settings.clickhouse_url)
        console.print(f"Starting the stream worker (log: {log_path})…")
        with open(log_path, "ab") as log:
            worker = subprocess.Popen([sys.executable, "-m", "pipeline.cli", "worker", "--loglevel", "info"], env=env,
                                      stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                      **worker_popen_kwargs())
        rc = asyncio.run(_run(settings, scenario, seed, timeout_s, console,
                              check=lambda: _check_worker(worker, log_path), speed=speed))
    except WorkerDied as exc:
        console.print(f"[red]{exc}[/]")
        rc = 1
    except KeyboardInterrupt:
        console.print("Interrupted.")
        rc = 130
    finally:
        stop_in_order(worker, broker, console.print)
    if rc == 0:
        _summary(settings, console)
    return rc


def _summary(settings: Settings, console: Console) -> None:
    from pipeline.storage.client import open_client
    from pipeline.storage.query import format_table, run_readonly_query

    console.print(f"\n[bold]Data[/]: ClickHouse at {settings.clickhouse_url_redacted} "
                  "(tables channel_health.request_events, channel_minute_stats, channel_verdicts)")
    console.print("Example query (also: channel-health query \"SQL\"):")
    console.print(f"  {EXAMPLE_SQL}")
    client = open_client(settings)
    cols, rows = run_readonly_query(client, EXAMPLE_SQL)
    console.print(format_table(cols, rows, width=max(console.width, 100)))
