"""``channel-health bench`` is wired into the CLI and rejects bad sizes before starting anything."""

from __future__ import annotations

from typer.testing import CliRunner

from pipeline.cli.main import app


def test_bench_help_lists_the_options():
    out = CliRunner().invoke(app, ["bench", "--help"])
    assert out.exit_code == 0
    for opt in ("--json", "--quick", "--events", "--channels", "--quality"):
        assert opt in out.output


def test_help_rewraps_the_docstring_paragraphs_to_the_terminal():
    # The docstring is hard-wrapped at ~110 columns: its line breaks must not survive into the help text
    # (they did with typer's "rich" markup: "(c) the" ended one line, "full pipeline" began the next).
    out = CliRunner().invoke(app, ["bench", "--help"], env={"COLUMNS": "200"})
    assert out.exit_code == 0
    assert "(c) the full pipeline (validate → detectors → verdicts → ClickHouse) as the faust worker" in out.output


def test_bench_rejects_inconsistent_sizes_without_starting_a_broker():
    out = CliRunner().invoke(app, ["bench", "--events", "1000", "--single-events", "5000"])
    assert out.exit_code == 2
    assert "single-events" in out.output
