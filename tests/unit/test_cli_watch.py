"""``channel-health watch`` (issue #20 item 4): panels from ClickHouse (chDB), states from verdicts.

A reduced gradual degradation: route chat-70b, two channels at 5 req/s for
20 min; in the last 10 min the free channel's latency doubles and its
failures climb to 12 %. Events go through the engine (verdicts) and into a
chDB directory (panels); the board must show the degraded channel's state
and reasons and the five panels' numbers.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import msgspec
import pytest

from pipeline.cli.watch import VerdictBook, build_board, next_transition, query_panels, state_text
from pipeline.contracts import RequestEvent, encode
from pipeline.policy.defaults import PolicyConfig

START_MS = 1_700_000_040_000
FREE, PAID = "lepton/llama-70b@free", "fireworks/llama-70b@paid"
DURATION_S, FAULT_S = 1200, 600


def events() -> list[dict]:
    out = []
    for k in range(DURATION_S * 5):
        ts, t_s = START_MS + k * 200, k / 5
        for ch in (FREE, PAID):
            ramp = max(0.0, (t_s - FAULT_S) / (DURATION_S - FAULT_S)) if ch == FREE else 0.0
            fail = (k * 7919 % 100) < 12 * ramp
            e = {"event_id": f"{ch}#{k}", "ts_ms": ts, "channel": ch, "route": "chat-70b",
                 "tier": "free" if ch == FREE else "paid", "status": "error" if fail else "ok",
                 "latency_ms": 200.0 * (1 + ramp) + k % 40, "quota_remaining": 0.5 if ch == FREE else 0.9}
            if k % 10 == 0:  # one in ten answers checked for fields; the free channel misses some late on
                e.update(expected_fields=["answer"], missing_fields=["answer"] if ramp > 0.5 and k % 20 == 0 else [])
            out.append(e)
    return out


@pytest.fixture(scope="module")
def scenario(tmp_path_factory: pytest.TempPathFactory) -> tuple[VerdictBook, Path]:
    from pipeline.config import Settings
    from pipeline.engine.replay import replay
    from pipeline.sinks.clickhouse import ClickHouseSink
    from pipeline.storage.client import close_clients

    evs = events()
    _, verdicts = replay(evs)
    book = VerdictBook()
    for v in verdicts:
        book.add(encode(v))
    folder = tmp_path_factory.mktemp("watch") / "chdb"
    sink = ClickHouseSink.from_settings(Settings(kafka_bootstrap=None, clickhouse_url=f"chdb://{folder}"))
    typed = [msgspec.convert(e, RequestEvent) for e in evs]
    sink.add_events([(e, True if e.missing_fields is not None else None, e.missing_fields) for e in typed])
    sink.add_verdicts(verdicts)
    sink.flush()
    close_clients()
    return book, folder


def test_next_transition_follows_the_policy_schedule() -> None:
    p = PolicyConfig()
    assert next_transition("half_open", 0, 50_000, p) == ("recovering", 40_000)
    assert next_transition("open", 0, 100_000, p) == ("half_open", 0)
    assert next_transition("recovering", 0, 130_000, p) == ("ramp step", 110_000)
    assert next_transition("healthy", 0, 1, p) is None
    row = {"state": "half_open", "in_state_s": 50.0, "next": {"to": "recovering", "in_s": 40.0}, "override": None}
    assert state_text(row) == "half_open · 50 s → recovering in 40 s"
    assert state_text(dict(row, state="healthy", in_state_s=9240.0, next=None)) == "healthy · 2.6 h"
    assert state_text(dict(row, state="healthy", in_state_s=4.0, next=None, suspect_run=3)) == (
        "healthy · 4 s; suspect (3 failures in a row): its share goes to its peers")


def test_a_forced_state_shows_who_forced_it_and_no_scheduled_transition() -> None:
    """Issue #35: a forced open read "open · 90 s → half_open in 0 s" with the override dropped as markup."""
    from rich.console import Console

    from pipeline.cli.watch import render

    o = {"kind": "open", "by": "ana", "key_id": "k1", "reason": "[red]vendor[/red] #123", "state": "open",
         "weight": 0.0, "expires_ts_ms": 1_780_005_840_000, "set_ts_ms": 1_780_004_040_000}
    row = {"state": "open", "in_state_s": 90.0, "next": {"to": "half_open", "in_s": 0.0}, "override": o,
           "weight": 0.0, "share": 0.0, "reasons": [], "panels": {}}
    assert state_text(row) == ("open · 90 s; forced open by ana (key k1) until 22:04:00 UTC: [red]vendor[/red] #123")
    weight = dict(row, state="degraded", next=None, override={**o, "kind": "weight", "weight": 0.2, "key_id": ""})
    assert state_text(weight).endswith("weight forced to 0.2 by ana (unsigned) until 22:04:00 UTC: "
                                       "[red]vendor[/red] #123")
    console = Console(width=400, record=True, color_system=None)
    console.print(render({"clickhouse": {"error": None}, "routes": {"r": {"c1": row}}}))
    assert "forced open by ana (key k1) until 22:04:00 UTC: [red]vendor[/red] #123" in console.export_text()


def test_board_shows_degraded_channel_and_the_five_panels(scenario: tuple[VerdictBook, Path]) -> None:
    from pipeline.config import Settings
    from pipeline.storage.client import close_clients, open_client

    book, folder = scenario
    client = open_client(Settings(kafka_bootstrap=None, clickhouse_url=f"chdb://{folder}"), create_database=False)
    try:
        panels, now_ms = query_panels(client)
    finally:
        close_clients()
    board = build_board(book, panels, PolicyConfig(), None, now_ms)
    assert now_ms == START_MS + (DURATION_S * 5 - 1) * 200
    free, paid = board["routes"]["chat-70b"][FREE], board["routes"]["chat-70b"][PAID]
    assert free["state"] in ("degraded", "open") and paid["state"] == "healthy"
    assert set(free["reasons"]) & {"error_rate", "latency_p95_ratio", "consecutive_failures"}
    p = free["panels"]
    assert p["traffic_1m"] == 300  # 5 req/s over the last minute
    assert p["error_rate_1m"] == pytest.approx(0.12, abs=0.03)
    lat = p["latency_ms_5m"]  # the last 5 min of the ramp: 300..400 ms plus 0..39
    assert 360 <= lat["p50"] <= 380 and lat["p50"] < lat["p90"] < lat["p95"] < lat["p99"] and 420 <= lat["p99"] <= 440
    assert p["missing_rate_5m"] == pytest.approx(0.5, abs=0.05)  # every other checked answer late on
    assert p["quota_remaining"] == 0.5
    assert p["quality_5m"] is None  # no scores stored in this run
    assert paid["panels"]["error_rate_1m"] == 0.0 and paid["panels"]["missing_rate_5m"] == 0.0


@pytest.mark.integration
def test_watch_once_json_against_broker_and_chdb(scenario: tuple[VerdictBook, Path]) -> None:
    """The CLI on the embedded broker (verdicts) and the chDB folder (panels), as after a worker stopped."""
    import asyncio
    import os
    import uuid

    from pipeline.config import Settings

    broker_mod = pytest.importorskip("pipeline.tools.embedded.broker")
    book, folder = scenario
    try:
        broker = broker_mod.EmbeddedBroker().start()
    except broker_mod.BrokerStartError as exc:
        pytest.skip(f"embedded broker unavailable: {exc}")
    try:
        settings = Settings(kafka_bootstrap=broker.bootstrap, clickhouse_url=f"chdb://{folder}",
                            topic_prefix=f"w{uuid.uuid4().hex[:8]}.")

        async def put() -> None:
            from aiokafka import AIOKafkaProducer

            from pipeline.kafka.admin import ensure_topics

            await ensure_topics(broker.bootstrap, [settings.topics.health], 1)
            prod = AIOKafkaProducer(bootstrap_servers=broker.bootstrap, acks="all")
            await prod.start()
            try:
                for t in book.tracks.values():
                    await prod.send_and_wait(settings.topics.health, encode(t.verdict), key=t.verdict.channel.encode())
            finally:
                await prod.stop()

        asyncio.run(put())
        env = {k: v for k, v in os.environ.items() if not k.startswith("CHANNEL_HEALTH_")}
        env.update({"CHANNEL_HEALTH_KAFKA_BOOTSTRAP": broker.bootstrap,
                    "CHANNEL_HEALTH_TOPIC_PREFIX": settings.topic_prefix,
                    "CHANNEL_HEALTH_CLICKHOUSE_URL": f"chdb://{folder}"})
        done = subprocess.run([sys.executable, "-m", "pipeline.cli", "watch", "--once", "--json"], env=env,
                              cwd=Path(__file__).resolve().parents[2], capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        board = json.loads(done.stdout)
        free = board["routes"]["chat-70b"][FREE]
        assert board["clickhouse"]["error"] is None
        assert free["state"] == book.tracks[FREE].verdict.state and free["reasons"]
        assert free["panels"]["traffic_1m"] == 300 and free["panels"]["latency_ms_5m"]["p95"] > 400
    finally:
        broker.stop()


def test_board_without_clickhouse_says_why_and_renders(scenario: tuple[VerdictBook, Path]) -> None:
    from rich.console import Console

    from pipeline.cli.watch import render

    book, _ = scenario
    board = build_board(book, {}, PolicyConfig(), "chdb is held by the worker; use a ClickHouse server")
    assert board["routes"]["chat-70b"][FREE]["panels"] == {}
    console = Console(record=True, width=250)
    console.print(render(board))
    text = console.export_text()
    # the error is already one whole sentence (history_off_line): the title shows it as is
    assert "channel-health watch  (chdb is held by the worker; use a ClickHouse server)" in text and FREE in text


def test_the_book_feeds_each_new_verdict_to_the_prometheus_gauges() -> None:
    """Issue #21: `watch` is a long-running process with metrics; each verdict it reads sets the gauges once."""
    from prometheus_client import CollectorRegistry

    from pipeline.engine.replay import replay
    from pipeline.metrics import PipelineMetrics

    _, verdicts = replay(events()[:4000])
    metrics = PipelineMetrics(CollectorRegistry())
    book = VerdictBook()
    book.observe = metrics.observe_verdicts
    for v in verdicts:
        book.add(encode(v))
    for v in verdicts[:3]:
        book.add(encode(v))  # replays of verdicts already seen are not counted again
    reg = metrics.registry
    newest = {v.channel: v for v in verdicts}
    for channel, v in newest.items():
        assert reg.get_sample_value("channel_health_channel_weight", {"channel": channel}) == v.weight
    counted = sum(s.value for m in reg.collect() if m.name == "channel_health_verdicts"
                  for s in m.samples if s.name.endswith("_total"))
    assert counted == sum(max(1, len(v.reasons)) for v in verdicts)


def test_a_locked_chdb_is_said_in_one_line_never_as_a_raw_exception() -> None:
    """Issue #35: the default setup printed `Code: 76. DB::Exception: Cannot lock file ...` above empty panels."""
    from pipeline.cli.watch import history_off_line
    from pipeline.storage.errors import StorageConnectError

    raw = StorageConnectError("cannot open chDB directory /x/chdb: RuntimeError: Code: 76. DB::Exception: Cannot "
                              "lock file /x/chdb/status. Another server instance in same directory is already "
                              "running. (CANNOT_OPEN_FILE)\nstack trace:\n0. DB::Exception ...")
    line = history_off_line("chdb://./data/chdb", raw)
    assert line == ("history panels off: another process (the worker) holds the chDB directory, and chDB allows "
                    "one process per directory; showing live state from channel.health. For history too, point "
                    "CHANNEL_HEALTH_CLICKHOUSE_URL at a ClickHouse server")
    other = history_off_line("https://u:pw@ch:8443", ConnectionError("refused\nsecond line"))
    assert other == ("history panels off: ClickHouse unavailable (ConnectionError: refused); showing live state "
                     "from channel.health") and "\n" not in other


def _board(name: str) -> dict:
    row = {"state": "degraded", "in_state_s": 5.0, "next": None, "override": None, "weight": 0.5, "share": 0.25,
           "reasons": ["latency_p95_ratio"], "panels": {"traffic_1m": 1204, "latency_ms_5m": {"p50": 100.0,
           "p90": 200.0, "p95": 640.0, "p99": 900.0}, "error_rate_1m": 0.021, "missing_rate_5m": 0.0,
           "quality_5m": 0.91, "quota_remaining": 0.5}}
    return {"clickhouse": {"error": None}, "routes": {"chat-70b": {name: row}}}


def test_piped_board_is_not_wrapped_at_80_columns_and_names_are_never_cut(monkeypatch) -> None:
    import io

    from pipeline.cli.watch import PIPE_WIDTH, board_console, render

    monkeypatch.delenv("COLUMNS", raising=False)
    name = "provider-with-a-very-long-deployment-name/" + "x" * 150 + "/llama-3.1-70b-instruct@paid"
    out = io.StringIO()
    console = board_console(file=out, color_system=None)
    assert not console.is_terminal and console.width == PIPE_WIDTH
    console.print(render(_board(name)))
    assert name in out.getvalue()  # one line, whole (the old board: 80 columns, the name cut)
    narrow = io.StringIO()
    console = board_console(file=narrow, width=60, color_system=None)
    console.print(render(_board(name), 60))
    text = narrow.getvalue()
    assert name in "".join(line.split("│")[2].strip() for line in text.splitlines() if line.count("│") > 2)
    assert "quota" not in text and "channel" in text  # the least-needed panels left out when narrow
    wide = io.StringIO()
    board_console(file=wide, width=400, color_system=None).print(render(_board("c1"), 400))
    assert all(col in wide.getvalue() for col in ("quota", "quality 5m", "P50/P90/P95/P99 ms 5m"))
    assert "        1204 " not in wide.getvalue() and " 1204 │" in wide.getvalue()  # numbers right-aligned


def test_a_held_chdb_directory_is_seen_without_opening_the_engine(tmp_path: Path) -> None:
    """On the demo stack chDB itself printed `Code: 76. DB::Exception: Cannot lock file` to the terminal while
    the board tried to open the directory: the lock is now probed first and the engine never opened."""
    import fcntl

    from pipeline.cli.watch import Board, chdb_held
    from pipeline.config import Settings

    (tmp_path / "status").write_text("PID: 1\n")
    url = f"chdb://{tmp_path}"
    assert not chdb_held(url) and not chdb_held("http://h:8123") and not chdb_held(f"chdb://{tmp_path}/absent")
    with open(tmp_path / "status", "rb") as held:  # what the worker's chDB does while it runs
        fcntl.flock(held.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        assert chdb_held(url)
        board = Board(Settings(kafka_bootstrap="x", clickhouse_url=url), PolicyConfig())

        async def no_kafka(*a, **k) -> int:
            return 0

        import pipeline.stream.control as control

        real, control.read_to_end = control.read_to_end, no_kafka
        try:
            import asyncio

            asyncio.run(board.start())
        finally:
            control.read_to_end = real
        assert board.client is None and board.ch_error.startswith("history panels off: another process (the worker)")


def test_board_shows_the_backed_off_next_probe_of_a_reopen() -> None:
    """Issue #33 part 3 ("the board the next probe time"): a 10 min outage re-opens after its first failed
    probe with a cooldown of 90 s x 2 + jitter (PolicyConfig.backoff: 180-198 s). The board's next
    transition is the probe time that re-open published (next_probe_ts_ms), not the plain 90 s."""
    import time

    from pipeline.alert.reasons import duration
    from pipeline.engine.replay import replay
    from pipeline.tools.drill.runner import plan_drill

    policy = PolicyConfig()
    plan = plan_drill("errors", "drill/a", policy, duration_s=600, end_ms=START_MS + 10_000_000, run_id="r")
    _, verdicts = replay(plan.events(), policy)
    mine = [v for v in verdicts if v.channel == "drill/a"]
    # the first failed probe: the drill channel's own 503s answer it at the round after the 90 s cooldown, so
    # it stays open with the next cooldown (SPEC §4.2 probe on evidence; before: half_open, then a re-open)
    first = next(v for v in mine if v.state == "open")
    at = next(i for i, v in enumerate(mine) if v.state == "open"
              and v.metrics["next_probe_ts_ms"] != first.metrics["next_probe_ts_ms"])
    assert all(v.state == "open" for v in mine[mine.index(first):at + 1])
    reopen = mine[at]
    cooldown_ms = policy.backoff("").delay_ms(1, seed=reopen.ts_ms)
    assert 180_000 <= cooldown_ms <= 198_000 and reopen.metrics["next_probe_ts_ms"] == reopen.ts_ms + cooldown_ms
    book = VerdictBook()
    for v in mine[:at + 1]:
        book.add(encode(v))
    row = build_board(book, {}, policy)["routes"]["drill"]["drill/a"]
    assert row["next"] == {"to": "half_open", "in_s": cooldown_ms / 1000, "at_ts_ms": reopen.ts_ms + cooldown_ms}
    probe = time.strftime("%H:%M:%S UTC", time.gmtime((reopen.ts_ms + cooldown_ms) / 1000))
    open_s = (reopen.ts_ms - first.ts_ms) // 1000  # open since the trip: the answered probe kept it open
    assert open_s == 107
    assert state_text(row) == f"open · {open_s} s → half_open in {duration(cooldown_ms / 1000)} (probe at {probe})"
    # a verdict from before the backoff (no next_probe_ts_ms) keeps the plain schedule
    assert next_transition("open", 0, 30_000, policy, None) == ("half_open", 60_000)
    assert next_transition("open", 0, 30_000, policy, 200_000) == ("half_open", 170_000)
