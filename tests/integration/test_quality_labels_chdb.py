"""``quality import-labels`` into chDB, then ``quality train --from-clickhouse``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("chdb", reason="chdb (embedded ClickHouse) not installed")
pytest.importorskip("sentence_transformers")
pytestmark = pytest.mark.integration


def _rows():
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit"))
    from test_quality_train import _rows as rows  # small synthetic labelled set

    return rows()


def test_import_labels_then_train_from_clickhouse(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from pipeline.config import load_settings
    from pipeline.tools.quality.cli import app, read_labels
    from pipeline.storage.client import close_clients, open_client

    close_clients()
    monkeypatch.setenv("CHANNEL_HEALTH_CLICKHOUSE_URL", f"chdb://{tmp_path / 'chdb'}")
    rows = _rows()
    path = tmp_path / "labels.jsonl"
    lines = [json.dumps(r) for r in rows]
    lines += [json.dumps({"response": "meh", "score": 5, "scale": "1-10"}), "{broken"]
    path.write_text("\n".join(lines) + "\n")
    runner = CliRunner()
    try:
        res = runner.invoke(app, ["import-labels", str(path), "--source", "unit-test"])
        assert res.exit_code == 0, res.output
        out = json.loads(res.stdout.strip().splitlines()[-1])
        assert out["imported"] == len(rows)
        assert out["skipped"] == {"ambiguous_score": 1, "bad_json": 1}
        # Re-importing replaces rows (same label_id), it does not duplicate them.
        assert runner.invoke(app, ["import-labels", str(path), "--source", "unit-test"]).exit_code == 0
        client = open_client(load_settings())
        loaded = read_labels(client)
        assert len(loaded.rows) == len(rows)
        assert {r.group for r in loaded.rows} == {r["model"] for r in rows}
        assert sorted(r.label for r in loaded.rows) == sorted(r["label"] for r in rows)

        models = tmp_path / "models"
        res = runner.invoke(
            app, ["train", "--from-clickhouse", "--models-dir", str(models), "--no-cache", "--test-fraction", "0.34"]
        )
        assert res.exit_code == 0, res.output
        out = json.loads(res.stdout.strip().splitlines()[-1])
        assert out["model_version"] == "v1" and out["promoted"] is True and out["roc_auc"] >= 0.8
        assert (models / "v1" / "MODEL_CARD.md").is_file()
    finally:
        close_clients()
