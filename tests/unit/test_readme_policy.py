"""README.md's "Detection policy" table is the one generated from the signal registry."""

from pathlib import Path

from pipeline.signals import SIGNALS
from pipeline.signals.registry import policy_table

README = Path(__file__).parents[2] / "README.md"


def test_readme_policy_table_matches_the_registry():
    text = README.read_text()
    table = policy_table()
    assert table in text, "README's policy table is stale: paste `python -m pipeline.signals`"
    assert text.count("| signal | rule | default |") == 1
    for s in SIGNALS:
        assert f"| `{s.name}` ({s.kind}) |" in table
