"""In-memory caches around the quality model: same text in, same number out.

The model is deterministic, so repeated inputs need no second encode:

- :class:`CachingEmbedder` wraps an :class:`~pipeline.quality.embedding.Embedder`
  and remembers embeddings by text hash (prompts repeat a lot: system
  prompts, templates, benchmark questions);
- :class:`CachedScorer` wraps a :class:`~pipeline.quality.scorer.QualityScorer`
  and remembers scores by hash of ``(model version, prompt, response)``
  (refusals and canned answers repeat).

Both are bounded LRU maps (``max_entries``) and thread-safe. The worker
uses them to save CPU; replays and tests use them so a fixed answer pool
is encoded once per process, however many events reuse it.
"""

from __future__ import annotations

import hashlib
import threading
from collections import Counter, OrderedDict
from typing import Any, Sequence

import numpy as np

from pipeline.quality.scorer import OffLoopScoring


def _key_part(x: Any) -> bytes:
    if x is None:
        return b"N"
    if isinstance(x, str):
        return b"S" + x.encode("utf-8", "surrogatepass")
    if isinstance(x, (bytes, bytearray, memoryview)):
        return b"B" + bytes(x)
    return b"O" + repr(type(x)).encode()


def pair_key(version: str, prompt: Any, response: Any) -> bytes:
    """Digest of ``(version, prompt, response)`` (any values; str with lone surrogates too)."""
    h = hashlib.blake2b(digest_size=16)
    for part in (version.encode(), _key_part(prompt), _key_part(response)):
        h.update(len(part).to_bytes(8, "little"))
        h.update(part)
    return h.digest()



def fill_from_cache(lru: Any, keys: Sequence[bytes], out: np.ndarray) -> dict[bytes, list[int]]:
    """Copy cached values of ``keys`` into ``out[i]``; return the misses.

    ``lru.get(key)`` returns a value or None. The result maps each missing key
    to the positions that need it, in first-seen order, so a duplicate text in
    one batch is computed once.
    """
    todo: dict[bytes, list[int]] = {}
    for i, k in enumerate(keys):
        v = lru.get(k)
        if v is None:
            todo.setdefault(k, []).append(i)
        else:
            out[i] = v
    return todo

class _LRU:
    def __init__(self, max_entries: int) -> None:
        if max_entries < 1:
            raise ValueError("max_entries must be >= 1")
        self.max_entries = max_entries
        self._d: OrderedDict[bytes, Any] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, k: bytes) -> Any:
        with self._lock:
            v = self._d.get(k)
            if v is not None:
                self._d.move_to_end(k)
            return v

    def put(self, k: bytes, v: Any) -> None:
        with self._lock:
            self._d[k] = v
            self._d.move_to_end(k)
            while len(self._d) > self.max_entries:
                self._d.popitem(last=False)

    def __len__(self) -> int:
        return len(self._d)


class CachingEmbedder:
    """An :class:`~pipeline.quality.embedding.Embedder` with an LRU of embeddings by text.

    Offers what :class:`~pipeline.quality.scorer.QualityScorer` uses
    (``info``, ``dim``, ``max_chars``, ``encode_clean``, ``counters``);
    ``hits`` / ``misses`` count texts.
    """

    def __init__(self, embedder: Any, max_entries: int = 20_000) -> None:
        self.embedder = embedder
        self._lru = _LRU(max_entries)
        self.hits = 0
        self.misses = 0

    def __getattr__(self, name: str) -> Any:  # info, dim, max_chars, counters, model, path ...
        return getattr(self.embedder, name)

    def encode_clean(self, texts: Sequence[str], batch_size: int = 32) -> np.ndarray:
        keys = [hashlib.blake2b(t.encode("utf-8", "surrogatepass"), digest_size=16).digest() for t in texts]
        out = np.zeros((len(texts), self.embedder.dim), dtype=np.float32)
        todo = fill_from_cache(self._lru, keys, out)
        self.hits += len(texts) - sum(len(v) for v in todo.values())
        if todo:
            first = [idx[0] for idx in todo.values()]
            vecs = self.embedder.encode_clean([texts[i] for i in first], batch_size)
            self.misses += len(first)
            for (k, idx), v in zip(todo.items(), vecs):
                self._lru.put(k, v.copy())
                out[idx] = v
        return out


class CachedScorer(OffLoopScoring):
    """A quality scorer with an LRU of scores by ``(model version, prompt, response)``.

    ``score`` / ``score_async`` / ``version`` / ``close`` like
    :class:`~pipeline.quality.scorer.QualityScorer`; only inputs not seen
    before reach the wrapped scorer (its reason counters then count only
    those). ``counters``: ``cache_hit`` / ``cache_miss`` per response.
    """

    def __init__(self, scorer: Any, max_entries: int = 50_000) -> None:
        self.scorer = scorer
        self._lru = _LRU(max_entries)
        self.counters: Counter[str] = Counter()

    @property
    def version(self) -> str:
        return self.scorer.version

    def score(self, prompts: Sequence[Any] | None, responses: Sequence[Any]) -> np.ndarray:
        n = len(responses)
        if prompts is None:
            prompts = [None] * n
        if len(prompts) != n:
            raise ValueError(f"{len(prompts)} prompts for {n} responses")
        version = self.version
        keys = [pair_key(version, p, r) for p, r in zip(prompts, responses)]
        out = np.empty(n, dtype=np.float64)
        todo = fill_from_cache(self._lru, keys, out)
        self.counters["cache_hit"] += n - sum(len(v) for v in todo.values())
        if todo:
            first = [idx[0] for idx in todo.values()]
            got = np.asarray(self.scorer.score([prompts[i] for i in first], [responses[i] for i in first]),
                             dtype=np.float64)
            self.counters["cache_miss"] += len(first)
            for (k, idx), v in zip(todo.items(), got.tolist()):
                self._lru.put(k, v)
                out[idx] = v
        return out

    def close(self) -> None:
        """Stop this wrapper's worker thread and close the wrapped scorer."""
        super().close()
        close = getattr(self.scorer, "close", None)
        if close is not None:
            close()
