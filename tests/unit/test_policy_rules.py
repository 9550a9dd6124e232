"""Policy-file rules (issue #18 item 5): refusals name the key and the rule; the accepted forms load."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from pipeline.cli.main import app
from pipeline.policy.defaults import load_policy
from pipeline.policy.rules import PolicyRuleError


def _load(tmp_path, text: str):
    p = tmp_path / "policy.toml"
    p.write_text(text)
    return load_policy(p)


@pytest.mark.parametrize("text", [
    "[tier.free]\nerror_rate_trip = 0.006\n",
    "[tier.free.error_rate]\nerror_rate_trip = 0.006\n",
    "[tier.paid]\nerror_rate_trip = 0.003\n",  # the paid line lowered under the free default 0.35 %
])
def test_free_line_above_paid_is_refused_naming_key_and_rule(tmp_path, text):
    with pytest.raises(PolicyRuleError, match=r"\[tier.free\] error_rate_trip: .* exceeds the paid line .*"
                                              r"\(rule free-not-above-paid\)") as err:
        _load(tmp_path, text)
    assert (err.value.key, err.value.rule) == ("[tier.free] error_rate_trip", "free-not-above-paid")


def test_long_cooldown_needs_the_opt_in(tmp_path):
    with pytest.raises(PolicyRuleError, match=r"\[policy\] open_cooldown_ms: a cooldown of 300000 ms is above "
                                              r"120000 ms; set allow_long_cooldown = true .*long-cooldown-opt-in"):
        _load(tmp_path, "[policy]\nopen_cooldown_ms = 300000\n")
    assert _load(tmp_path, "[policy]\nopen_cooldown_ms = 300000\nallow_long_cooldown = true\n").open_cooldown_ms == 300_000
    with pytest.raises(ValueError, match="allow_long_cooldown must be true or false"):
        _load(tmp_path, "[policy]\nopen_cooldown_ms = 300000\nallow_long_cooldown = 1\n")


@pytest.mark.parametrize("text,trip_free,cooldown", [
    ("", 0.0035, 90_000),
    ("[tier.free]\nerror_rate_trip = 0.005\n", 0.005, 90_000),  # equal to the paid line: allowed
    ("[tier.free.error_rate]\nerror_rate_trip = 0.002\n[policy]\nopen_cooldown_ms = 120000\n", 0.002, 120_000),
    ("[policy]\nallow_long_cooldown = false\n", 0.0035, 90_000),
])
def test_accepted_forms(tmp_path, text, trip_free, cooldown):
    pol = _load(tmp_path, text)
    assert pol.tiers["free"].error_rate_trip == trip_free and pol.open_cooldown_ms == cooldown


def test_worker_cli_shows_a_refused_policy_in_one_line(tmp_path, monkeypatch):
    p = tmp_path / "bad.toml"
    p.write_text("[policy]\nopen_cooldown_ms = 300000\n")
    monkeypatch.setenv("CHANNEL_HEALTH_KAFKA_BOOTSTRAP", "127.0.0.1:1")
    res = CliRunner().invoke(app, ["worker", "--policy", str(p)])
    assert res.exit_code == 2
    assert "open_cooldown_ms" in res.output and "long-cooldown-opt-in" in res.output
    assert "Traceback" not in res.output and res.exception is None or isinstance(res.exception, SystemExit)
