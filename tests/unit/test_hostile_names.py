"""Names are data, never markup (SPEC §8, issue #30 item 5): hostile names through every output.

Each name a gateway could send (rich markup, ANSI/OSC escapes, a newline, mathtext, Slack and IM mention
and link syntax, markdown, SQL, a bidi override, a very long name) goes through the watch board, the
``override list`` lines, the ``query`` table, the report's plots and HTML, every alert format and the log
records; each output must neither crash nor pass the name's markup or control characters on. The
helpers of :mod:`pipeline.escape` are fuzzed with hypothesis at the end.
"""

from __future__ import annotations

import html
import io
import json
import logging
import re
from datetime import datetime, timedelta, timezone
from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.escape import (UNSAFE, EscapingRecordFactory, feishu_text, html_text, im_markdown,
                             install_log_escaping, plot_text, rich_text, slack_text, sql_literal, terminal_text)

OSC8 = "\x1b]8;;http://evil\x1b\\click\x1b]8;;\x1b\\"
HOSTILE = [
    "x/[/bold]", "[red]boom", OSC8, "\x1b[2J", "a\nFAKE LOG LINE", "x/$\\undefinedcommand$", "<!channel>",
    "<https://evil|click>", "@all", "**bold**", "'; DROP TABLE x; --", "\u202eevil", "[click](https://evil)",
    "<at user_id=\"all\">all</at>", "x`y\\", "_hidden", "\x9b31m8-bit CSI", "long-" + "n" * 300,
]
IDS = [repr(n)[:24] for n in HOSTILE]
#: Control characters that must never reach an output: C0 except none, DEL, C1, bidi controls.
CONTROL = UNSAFE


def _verdict(name: str, **over):
    from pipeline.contracts import Verdict

    fields = dict(channel=name, route=name, state="open", weight=0.0, reasons=["error_rate", name],
                  metrics={"error_rate_5m": 0.5, name[:40]: 1.0}, ts_ms=1_750_000_000_000, seq=3)
    fields.update(over)
    return Verdict(**fields)


# -- terminals: watch, override list, query ------------------------------------------------------------

def _watch_text(name: str) -> str:
    from rich.console import Console

    from pipeline.cli.watch import Track, VerdictBook, build_board, render
    from pipeline.policy.defaults import PolicyConfig

    book = VerdictBook()
    override = {"kind": "open", "by": name, "reason": name}
    book.tracks[name] = Track(_verdict(name, override=override), 1_750_000_000_000 - 5_000)
    board = build_board(book, {name: {"route": name, "traffic_1m": 3}}, PolicyConfig(), clickhouse_error=name)
    out = io.StringIO()
    Console(file=out, width=3000, color_system=None, force_terminal=False).print(render(board))
    return out.getvalue()


@pytest.mark.parametrize("name", HOSTILE, ids=IDS)
def test_watch_board_renders_a_hostile_name_as_text(name: str) -> None:
    text = _watch_text(name)  # rich markup in a name raised MarkupError here
    assert not CONTROL.search(text.replace("\n", "")), "a control character reached the terminal"
    assert terminal_text(name) in text  # shown as written, escapes made visible
    assert len(text.splitlines()) == len(_watch_text("plain").splitlines())  # no extra line


@pytest.mark.parametrize("name", HOSTILE, ids=IDS)
def test_override_list_prints_one_inert_line_per_override(name: str, monkeypatch) -> None:
    from typer.testing import CliRunner

    import pipeline.cli.override as cli_override
    import pipeline.stream.control as control
    from pipeline.policy.override import Override

    overrides = [Override(kind="open", by=name, reason=name, set_ts_ms=0, expires_ts_ms=2**42, channel=name)]

    async def read_overrides(*args, **kwargs):
        return SimpleNamespace(active=lambda: overrides)

    monkeypatch.setattr(control, "read_overrides", read_overrides)
    monkeypatch.setattr(cli_override, "_settings", lambda: SimpleNamespace(
        kafka_bootstrap="127.0.0.1:1", topics=SimpleNamespace(control="channel.control"), control=None,
        kafka_security=SimpleNamespace(aiokafka_kwargs=dict)))
    result = CliRunner().invoke(cli_override.override_app, ["list"])
    assert result.exit_code == 0, result.output
    assert result.output.count("\n") == 1 and not CONTROL.search(result.output[:-1])
    assert result.output.startswith(f"channel:{terminal_text(name)}")
    assert result.output.rstrip("\n").endswith(f"by {terminal_text(name)} (key unsigned): {terminal_text(name)}")


@pytest.mark.parametrize("name", HOSTILE, ids=IDS)
def test_query_table_shows_a_hostile_value_on_its_own_row(name: str) -> None:
    from pipeline.storage.query import format_table

    text = format_table(["channel", "n"], [(name, 1), ("plain", 2)], width=2000)
    assert not CONTROL.search(text.replace("\n", ""))
    assert len(text.splitlines()) == len(format_table(["channel", "n"], [("a", 1), ("b", 2)]).splitlines())
    assert terminal_text(name) in text


# -- report: plots and HTML ------------------------------------------------------------------------------

def _report_data(names: list[str]):
    from pipeline.tools.report.data import VERDICT_METRICS, ReportData
    from pipeline.tools.report.html import TRANSITION_NUMBERS

    t0 = datetime(2026, 1, 1, tzinfo=timezone.utc)
    d = ReportData(f"channel {names[0]}", names, t0, t0 + timedelta(minutes=5))
    for i in range(5):
        ts = t0 + timedelta(minutes=i)
        for ch in names:
            row = {k: 0.5 for k in (*VERDICT_METRICS, *TRANSITION_NUMBERS)}
            d.verdicts.append({**row, "channel": ch, "route": ch, "ts": ts, "seq": i, "weight": 0.5,
                               "state": "open" if i % 2 else "healthy", "reasons": [ch]})
            d.minutes.append({"channel": ch, "minute": ts, "requests": 10, "failures": 2, "error_rate": 0.2,
                              "p95_latency_ms": 300.0, "missing_field_rate": 0.0})
            d.extras.append({"channel": ch, "minute": ts, "quota_remaining_min": 0.5, "max_stream_gap_ms": 80.0})
    return d


def test_report_plots_draw_every_hostile_name() -> None:
    pytest.importorskip("matplotlib")
    from pipeline.tools.report.plots import PLOTS

    data = _report_data(HOSTILE)
    for plot in PLOTS:
        title, png, note = plot(data)  # mathtext would raise ValueError at draw time
        assert png is not None and png[:4] == b"\x89PNG", (title, note)


def test_report_plot_labels_read_as_the_names_and_none_is_mathtext() -> None:
    pytest.importorskip("matplotlib")
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.text import Text

    for name in HOSTILE:
        shown, math = Text(0, 0, plot_text(name))._preprocess_math(plot_text(name))  # noqa: SLF001
        assert math is False and shown.lstrip(" ") == terminal_text(name)


def test_report_html_escapes_every_hostile_name(monkeypatch) -> None:
    pytest.importorskip("matplotlib")
    from pipeline.tools.report import plots
    from pipeline.tools.report.html import render_html

    monkeypatch.setattr(plots, "_png", lambda fig, data: plots._none(fig, "", "") and b"png")  # noqa: SLF001
    page = render_html(_report_data(HOSTILE), "chdb:///x")
    assert not CONTROL.search(page.replace("\n", ""))
    for name in HOSTILE:
        assert html_text(name) in page
    for raw in ("<!channel>", "<at user_id", "<https://evil"):
        assert raw not in page


# -- alerts ------------------------------------------------------------------------------------------------

def _payloads(name: str) -> dict[str, dict]:
    from pipeline.alert.config import parse_alert_config
    from pipeline.alert.formats import FORMATTERS, payload
    from pipeline.alert.grouping import Notification

    v = _verdict(name)
    firing = Notification("firing", "k", name, "critical", firing=((v, "critical"),), resolved=(v,))
    out = {}
    for fmt in FORMATTERS:
        raw = {"name": fmt, "url": "http://127.0.0.1:1/x", "format": fmt}
        if fmt == "pagerduty":
            raw["routing_key"] = "R" * 32
        out[fmt] = payload(firing, parse_alert_config({"route": [raw]}, env={}).routes[0])
    return out


def _texts(fmt: str, body: dict) -> list[str]:
    """The texts of a payload that a chat client or pager shows as text."""
    if fmt == "slack":
        return [body["text"], body["blocks"][0]["text"]["text"], body["blocks"][1]["text"]["text"]]
    if fmt == "feishu":
        return [body["content"]["text"]]
    if fmt == "dingtalk":
        return [body["markdown"]["title"], body["markdown"]["text"]]
    if fmt == "wecom":
        return [body["markdown"]["content"]]
    if fmt == "pagerduty":
        return [body["payload"]["summary"], body["payload"]["component"]]
    return [body["text"], body["title"]]


@pytest.mark.parametrize("name", HOSTILE, ids=IDS)
def test_alert_formats_carry_a_hostile_name_inert(name: str) -> None:
    bodies = _payloads(name)
    assert set(bodies) == {"json", "slack", "feishu", "dingtalk", "wecom", "pagerduty"}
    for fmt, body in bodies.items():
        json.dumps(body)  # still a valid JSON body
        for text in _texts(fmt, body):
            assert not CONTROL.search(text.replace("\n", "")), fmt
    for text in _texts("slack", bodies["slack"]):  # Slack: <!channel>, <url|text>, <@U..> need a raw "<"
        assert "<" not in text and ">" not in text
    assert slack_text(name) in bodies["slack"]["text"] and slack_text(name) in _texts("slack", bodies["slack"])[2]
    for fmt in ("dingtalk", "wecom", "feishu"):  # no tag (<at>, <@id>, <font>) opens
        for text in _texts(fmt, bodies[fmt]):
            assert "<" not in text, fmt
    for fmt in ("dingtalk", "wecom"):  # markdown: no link opens (Feishu's text message has no markdown)
        for text in _texts(fmt, bodies[fmt]):
            assert not re.search(r"(?<!\\)\]\(", text), fmt
    for fmt in ("dingtalk", "wecom"):
        assert im_markdown(name) in _texts(fmt, bodies[fmt])[-1]
    assert feishu_text(name) in bodies["feishu"]["content"]["text"]
    # the structured form keeps the raw data (JSON encoding is safe); the history SQL selects exactly it
    assert bodies["json"]["firing"][0]["channel"] == name
    assert bodies["json"]["firing"][0]["history_sql"].count(sql_literal(name)) == 1


def test_history_sql_literal_selects_exactly_the_name() -> None:
    chdb = pytest.importorskip("chdb")
    sql = "SELECT [" + ", ".join(sql_literal(n) for n in HOSTILE) + "] AS names"
    assert json.loads(chdb.query(sql, "JSONEachRow").bytes())["names"] == HOSTILE


# -- logs ----------------------------------------------------------------------------------------------------

@pytest.fixture
def escaping_logs():
    """:func:`install_log_escaping` for one test; the process's previous factory afterwards."""
    before = logging.getLogRecordFactory()
    install_log_escaping()
    install_log_escaping()  # idempotent: one wrapper
    factory = logging.getLogRecordFactory()
    assert isinstance(factory, EscapingRecordFactory) and factory.base is before
    yield
    logging.setLogRecordFactory(before)


@pytest.mark.parametrize("name", HOSTILE, ids=IDS)
def test_a_name_in_a_log_record_cannot_forge_a_line(name: str, escaping_logs) -> None:
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    log = logging.getLogger("test_hostile_names")
    log.addHandler(handler)
    try:
        log.warning("channel %s refused (%d so far)", name, 1)
        log.warning(f"f-string with {name}")
    finally:
        log.removeHandler(handler)
    lines = out.getvalue().splitlines()
    assert lines == [f"WARNING test_hostile_names: channel {terminal_text(name)} refused (1 so far)",
                     f"WARNING test_hostile_names: f-string with {terminal_text(name)}"]


def test_the_alert_process_installs_log_escaping(tmp_path, monkeypatch) -> None:
    from typer.testing import CliRunner

    from pipeline.cli.main import app

    before = logging.getLogRecordFactory()
    try:
        CliRunner().invoke(app, ["alert", "--config", str(tmp_path / "missing.toml")])
        assert isinstance(logging.getLogRecordFactory(), EscapingRecordFactory)
    finally:
        logging.setLogRecordFactory(before)


# -- the helpers, fuzzed ---------------------------------------------------------------------------------

PRINTABLE = st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7e), max_size=60)


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=60))
def test_no_helper_output_holds_a_control_character(text: str) -> None:
    for helper in (terminal_text, html_text, slack_text, im_markdown, feishu_text, plot_text, sql_literal):
        assert not UNSAFE.search(helper(text)), helper.__name__
    assert not UNSAFE.search(rich_text(text).plain)
    assert "<" not in slack_text(text) + im_markdown(text) + feishu_text(text)


@settings(max_examples=200, deadline=None)
@given(PRINTABLE)
def test_printable_ascii_round_trips_where_the_medium_allows(text: str) -> None:
    assert terminal_text(text) == text and rich_text(text).plain == text
    assert html.unescape(html_text(text)) == text
    assert slack_text(text).replace("&lt;", "<").replace("&gt;", ">").replace("&amp;", "&") == text
    assert re.sub(r"\\(.)", r"\1", im_markdown(text)).replace("\uff1c", "<").replace("\uff1e", ">") == text
    assert feishu_text(text).replace("\uff1c", "<").replace("\uff1e", ">") == text
    assert plot_text(text).replace("\\$", "$") == (" " + text if text.startswith("_") else text)


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=60))
def test_a_log_record_is_always_one_line(text: str) -> None:
    record = EscapingRecordFactory(logging.LogRecord)("t", logging.WARNING, __file__, 1, "name %s", (text,), None)
    message = record.getMessage()
    assert message == "name " + terminal_text(text) and len(message.splitlines()) <= 1
