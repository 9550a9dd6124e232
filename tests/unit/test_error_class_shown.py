"""Issue #32 part 3 "where it shows": alerts say "dead key on account acct-a (2 channels)", the board (`watch`)
and the report show the class. The provider's message and the account are text from outside: every medium
gets them through its own escaper (:mod:`pipeline.escape`), so a message holding ``<!channel>`` or a
Markdown link pings nobody and links nowhere. Before this change no alert, board or report showed the
class (``error_class_line`` was called from nowhere): each test below fails there.
"""

from __future__ import annotations

import io
from datetime import datetime, timedelta, timezone

import pytest

from pipeline.alert.config import parse_alert_config
from pipeline.alert.formats import FORMATTERS, payload
from pipeline.alert.grouping import Notification
from pipeline.contracts import Verdict
from pipeline.engine.replay import replay
from pipeline.escape import feishu_text, html_text, im_markdown, slack_text, terminal_text

LINE = "dead key on account acct-a (2 channels)"
HOSTILE = ["<!channel> key revoked", "[click](https://evil) **now**", '<at user_id="all">all</at>',
           "bad key\nFAKE LINE", "plain: Incorrect API key provided"]


def _verdict(message: str) -> Verdict:
    return Verdict(channel="openai/gpt-4o@paid", route="chat", state="open", weight=0.0,
                   reasons=["credential_invalid"], ts_ms=1_780_000_000_000, seq=4,
                   metrics={"error_class": "credential", "account": "acct-a", "account_channels": 2,
                            "http_status": 401, "error_message": message, "next_probe_ts_ms": 1_780_000_300_000})


def _payloads(v: Verdict) -> dict[str, dict]:
    n = Notification("firing", "k", v.route, "critical", firing=((v, "critical"),))
    out = {}
    for fmt in FORMATTERS:
        raw = {"name": fmt, "url": "http://127.0.0.1:1/x", "format": fmt}
        if fmt == "pagerduty":
            raw["routing_key"] = "R" * 32
        out[fmt] = payload(n, parse_alert_config({"route": [raw]}, env={}).routes[0])
    return out


@pytest.mark.parametrize("message", HOSTILE)
def test_every_alert_format_says_dead_key_on_account_with_the_message_escaped(message: str) -> None:
    line = f"{LINE} — {message}"
    bodies = _payloads(_verdict(message))
    assert f"  {terminal_text(line)}" in bodies["json"]["text"].splitlines()
    assert f"  {slack_text(line)}" in bodies["slack"]["blocks"][1]["text"]["text"].splitlines()
    assert f"  {feishu_text(line)}" in bodies["feishu"]["content"]["text"].splitlines()
    assert f"  {im_markdown(line)}" in bodies["dingtalk"]["markdown"]["text"].splitlines()
    assert f"  {im_markdown(line)}" in bodies["wecom"]["markdown"]["content"].splitlines()
    assert bodies["pagerduty"]["payload"]["custom_details"]["firing"][0]["error_class_text"] == line
    assert bodies["json"]["firing"][0]["error_class_text"] == line  # structured: raw (JSON encoding is safe)
    slack = bodies["slack"]["blocks"][1]["text"]["text"]
    assert "<!channel>" not in slack and "<at" not in bodies["feishu"]["content"]["text"]
    assert "](https://evil)" not in bodies["dingtalk"]["markdown"]["text"]


def test_a_verdict_without_a_class_has_no_class_line() -> None:
    v = Verdict(channel="c", route="r", state="open", weight=0.0, reasons=["error_rate"], ts_ms=1, seq=1,
                metrics={"error_rate_5m": 0.3})
    bodies = _payloads(v)
    assert bodies["json"]["firing"][0]["error_class_text"] is None
    assert len(bodies["json"]["text"].splitlines()) == 3  # title, channel line, history: nothing more


def test_engine_dead_key_verdicts_alert_as_dead_key_on_the_account() -> None:
    t0 = 1_780_000_000_000 - 1_780_000_000_000 % 3_600_000
    events = []
    for i in range(700 * 2):
        for k, ch in enumerate(("openai/gpt-4o@paid", "openai/gpt-4o-mini@paid")):
            e = {"event_id": f"{ch}-{i}", "ts_ms": t0 + i * 500 + k, "channel": ch, "route": "chat",
                 "status": "ok", "latency_ms": 700.0, "tier": "paid", "account": "acct-a"}
            if k == 0 and i >= 600 * 2:
                e.update(status="error", http_status=401, latency_ms=20.0,
                         error_message="Incorrect API key provided: sk-abc1234567.")
            events.append(e)
    _, verdicts = replay(events)
    opened = [next(v for v in verdicts if v.channel == ch and v.state == "open")
              for ch in ("openai/gpt-4o@paid", "openai/gpt-4o-mini@paid")]
    n = Notification("firing", "k", "chat", "critical", firing=tuple((v, "critical") for v in opened))
    text = FORMATTERS["json"](n, parse_alert_config({"route": [{"name": "j", "url": "http://127.0.0.1:1/x", "format": "json"}]},
                                                      env={}).routes[0])["text"]
    assert text.count(f"  {LINE} — Incorrect API key provided: <redacted>.") == 2  # the key never shows


def _board_text(v: Verdict) -> tuple[dict, str]:
    from rich.console import Console

    from pipeline.cli.watch import Track, VerdictBook, build_board, render
    from pipeline.policy.defaults import PolicyConfig

    book = VerdictBook()
    book.tracks[v.channel] = Track(v, v.ts_ms - 5_000)
    board = build_board(book, {}, PolicyConfig())
    out = io.StringIO()
    Console(file=out, width=3000, color_system=None, force_terminal=False).print(render(board))
    return board, out.getvalue()


def test_watch_board_shows_the_class() -> None:
    board, text = _board_text(_verdict("[red]Incorrect key"))
    row = board["routes"]["chat"]["openai/gpt-4o@paid"]
    assert row["error_class"] == "credential"
    assert row["error_class_text"] == f"{LINE} — [red]Incorrect key"
    assert "error class" in text and f"{LINE} — [red]Incorrect key" in text  # shown as data, not as markup
    caller = Verdict(channel="c", route="r", state="healthy", weight=1.0, reasons=["caller_errors"], ts_ms=10,
                     seq=1, metrics={"caller_errors_5m": 360})
    board, text = _board_text(caller)
    assert board["routes"]["r"]["c"]["error_class"] == "caller"
    assert "360 caller errors in 5 min (the client's requests, not the channel)" in text


def test_report_transitions_show_the_class_html_escaped() -> None:
    from pipeline.tools.report.data import CLASS_METRICS, SQL_VERDICTS, VERDICT_METRICS, ReportData
    from pipeline.tools.report.html import render_html

    for k in CLASS_METRICS:  # read from the verdict's metrics by the report's query
        assert f"JSONExtract(metrics, '{k}', '{CLASS_METRICS[k]}') AS {k}" in SQL_VERDICTS
    t0 = datetime(2026, 1, 1, tzinfo=timezone.utc)
    ch = "openai/gpt-4o@paid"
    d = ReportData(f"channel {ch}", [ch], t0, t0 + timedelta(minutes=5))
    base = {k: None for k in VERDICT_METRICS} | {k: None for k in CLASS_METRICS}
    d.verdicts.append({**base, "channel": ch, "route": "chat", "ts": t0, "seq": 1, "weight": 1.0,
                       "state": "healthy", "reasons": []})
    d.verdicts.append({**base, "channel": ch, "route": "chat", "ts": t0 + timedelta(minutes=1), "seq": 2,
                       "weight": 0.0, "state": "open", "reasons": ["credential_invalid"], "error_class": "credential",
                       "account": "acct-a", "account_channels": 2, "error_message": "<script>alert(1)</script>"})
    page = render_html(d, "chdb://x")
    assert "<th>error class</th>" in page
    assert f"<td>{html_text(LINE + ' — <script>alert(1)</script>')}</td>" in page
    assert "<script>alert(1)" not in page
