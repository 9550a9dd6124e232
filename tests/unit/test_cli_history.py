"""`channel-health backtest`, `tune` and `incident mark|list` through the CLI (issue #22), on chDB."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from pipeline.cli.main import app

H = 3_600_000
T0 = 1_767_225_600_000  # 2026-01-01T00:00:00Z


@pytest.fixture
def env(tmp_path: Path, monkeypatch) -> dict[str, str]:
    from pipeline.config import Settings
    from pipeline.storage.client import close_clients, open_client
    from pipeline.storage.schema import apply_ddl
    from pipeline.tools.history.synthetic import Fault, record, synthetic_events

    url = f"chdb://{tmp_path / 'chdb'}"
    close_clients()
    client = open_client(Settings(kafka_bootstrap=None, clickhouse_url=url))
    apply_ddl(client)
    record(client, synthetic_events(["a", "b"], T0, T0 + 2 * H, 1.0, seed=5,
                                    faults=[Fault("b", T0 + H + 600_000, T0 + H + 900_000, error_rate=0.3)]))
    monkeypatch.setenv("CHANNEL_HEALTH_CLICKHOUSE_URL", url)
    yield {"CHANNEL_HEALTH_CLICKHOUSE_URL": url}
    close_clients()


def test_mark_list_and_backtest_json(env) -> None:
    runner = CliRunner()
    r = runner.invoke(app, ["incident", "mark", "--channel", "b", "--from", "2026-01-01T01:10:00Z",
                            "--to", "2026-01-01T01:15:00Z", "--kind", "errors", "--note", "drill-less"])
    assert r.exit_code == 0, r.output
    r = runner.invoke(app, ["incident", "list", "--json"])
    (row,) = [json.loads(line) for line in r.output.splitlines()]
    assert (row["channel"], row["kind"], row["from_ms"], row["note"]) == ("b", "errors", T0 + H + 600_000, "drill-less")
    r = runner.invoke(app, ["backtest", "--from", str(T0), "--to", "2026-01-01T02:00:00Z", "--json"])
    assert r.exit_code == 0, r.output
    report = json.loads(r.output.strip().splitlines()[-1])
    assert report["transitions_recorded"] == report["transitions_replayed"] == report["transitions_matching"] > 0
    assert report["channels"]["b"]["transitions_recorded"] > 0
    (inc,) = report["incidents"]
    assert inc["delay_recorded_ms"] == inc["delay_replayed_ms"] is not None
    assert "matching" in r.output  # the table comes first


@pytest.mark.parametrize(("args", "words"), [
    (["incident", "mark", "--channel", "b", "--from", "2026-01-01T01:00:00Z", "--to", "2026-01-01T02:00:00Z",
      "--kind", "meteor"], "unknown incident kind"),
    (["incident", "mark", "--channel", "b", "--from", "2026-01-01T01:00:00", "--to", "now", "--kind", "clean"],
     "no time zone"),
    (["backtest", "--from", "2026-01-02T00:00:00Z", "--to", "2026-01-01T00:00:00Z"], "before --to"),
    (["backtest", "--from", "2025-01-01T00:00:00Z", "--to", "2025-01-02T00:00:00Z"], "no stored request events"),
])
def test_bad_input_is_a_clear_error(env, args, words) -> None:
    r = CliRunner().invoke(app, args)
    assert r.exit_code == 2
    assert words in r.output


def test_tune_refuses_without_labels(env, tmp_path: Path) -> None:
    bounds = tmp_path / "b.toml"
    bounds.write_text('[bounds]\n"errors.trip_rate" = [0.002, 0.01, 0.002]\n')
    r = CliRunner().invoke(app, ["tune", "--from", str(T0), "--to", str(T0 + 2 * H), "--bounds", str(bounds)])
    assert r.exit_code == 2
    assert "no labelled incident" in r.output


def test_empty_database_is_a_clear_error_not_a_traceback(tmp_path: Path, monkeypatch) -> None:
    from pipeline.config import Settings
    from pipeline.storage.client import close_clients, open_client

    url = f"chdb://{tmp_path / 'empty'}"
    close_clients()
    monkeypatch.setenv("CHANNEL_HEALTH_CLICKHOUSE_URL", url)
    r = CliRunner().invoke(app, ["incident", "list"])
    assert r.exit_code == 2 and "no chDB data directory" in r.output  # a reader creates nothing
    open_client(Settings(kafka_bootstrap=None, clickhouse_url=url))  # the database, but no tables
    try:
        r = CliRunner().invoke(app, ["incident", "list"])
        assert r.exit_code == 0 and "(0 rows)" in r.output  # no table yet: nothing marked
        r = CliRunner().invoke(app, ["backtest", "--from", str(T0), "--to", str(T0 + H)])
        assert r.exit_code == 1
        assert "no channel-health tables there" in r.output
    finally:
        close_clients()


def test_backtest_html_file(env, tmp_path: Path) -> None:
    import re

    out = tmp_path / "bt.html"
    r = CliRunner().invoke(app, ["backtest", "--from", str(T0), "--to", str(T0 + 2 * H), "--html", str(out), "--json"])
    assert r.exit_code == 0, r.output
    report = json.loads(r.output.strip().splitlines()[-1])
    assert "timelines" not in report
    page = out.read_text(encoding="utf-8")
    assert not re.search(r'(src|href)\s*=\s*["\']?https?://', page, re.I)
    for key in ("transitions_recorded", "transitions_replayed", "transitions_matching"):
        assert re.findall(rf'id="{key}">(\d+)<', page) == [str(report[key])]
    assert "built-in default" in page and "no channel differs" in page
