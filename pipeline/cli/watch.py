"""``channel-health watch``: the live operator board (SPEC §7, issue #20 item 4). Registered in :mod:`pipeline.cli.main`.

Per route and channel: state with time in state and the next scheduled
transition (from ``channel.health``; an ``open`` channel's next probe is the
``next_probe_ts_ms`` its verdict published: the backed-off cooldown of SPEC §4.2), and seed 003's panels from ClickHouse:
traffic (1 min), latency P50/P90/P95/P99 of ``ok`` requests (5 min), error
rate (1 min), missing-field rate of checked ``ok`` answers and mean quality
score (5 min), the last reported quota remaining. Overrides are marked.

Times are **event time**: panel windows end at the newest stored event
(``max(ts)`` of ``request_events``), time in state is measured up to the
newest verdict, so a replay shows what a live run would. The next transition
is the policy's schedule (:class:`~pipeline.policy.defaults.PolicyConfig`:
``open_cooldown_ms`` 90 s open → half_open, ``half_open_observe_ms`` 90 s
half_open → recovering when the probes pass, ``ramp_interval_ms`` 120 s per
recovering step): what happens if nothing else does.

Live state always comes from ``channel.health``. The history panels come
from ClickHouse only when it can be opened: a ClickHouse server over HTTP, or
a chDB directory no other process holds. chDB allows one process per data
directory, so on the default setup (the worker holds it) the board says so in
one line (``clickhouse.error``, :func:`history_off_line`) and carries on with
the live state; point ``CHANNEL_HEALTH_CLICKHOUSE_URL`` at a ClickHouse
server to see both. A database error is never printed raw (issue #35).

Width (issue #35): on a terminal the table fits its width, folding long
channel and route names rather than cutting them and leaving out the
least-needed panels when narrow (:data:`NARROW_DROP`); piped output is never
wrapped at 80 columns (:func:`board_console`).
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass
from typing import Any, Callable

import msgspec
import typer

from pipeline.cli.settings import kafka_settings_or_exit
from pipeline.config import Settings
from pipeline.redaction import redact_secrets
from pipeline.contracts import SUSPECT_METRIC, Verdict, decode_verdict
from pipeline.policy.defaults import PolicyConfig
from pipeline.alert.error_class_text import error_class_line
from pipeline.alert.reasons import next_probe_ms, override_text

#: Live refresh interval (s): at least once a second (issue #20).
REFRESH_S = 1.0
FAILURES = "('error', 'timeout', 'rate_limited')"

PANELS_SQL = f"""
WITH (SELECT max(ts) FROM channel_health.request_events) AS now_ts
SELECT channel, any(route) AS route,
       countIf(ts > now_ts - INTERVAL 1 MINUTE) AS requests_1m,
       countIf(ts > now_ts - INTERVAL 1 MINUTE AND status IN {FAILURES}) AS failures_1m,
       quantilesIf(0.5, 0.9, 0.95, 0.99)(latency_ms, status = 'ok') AS latency_q,
       countIf(status = 'ok' AND parse_ok IS NOT NULL) AS checked_5m,
       countIf(status = 'ok' AND parse_ok IS NOT NULL AND (parse_ok = 0 OR notEmpty(missing_fields))) AS missing_5m,
       argMaxIf(quota_remaining, ts, quota_remaining IS NOT NULL) AS quota,
       countIf(quota_remaining IS NOT NULL) AS quota_n,
       toUnixTimestamp64Milli(any(now_ts)) AS now_ms
FROM channel_health.request_events FINAL
WHERE ts > now_ts - INTERVAL 5 MINUTE
GROUP BY channel
"""
QUALITY_SQL = """
WITH (SELECT max(ts) FROM channel_health.request_events) AS now_ts
SELECT channel, avg(score), count()
FROM channel_health.quality_scores FINAL
WHERE ts > now_ts - INTERVAL 5 MINUTE
GROUP BY channel
"""


@dataclass
class Track:
    """A channel's newest verdict and the event time (ms) its state began."""

    verdict: Verdict
    since_ms: int


class VerdictBook:
    """Newest verdict per channel and when its state began, fed in topic order."""

    def __init__(self) -> None:
        self.tracks: dict[str, Track] = {}
        self.bad = 0
        #: Called with each new verdict (a list of one), e.g. the Prometheus gauges; None: nothing.
        self.observe: Callable[[list[Verdict]], None] | None = None

    def add(self, value: bytes | None) -> None:
        """Apply one ``channel.health`` message (bad ones are counted, never fatal)."""
        if value is None:
            return
        try:
            v = decode_verdict(value)
        except ValueError:  # msgspec's decode errors are ValueErrors
            self.bad += 1
            return
        old = self.tracks.get(v.channel)
        if old is not None and v.seq <= old.verdict.seq and v.ts_ms <= old.verdict.ts_ms:
            return  # a replay
        since = old.since_ms if old is not None and old.verdict.state == v.state else v.ts_ms
        self.tracks[v.channel] = Track(v, since)
        if self.observe is not None:
            self.observe([v])


def next_transition(state: str, since_ms: int, now_ms: int, policy: PolicyConfig,
                    next_probe_ms: int | None = None) -> tuple[str, int] | None:
    """``(next state or step, ms until it)`` by the policy's schedule, or None (no timed transition).

    ``open`` → ``half_open`` at ``next_probe_ms`` (the verdict's ``next_probe_ts_ms``, event time ms: the
    cooldown the worker set, backed off for each re-open after a failed probe, SPEC §4.2, and for a spent
    quota or dead key, §4.1), else ``open_cooldown_ms`` after ``since_ms`` (a verdict from before the
    backoff); ``half_open`` → ``recovering`` after ``half_open_observe_ms`` (if the probes pass);
    ``recovering`` → its next ramp step every ``ramp_interval_ms`` from entry.
    """
    if state == "open":
        due = next_probe_ms if next_probe_ms is not None else since_ms + policy.open_cooldown_ms
        return "half_open", max(0, due - now_ms)
    if state == "half_open":
        return "recovering", max(0, since_ms + policy.half_open_observe_ms - now_ms)
    if state == "recovering":
        step = policy.ramp_interval_ms
        return "ramp step", step - (now_ms - since_ms) % step
    return None


def _num(x: Any, nd: int = 4) -> float | None:
    try:
        f = float(x)
    except (TypeError, ValueError):
        return None
    return None if f != f else round(f, nd)


def query_panels(client: Any) -> tuple[dict[str, dict], int | None]:
    """Per channel the five panels' numbers from ClickHouse, and the panels' event-time end (ms)."""
    out: dict[str, dict] = {}
    now_ms = None
    for row in client.query(PANELS_SQL).result_rows:
        ch, route, n1, f1, q, checked, missing, quota, quota_n, now = row
        now_ms = int(now)
        out[ch] = {"route": route, "traffic_1m": int(n1),
                   "latency_ms_5m": dict(zip(("p50", "p90", "p95", "p99"), (_num(x, 1) for x in q))),
                   "error_rate_1m": _num(f1 / n1) if n1 else None, "requests_1m": int(n1),
                   "missing_rate_5m": _num(missing / checked) if checked else None, "checked_5m": int(checked),
                   "quota_remaining": _num(quota) if quota_n else None, "quality_5m": None, "quality_n_5m": 0}
    for ch, score, n in client.query(QUALITY_SQL).result_rows:
        out.setdefault(ch, {}).update({"quality_5m": _num(score), "quality_n_5m": int(n)})
    return out, now_ms


def build_board(book: VerdictBook, panels: dict[str, dict], policy: PolicyConfig,
                clickhouse_error: str | None = None, panels_now_ms: int | None = None) -> dict:
    """The board as one JSON-ready dict: ``routes`` → channel → verdict fields, timing and panels.

    A channel's ``error_class`` is the SPEC §4.1 class behind its verdict (``metrics["error_class"]``, or
    ``caller`` while the advisory ``caller_errors`` holds; None: none) and ``error_class_text`` its line
    (:func:`~pipeline.alert.error_class_text.error_class_line`, e.g. "dead key on account acct-a (2 channels)")."""
    now_ms = max((t.verdict.ts_ms for t in book.tracks.values()), default=0)
    routes: dict[str, dict] = {}
    for ch in sorted(set(book.tracks) | set(panels)):
        t = book.tracks.get(ch)
        p = panels.get(ch, {})
        row: dict[str, Any] = {"panels": {k: v for k, v in p.items() if k != "route"}}
        route = p.get("route")
        if t is not None:
            v = t.verdict
            route = v.route
            probe = next_probe_ms(v)
            nxt = next_transition(v.state, t.since_ms, now_ms, policy, probe)
            row.update({"state": v.state, "weight": v.weight, "share": v.metrics.get("route_share"),
                        "reasons": list(v.reasons), "seq": v.seq, "ts_ms": v.ts_ms,
                        "in_state_s": (now_ms - t.since_ms) / 1000,
                        "next": None if nxt is None else {"to": nxt[0], "in_s": nxt[1] / 1000,
                                                          **({"at_ts_ms": probe} if probe is not None else {})},
                        "override": None if v.override is msgspec.UNSET else v.override,
                        "error_class": v.metrics.get("error_class")
                        or ("caller" if "caller_errors" in v.reasons else None),
                        "error_class_text": error_class_line(list(v.reasons), v.metrics),
                        "suspect_run": v.metrics.get(SUSPECT_METRIC)})
        else:
            row.update({"state": None, "override": None})
        routes.setdefault(route or "?", {})[ch] = row
    return {"verdicts_ts_ms": now_ms or None, "panels_ts_ms": panels_now_ms, "bad_verdicts": book.bad,
            "clickhouse": {"error": clickhouse_error}, "routes": routes}


def state_text(row: dict) -> str:
    """E.g. ``half_open · 40 s → recovering in 50 s``, ``open · 20 s → half_open in 3 min (probe at 12:33:10
    UTC)`` (the published probe time of a backed-off cooldown); a forced state has no scheduled transition
    and says who forced it: ``open · 12 s; forced open by ana (key k1) until 12:30:00 UTC: vendor incident``;
    a suspect channel (pipeline/engine/suspects.py) says so: ``healthy · 4 s; suspect (3 failures in a row):
    its share goes to its peers`` (under an override: ``the override holds its share``)."""
    if row.get("state") is None:
        return "no verdict"
    from pipeline.alert.reasons import duration

    o = row.get("override")
    text = f"{row['state']} · {duration(row['in_state_s'])}"  # 50 s, 12 min, 2.6 h: not "9240 s"
    if row.get("next") and not (o and o.get("kind") in ("open", "healthy")):
        text += f" → {row['next']['to']} in {duration(row['next']['in_s'])}"
        at = row["next"].get("at_ts_ms")
        if isinstance(at, int):
            text += time.strftime(" (probe at %H:%M:%S UTC)", time.gmtime(at / 1000))
    if o:
        text += f"; {override_text(o)}"
    if row.get("suspect_run"):  # an override holds the share against the suspicion (pipeline.router.table)
        text += (f"; suspect ({row['suspect_run']} failures in a row): "
                 + ("the override holds its share" if o else "its share goes to its peers"))
    return text


#: Panel columns left out, in this order, while the table does not fit a narrow terminal.
NARROW_DROP = ("quota", "error class", "quality 5m", "missing 5m", "P50/P90/P95/P99 ms 5m", "share", "req 1m")
#: Width of a console that is not a terminal (a pipe, a file): wide enough never to wrap a board.
PIPE_WIDTH = 100_000


def history_off_line(url: str, exc: BaseException) -> str:
    """One line saying why the history panels are off, for ``exc`` raised opening or querying ``url``.

    chDB's "Cannot lock file" (another process, normally the worker, holds the directory) is said in words;
    any other error is named by its type and the first line of its text (at most 160 characters), with
    secrets redacted. Never a multi-line database exception.
    """
    first = (str(exc).strip().splitlines() or [""])[0]
    if url.startswith("chdb") and ("lock" in str(exc).lower() or "already has chDB" in str(exc)):
        return ("history panels off: another process (the worker) holds the chDB directory, and chDB allows one "
                "process per directory; showing live state from channel.health. For history too, point "
                "CHANNEL_HEALTH_CLICKHOUSE_URL at a ClickHouse server")
    return redact_secrets(f"history panels off: ClickHouse unavailable ({type(exc).__name__}: {first[:160]}); "
                          f"showing live state from channel.health")


def chdb_held(url: str) -> bool:
    """True when ``url`` is a ``chdb://`` directory whose ``status`` file another process holds locked.

    ClickHouse (and so chDB) takes an exclusive ``flock`` on ``<dir>/status`` while it runs; probing it with a
    non-blocking ``flock`` (released at once) tells a held directory apart without opening the engine, which
    would print its own ``Cannot lock file`` error straight to the terminal. False for any other URL, a
    missing directory, or a platform without ``fcntl``.
    """
    if not url.startswith("chdb"):
        return False
    try:
        import fcntl

        from pipeline.storage.client import chdb_path

        status = chdb_path(url) / "status"
        with open(status, "rb") as f:
            try:
                fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return True
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)
    except (ImportError, OSError, ValueError):
        return False
    return False


def board_console(**kw: Any) -> Any:
    """A rich Console for the board: the terminal's width on a terminal, :data:`PIPE_WIDTH` otherwise
    (``COLUMNS``, when set, wins as rich reads it)."""
    import os

    from rich.console import Console

    console = Console(**kw)
    if not console.is_terminal and "COLUMNS" not in os.environ and "width" not in kw:
        console.width = PIPE_WIDTH
    return console


def render(board: dict, width: int | None = None) -> Any:
    """A rich Table of the board. Every cell is a :class:`rich.text.Text` (:func:`~pipeline.escape.rich_text`):
    names, reasons and errors are shown as data, never read as rich markup or terminal escapes (SPEC §8)."""
    from rich.table import Table

    from pipeline.escape import rich_text

    def fmt(x: Any, pct: bool = False) -> str:
        return "-" if x is None else (f"{100 * x:.2f}%" if pct else f"{x:g}")

    title = "channel-health watch"
    if board["clickhouse"]["error"]:
        title += f"  ({board['clickhouse']['error']})"
    cols = ["route", "channel", "state", "weight", "share", "reasons", "error class", "req 1m",
            "P50/P90/P95/P99 ms 5m", "err 1m", "missing 5m", "quality 5m", "quota"]
    rows = []
    for route, chans in board["routes"].items():
        for ch, row in chans.items():
            p = row["panels"]
            lat = p.get("latency_ms_5m") or {}
            rows.append(dict(zip(cols, (
                route, ch, state_text(row), fmt(row.get("weight")), fmt(row.get("share")),
                ",".join(row.get("reasons") or []), row.get("error_class_text") or "-", fmt(p.get("traffic_1m")),
                "/".join(fmt(lat.get(k)) for k in ("p50", "p90", "p95", "p99")),
                fmt(p.get("error_rate_1m"), True), fmt(p.get("missing_rate_5m"), True),
                fmt(p.get("quality_5m")), fmt(p.get("quota_remaining"))))))
    if width is not None:  # leave out the least-needed panels until the widest cells could fit
        def need(cs: list[str]) -> int:
            return sum(min(40, max([len(c)] + [len(r[c]) for r in rows])) + 3 for c in cs)

        for drop in NARROW_DROP:
            if need(cols) <= width:
                break
            cols.remove(drop)
    numeric = {"weight", "share", "req 1m", "P50/P90/P95/P99 ms 5m", "err 1m", "missing 5m", "quality 5m", "quota"}
    table = Table(title=rich_text(title))
    for col in cols:
        # names fold onto further lines, never cut: a cut name could read as another channel
        table.add_column(col, justify="right" if col in numeric else "left",
                         overflow="fold", min_width=min(12, len(col)) if col in ("route", "channel") else None)
    for r in rows:
        table.add_row(*(rich_text(r[c]) for c in cols))
    return table


class Board:
    """Keeps a group-less consumer on ``channel.health`` and a ClickHouse client; :meth:`refresh` → board dict."""

    def __init__(self, settings: Settings, policy: PolicyConfig):
        self.settings, self.policy = settings, policy
        self.book = VerdictBook()
        self.consumer: Any = None
        self.client: Any = None
        self.ch_error: str | None = None

    async def start(self) -> None:
        from pipeline.stream.control import read_to_end

        await read_to_end(self.settings.kafka_bootstrap or "", self.settings.topics.health,
                          lambda k, v: self.book.add(v), self.settings.kafka_security.aiokafka_kwargs(), 30.0)
        if chdb_held(self.settings.clickhouse_url):  # the default setup: the worker holds the directory
            self.ch_error = history_off_line(self.settings.clickhouse_url, OSError("Cannot lock file: held"))
            return
        try:
            from pipeline.storage.client import open_client

            self.client = open_client(self.settings, create_database=False)
        except Exception as exc:  # shown on the board in one line, never a raw database exception
            self.ch_error = history_off_line(self.settings.clickhouse_url, exc)

    async def follow(self) -> None:
        """Start a consumer of ``channel.health`` for live mode (from the beginning: replays are ignored)."""
        from aiokafka import AIOKafkaConsumer

        self.consumer = AIOKafkaConsumer(self.settings.topics.health, bootstrap_servers=self.settings.kafka_bootstrap,
                                         group_id=None, enable_auto_commit=False, auto_offset_reset="earliest",
                                         **self.settings.kafka_security.aiokafka_kwargs())
        await self.consumer.start()

    async def refresh(self) -> dict:
        if self.consumer is not None:
            batches = await self.consumer.getmany(timeout_ms=int(REFRESH_S * 500))
            for msgs in batches.values():
                for m in msgs:
                    self.book.add(m.value)
        panels, now_ms = {}, None
        if self.client is not None:
            try:
                panels, now_ms = await asyncio.to_thread(query_panels, self.client)
                self.ch_error = None
            except Exception as exc:  # shown on the board in one line, retried next refresh
                self.ch_error = history_off_line(self.settings.clickhouse_url, exc)
        return build_board(self.book, panels, self.policy, self.ch_error, now_ms)

    async def stop(self) -> None:
        if self.consumer is not None:
            await self.consumer.stop()


def watch(
    once: bool = typer.Option(False, "--once", help="Print the board once and exit."),
    as_json: bool = typer.Option(False, "--json", help="JSON instead of a table (with --once: one object)."),
) -> None:
    """Live operator board: per route and channel, state, time in state and next transition, and the panels.

    Reads channel.health (Kafka) and request_events / quality_scores (ClickHouse): traffic (1 min), latency
    P50/P90/P95/P99 (5 min), error rate (1 min), missing fields and quality (5 min), quota remaining;
    overrides are marked. Refreshes every second until Ctrl-C. With chDB the worker holds the directory: the
    board then shows the Kafka side and says so.

    Example: `channel-health watch`   or, for scripts: `channel-health watch --once --json | jq .routes`
    """
    settings = kafka_settings_or_exit()
    board = Board(settings, PolicyConfig())

    async def main() -> None:
        await board.start()
        try:
            if once:
                data = await board.refresh()
                if as_json:
                    typer.echo(json.dumps(data))
                else:
                    console = board_console()
                    console.print(render(data, console.width if console.is_terminal else None))
                return
            # A long-running process: Prometheus metrics on CHANNEL_HEALTH_METRICS_PORT (issue #21).
            from pipeline.metrics import start_metrics_server

            metrics = start_metrics_server(settings)
            board.book.observe = metrics.observe_verdicts
            await board.follow()
            if as_json:
                while True:
                    typer.echo(json.dumps(await board.refresh()))
                    await asyncio.sleep(REFRESH_S / 2)
            from rich.live import Live

            console = board_console()
            if board.ch_error:
                typer.secho(board.ch_error, fg="yellow", err=True)

            def draw(data: dict) -> Any:
                return render(data, console.width if console.is_terminal else None)

            with Live(draw(await board.refresh()), console=console, refresh_per_second=2) as live:
                while True:
                    started = time.monotonic()
                    live.update(draw(await board.refresh()))
                    await asyncio.sleep(max(0.0, REFRESH_S - (time.monotonic() - started)))
        finally:
            await board.stop()

    try:
        asyncio.run(main())
    except KeyboardInterrupt:
        pass

