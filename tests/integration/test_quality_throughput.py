"""Throughput of the scorer path vs bare ``SentenceTransformer.encode`` (printed, not asserted).

Run: ``pytest -s -m slow tests/integration/test_quality_throughput.py``.
Uses 512 real MT-bench answers when ``../shared/data`` is present, else synthetic text.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("sentence_transformers")
pytestmark = pytest.mark.slow

DATA = Path(__file__).resolve().parents[3] / "shared" / "data" / "llm-answers-judged" / "mt_bench_judged.jsonl"
N = 512


def _texts() -> tuple[list[str], list[str], str]:
    if DATA.is_file():
        rows = [json.loads(line) for line in DATA.open()][:N]
        return [r["prompt"] for r in rows], [r["response"] for r in rows], "MT-bench answers"
    rng = np.random.default_rng(0)
    words = "the a channel model answer latency quota error request token stream user data".split()
    resp = [" ".join(rng.choice(words, size=int(rng.integers(20, 200)))) for _ in range(N)]
    return ["Explain the result."] * N, resp, "synthetic text"


def test_throughput_scorer_vs_bare_encode():
    import torch

    from pipeline.quality.artifact import current_version
    from pipeline.quality.embedding import shared_embedder
    from pipeline.quality.scorer import QualityScorer

    if current_version() is None:
        pytest.skip("no promoted quality model")
    prompts, responses, what = _texts()
    emb = shared_embedder()
    scorer = QualityScorer(embedder=emb, batch_size=32)
    bare = emb.model  # the same SentenceTransformer, same torch thread cap
    bare.encode(responses[:16], batch_size=32)  # warm up
    scorer.score(prompts[:16], responses[:16])

    def rate(fn) -> float:
        t = time.perf_counter()
        fn()
        return N / (time.perf_counter() - t)

    r_bare = rate(lambda: bare.encode(responses, batch_size=32, convert_to_numpy=True))
    r_emb = rate(lambda: emb.encode(responses, batch_size=32))
    r_nop = rate(lambda: scorer.score(None, responses))
    r_full = rate(lambda: scorer.score(prompts, responses))
    print(
        f"\nquality throughput on {N} {what}, torch threads={torch.get_num_threads()}:\n"
        f"  bare SentenceTransformer.encode   {r_bare:7.1f} texts/s\n"
        f"  Embedder.encode (clean + encode)  {r_emb:7.1f} texts/s\n"
        f"  QualityScorer.score, no prompts   {r_nop:7.1f} texts/s (response + tail embeddings + head)\n"
        f"  QualityScorer.score, with prompts {r_full:7.1f} texts/s (+ prompt embeddings)"
    )
