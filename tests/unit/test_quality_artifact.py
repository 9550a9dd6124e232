"""Versioned artifacts: round trip, CURRENT, checksum and embedding-mismatch errors."""

from __future__ import annotations

import json

import numpy as np
import pytest

from pipeline.quality.artifact import (
    ArtifactError,
    ChecksumError,
    ModelMismatchError,
    ModelNotFoundError,
    QualityModel,
    current_version,
    list_versions,
    load_model,
    next_version,
    promote,
    save_model,
)
from pipeline.quality.embedding import EmbeddingInfo
from pipeline.quality.features import STAT_NAMES, FeatureInputs, get_recipe
from pipeline.quality.head import LogisticHead

INFO = EmbeddingInfo(name="test/fake-embed", dim=8, fingerprint="ab" * 32, max_seq_length=128)


def _head(n: int, seed: int) -> LogisticHead:
    rng = np.random.default_rng(seed)
    return LogisticHead(rng.normal(size=n), 0.1, np.zeros(n), np.ones(n), l2=0.1)


def _inputs(n: int = 5, d: int = 8) -> FeatureInputs:
    rng = np.random.default_rng(0)
    return FeatureInputs(
        resp=rng.normal(size=(n, d)).astype(np.float32),
        tail=rng.normal(size=(n, d)).astype(np.float32),
        prompt=rng.normal(size=(n, d)).astype(np.float32),
        has_prompt=np.array([True, False, True, False, True][:n]),
        stats=rng.normal(size=(n, len(STAT_NAMES))),
    )


def _model(version: str = "v1") -> QualityModel:
    f = _inputs()
    n_with = get_recipe("plain-v1")(f).shape[1]
    n_without = get_recipe("plain-v1-noprompt")(f).shape[1]
    return QualityModel(
        version=version,
        recipe=get_recipe("plain-v1"),
        heads={"with_prompt": _head(n_with, 1), "no_prompt": _head(n_without, 2)},
        embedding=INFO,
        metadata={"recipe": {"name": "plain-v1", "noprompt": "plain-v1-noprompt"}, "metrics": {"held_out": {"roc_auc": 0.9}}},
    )


def test_round_trip_and_current(tmp_path):
    m = _model()
    d = save_model(m, tmp_path, card="# card\n")
    assert {p.name for p in d.iterdir()} == {"head.npz", "metadata.json", "MODEL_CARD.md"}
    meta = json.loads((d / "metadata.json").read_text())
    assert meta["embedding"]["name"] == INFO.name and meta["embedding"]["dim"] == 8
    assert len(meta["checksum"]["head.npz"]) == 64
    assert current_version(tmp_path) is None
    with pytest.raises(ModelNotFoundError):
        load_model(None, tmp_path)
    promote("v1", tmp_path)
    assert current_version(tmp_path) == "v1"
    loaded = load_model(None, tmp_path, embedding=INFO)
    f = _inputs()
    np.testing.assert_allclose(loaded.predict(f), m.predict(f))
    p = loaded.predict(f)
    assert np.all((p >= 0) & (p <= 1))
    assert next_version(tmp_path) == "v2" and list_versions(tmp_path) == ["v1"]
    with pytest.raises(ArtifactError, match="already exists"):
        save_model(_model("v1"), tmp_path)  # versions are immutable
    with pytest.raises(ModelNotFoundError):
        promote("v9", tmp_path)


def test_tampered_weights_raise_checksum_error(tmp_path):
    d = save_model(_model(), tmp_path)
    data = bytearray((d / "head.npz").read_bytes())
    data[-40] ^= 0xFF
    (d / "head.npz").write_bytes(bytes(data))
    with pytest.raises(ChecksumError, match="sha256"):
        load_model("v1", tmp_path)


def test_edited_metadata_raises_checksum_error(tmp_path):
    d = save_model(_model(), tmp_path)
    meta = json.loads((d / "metadata.json").read_text())
    meta["embedding"]["name"] = "something/else"
    (d / "metadata.json").write_text(json.dumps(meta))
    with pytest.raises(ChecksumError, match="metadata"):
        load_model("v1", tmp_path)


@pytest.mark.parametrize(
    "other, what",
    [
        (EmbeddingInfo("other/model", 8, INFO.fingerprint, 128), "name"),
        (EmbeddingInfo(INFO.name, 16, INFO.fingerprint, 128), "dimension"),
        (EmbeddingInfo(INFO.name, 8, "cd" * 32, 128), "fingerprint"),
    ],
)
def test_embedding_mismatch_is_a_clear_error(tmp_path, other, what):
    save_model(_model(), tmp_path)
    with pytest.raises(ModelMismatchError, match=what) as exc:
        load_model("v1", tmp_path, embedding=other)
    assert "test/fake-embed" in str(exc.value) and "retrain" in str(exc.value)


def test_bad_version_names_are_rejected(tmp_path):
    with pytest.raises(ValueError):
        load_model("../etc", tmp_path)
    with pytest.raises(ModelNotFoundError):
        load_model("v3", tmp_path)


def test_changed_feature_constants_are_a_mismatch(tmp_path):
    from pipeline.quality import artifact

    m = _model()
    m.metadata["recipe"]["params"] = {"max_chars": 1}
    d = save_model(m, tmp_path)
    with pytest.raises(ModelMismatchError, match="feature constants"):
        load_model("v1", tmp_path)
    meta = json.loads((d / "metadata.json").read_text())
    meta["recipe"]["name"] = "no-such-recipe"
    meta["metadata_sha256"] = artifact._metadata_digest(meta)
    (d / "metadata.json").write_text(json.dumps(meta))
    with pytest.raises(ModelMismatchError, match="no-such-recipe"):
        load_model("v1", tmp_path)
