"""Bad input through the sampler and the real scorer (SPEC §4.5): empty text, a 1 MB text,
invalid UTF-8 (lone surrogates, undecodable bytes) and Chinese text are scored or skipped with a
counted reason, never a crash, and what is published or stored is valid UTF-8."""

from __future__ import annotations

import msgspec
import numpy as np
import pytest

from pipeline.contracts import RequestEvent
from pipeline.engine import Engine
from pipeline.quality.sampler import QualitySampler, SamplerConfig
from pipeline.sinks.rows import quality_row

pytest.importorskip("sentence_transformers")

T0 = 1_780_002_000_000
PROMPT = "Explain how a binary search works."
CASES = {
    "empty": "",
    "blank": "   \n\t ",
    "one_mb": "Binary search halves the interval each step. " * 23_000,  # ~1 MB
    "surrogates": "Binary search \ud800 compares the middle \udfff element.",
    "chinese": "二分查找每一步都将搜索区间减半：比较中间元素，然后只在可能包含目标的一半中继续查找。",
    "control": "Binary\x00 search\x07 halves\x1b the range.",
}


@pytest.fixture(scope="module")
def scorer():
    from pipeline.quality.artifact import current_version
    from pipeline.quality.embedding import shared_embedder
    from pipeline.quality.scorer import QualityScorer

    if current_version() is None:
        pytest.skip("no promoted quality model under models/quality")
    s = QualityScorer(embedder=shared_embedder())
    yield s
    s.close()


def events():
    out = [msgspec.convert({"event_id": f"e-{k}", "ts_ms": T0 + i * 1_000, "channel": f"ch-{k}", "route": "r",
                            "status": "ok", "latency_ms": 5.0, "response_text": text, "prompt_text": PROMPT},
                           RequestEvent) for i, (k, text) in enumerate(CASES.items())]
    # a non-string text cannot come through the decoder; a replay of raw dicts could carry one
    odd = msgspec.convert({"event_id": "e-odd", "ts_ms": T0, "channel": "ch-odd", "route": "r", "status": "ok",
                           "latency_ms": 5.0}, RequestEvent)
    odd.response_text = b"caf\xe9 \xff bytes"  # type: ignore[assignment]
    return out + [odd]


def test_bad_input_is_scored_or_skipped_with_counted_reasons(scorer):
    sampler = QualitySampler(SamplerConfig(interval_ms=1))
    evs = events()
    picks = sampler.offer(evs)
    assert len(picks) == len(evs)  # every case is scored; none is skipped silently
    c = sampler.counters
    assert c["sampled"] == len(evs)
    assert c["truncated"] == 1 and c["invalid_utf8"] == 2 and c["empty_text"] == 2
    for p in picks:
        msgspec.json.encode(p.response)  # valid UTF-8: publishable and storable
        assert len(p.response) <= sampler.config.max_text_chars

    report = scorer.score_detailed([p.prompt for p in picks], [p.response for p in picks])
    s = report.scores
    assert s.shape == (len(picks),) and np.all(np.isfinite(s)) and np.all((s >= 0) & (s <= 1))
    by = dict(zip([p.event_id for p in picks], s.tolist()))
    assert by["e-empty"] == 0.0 and by["e-blank"] == 0.0  # an empty ok answer is useless
    why = dict(zip([p.event_id for p in picks], report.reasons))
    assert "empty" in why["e-empty"] and "non_latin" in why["e-chinese"]
    assert "truncated" in why["e-one_mb"] and "control_chars" in why["e-control"]
    counts = report.counts
    assert counts["scored"] == len(picks) and counts["empty"] == 2 and counts["non_latin"] == 1

    eng = Engine()
    eng.process(evs[:-1], fields=eng.read_fields(evs[:-1]))
    eng.process((batch := [msgspec.convert({"event_id": "e-odd", "ts_ms": T0, "channel": "ch-odd", "route": "r",
                                  "status": "ok", "latency_ms": 5.0}, RequestEvent)]), fields=eng.read_fields(batch))
    assert eng.add_quality_scores([p.channel for p in picks], [p.ts_ms for p in picks], s, scorer.version) == len(s)
    for p, v in zip(picks, s):
        row = quality_row(p.event_id, p.ts_ms, p.channel, p.route, v, scorer.version, p.response, p.prompt)
        assert len(row[6]) <= 2_000
        row[6].encode("utf-8")


def test_worker_factory_rolls_the_real_model_without_reloading_the_embedder(tmp_path):
    """The default scorer factory of the worker: a promoted version is picked up by check_reload,
    verified, and loaded in the same scoring process (the embedder there stays loaded)."""
    import asyncio
    import shutil

    from pipeline.quality.artifact import default_models_dir, promote
    from pipeline.stream.quality_agent import QualityAgent, QualitySettings

    src = default_models_dir()
    if not (src / "v1").is_dir():
        pytest.skip("no v1 quality model")
    for v in ("v1", "v2"):
        shutil.copytree(src / "v1", tmp_path / v)
    (tmp_path / "CURRENT").write_text("v1\n")
    (tmp_path / "v3").mkdir()  # a broken copy: metadata without weights
    shutil.copy(src / "v1" / "metadata.json", tmp_path / "v3" / "metadata.json")
    eng = Engine()
    eng.process((batch := events()[:1]), fields=eng.read_fields(batch))

    async def main():
        agent = QualityAgent(QualitySettings(models_dir=str(tmp_path), sample_interval_ms=1), get_engine=lambda: eng,
                             models_dir=tmp_path)
        assert await agent.load() and agent.scorer.version == "v1"
        first = agent.scorer
        promote("v2", tmp_path)
        agent._current_mtime = -1  # the copy above and the promote may share one mtime tick
        assert await agent.check_reload()
        assert agent.scorer.version == "v2" and agent.scorer._pool is first._pool
        promote("v3", tmp_path)
        agent._current_mtime = -1
        assert not await agent.check_reload() and agent.scorer.version == "v2"
        agent.offer(events()[:1])
        await agent.drain()
        return agent

    agent = asyncio.run(main())
    agent.scorer.close()
    assert agent.counters["reloads"] == 1 and agent.counters["reload_failed"] == 1
    assert eng.quality.added == 1 and eng.store.extensions["quality"].scores.version[0] == "v2"
