"""``demo --keep`` (issue #35 part 5): the exports and commands printed, the wait until Ctrl-C."""

from __future__ import annotations

import shlex

import pytest
from typer.testing import CliRunner

from pipeline.cli.main import app
from pipeline.config import Settings
from pipeline.tools.demo_keep import keep_lines, keep_up


def test_keep_lines_export_what_another_shell_needs_quoted() -> None:
    s = Settings(kafka_bootstrap="127.0.0.1:40123", clickhouse_url="chdb:///tmp/data dir/chdb", topic_prefix="t.")
    name = "lepton/llama-70b@free; rm -rf ~"
    lines = keep_lines(s, name, "gradual-degradation")
    assert "  export CHANNEL_HEALTH_KAFKA_BOOTSTRAP=127.0.0.1:40123" in lines
    assert "  export CHANNEL_HEALTH_CLICKHOUSE_URL='chdb:///tmp/data dir/chdb'" in lines
    assert "  export CHANNEL_HEALTH_TOPIC_PREFIX=t." in lines
    cmd = next(line for line in lines if "override set" in line)
    assert shlex.split(cmd)[:8] == ["channel-health", "override", "set", name, "--open", "--ttl", "5m", "--reason"]
    assert any(line.strip().startswith("channel-health watch") for line in lines)
    assert not any("TOPIC_PREFIX" in line for line in keep_lines(Settings(kafka_bootstrap="b", clickhouse_url="chdb://x"), None, "x"))


def test_keep_up_waits_until_ctrl_c_and_stops_when_the_worker_dies() -> None:
    said, checks = [], []

    def sleep(_s: float) -> None:
        if len(checks) == 3:
            raise KeyboardInterrupt

    keep_up(said.append, lambda: checks.append(1), ["a", "b"], sleep=sleep)
    assert said == ["a", "b", "Stopping the kept stack…"] and len(checks) == 3

    def dead() -> None:
        raise RuntimeError("worker exited with code 1")

    with pytest.raises(RuntimeError, match="worker exited"):
        keep_up(said.append, dead, [], sleep=lambda s: None)


def test_demo_offers_keep() -> None:
    r = CliRunner().invoke(app, ["demo", "--help"], env={"COLUMNS": "200", "NO_COLOR": "1", "TERM": "dumb"})
    assert r.exit_code == 0 and "--keep" in r.output
