"""pipeline.tools.demo_timeline: the demo's folded timeline and closing summary (pure functions)."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console

from pipeline.contracts import Verdict
from pipeline.tools.demo import choose_data_dir, fresh_data_dir
from pipeline.tools.demo_timeline import Timeline, fmt_duration, fmt_offset, summary_lines

S = 1_780_000_000_000  # scenario time 0 (ms)
CH = "lepton/llama-70b@free"


def v(t_s: float, state: str, reasons=(), channel: str = CH, weight: float = 1.0) -> Verdict:
    return Verdict(channel=channel, route="chat-70b", state=state, weight=weight, reasons=list(reasons), metrics={},
                   ts_ms=S + int(t_s * 1000), seq=1)


def feed(tl: Timeline, verdicts: list[Verdict]) -> list[str]:
    out = []
    for x in verdicts:
        out.extend(tl.add(x))
    return out


def test_formats():
    assert fmt_offset(S + 7_445_000, S) == "+02:04:05"
    assert fmt_offset(S - 5_000, S) == "+00:00:00"
    assert [fmt_duration(ms) for ms in (45_000, 270_000, 3_720_000, -90_000)] == ["45s", "4m30s", "1h02m", "-1m30s"]


def test_repeated_probe_cycles_fold_into_one_line_with_a_count():
    tl = Timeline(S)
    seq = [v(7000, "healthy"), v(7440, "degraded", ["latency_p95_ratio"], weight=0.85),
           v(7620, "open", ["error_rate", "latency_p95_ratio"], weight=0.0)]
    t = 7620
    for _ in range(8):  # 8 probes, each failing 10 s later
        t += 90
        seq.append(v(t, "half_open", ["error_rate"], weight=0.05))
        seq.append(v(t + 10, "open", ["consecutive_failures"], weight=0.0))
        t += 10
    lines = feed(tl, seq)
    assert lines == [
        f"+02:04:00  {CH:<28}    healthy → degraded   weight 0.85  latency_p95_ratio",
        f"+02:07:00  {CH:<28}   degraded → open       weight 0.00  error_rate, latency_p95_ratio",
    ]
    folded = [f"+02:20:20  {CH:<28} open ↔ half_open ×8 since +02:08:30 (8 of 8 probes failed; now open)"]
    assert tl.pending() == folded
    assert tl.finish() == folded
    assert tl.pending() == [] and tl.finish() == []


def test_a_single_successful_probe_prints_as_plain_lines_and_the_cycle_closes_on_recovery():
    tl = Timeline(S)
    lines = feed(tl, [v(0, "healthy"), v(60, "open", ["error_rate"], weight=0.0),
                      v(180, "half_open", ["error_rate"], weight=0.05), v(270, "recovering", weight=0.1),
                      v(990, "healthy")])
    assert [line.split()[2:5] for line in lines] == [
        ["healthy", "→", "open"], ["open", "→", "half_open"], ["half_open", "→", "recovering"],
        ["recovering", "→", "healthy"]]
    assert tl.finish() == []


def test_failed_cycles_then_recovery_fold_and_then_print_the_recovery():
    tl = Timeline(S)
    seq = [v(0, "healthy"), v(60, "open", ["error_rate"]), v(150, "half_open"), v(155, "open"),
           v(250, "half_open"), v(340, "recovering")]
    lines = feed(tl, seq)
    assert lines[-2] == (f"+00:04:10  {CH:<28} open ↔ half_open ×2 since +00:02:30 "
                         "(1 of 2 probes failed; now recovering)")
    assert "half_open → recovering" in lines[-1]
    assert len(lines) == 3


def test_summary_says_detection_delay_time_open_and_recovery_per_channel():
    tl = Timeline(S)
    feed(tl, [v(0, "healthy"), v(7440, "degraded", ["latency_p95_ratio"]), v(7620, "open", ["error_rate"]),
              v(7710, "half_open"), v(7720, "open"), v(7810, "half_open"), v(7900, "recovering"),
              v(8800, "healthy"),
              v(0, "healthy", channel="b/sibling@paid")])
    lines = summary_lines(tl.changes, {CH: (S + 7200_000, S + 8580_000)}, S, S + 9000_000)
    assert lines == [
        "b/sibling@paid: no fault; healthy throughout",
        f"{CH}: fault +02:00:00–+02:23:00; first degraded +02:04:00, 4m00s after the fault began "
        "(latency_p95_ratio); open +02:07:00 (error_rate); circuit open 4m40s, 2 probe(s); "
        "healthy again +02:26:40, 3m40s after the fault ended",
    ]


def test_summary_of_a_channel_still_open_and_of_a_false_alarm():
    tl = Timeline(S)
    feed(tl, [v(0, "healthy"), v(100, "open", ["consecutive_failures"]), v(0, "healthy", channel="x"),
              v(50, "degraded", ["missing_fields"], channel="x")])
    lines = summary_lines(tl.changes, {CH: (S + 90_000, S + 900_000)}, S, S + 400_000)
    assert lines == [
        f"{CH}: fault +00:01:30–+00:15:00; first open +00:01:40, 10s after the fault began (consecutive_failures); "
        "circuit open 5m00s, 0 probe(s); still open at the end (+00:06:40)",
        "x: no fault; first degraded +00:00:50 (false alarm) (missing_fields); still degraded at the end (+00:06:40)",
    ]


def test_summary_of_an_overloaded_backup_is_not_a_false_alarm():
    """Issue #33 part 2: a backup capped for the route's load (reason over_capacity) is not a fault of its
    own; before, the summary called it a false alarm."""
    tl = Timeline(S)
    feed(tl, [v(0, "healthy", channel="x"), v(50, "degraded", ["over_capacity"], channel="x"),
              v(300, "healthy", channel="x")])
    lines = summary_lines(tl.changes, {}, S, S + 400_000)
    assert lines[0].startswith("x: no fault; first degraded +00:00:50 (over capacity: the route's load, no fault "
                               "of its own) (over_capacity)"), lines


def test_the_summary_says_how_long_a_route_had_no_channel_in_service():
    """Issue #33: the demo shows the route's blackout (every channel's latest weight 0), not only states."""
    tl = Timeline(S)
    b = "b/backup@paid"
    feed(tl, [v(0, "healthy"), v(0, "healthy", channel=b), v(100, "open", weight=0.0),
              v(220, "open", weight=0.0, channel=b),                    # dark from 220 s ...
              v(310, "half_open", weight=0.05),                         # ... to 310 s: 90 s
              v(320, "open", weight=0.0), v(400, "open", weight=0.5, channel=b)])  # 320 -> 400 s: 80 s
    assert tl.route_lines(S + 1000_000) == ["route chat-70b: no channel in service for 2m50s"]
    feed(tl, [v(500, "open", weight=0.0, channel=b)])              # dark from 500 s to the end (1000 s)
    assert tl.route_lines(S + 1000_000) == ["route chat-70b: no channel in service for 11m10s"]
    tl = Timeline(S)
    feed(tl, [v(0, "healthy"), v(0, "healthy", channel=b), v(100, "open", weight=0.0)])
    assert tl.route_lines(S + 1000_000) == ["route chat-70b: a channel in service throughout"]


def test_each_demo_run_gets_a_fresh_folder(tmp_path: Path):
    now = 1_780_000_000.0
    a = fresh_data_dir(tmp_path, now)
    b = fresh_data_dir(tmp_path, now)
    assert a.name == "demo-20260528T202640Z" and b.name == "demo-20260528T202640Z-2"
    assert a.is_dir() and b.is_dir()


def test_a_kept_data_dir_that_holds_data_is_announced(tmp_path: Path):
    console = Console(record=True, width=300)
    (tmp_path / "chdb").mkdir()
    assert choose_data_dir(tmp_path, console) == tmp_path.resolve()
    assert "already holds data" in console.export_text()
    empty = tmp_path / "new"
    assert choose_data_dir(empty, console) == empty.resolve() and empty.is_dir()
    assert f"Data folder: {empty.resolve()}" in console.export_text()
