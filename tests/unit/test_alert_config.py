"""alerts.toml parsing (pipeline.alert.config): the SPEC §7 minimal file, secrets, clear errors."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from pipeline.alert.config import PAGERDUTY_URL, load_alert_config, parse_alert_config
from pipeline.config import ConfigError
from pipeline.redaction import redact_secrets

MINIMAL = '''
[[route]]            # tried in order of severity match; backup on failure
name = "im"          # any name
url = "http://127.0.0.1:9001/hook"
format = "json"      # json | slack | feishu | dingtalk | wecom | pagerduty
min_severity = "warning"   # info | warning | critical
backup = "pager2"    # optional: route used when this one fails
'''


def test_minimal_file_of_the_spec_loads_with_defaults(tmp_path: Path, caplog) -> None:
    path = tmp_path / "alerts.toml"
    path.write_text(MINIMAL)
    with caplog.at_level(logging.WARNING, "channel_health.alert"):
        cfg = load_alert_config(path, env={})
    (route,) = cfg.routes
    assert (route.name, route.format, route.min_severity, route.backup) == ("im", "json", "warning", "pager2")
    assert (cfg.grouping.group_wait_s, cfg.grouping.group_interval_s, cfg.grouping.repeat_interval_s) == (30, 300, 14400)
    assert cfg.heartbeat_s == 300.0 and cfg.consumer_group == "channel-health-alert"
    assert "backup 'pager2' is not defined" in caplog.text
    assert "127.0.0.1:9001" not in caplog.text


def test_env_expansion_and_url_file_are_secret(tmp_path: Path) -> None:
    (tmp_path / "pd.key").write_text("pdkey-R0UT1NG-secret\n")
    cfg = parse_alert_config({"route": [
        {"name": "slack", "url": "https://hooks.slack.example/services/${SLACK_TOKEN}", "format": "slack"},
        {"name": "pd", "format": "pagerduty", "routing_key_file": str(tmp_path / "pd.key"),
         "min_severity": "critical"}]}, env={"SLACK_TOKEN": "T000/B000/XXXXsecretXXXX"})
    slack, pd = cfg.routes
    assert slack.url == "https://hooks.slack.example/services/T000/B000/XXXXsecretXXXX"
    assert pd.url == PAGERDUTY_URL and pd.routing_key == "pdkey-R0UT1NG-secret"
    assert "secret" not in repr(cfg)
    assert redact_secrets(f"failed {slack.url} {pd.routing_key}") == "failed *** ***"


@pytest.mark.parametrize("route, message", [
    ({"name": "a", "url": "http://h/x", "format": "teams"}, "route[0].format must be one of"),
    ({"name": "a", "url": "http://h/x", "format": "json", "min_severity": "high"}, "route[0].min_severity"),
    ({"name": "a", "url": "http://h/${NOPE}", "format": "json"}, "route[0].url: environment variable NOPE is not set"),
    ({"name": "a", "format": "json"}, "route[0].url (or url_file) is required"),
    ({"name": "a", "url": "http://h/x", "format": "pagerduty"}, "route[0].routing_key"),
    ({"name": "a", "url": "http://h/x", "format": "json", "colour": "red"}, "unknown key route[0].colour"),
    ({"name": "a", "url": "http://h/x", "format": "json", "attempts": 0}, "route[0].attempts must be an integer >= 1"),
    ({"name": "a", "url": "ftp://h/x", "format": "json"}, "route[0].url must start with http"),
])
def test_bad_route_names_the_key(route: dict, message: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_alert_config({"route": [route]}, env={})
    assert message in str(err.value)


def test_bad_file_and_sections_name_the_problem(tmp_path: Path) -> None:
    path = tmp_path / "alerts.toml"
    path.write_text("[[route]\n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_alert_config(path, env={})
    with pytest.raises(ConfigError, match=r"at least one \[\[route\]\]"):
        parse_alert_config({}, env={})
    ok = {"name": "a", "url": "http://h/x", "format": "json"}
    with pytest.raises(ConfigError, match=r"silence\[0\].until is required"):
        parse_alert_config({"route": [ok], "silence": [{"channel": "x"}]}, env={})
    with pytest.raises(ConfigError, match=r"grouping.group_wait_s must be a number"):
        parse_alert_config({"route": [ok], "grouping": {"group_wait_s": -1}}, env={})
    with pytest.raises(ConfigError, match=r"severity\[0\].severity must be one of"):
        parse_alert_config({"route": [ok], "severity": [{"state": "open", "severity": "page"}]}, env={})
    with pytest.raises(ConfigError, match="used twice"):
        parse_alert_config({"route": [ok, ok]}, env={})
    off = parse_alert_config({"route": [ok], "heartbeat": {"enabled": False}}, env={})
    assert off.heartbeat_s is None


def test_example_file_in_infra_loads() -> None:
    example = Path(__file__).resolve().parents[2] / "infra" / "alerts.example.toml"
    cfg = load_alert_config(example, env={"SLACK_WEBHOOK_PATH": "T0/B0/abcd1234", "PAGERDUTY_ROUTING_KEY": "k" * 32})
    assert [r.format for r in cfg.routes] == ["slack", "pagerduty", "json"]
    assert cfg.routes[0].backup == "fallback" and cfg.routes[2].backup_only
