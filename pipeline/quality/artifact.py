"""Versioned quality-model artifacts under ``models/quality/<version>/``.

Each version directory holds

- ``head.npz``       the head weights (``with_prompt__*`` and ``no_prompt__*``)
- ``metadata.json``  embedding model (name, dim, fingerprint), feature recipe,
                     training-data summary, metrics, and checksums: sha256 of
                     ``head.npz`` and of the metadata itself
- ``MODEL_CARD.md``  data, held-out metrics, intended use, limits

``models/quality/CURRENT`` names the promoted version. :func:`load_model`
verifies both checksums (:class:`ChecksumError`) and, given the embedder's
:class:`~pipeline.quality.embedding.EmbeddingInfo`, that the artifact was
trained on the same embedding model (:class:`ModelMismatchError`).
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.quality.embedding import EmbeddingInfo
from pipeline.quality.features import FeatureInputs, Recipe, get_recipe, recipe_params
from pipeline.quality.head import LogisticHead

FORMAT = "channel-health-quality/1"
HEAD_FILE = "head.npz"
META_FILE = "metadata.json"
CARD_FILE = "MODEL_CARD.md"
CURRENT_FILE = "CURRENT"
HEAD_NAMES = ("with_prompt", "no_prompt")

_VERSION_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


class ArtifactError(RuntimeError):
    """Base class of artifact problems."""


class ModelNotFoundError(ArtifactError):
    """No such version, or no promoted version."""


class ChecksumError(ArtifactError):
    """Weights or metadata do not match the recorded sha256."""


class ModelMismatchError(ArtifactError):
    """The artifact was trained on a different embedding model than the one loaded."""


def default_models_dir() -> Path:
    """``<repo>/models/quality`` (the repo holding this package), else ``./models/quality``."""
    repo = Path(__file__).resolve().parents[2]
    if (repo / "models").is_dir():
        return repo / "models" / "quality"
    return Path.cwd() / "models" / "quality"


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _metadata_digest(meta: dict[str, Any]) -> str:
    body = {k: v for k, v in meta.items() if k != "metadata_sha256"}
    return sha256_bytes(json.dumps(body, sort_keys=True, separators=(",", ":")).encode())


@dataclass
class QualityModel:
    """A loaded (or freshly trained) quality model: recipe + heads + metadata."""

    version: str
    recipe: Recipe
    heads: dict[str, LogisticHead]
    embedding: EmbeddingInfo
    metadata: dict[str, Any] = field(default_factory=dict)

    @property
    def noprompt_recipe(self) -> Recipe:
        return get_recipe(self.metadata["recipe"]["noprompt"])

    def predict(self, inputs: FeatureInputs) -> np.ndarray:
        """P(good) per row: the with-prompt head where a prompt exists, else the
        response-only head."""
        n = len(inputs)
        out = np.empty(n, dtype=np.float64)
        hp = inputs.has_prompt
        if hp.any():
            idx = np.flatnonzero(hp)
            out[idx] = self.heads["with_prompt"].predict_proba(self.recipe(inputs.subset(idx)))
        if (~hp).any():
            idx = np.flatnonzero(~hp)
            out[idx] = self.heads["no_prompt"].predict_proba(
                self.noprompt_recipe(inputs.subset(idx))
            )
        return out

    def check_embedding(self, info: EmbeddingInfo) -> None:
        """Raise :class:`ModelMismatchError` unless ``info`` is the training-time model."""
        want = self.embedding
        problems = []
        if info.name != want.name:
            problems.append(f"name {info.name!r} != {want.name!r}")
        if info.dim != want.dim:
            problems.append(f"dimension {info.dim} != {want.dim}")
        if info.fingerprint != want.fingerprint:
            problems.append(
                f"fingerprint {info.fingerprint[:12]}... != {want.fingerprint[:12]}..."
            )
        if problems:
            raise ModelMismatchError(
                f"quality model {self.version} was trained on embedding model "
                f"{want.name!r} ({want.dim}-d) but the loaded embedder differs: "
                + "; ".join(problems)
                + ". Load the matching embedding model or retrain the head."
            )


def validate_version(version: str) -> str:
    if not _VERSION_RE.match(version):
        raise ValueError(f"bad model version {version!r} (letters, digits, '.', '_', '-')")
    return version


def list_versions(models_dir: Path | None = None) -> list[str]:
    """Version directories that hold a metadata file, oldest first by number."""
    root = Path(models_dir or default_models_dir())
    if not root.is_dir():
        return []
    found = [p.name for p in root.iterdir() if (p / META_FILE).is_file()]

    def key(v: str) -> tuple[int, str]:
        m = re.match(r"^v(\d+)$", v)
        return (int(m.group(1)) if m else -1, v)

    return sorted(found, key=key)


def next_version(models_dir: Path | None = None) -> str:
    nums = [int(v[1:]) for v in list_versions(models_dir) if re.match(r"^v\d+$", v)]
    return f"v{max(nums, default=0) + 1}"


def current_version(models_dir: Path | None = None) -> str | None:
    f = Path(models_dir or default_models_dir()) / CURRENT_FILE
    if not f.is_file():
        return None
    v = f.read_text().strip()
    return v or None


def promote(version: str, models_dir: Path | None = None) -> None:
    """Point ``CURRENT`` at ``version`` (atomic rename)."""
    root = Path(models_dir or default_models_dir())
    validate_version(version)
    if not (root / version / META_FILE).is_file():
        raise ModelNotFoundError(f"no quality model {version!r} under {root}")
    tmp = root / f".{CURRENT_FILE}.tmp"
    tmp.write_text(version + "\n")
    os.replace(tmp, root / CURRENT_FILE)


def save_model(
    model: QualityModel,
    models_dir: Path | None = None,
    card: str | None = None,
) -> Path:
    """Write ``head.npz``, ``metadata.json`` (+ card) for ``model.version``; returns the dir.

    Refuses to overwrite an existing version.
    """
    root = Path(models_dir or default_models_dir())
    validate_version(model.version)
    out = root / model.version
    if (out / META_FILE).exists():
        raise ArtifactError(f"quality model {model.version} already exists under {root}")
    out.mkdir(parents=True, exist_ok=True)
    arrays: dict[str, np.ndarray] = {}
    for name in HEAD_NAMES:
        arrays.update(model.heads[name].to_arrays(prefix=f"{name}__"))
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    data = buf.getvalue()
    (out / HEAD_FILE).write_bytes(data)
    meta = dict(model.metadata)
    meta.update(
        {
            "format": FORMAT,
            "version": model.version,
            "embedding": model.embedding.to_json(),
            "head": {
                "file": HEAD_FILE,
                "heads": list(HEAD_NAMES),
                "n_features": {n: model.heads[n].n_features for n in HEAD_NAMES},
                "l2": {n: model.heads[n].l2 for n in HEAD_NAMES},
            },
            "checksum": {"algorithm": "sha256", HEAD_FILE: sha256_bytes(data)},
        }
    )
    meta["metadata_sha256"] = _metadata_digest(meta)
    (out / META_FILE).write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")
    if card is not None:
        (out / CARD_FILE).write_text(card)
    model.metadata = meta
    return out


def load_model(
    version: str | None = None,
    models_dir: Path | None = None,
    embedding: EmbeddingInfo | None = None,
) -> QualityModel:
    """Load ``version`` (default: the one named in ``CURRENT``), verifying checksums.

    If ``embedding`` is given, also verify the artifact matches it.
    """
    root = Path(models_dir or default_models_dir())
    if version is None:
        version = current_version(root)
        if version is None:
            raise ModelNotFoundError(f"no promoted quality model ({root / CURRENT_FILE} missing)")
    validate_version(version)
    d = root / version
    if not (d / META_FILE).is_file() or not (d / HEAD_FILE).is_file():
        raise ModelNotFoundError(f"no quality model {version!r} under {root}")
    try:
        meta = json.loads((d / META_FILE).read_text())
    except json.JSONDecodeError as exc:
        raise ChecksumError(f"{d / META_FILE} is not valid JSON: {exc}") from exc
    if meta.get("metadata_sha256") != _metadata_digest(meta):
        raise ChecksumError(f"{d / META_FILE}: metadata checksum mismatch (edited or corrupt)")
    if meta.get("format") != FORMAT:
        raise ArtifactError(f"{d}: unsupported artifact format {meta.get('format')!r}")
    data = (d / HEAD_FILE).read_bytes()
    want = meta.get("checksum", {}).get(HEAD_FILE)
    got = sha256_bytes(data)
    if got != want:
        raise ChecksumError(
            f"{d / HEAD_FILE}: sha256 {got[:16]}... does not match metadata {str(want)[:16]}..."
        )
    with np.load(io.BytesIO(data), allow_pickle=False) as z:
        heads = {n: LogisticHead.from_arrays(z, prefix=f"{n}__") for n in HEAD_NAMES}
    try:
        recipe = get_recipe(meta["recipe"]["name"])
        get_recipe(meta["recipe"]["noprompt"])
    except KeyError as exc:
        raise ModelMismatchError(
            f"quality model {version} needs feature recipe {meta['recipe']}, which this code "
            f"does not have: {exc.args[0]}"
        ) from None
    want_params = meta["recipe"].get("params")
    if want_params is not None and want_params != recipe_params():
        diff = sorted(k for k in set(want_params) | set(recipe_params())
                      if want_params.get(k) != recipe_params().get(k))
        raise ModelMismatchError(
            f"quality model {version} was built with different feature constants ({', '.join(diff)}); "
            "retrain it with this code or use the code version that built it"
        )
    model = QualityModel(
        version=version,
        recipe=recipe,
        heads=heads,
        embedding=EmbeddingInfo.from_json(meta["embedding"]),
        metadata=meta,
    )
    if embedding is not None:
        model.check_embedding(embedding)
    return model
