"""``channel-health alert`` command line: configuration errors are one clear line and exit status 2."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from pipeline.cli.main import app

runner = CliRunner()


def test_alert_bad_config_names_the_key_and_exits_2(tmp_path: Path) -> None:
    path = tmp_path / "alerts.toml"
    path.write_text('[[route]]\nname = "im"\nurl = "http://h/${SECRET_TOKEN}"\nformat = "teams"\n')
    r = runner.invoke(app, ["alert", "--config", str(path)], env={"CHANNEL_HEALTH_KAFKA_BOOTSTRAP": "127.0.0.1:1",
                                                                   "SECRET_TOKEN": "tok-123456"})
    assert r.exit_code == 2
    assert "route[0].format must be one of json, slack, feishu, dingtalk, wecom, pagerduty, got 'teams'" in r.output
    assert "tok-123456" not in r.output


def test_alert_without_bootstrap_is_a_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "alerts.toml"
    path.write_text('[[route]]\nname = "im"\nurl = "http://127.0.0.1:9001/hook"\nformat = "json"\n')
    r = runner.invoke(app, ["alert", "--config", str(path)], env={"CHANNEL_HEALTH_KAFKA_BOOTSTRAP": ""})
    assert r.exit_code == 2 and "CHANNEL_HEALTH_KAFKA_BOOTSTRAP is not set" in r.output
