"""The worker's scoring process (pipeline.quality.process): same scores as in-process, low priority, model rolls."""

from __future__ import annotations

import asyncio
import os

import numpy as np
import pytest

pytest.importorskip("sentence_transformers")

from pipeline.quality.artifact import current_version  # noqa: E402
from pipeline.quality.process import LoadCancelled, ProcessScorer, _init_child, _wait  # noqa: E402

pytestmark = pytest.mark.integration

PROMPTS = ["What is the capital of France?", "Write a haiku about rain.", None]
RESPONSES = ["The capital of France is Paris.", "I'm sorry, but I cannot help with that request.", ""]


def test_child_scores_equal_in_process_scores_and_a_roll_keeps_both_versions_until_closed():
    from pipeline.quality.embedding import shared_embedder
    from pipeline.quality.scorer import QualityScorer

    version = current_version()
    if version is None:
        pytest.skip("no promoted quality model under models/quality")
    expected = QualityScorer(embedder=shared_embedder()).score(PROMPTS, RESPONSES)
    child = ProcessScorer.start(threads=1, nice=5)
    try:
        assert child.version == version
        got = child.score(PROMPTS, RESPONSES)
        np.testing.assert_allclose(got, expected, atol=1e-5)
        assert got[2] == 0.0 and child.counters["empty"] == 1
        again = asyncio.run(child.score_async(PROMPTS[:2], RESPONSES[:2]))
        np.testing.assert_allclose(again, expected[:2], atol=1e-5)
        assert child.counters["cache_hit"] == 2           # the child's score cache answered the repeat
        rolled = child.reload(version)                   # a roll in the same process; the old one still scores
        np.testing.assert_allclose(rolled.score(PROMPTS[:1], RESPONSES[:1]), expected[:1], atol=1e-5)
        np.testing.assert_allclose(child.score(PROMPTS[:1], RESPONSES[:1]), expected[:1], atol=1e-5)
        child.close()                                    # drops the old version only
        np.testing.assert_allclose(rolled.score(PROMPTS[1:2], RESPONSES[1:2]), expected[1:2], atol=1e-5)
    finally:
        child.close()
        if "rolled" in locals():
            rolled.close()


def test_a_missing_model_version_fails_loudly_and_stops_the_child():
    with pytest.raises(Exception, match="v999"):
        ProcessScorer.start("v999", threads=1)


def test_a_cancelled_load_kills_the_scoring_process_and_leaves_no_child():
    """The worker stops during the first load (torch import and model: seconds): ``cancel`` set as soon as
    the scoring process exists ends the load with ``LoadCancelled`` and leaves no child process."""
    import threading

    import psutil

    me = psutil.Process()
    before = {p.pid for p in me.children(recursive=True)}
    cancel = threading.Event()

    def cancel_once_the_child_runs() -> None:
        while not {p.pid for p in me.children(recursive=True)} - before:
            cancel.wait(0.01)  # polls the process table; returns early only if the test already cancelled
        cancel.set()

    watcher = threading.Thread(target=cancel_once_the_child_runs, daemon=True)
    watcher.start()
    with pytest.raises(LoadCancelled, match="cancelled"):
        ProcessScorer.start(threads=1, cancel=cancel)
    watcher.join(30)
    left = [p for p in me.children(recursive=True) if p.pid not in before]
    _, alive = psutil.wait_procs(left, timeout=10)
    assert alive == []


def test_wait_kills_the_child_it_waits_for_once_cancelled():
    """``_wait`` with the child's pid known: SIGKILL to that child, then ``LoadCancelled``."""
    import subprocess
    import threading
    from concurrent.futures import Future

    child = subprocess.Popen(["sleep", "30"])
    cancel = threading.Event()
    cancel.set()
    try:
        with pytest.raises(LoadCancelled):
            _wait(Future(), cancel, child.pid)  # a future that never completes: only the cancel ends the wait
        assert child.wait(10) == -9
    finally:
        child.kill()
        child.wait()


def test_nice_out_of_range_is_refused():
    with pytest.raises(ValueError, match="nice must be in 0..19"):
        ProcessScorer.start(threads=1, nice=25)


def test_child_initialiser_sets_priority_and_thread_caps(monkeypatch):
    calls = []
    monkeypatch.setattr(os, "nice", calls.append)
    monkeypatch.setenv("OMP_NUM_THREADS", "8")
    _init_child(threads=1, nice=10, batch=16, models_dir=None)
    assert calls == [10] and os.environ["OMP_NUM_THREADS"] == "1" and os.environ["TOKENIZERS_PARALLELISM"] == "false"
