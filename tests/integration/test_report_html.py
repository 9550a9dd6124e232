"""``channel-health report`` as a person sees it (issue #21): numbers equal the ClickHouse rows they came
from, the file is self-contained, and headless Chromium renders it to a PNG with the plots in it.

Chromium: Debian's ``chromium`` package, installed here with apt-get when missing (CI runs as root with
Debian's registry reachable); the render test is skipped, saying why, only when it cannot be installed.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from datetime import datetime, timezone
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pytest

from pipeline.tools.report import write_report
from pipeline.tools.report.html import TRANSITION_NUMBERS, fmt
from scenario_store import FAULTY_CHANNEL, open_scenario, scenario_chdb_url  # noqa: F401  (fixture)

pytest.importorskip("chdb", reason="chdb (embedded ClickHouse) not installed")
pytest.importorskip("matplotlib", reason="matplotlib (the report's plots) not installed")
pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
#: A minute-aligned window around the scenario's fault (sparse-consecutive-failures: opens at 22:05:00.270).
T0 = datetime(2026, 5, 28, 21, 50, tzinfo=timezone.utc)
T1 = datetime(2026, 5, 28, 22, 40, tzinfo=timezone.utc)
WINDOW_PX = (1200, 2600)


class _Tables(HTMLParser):
    """The text of every ``<table id=...>`` cell, per table id: ``{id: [[cell, ...] per body row]}``."""

    def __init__(self) -> None:
        super().__init__()
        self.tables: dict[str, list[list[str]]] = {}
        self._id = None
        self._row: list[str] | None = None
        self._cell: list[str] | None = None
        self._in_body = False

    def handle_starttag(self, tag, attrs):
        if tag == "table":
            self._id = dict(attrs).get("id")
            self.tables[self._id] = []
        elif tag == "tbody":
            self._in_body = True
        elif tag == "tr" and self._in_body:
            self._row = []
        elif tag == "td" and self._row is not None:
            self._cell = []

    def handle_endtag(self, tag):
        if tag == "td" and self._cell is not None:
            self._row.append("".join(self._cell).strip())
            self._cell = None
        elif tag == "tr" and self._row is not None:
            self.tables[self._id].append(self._row)
            self._row = None
        elif tag == "tbody":
            self._in_body = False

    def handle_data(self, data):
        if self._cell is not None:
            self._cell.append(data)


def _tables(html: str) -> dict[str, list[list[str]]]:
    parser = _Tables()
    parser.feed(html)
    return parser.tables


@pytest.fixture(scope="module")
def window_report(scenario_chdb_url: str, tmp_path_factory) -> tuple[str, Path]:  # noqa: F811
    client = open_scenario(scenario_chdb_url)
    path = write_report(client, tmp_path_factory.mktemp("report") / "r.html", "test",
                        channel=FAULTY_CHANNEL, t0=T0, t1=T1)
    return path.read_text(), path


def test_summary_numbers_equal_the_request_rows(scenario_chdb_url, window_report) -> None:  # noqa: F811
    html, _ = window_report
    client = open_scenario(scenario_chdb_url)
    req, fail = client.query(
        "SELECT count(), countIf(status IN ('error', 'timeout', 'rate_limited')) FROM channel_health.request_events "
        "FINAL WHERE channel = {c:String} AND ts >= {a:DateTime64(3, 'UTC')} AND ts < {b:DateTime64(3, 'UTC')}",
        parameters={"c": FAULTY_CHANNEL, "a": "2026-05-28 21:50:00", "b": "2026-05-28 22:40:00"}).result_rows[0]
    verdicts = client.query(
        "SELECT count() FROM channel_health.channel_verdicts FINAL WHERE channel = {c:String} "
        "AND ts >= {a:DateTime64(3, 'UTC')} AND ts < {b:DateTime64(3, 'UTC')}",
        parameters={"c": FAULTY_CHANNEL, "a": "2026-05-28 21:50:00", "b": "2026-05-28 22:40:00"}).result_rows[0][0]
    (row,) = _tables(html)["summary"]
    assert row == [FAULTY_CHANNEL, str(req), str(fail), fmt(fail / req), str(verdicts), "6", "healthy"]
    assert fail == 8  # the scenario's failure run: 5 consecutive, then 3 more in half-open


def test_transitions_equal_the_verdict_rows(scenario_chdb_url, window_report) -> None:  # noqa: F811
    html, _ = window_report
    client = open_scenario(scenario_chdb_url)
    cols = ", ".join(f"JSONExtract(metrics, '{k}', 'Nullable(Float64)')" for k in TRANSITION_NUMBERS)
    rows = client.query(
        f"SELECT ts, state, reasons, weight, {cols} FROM channel_health.channel_verdicts FINAL "
        "WHERE channel = {c:String} AND ts >= {a:DateTime64(3, 'UTC')} AND ts < {b:DateTime64(3, 'UTC')} "
        "ORDER BY ts, seq",
        parameters={"c": FAULTY_CHANNEL, "a": "2026-05-28 21:50:00", "b": "2026-05-28 22:40:00"}).result_rows
    expected, prev = [], None
    for ts, state, reasons, weight, *nums in rows:
        if state != prev:
            expected.append([fmt(ts.replace(tzinfo=timezone.utc) if ts.tzinfo is None else ts), FAULTY_CHANNEL,
                             prev or "-", state, fmt(reasons or None), "-", fmt(weight), *(fmt(n) for n in nums)])
        prev = state
    got = _tables(html)["transitions"]
    assert got == expected
    assert [r[3] for r in got] == ["healthy", "open", "half_open", "open", "half_open", "recovering", "healthy"]
    assert got[1][0] == "2026-05-28T22:05:00.270+00:00" and got[1][4] == "consecutive_failures"


def test_the_file_is_self_contained(window_report) -> None:
    html, _ = window_report
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", html, re.I)
    assert "<script" not in html.lower()
    # traffic, state, P95, error rate, stalls, weight: drawn; missing/quality and quota: said to be absent
    assert html.count('src="data:image/png;base64,') == 6
    assert "no quota data" in html and "no missing-field or quality data" in html
    assert "FROM channel_health.channel_verdicts FINAL" in html  # the queries behind it


def _chromium() -> str:
    """The path of a headless-capable Chromium, installing Debian's ``chromium`` when missing; skip if impossible."""
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found:
        return found
    if shutil.which("apt-get") is None or os.geteuid() != 0:
        pytest.skip("chromium is not installed and cannot be installed here (needs apt-get as root): "
                    "apt-get install chromium to run the render test")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    try:
        subprocess.run(["apt-get", "update"], env=env, capture_output=True, timeout=300, check=True)
        subprocess.run(["apt-get", "install", "-y", "--no-install-recommends", "chromium"], env=env,
                       capture_output=True, timeout=600, check=True)
    except (subprocess.SubprocessError, OSError) as exc:
        pytest.skip(f"chromium is not installed and apt-get could not install it ({exc}); "
                    "apt-get install chromium to run the render test")
    found = shutil.which("chromium")
    if not found:
        pytest.skip("apt-get installed chromium but no chromium command is on PATH")
    return found


def test_chromium_renders_the_plots(window_report, tmp_path: Path) -> None:
    Image = pytest.importorskip("PIL.Image", reason="Pillow (installed with matplotlib) reads the screenshot")
    _, path = window_report
    png = tmp_path / "report.png"
    proc = subprocess.run([_chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                           f"--screenshot={png}", f"--window-size={WINDOW_PX[0]},{WINDOW_PX[1]}",
                           path.as_uri()], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and png.exists(), proc.stderr[-2000:]
    img = Image.open(png).convert("RGB")
    assert img.size == WINDOW_PX
    pixels = np.asarray(img, dtype=np.int16)
    non_white = float((pixels.min(axis=2) < 235).mean())
    assert non_white > 0.05, f"the page looks blank: {non_white:.1%} non-white pixels"

    def near(colour: str) -> int:
        want = np.array([int(colour[i:i + 2], 16) for i in (1, 3, 5)], dtype=np.int16)
        return int((np.abs(pixels - want).max(axis=2) <= 12).sum())

    # the state bands: healthy green and the open red band are drawn, not just the page's text
    assert near("#2e9e44") > 5_000 and near("#d62728") > 500


def test_cli_writes_a_route_report_and_refuses_an_unknown_channel(scenario_chdb_url, tmp_path) -> None:  # noqa: F811
    from pipeline.storage.client import close_clients

    close_clients()  # chDB: one process per directory; the CLI runs in its own
    env = dict(os.environ, CHANNEL_HEALTH_CLICKHOUSE_URL=scenario_chdb_url, PYTHONPATH=str(REPO))
    out = tmp_path / "route.html"
    cmd = [sys.executable, "-m", "pipeline.cli", "report", "--route", "chat-13b", "--incident", "--out", str(out)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == str(out.resolve())
    rows = _tables(out.read_text())["summary"]
    assert [r[0] for r in rows] == ["replicate/llama-13b@free", "together/llama-13b@paid"]
    bad = subprocess.run(cmd[:4] + ["--channel", "nope/none@free", "--incident", "--out", str(tmp_path / "x.html")],
                         env=env, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert bad.returncode == 2
    assert "no verdicts for channel nope/none@free" in bad.stderr
    assert not (tmp_path / "x.html").exists()
