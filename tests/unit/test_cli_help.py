"""channel-health help texts and scenario listing (issue #17), through typer's CliRunner."""

from __future__ import annotations

import re

import pytest
import typer
from typer.testing import CliRunner

from pipeline.cli.main import app
from pipeline.tools.simulate.scenarios import SCENARIOS

runner = CliRunner()
ENV = {"COLUMNS": "200", "NO_COLOR": "1", "TERM": "dumb"}


def _command_paths() -> list[list[str]]:
    """Every command and sub-command of the app, as argv prefixes (the root is [])."""
    group = typer.main.get_command(app)
    out, todo = [], [([], group)]
    while todo:
        path, cmd = todo.pop()
        out.append(path)
        for name, sub in getattr(cmd, "commands", {}).items():
            todo.append(([*path, name], sub))
    return out


def test_simulate_list_works_without_a_scenario():
    r = runner.invoke(app, ["simulate", "--list"], env=ENV)
    assert r.exit_code == 0, r.output
    names = [line.split()[0] for line in r.output.splitlines()]
    assert names == sorted(SCENARIOS)
    assert "gradual-degradation          SPEC §5.1: over 13 min a free channel's P95 goes 180 -> 800 ms" in r.output


def test_simulate_without_scenario_or_list_is_a_clear_usage_error():
    r = runner.invoke(app, ["simulate"], env=ENV)
    assert r.exit_code == 2
    assert "give --scenario NAME" in r.output


def test_demo_help_lists_every_scenario_with_its_headline():
    r = runner.invoke(app, ["demo", "--help"], env=ENV)
    assert r.exit_code == 0
    for name in SCENARIOS:
        assert f"{name}:" in r.output
    assert "SPEC §5.2: the primary fails hard for 15 min" in r.output


@pytest.mark.parametrize("path", _command_paths(), ids=lambda p: " ".join(p) or "root")
def test_help_shows_no_bool_type_for_flags(path):
    r = runner.invoke(app, [*path, "--help"], env=ENV)
    assert r.exit_code == 0, r.output
    assert "--help" in r.output
    assert "<bool>" not in r.output


def test_query_usage_names_its_argument_in_capitals():
    r = runner.invoke(app, ["query", "--help"], env=ENV)
    assert "query [OPTIONS] SQL" in r.output and "{sql}" not in r.output


def test_scorecard_help_lists_its_scenarios_from_the_scorecard_tuples():
    """The default list, the by-name-only ones and the unsupported one come from
    ``pipeline.tools.scorecard.scenarios`` (the help said "every SPEC §5 scenario but quality-drift": stale
    once peer-creep ran by name only, and it never named route-wide)."""
    from pipeline.tools.scorecard.scenarios import DEFAULT_SCENARIOS, LONG_SCENARIOS, UNSUPPORTED

    r = runner.invoke(app, ["scorecard", "--help"], env={**ENV, "COLUMNS": "2000"})
    assert r.exit_code == 0, r.output
    text = " ".join(r.output.split())
    assert "by default " + ", ".join(DEFAULT_SCENARIOS) + "." in text
    assert "By name only (long replays): peer-creep." in text and LONG_SCENARIOS == ("peer-creep",)
    assert "Not supported: quality-drift (needs the quality scorer" in text and list(UNSUPPORTED) == ["quality-drift"]
    assert "route-wide" in DEFAULT_SCENARIOS and "peer-creep" not in DEFAULT_SCENARIOS


#: A bracketed part of a help text: ``[route_wide]``, ``[error_classes.<provider>]``, ``<UTC time>``.
_BRACKETED = re.compile(r"\[[^\[\]\n]*\]|<[^<>\n]*>")


def _plain(text: str) -> str:
    """``text`` as words: panel borders dropped, whitespace collapsed, markdown's code and emphasis marks
    (which the help renders away) removed."""
    return " ".join(re.sub(r"[│╭╮╰╯─]", " ", text).replace("`", "").replace("*", "").split())


@pytest.mark.parametrize("path", _command_paths(), ids=lambda p: " ".join(p) or "root")
def test_help_keeps_every_bracketed_part_of_its_source(path):
    """Every ``[...]`` and ``<...>`` of a command's docstring, epilog and option/argument help strings is in
    its rendered ``--help``: the help is rendered as markdown (rich), which drops a ``<...>`` as an HTML
    tag, and rich markup would eat a ``[...]`` as a style. An earlier review saw ``--policy`` render
    ``[error_classes.]`` for ``[error_classes.<provider>]``; demo's ``--data-dir`` said ``data/demo- per
    run`` for ``data/demo-<UTC time>`` (this test failed there)."""
    cmd = typer.main.get_command(app)
    for name in path:
        cmd = cmd.commands[name]  # type: ignore[attr-defined]
    r = runner.invoke(app, [*path, "--help"], env=ENV)
    assert r.exit_code == 0, r.output
    shown = _plain(r.output)
    sources = [cmd.help or "", cmd.epilog or "", *(getattr(p, "help", None) or "" for p in cmd.params)]
    lost = [part for text in sources for part in _BRACKETED.findall(text) if _plain(part) not in shown]
    assert lost == [], f"{' '.join(path) or 'root'} --help lost {lost}"
