"""Labels, group split, train -> evaluate -> promote on a small file, a worse model refused."""

from __future__ import annotations

import json

import pytest

from pipeline.quality.artifact import current_version, list_versions, load_model
from pipeline.tools.quality.train import (
    evaluate,
    group_folds,
    label_from_score,
    load_rows,
    parse_lines,
    split_by_group,
    train_and_maybe_promote,
)

pytest.importorskip("sentence_transformers")

QA = [
    ("What is the capital of France?", "The capital of France is Paris, on the Seine in the north of the country."),
    ("How do I reverse a list in Python?", "Use my_list.reverse() to reverse in place, or reversed(my_list) / my_list[::-1] for a reversed copy."),
    ("Why is the sky blue?", "Sunlight is scattered by air molecules; shorter blue wavelengths scatter far more (Rayleigh scattering), so the sky looks blue."),
    ("Give me a tip for better sleep.", "Keep a regular schedule: go to bed and wake up at the same time every day, and avoid screens for an hour before bed."),
    ("What does HTTP 404 mean?", "404 Not Found: the server was reached but has no resource at the requested URL."),
    ("Name three primary colours.", "In the traditional painting model the primary colours are red, yellow and blue."),
    ("How many days are in a leap year?", "A leap year has 366 days; February gets a 29th day."),
    ("What is photosynthesis?", "Photosynthesis is how plants turn light, water and carbon dioxide into glucose and oxygen, using chlorophyll."),
]
BAD = [
    "I'm sorry, but as an AI language model I cannot help with that request.",
    "asdf qwer zxcv asdf qwer zxcv asdf qwer zxcv",
    "I cannot answer that.",
    "The the the the the the the the the the the",
    "Buy cheap watches now!!! Click here for the best deals on watches",
    "",
]


def _rows(groups=("m1", "m2", "m3", "m4", "m5", "m6")):
    rows = []
    for gi, g in enumerate(groups):
        for qi, (q, a) in enumerate(QA):
            bad = (qi + gi) % 2 == 0
            resp = BAD[(qi + gi) % len(BAD)] if bad else a
            rows.append({"model": g, "prompt": q, "response": resp, "label": 0 if bad else 1})
    return rows


@pytest.fixture(scope="module")
def embedder():
    from pipeline.quality.embedding import shared_embedder

    return shared_embedder()


def test_label_parsing():
    assert label_from_score(7) == 1 and label_from_score("4") == 0 and label_from_score(6) is None
    assert label_from_score("x") is None and label_from_score(float("nan")) is None
    assert label_from_score(80, "0-100") == 1 and label_from_score(20, "0-100") == 0
    lines = [
        json.dumps({"response": "a", "label": 1}),
        json.dumps({"response": "b", "label": "bad", "model": "m"}),
        json.dumps({"response": "c", "score": 9, "scale": "1-10", "question_id": 81}),
        json.dumps({"response": "d", "score": 5.5, "scale": "1-10"}),
        json.dumps({"prompt": "p"}),
        json.dumps({"response": "e", "label": 7}),
        "not json",
        "",
    ]
    out = parse_lines(lines)
    assert [r.label for r in out.rows] == [1, 0, 1]
    assert out.rows[1].group == "m" and out.rows[2].item == "81"
    assert out.skipped == {"ambiguous_score": 1, "no_response": 1, "bad_label": 1, "bad_json": 1}


def test_group_split_is_deterministic_and_disjoint():
    rows = parse_lines([json.dumps(r) for r in _rows()]).rows
    a, b = split_by_group(rows, 0.34), split_by_group(rows, 0.34)
    assert a == b and 1 <= len(a.test_groups) < 6
    tr, te = a.partition(rows)
    groups = a.groups(rows)
    assert not {groups[i] for i in tr} & {groups[i] for i in te}
    assert len(tr) + len(te) == len(rows)
    folds = group_folds([groups[i] for i in tr], 3)
    for g in set(groups[i] for i in tr):
        assert len({f for f, gg in zip(folds, (groups[i] for i in tr)) if gg == g}) == 1


def test_train_evaluate_promote_and_refuse_worse(tmp_path, embedder):
    path = tmp_path / "labels.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in _rows()) + "\n")
    rows = load_rows(path).rows
    split = split_by_group(rows, 0.34)
    models = tmp_path / "models"
    kw = dict(embedder=embedder, models_dir=models, l2_grid=(0.1, 1.0), k_folds=2)

    first = train_and_maybe_promote(rows, split, **kw)
    assert first.promoted and first.version == "v1" and current_version(models) == "v1"
    assert first.new_roc_auc is not None and first.new_roc_auc >= 0.9
    card = (models / "v1" / "MODEL_CARD.md").read_text()
    assert "Intended use" in card and "Limits" in card and "plain-v1" in card

    m = load_model(None, models, embedding=embedder.info)
    ev = evaluate(m, rows, embedder)
    assert ev["model_version"] == "v1" and ev["n"] == len(rows) and ev["roc_auc"] >= 0.9

    # Flip the training labels only: same held-out rows, a clearly worse model.
    tr, _ = split.partition(rows)
    flipped = list(rows)
    for i in tr:
        flipped[i] = type(rows[i])(**{**rows[i].__dict__, "label": 1 - rows[i].label})
    worse = train_and_maybe_promote(flipped, split, **kw)
    assert worse.version == "v2" and not worse.promoted
    assert worse.new_roc_auc < worse.current_roc_auc and "not promoted" in worse.reason
    assert current_version(models) == "v1" and list_versions(models) == ["v1", "v2"]

    forced = train_and_maybe_promote(flipped, split, force=True, **kw)
    assert forced.promoted and current_version(models) == "v3"


def test_cli_evaluate_prints_json_last_line(tmp_path, embedder):
    from typer.testing import CliRunner

    from pipeline.tools.quality.cli import app

    path = tmp_path / "labels.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in _rows()) + "\n")
    rows = load_rows(path).rows
    models = tmp_path / "models"
    train_and_maybe_promote(
        rows, split_by_group(rows, 0.34), embedder=embedder, models_dir=models, l2_grid=(0.3,), k_folds=2
    )
    res = CliRunner().invoke(
        app, ["evaluate", "--labels", str(path), "--model", "v1", "--models-dir", str(models), "--no-cache"]
    )
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout.strip().splitlines()[-1])
    assert out["model_version"] == "v1" and out["n"] == len(rows) and 0.5 < out["roc_auc"] <= 1.0
