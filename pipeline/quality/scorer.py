"""Batched quality scoring, safe to run beside an asyncio event loop.

``QualityScorer.score`` is CPU-bound (tokenising + a small transformer): call
it from a worker thread, e.g. ``await scorer.score_async(prompts, responses)``,
which uses a dedicated single-thread executor so encodes are serialised and
the event loop never blocks. torch threads are capped when the embedder is
created (default 2).

Bad input never raises: every response gets a score in [0, 1]. Empty or
non-text responses score 0.0 (an empty ``ok`` answer is useless); other
problems (invalid UTF-8, control characters, 1 MB bodies, non-Latin script)
are repaired or truncated and scored. Reasons are counted in
:attr:`QualityScorer.counters` and returned per call by :meth:`score_detailed`.
"""

from __future__ import annotations

import asyncio
import threading
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from pipeline.quality.artifact import QualityModel, load_model
from pipeline.quality.embedding import DEFAULT_THREADS, Embedder, clean_text
from pipeline.quality.features import build_inputs

EMPTY_SCORE = 0.0


@dataclass
class ScoreReport:
    scores: np.ndarray
    reasons: list[list[str]]
    counts: Counter
    model_version: str


class OffLoopScoring:
    """``score_async`` and ``close`` for a class with a blocking ``score(prompts, responses)``.

    Calls run on a single worker thread of the instance's own, so they are
    serialised and the event loop never blocks.
    """

    _executor: ThreadPoolExecutor | None = None
    score: Any  # the subclass's blocking ``score(prompts, responses) -> np.ndarray``

    async def score_async(self, prompts: Sequence[Any] | None, responses: Sequence[Any]) -> np.ndarray:
        """:meth:`score` on the instance's own worker thread (never on the event loop)."""
        if self._executor is None:
            self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="quality")
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, self.score, prompts, responses)

    def close(self) -> None:
        """Stop the worker thread (queued calls are cancelled)."""
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)
            self._executor = None


class QualityScorer(OffLoopScoring):
    """P(good answer) for (prompt, response) pairs with a versioned quality model.

    ``model``: a :class:`QualityModel`, a version string, or ``None`` for the
    promoted version. ``embedder`` / ``embedding_model_path``: the embedding
    model (default: the bundled all-MiniLM-L6-v2); the artifact is checked
    against it and a mismatch raises
    :class:`~pipeline.quality.artifact.ModelMismatchError`.
    """

    def __init__(
        self,
        model: QualityModel | str | None = None,
        *,
        embedder: Embedder | None = None,
        embedding_model_path: str | Path | None = None,
        models_dir: Path | None = None,
        batch_size: int = 32,
        num_threads: int = DEFAULT_THREADS,
    ) -> None:
        self.embedder = embedder or Embedder(embedding_model_path, num_threads=num_threads)
        if isinstance(model, QualityModel):
            model.check_embedding(self.embedder.info)
            self.model = model
        else:
            self.model = load_model(model, models_dir, embedding=self.embedder.info)
        self.batch_size = batch_size
        self.counters: Counter[str] = Counter()
        self._lock = threading.Lock()

    @property
    def version(self) -> str:
        return self.model.version

    def score_detailed(
        self, prompts: Sequence[Any] | None, responses: Sequence[Any]
    ) -> ScoreReport:
        n = len(responses)
        if prompts is not None and len(prompts) != n:
            raise ValueError(f"{len(prompts)} prompts for {n} responses")
        reasons: list[list[str]] = []
        for r in responses:
            _, why = clean_text(r, self.embedder.max_chars)
            reasons.append(why)
        counts: Counter[str] = Counter()
        for why in reasons:
            counts.update(why)
        scores = np.full(n, EMPTY_SCORE, dtype=np.float64)
        live = [i for i, why in enumerate(reasons) if "empty" not in why and "not_text" not in why]
        if live:
            emb = self.embedder
            inputs = build_inputs(
                None if prompts is None else [prompts[i] for i in live],
                [responses[i] for i in live],
                lambda texts: emb.encode_clean(texts, self.batch_size),
                lambda t: clean_text(t, emb.max_chars)[0],
                emb.dim,
                need_tail=self.model.recipe.uses_tail,
            )
            p = self.model.predict(inputs)
            scores[live] = np.clip(np.nan_to_num(p, nan=0.5), 0.0, 1.0)
            counts["no_prompt"] += int((~inputs.has_prompt).sum())
        counts["scored"] += n
        with self._lock:
            self.counters.update(counts)
        return ScoreReport(scores, reasons, counts, self.model.version)

    def score(self, prompts: Sequence[Any] | None, responses: Sequence[Any]) -> np.ndarray:
        """P(good answer) in [0, 1], one per response (``prompts`` may be ``None``
        or hold ``None`` entries)."""
        return self.score_detailed(prompts, responses).scores

