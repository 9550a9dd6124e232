"""The shipped model: loads (checksums, embedding match), meets its card, ranks answers sensibly;
the scorer survives hostile input and runs off the event loop."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from pipeline.quality.artifact import current_version, default_models_dir, load_model

pytest.importorskip("sentence_transformers")

PROMPT = "What are three practical ways to reduce my home's energy use in winter?"
GOOD = (
    "Here are three practical ways:\n\n"
    "1. Seal drafts: weather-strip doors and windows and caulk gaps; leaks can waste 10-20% of heating energy.\n"
    "2. Turn the thermostat down 1-2 °C and use a programmable schedule so you are not heating an empty house.\n"
    "3. Add insulation where it pays most, usually the attic, and close curtains at night to keep heat in.\n\n"
    "Together these cut heating bills noticeably without major renovation."
)
REFUSAL = "I'm sorry, but as an AI language model I cannot help with that request."


@pytest.fixture(scope="module")
def scorer():
    from pipeline.quality.embedding import shared_embedder
    from pipeline.quality.scorer import QualityScorer

    if current_version() is None:
        pytest.skip("no promoted quality model under models/quality")
    s = QualityScorer(embedder=shared_embedder())
    yield s
    s.close()


def test_shipped_model_meets_its_card():
    m = load_model(None)
    held = m.metadata["metrics"]["held_out"]
    base = m.metadata["metrics"]["baselines_held_out"]
    assert held["roc_auc"] >= 0.88
    assert held["roc_auc"] > base["plain-v1"]["roc_auc"] > base["length-v1"]["roc_auc"]
    split = m.metadata["training_data"]["split"]
    assert not set(split["test_groups"]) & set(m.metadata["training_data"]["train_groups"])
    card = (default_models_dir() / m.version / "MODEL_CARD.md").read_text()
    for needle in ("Intended use", "Limits", "plain-v1", "length-v1", str(held["roc_auc"])):
        assert needle in card


def test_good_answer_scores_above_refusal(scorer):
    s = scorer.score([PROMPT, PROMPT], [GOOD, REFUSAL])
    assert s.shape == (2,) and np.all((s >= 0) & (s <= 1))
    assert s[0] > s[1]
    assert s[0] > 0.5 > s[1]
    # Without a prompt the response-only head is used; the order holds.
    s2 = scorer.score(None, [GOOD, REFUSAL])
    assert s2[0] > s2[1]


def test_hostile_input_is_scored_with_counted_reasons(scorer):
    responses = ["", None, "word " * 200_000, b"caf\xe9 \xff answer", "broken \udcff byte answer",
                 "巴黎是法国的首都，也是该国最大的城市。", GOOD]
    prompts = [PROMPT, None, PROMPT, "q", "q\udcff", "法国的首都是哪里？", None]
    rep = scorer.score_detailed(prompts, responses)
    assert rep.scores.shape == (7,) and np.all((rep.scores >= 0) & (rep.scores <= 1))
    assert rep.scores[0] == 0.0 and rep.scores[1] == 0.0  # empty / not text
    c = rep.counts
    assert c["empty"] == 1 and c["not_text"] == 1 and c["truncated"] == 1
    assert c["invalid_utf8"] == 2 and c["non_latin"] == 1 and c["scored"] == 7
    assert rep.reasons[5] == ["non_latin"] and rep.model_version == scorer.version
    assert scorer.counters["scored"] >= 7


def test_score_async_runs_in_worker_thread(scorer):
    async def main():
        ticks = 0

        async def ticker():
            nonlocal ticks
            while True:
                ticks += 1
                await asyncio.sleep(0.001)

        t = asyncio.create_task(ticker())
        out = await scorer.score_async([PROMPT] * 16, [GOOD] * 8 + [REFUSAL] * 8)
        t.cancel()
        return out, ticks

    out, ticks = asyncio.run(main())
    assert out.shape == (16,) and out[:8].min() > out[8:].max()
    assert ticks > 1  # the loop kept running while encoding


def test_mismatched_embedder_is_refused(tmp_path):
    from pipeline.quality.artifact import ModelMismatchError
    from pipeline.quality.embedding import EmbeddingInfo

    m = load_model(None)
    with pytest.raises(ModelMismatchError):
        m.check_embedding(EmbeddingInfo("sentence-transformers/all-mpnet-base-v2", 768, "0" * 64, 384))
