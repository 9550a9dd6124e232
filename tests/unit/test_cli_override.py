"""``channel-health override`` on the command line (issue #35 part 1): TTLs name their unit."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from pipeline.cli.main import app

runner = CliRunner()
ENV = {"COLUMNS": "200", "NO_COLOR": "1", "TERM": "dumb"}


@pytest.mark.parametrize("ttl", ["5", "30", "1.5", "0m", "-5m", "5 minutes", "m", "5x"])
def test_a_ttl_without_a_unit_or_positive_value_is_refused_before_any_broker_call(ttl: str) -> None:
    r = runner.invoke(app, ["override", "set", "c1", "--open", "--ttl", ttl, "--reason", "x"], env=ENV)
    assert r.exit_code == 2, r.output
    assert "--ttl" in r.output and "Traceback" not in r.output
    if ttl in ("5", "30", "1.5"):  # the old code took these as seconds
        assert f"--ttl {ttl!r} needs a unit: e.g. 90s, 5m, 1h, 1d" in r.output


@pytest.mark.parametrize("ttl, ms", [("90s", 90_000), ("5m", 300_000), ("1h", 3_600_000), ("1.5H", 5_400_000),
                                     ("250ms", 250)])
def test_ttls_with_units(ttl: str, ms: int) -> None:
    from pipeline.cli.override import _ttl_ms

    assert _ttl_ms(ttl) == ms
