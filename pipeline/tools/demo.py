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

from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from pipeline.config import Settings
from pipeline.contracts import Verdict
from pipeline.escape import rich_text
from pipeline.tools.demo_timeline import Timeline, fmt_offset, summary_lines

STATE_STYLE = {"healthy": "green", "degraded": "yellow", "open": "bold red", "half_open": "magenta",
               "recovering": "cyan", "no_data": "dim"}

EXAMPLE_SQL = (
    "SELECT channel, state, count() AS verdicts, arrayStringConcat(groupUniqArrayArray(reasons), ',') AS reasons "
    "FROM channel_health.channel_verdicts FINAL GROUP BY channel, state ORDER BY channel, state"
)


def _table(latest: dict[str, Verdict], start_ms: int, events_sent: int, total: int) -> Table:
    """The live verdict table; names and reasons are :func:`~pipeline.escape.rich_text` (never markup)."""
    t = Table(title=f"channel.health — {events_sent:,}/{total:,} events published", expand=False)
    for col in ("channel", "route", "state", "weight", "share", "reasons", "event time"):
        t.add_column(col)
    for name in sorted(latest):
        v = latest[name]
        share = v.metrics.get("route_share")
        t.add_row(rich_text(name), rich_text(v.route), rich_text(v.state, STATE_STYLE.get(v.state, "")),
                  f"{v.weight:.2f}", "-" if share is None else f"{share:.2f}", rich_text(", ".join(v.reasons) or "-"),
                  fmt_offset(v.ts_ms, start_ms))
    return t


class WorkerDied(RuntimeError):
    """The worker process exited during the demo; the message holds its log tail."""


def _check_worker(worker: subprocess.Popen | None, log_path: Path) -> None:
    if worker is not None and worker.poll() is not None:
        tail = log_path.read_text(errors="replace")[-3000:] if log_path.exists() else ""
        raise WorkerDied(f"the worker exited with code {worker.returncode}; end of {log_path}:\n{tail}")


def fault_windows(scenario, start_ms: int) -> dict[str, tuple[int, int]]:
    """Per faulty channel of ``scenario``: ``(first fault start, last fault end)`` in event time, ms."""
    out: dict[str, tuple[int, int]] = {}
    for f in scenario.faults:
        a, b = start_ms + int(f.start_s * 1000), start_ms + int(f.end_s * 1000)
        if f.channel in out:
            a, b = min(a, out[f.channel][0]), max(b, out[f.channel][1])
        out[f.channel] = (a, b)
    return out


class _Out:
    """Where the demo's lines go: above a rich Live table on a terminal, else one flushed line at a time.

    Piped (CI logs, ``| tee``) there is no Live display: state changes and a
    progress line every 10 % of the events print as they happen.
    """

    def __init__(self, console: Console, total: int):
        self.console = console
        self.live_mode = console.is_terminal
        self.total = total
        self._next_progress = 0

    def line(self, text: str) -> None:
        """Print one plain line (no markup, no control character, no re-wrapping) and flush it."""
        self.console.print(rich_text(text), soft_wrap=True)
        self.console.file.flush()

    def progress(self, sent: int) -> None:
        """Piped only: one line per 10 % of the events published."""
        if self.live_mode or sent < self._next_progress:
            return
        self.line(f"… {sent:,}/{self.total:,} events published")
        self._next_progress = sent + max(1, self.total // 10)


async def _run(settings: Settings, scenario_name: str, seed: int, timeout_s: float, console: Console,
               check: Callable[[], None] = lambda: None, speed: float = 0.0, seen: list[str] | None = None) -> int:
    from contextlib import nullcontext

    from pipeline.kafka.producer import BatchingProducer
    from pipeline.router.subscriber import HealthSubscriber
    from pipeline.tools.simulate.scenarios import get_scenario
    from pipeline.tools.simulate.traces import describe_data_source

    scenario = get_scenario(scenario_name)
    console.print(describe_data_source(scenario.data_dir))
    now_ms = int(time.time() * 1000)
    start_ms = now_ms - int(scenario.duration_s * 1000)
    console.print(f"[bold]Scenario[/] {scenario.name}: {scenario.description}")
    pace = f"at {speed:g}× real time" if speed > 0 else "as fast as possible"
    console.print(f"Replaying {scenario.duration_s / 3600:.1f} h of event time (ending now) {pace}…")
    events = list(scenario.events(start_ms=start_ms, seed=seed))
    last_ts: dict[str, int] = {}
    for e in events:
        last_ts[e["channel"]] = e["ts_ms"]
    timeline = Timeline(start_ms)
    latest = timeline.latest
    out = _Out(console, len(events))
    printed = 0

    def on_verdict(v: Verdict) -> None:
        nonlocal printed
        for line in timeline.add(v):
            out.line(line)
            printed += 1

    def view(sent: int):
        table = _table(latest, start_ms, sent, len(events))
        pending = timeline.pending()
        return Group(table, *(rich_text(p) for p in pending)) if pending else table

    sec = settings.kafka_security.aiokafka_kwargs()
    async with HealthSubscriber(settings, on_verdict=on_verdict):
        async with BatchingProducer(settings.kafka_bootstrap or "", settings.topics.requests, security=sec,
                                    max_event_span_ms=10_000) as prod:
            live_cm = (Live(view(0), console=console, refresh_per_second=4, transient=False) if out.live_mode
                       else nullcontext(None))
            with live_cm as live:
                def refresh() -> None:
                    if live is not None:
                        live.update(view(prod.events_sent))
                    else:
                        out.progress(prod.events_sent)

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
                    refresh()
                deadline = time.monotonic() + timeout_s
                while time.monotonic() < deadline:
                    check()
                    refresh()
                    caught_up = all(name in latest and latest[name].ts_ms >= ts - 60_000
                                    for name, ts in last_ts.items())
                    if caught_up:
                        break
                    await asyncio.sleep(0.5)
                else:
                    console.print(f"[yellow]Stopped waiting after {timeout_s:.0f} s; the worker is behind.[/]")
                if live is not None:
                    live.update(_table(latest, start_ms, prod.events_sent, len(events)))
    for line in timeline.finish():
        out.line(line)
        printed += 1
    if seen is not None:  # the channels, the unhealthy first: demo --keep suggests one to try an override on
        seen.extend(sorted(latest, key=lambda c: (latest[c].state == "healthy", c)))
    if not out.live_mode:  # no terminal width to fit: wide enough for full channel names and reasons
        console.print(_table(latest, start_ms, len(events), len(events)), width=max(console.width, 120))
    n_changes = sum(len(v) - 1 for v in timeline.changes.values())
    out.line(f"{len(events):,} events published; {n_changes} state changes ({printed} timeline lines).")
    out.line("")
    out.line("What happened (scenario time; fault start → first verdict = detection delay):")
    end_ms = max(last_ts.values()) if last_ts else start_ms
    for line in summary_lines(timeline.changes, fault_windows(scenario, start_ms), start_ms, end_ms):
        out.line(f"  {line}")
    for line in timeline.route_lines(end_ms):
        out.line(f"  {line}")
    return 0


def fresh_data_dir(root: Path, now_s: float) -> Path:
    """A new folder ``root/demo-YYYYmmddTHHMMSSZ`` (UTC of ``now_s``, epoch seconds) for one demo run.

    A second run in the same second gets ``-2``, ``-3``, ... appended; the
    folder is created, never reused.
    """
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(now_s))
    root.mkdir(parents=True, exist_ok=True)
    for k in range(1, 1000):
        path = root / (f"demo-{stamp}" if k == 1 else f"demo-{stamp}-{k}")
        try:
            path.mkdir()
        except FileExistsError:
            continue
        return path
    raise FileExistsError(f"no free demo folder under {root} for {stamp}")


def choose_data_dir(data_dir: Path | None, console: Console, root: Path = Path("data")) -> Path:
    """The demo's data folder, said out loud: ``data_dir`` kept (warning when it holds an earlier run),
    or a fresh ``data/demo-<UTC time>`` when None."""
    if data_dir is None:
        path = fresh_data_dir(root, time.time()).resolve()
        console.print(f"Data folder: {path} (new for this run; --data-dir DIR keeps one)")
        return path
    path = data_dir.resolve()
    earlier = path.is_dir() and any(path.iterdir())
    path.mkdir(parents=True, exist_ok=True)
    if earlier:
        console.print(f"[yellow]Data folder {path} already holds data: this run adds to it, so tables and the "
                      "example query mix both runs (omit --data-dir for a fresh folder).[/]")
    else:
        console.print(f"Data folder: {path}")
    return path


def run_demo(settings: Settings, scenario: str, data_dir: Path | None, seed: int = 0, timeout_s: float = 600.0,
             speed: float = 0.0, keep: bool = False) -> int:
    """Run the whole demo; returns a process exit code (130 when stopped by Ctrl-C or SIGTERM).

    ``data_dir``: where chDB and the worker log go; None = a fresh
    ``data/demo-<UTC time>`` folder per run (:func:`choose_data_dir`).
    Call from the main thread: it handles SIGINT and SIGTERM (:mod:`pipeline.tools.demo_stop`).
    ``keep``: after the replay, leave broker and worker up until Ctrl-C (:mod:`pipeline.tools.demo_keep`).
    """
    from pipeline.tools.demo_stop import sigterm_interrupts

    with sigterm_interrupts():
        return _run_demo(settings, scenario, data_dir, seed, timeout_s, speed, keep)


def _run_demo(settings: Settings, scenario: str, data_dir: Path | None, seed: int, timeout_s: float,
              speed: float, keep: bool = False) -> int:
    from pipeline.tools.demo_stop import stop_in_order, worker_popen_kwargs
    from pipeline.tools.embedded.broker import EmbeddedBroker
    from pipeline.kafka.topics import ensure as ensure_topics

    # Piped (CI logs, `| tee`): rich would wrap at 80 columns and cut the table's names; lines are the record there.
    console = Console() if sys.stdout.isatty() else Console(width=int(os.environ.get("COLUMNS") or 160))
    data_dir = choose_data_dir(data_dir, console)
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
        asyncio.run(ensure_topics(settings))
        log_path = data_dir / "worker.log"
        env = dict(os.environ, CHANNEL_HEALTH_KAFKA_BOOTSTRAP=settings.kafka_bootstrap,
                   CHANNEL_HEALTH_CLICKHOUSE_URL=settings.clickhouse_url)
        console.print(f"Starting the stream worker (log: {log_path})…")
        with open(log_path, "ab") as log:
            worker = subprocess.Popen([sys.executable, "-m", "pipeline.cli", "worker", "--loglevel", "info"], env=env,
                                      stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                      **worker_popen_kwargs())
        seen: list[str] = []
        rc = asyncio.run(_run(settings, scenario, seed, timeout_s, console,
                              check=lambda: _check_worker(worker, log_path), speed=speed, seen=seen))
        if rc == 0 and keep:
            from pipeline.tools.demo_keep import keep_lines, keep_up

            keep_up(lambda line: console.print(rich_text(line), soft_wrap=True),
                    lambda: _check_worker(worker, log_path),
                    keep_lines(settings, seen[0] if seen else None, scenario))
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
        _report(settings, console, scenario, data_dir)
    return rc


def _summary(settings: Settings, console: Console) -> None:
    from pipeline.storage.client import open_client
    from pipeline.storage.query import format_table, run_readonly_query

    console.print(f"\n[bold]Data[/]: ClickHouse at {settings.clickhouse_url_redacted} "
                  "(tables channel_health.request_events, channel_minute_stats, channel_verdicts)")
    own_url = "CHANNEL_HEALTH_CLICKHOUSE_URL" in os.environ  # the user's own (may hold a password): not repeated
    env = "" if own_url else f"CHANNEL_HEALTH_CLICKHOUSE_URL={settings.clickhouse_url} "
    console.print("Example query; run your own with:")
    console.print(Text(f"  {env}channel-health query \"SQL\""), soft_wrap=True)
    console.print(Text(f"  {EXAMPLE_SQL}"), soft_wrap=True)
    client = open_client(settings)
    cols, rows = run_readonly_query(client, EXAMPLE_SQL)
    # A terminal: fit its width. Piped: the table's own width, printed as is (no re-wrapping into run-on lines).
    width = console.width if console.is_terminal else 200
    console.print(Text(format_table(cols, rows, width=width).rstrip("\n")), soft_wrap=True)
    console.file.flush()


def _report(settings: Settings, console: Console, scenario_name: str, data_dir: Path) -> None:
    """Write the HTML report (issue #21) of the scenario's faulted channel into ``data_dir`` and print its path.

    Window: the channel's first incident (``--incident``), or all its verdicts when it had none. A report
    that cannot be made is said in one line; the demo's result stands.
    """
    from pipeline.storage.client import open_client
    from pipeline.tools.report import write_report
    from pipeline.tools.report.data import ReportError
    from pipeline.tools.simulate.scenarios import get_scenario

    scenario = get_scenario(scenario_name)
    channel = scenario.faults[0].channel if scenario.faults else scenario.channels[0].name
    out = data_dir / ("report-" + "".join(c if c.isalnum() or c in "-." else "_" for c in channel) + ".html")
    client = open_client(settings)
    try:
        try:
            path = write_report(client, out, settings.clickhouse_url_redacted, channel=channel, incident=True)
        except ReportError:  # no incident on this channel: its whole history
            path = write_report(client, out, settings.clickhouse_url_redacted, channel=channel)
    except Exception as exc:  # the report is an extra: say why it is missing, keep the demo's exit code
        console.print(rich_text(f"No report written: {exc}"), soft_wrap=True)
        return
    console.print(Text(f"\nReport of {channel}: {path}\n  (open it in a browser; make another with "
                       f"channel-health report --channel {channel} --incident --out FILE.html)"), soft_wrap=True)
    console.file.flush()
