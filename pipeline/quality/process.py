"""Quality scoring in a child process at low CPU priority (the worker's scorer).

Why a process: encoding is CPU-bound. On a thread of the worker it competes
with the stream for the cores *and* for the GIL (tokenising and the Python
around each torch call hold it), which cost the stream 58 % of its
throughput on 2 cores. In a child process with its own interpreter, capped
torch threads (default 1) and a raised nice value (default 10; Linux CFS
gives a nice-10 task about 1/10 of a nice-0 task's share), the stream keeps
its core and scoring takes what is idle. Measured by ``channel-health bench
--quality`` (docs/THROUGHPUT.md). Under full load the scorer falls behind:
samples queue, then are dropped and counted (never the stream's events).

:class:`ProcessScorer` offers what the quality agent uses (``version``,
``score_async``, ``close``, ``counters``). The child keeps one
:class:`~pipeline.quality.cache.CachedScorer` per loaded version; a model
roll loads the new head in the same child (the embedding model stays).
The child exits with the parent, however the parent ends
(:func:`~pipeline.parent_death.watch_parent`: the pool's call queue does not
close when the parent dies, since the child holds both of its ends).
"""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import signal
import threading
from collections import Counter
from concurrent.futures import Future, ProcessPoolExecutor
from pathlib import Path
from typing import Any, Sequence

import numpy as np

#: Default nice increment of the scoring process (0 = same priority as the stream, 19 = lowest).
DEFAULT_NICE = 10

# -- the child's side -----------------------------------------------------------------------------

_scorers: dict[int, Any] = {}  # load handle -> CachedScorer
_settings: dict[str, Any] = {}


def _init_child(threads: int, nice: int, batch: int, models_dir: str | None, parent_pid: int | None = None) -> None:
    """Process initialiser: exit with ``parent_pid`` (None: not watched), priority and thread caps before torch
    is imported."""
    if parent_pid is not None:
        from pipeline.parent_death import watch_parent

        watch_parent(parent_pid, name="quality scorer")
    if nice:
        os.nice(nice)
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "TOKENIZERS_PARALLELISM"):
        os.environ[var] = "false" if var == "TOKENIZERS_PARALLELISM" else str(threads)
    _settings.update(threads=threads, batch=batch, models_dir=models_dir)


def _load(version: str | None) -> tuple[int, str]:
    """Load ``version`` (None: the promoted one) next to the loaded ones; returns ``(handle, version)``."""
    from pipeline.quality.cache import CachedScorer, CachingEmbedder
    from pipeline.quality.embedding import Embedder
    from pipeline.quality.scorer import QualityScorer

    embedder = next(iter(_scorers.values())).scorer.embedder if _scorers else \
        CachingEmbedder(Embedder(num_threads=_settings["threads"]))
    models_dir = Path(_settings["models_dir"]) if _settings.get("models_dir") else None
    scorer = CachedScorer(QualityScorer(version, embedder=embedder, models_dir=models_dir,
                                        batch_size=_settings["batch"]))
    handle = max(_scorers, default=0) + 1
    _scorers[handle] = scorer
    return handle, scorer.version


def _drop(handle: int) -> None:
    _scorers.pop(handle, None)


def _score(handle: int, prompts: Sequence[Any] | None, responses: Sequence[Any]) -> tuple[np.ndarray, dict]:
    """Scores of the scorer loaded as ``handle`` and its counters (reasons + cache hits), as totals."""
    scorer = _scorers.get(handle)
    if scorer is None:
        raise RuntimeError(f"quality model handle {handle} is not loaded in the scoring process")
    scores = scorer.score(prompts, responses)
    return scores, {**scorer.scorer.counters, **scorer.counters}


# -- the worker's side ----------------------------------------------------------------------------

#: How often a load waiting for the scoring process looks at its ``cancel`` event (s).
CANCEL_POLL_S = 0.1


class LoadCancelled(RuntimeError):
    """:meth:`ProcessScorer.start` gave up the load because its ``cancel`` event was set."""


def _wait(future: Future, cancel: threading.Event | None, child_pid: int | None) -> Any:
    """``future.result()``, polled every ``CANCEL_POLL_S`` for ``cancel``; once it is set, SIGKILL the
    scoring process ``child_pid`` (our own child, not yet reaped: its pid cannot have been reused) when
    known, and raise :class:`LoadCancelled`."""
    while True:
        if cancel is not None and cancel.is_set():
            if child_pid is not None:
                try:
                    os.kill(child_pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            raise LoadCancelled("the quality model load was cancelled (the worker is stopping)")
        try:
            return future.result(timeout=CANCEL_POLL_S if cancel is not None else None)
        except TimeoutError:
            continue


class ProcessScorer:
    """A quality model served by a child process; see the module doc.

    Create with :meth:`start` (blocks until the model is loaded: seconds);
    roll with :meth:`reload`. ``counters``: the child's reason and cache
    counters for this version, updated after each call.
    """

    def __init__(self, pool: ProcessPoolExecutor, handle: int, version: str) -> None:
        self._pool = pool
        self._handle = handle
        self.version = version
        self.counters: Counter[str] = Counter()
        self._owns_pool = True

    @classmethod
    def start(cls, version: str | None = None, *, threads: int = 1, nice: int = DEFAULT_NICE, batch: int = 32,
              models_dir: str | Path | None = None, cancel: threading.Event | None = None) -> "ProcessScorer":
        """Start the scoring process and load ``version`` (None: promoted).

        ``cancel``: set from another thread to give up the load (the worker is stopping): the scoring
        process is killed within ``CANCEL_POLL_S`` and :class:`LoadCancelled` raised. Without it a stopping
        worker would wait at exit for the load to finish (the pool's threads are joined at interpreter exit).
        Raises what loading raises (e.g. ``ModelMismatchError``, ``FileNotFoundError``), after stopping the
        process.
        """
        if not 0 <= int(nice) <= 19:
            raise ValueError(f"nice must be in 0..19, got {nice!r}")
        pool = ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn"),
                                   initializer=_init_child,
                                   initargs=(int(threads), int(nice), int(batch),
                                             None if models_dir is None else str(models_dir), os.getpid()))
        try:
            child_pid = _wait(pool.submit(os.getpid), cancel, None)
            handle, loaded = _wait(pool.submit(_load, version), cancel, child_pid)
        except BaseException:
            pool.shutdown(wait=False, cancel_futures=True)
            raise
        return cls(pool, handle, loaded)

    def reload(self, version: str) -> "ProcessScorer":
        """Load ``version`` in the same process; returns its scorer (this one stays usable until closed)."""
        handle, loaded = self._pool.submit(_load, version).result()
        new = ProcessScorer(self._pool, handle, loaded)
        self._owns_pool = False
        return new

    def score(self, prompts: Sequence[Any] | None, responses: Sequence[Any]) -> np.ndarray:
        """P(good answer) per response (blocking; see :meth:`QualityScorer.score`)."""
        scores, counts = self._pool.submit(_score, self._handle, prompts, responses).result()
        self.counters = Counter(counts)
        return scores

    async def score_async(self, prompts: Sequence[Any] | None, responses: Sequence[Any]) -> np.ndarray:
        """:meth:`score` without blocking the event loop."""
        fut = self._pool.submit(_score, self._handle, prompts, responses)
        scores, counts = await asyncio.wrap_future(fut)
        self.counters = Counter(counts)
        return scores

    def close(self) -> None:
        """Forget this version in the child; stop the child if no newer version uses it."""
        if self._owns_pool:
            self._pool.shutdown(wait=False, cancel_futures=True)
        else:
            try:
                self._pool.submit(_drop, self._handle)
            except RuntimeError:  # the pool is already shut down
                pass
