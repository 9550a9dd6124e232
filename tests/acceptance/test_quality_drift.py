"""Acceptance, SPEC §5.4 quality drift and §4.5: the in-process engine with quality scoring.

Replays run the real quality model (v1, all-MiniLM-L6-v2 on CPU) through
:func:`pipeline.engine.replay.replay` with a scorer: the default sampler (at most
one response per 2 s of event time per channel) picks responses, they are
scored synchronously, and the scores feed the ``quality`` detector. The
answers come from a fixed pool (32 good MT-bench answers + their useless
variants), so the scorer's caches (by text and by (prompt, response)) encode
each distinct text once per test session; that is what keeps a replay of
tens of thousands of scored samples within seconds.
"""

from __future__ import annotations

import dataclasses
import time

import numpy as np
import pytest

from pipeline.engine.replay import replay
from pipeline.quality.sampler import QualitySampler
from pipeline.tools.simulate.chat_answers import load_chat_pool
from pipeline.tools.simulate.scenarios import WARMUP_S
from pipeline.tools.simulate.traces import DataNotFoundError

from .conftest import START_MS, TRACES_DIR, Run, scenario
from .test_scenarios import NOT_HEALTHY, check_expected

pytest.importorskip("sentence_transformers")

DRIFT = "deepinfra/llama-70b@free"


@pytest.fixture(scope="module")
def scorer():
    from pipeline.quality.artifact import current_version
    from pipeline.quality.cache import CachedScorer, CachingEmbedder
    from pipeline.quality.embedding import shared_embedder
    from pipeline.quality.scorer import QualityScorer

    if current_version() is None:
        pytest.skip("no promoted quality model under models/quality")
    s = CachedScorer(QualityScorer(embedder=CachingEmbedder(shared_embedder())))
    yield s
    s.close()


def run_with_quality(scenario, scorer, seed: int = 0) -> Run:
    events: list[dict] = []

    def gen():
        for e in scenario.events(start_ms=START_MS, seed=seed):
            events.append(e)
            yield e

    sampler = QualitySampler()
    started = time.perf_counter()
    try:
        engine, verdicts = replay(gen(), scorer=scorer, sampler=sampler)
    except DataNotFoundError as exc:  # only where CHANNEL_HEALTH_TEST_TRACES_DIR names a missing folder
        pytest.fail(f"traces folder missing: {exc}")
    run = Run(scenario, events, engine, verdicts)
    run.sampler = sampler  # type: ignore[attr-defined]
    run.seconds = time.perf_counter() - started  # type: ignore[attr-defined]
    return run


@pytest.fixture(scope="module")
def drift_run(scorer):
    return run_with_quality(scenario("quality-drift"), scorer)


def test_quality_drift_raises_quality_on_the_drifting_channel_within_5_min(drift_run, scorer):
    run = drift_run
    fault = run.scenario.faults[0]
    t0, t1 = fault.start_s, fault.end_s
    # Injected truth (by finish time; the ramp takes 60 s): the drifting channel's answers are useless
    # during the fault only, with the
    # usual statuses (no injected failures) - nothing but the text changed.
    good: dict[str, set[str]] = {}
    for a in load_chat_pool(TRACES_DIR):
        good.setdefault(a.prompt, set()).add(a.text)
    mine = [e for e in run.events if e["channel"] == DRIFT and "response_text" in e]
    before = [e["response_text"] in good[e["prompt_text"]] for e in mine if run.t(e["ts_ms"]) < t0]
    during = [e["response_text"] in good[e["prompt_text"]] for e in mine if t0 + 120 <= run.t(e["ts_ms"]) < t1]
    assert all(before) and len(during) > 500 and not any(during)
    fails = [e["status"] != "ok" for e in run.events if e["channel"] == DRIFT and t0 <= run.t(e["ts_ms"]) < t1]
    assert np.mean(fails) < 0.01

    first = next(v for v in run.of(DRIFT) if "quality" in v.reasons)
    delay = run.t(first.ts_ms) - t0
    print(f"\nquality-drift: 'quality' raised {delay:.0f} s (event time) after the drift started; "
          f"{run.sampler.counters['sampled']} samples scored, replay {run.seconds:.1f} s, "  # type: ignore[attr-defined]
          f"cache {dict(scorer.counters)}")
    assert 0 < delay <= 300
    assert first.state == "degraded" and first.reasons == ["quality"]
    m = first.metrics
    assert m["quality_baseline"] - m["quality_score_5m"] >= 0.10
    assert m["quality_drop"] == pytest.approx(m["quality_baseline"] - m["quality_score_5m"], abs=1e-3)
    assert m["quality_samples_5m"] >= 20 and m["quality_baseline_samples"] >= 100
    # Only the quality signal moved on the drifting channel; it cleared after the fault.
    assert {r for v in run.of(DRIFT) for r in v.reasons} == {"quality"}
    assert run.of(DRIFT)[-1].state == "healthy"
    # Never on the clean channels, never before the drift.
    wrong = [(v.channel, run.t(v.ts_ms), v.state, v.reasons) for v in run.verdicts
             if (v.state in NOT_HEALTHY or "quality" in v.reasons) and (v.channel != DRIFT or run.t(v.ts_ms) < t0)]
    assert wrong == []
    check_expected(run)


def test_quality_drift_sampling_is_rate_limited_per_channel(drift_run):
    run = drift_run
    c = run.sampler.counters  # type: ignore[attr-defined]
    assert c["sampled"] == run.engine.quality.added and not run.engine.quality.dropped
    assert c["throttled"] > 0 and c["no_text"] > 0
    per5 = [v.metrics["quality_samples_5m"] for v in run.verdicts if v.metrics.get("quality_samples_5m")]
    assert max(per5) <= 153  # <= one sample / 2 s of event time per channel (+ a burst of 3)
    assert min(v.metrics["quality_baseline_samples"] for v in run.verdicts if run.t(v.ts_ms) > WARMUP_S) >= 500


@pytest.mark.slow
def test_clean_day_with_texts_raises_no_quality_reason(scorer):
    """26 h (2 h warm-up + a full day, night load 35 % of the peak) of the quality-drift channels
    without the fault, every answer scored by the real model at the default sampling rate."""
    sc = dataclasses.replace(scenario("quality-drift"), name="quality-clean-day", faults=(), expected=(),
                             duration_s=WARMUP_S + 24 * 3600, start_hour=0.0)
    run = run_with_quality(sc, scorer)
    assert run.t(run.events[-1]["ts_ms"]) > 24 * 3600
    bad = [(v.channel, run.t(v.ts_ms), v.state, v.reasons) for v in run.verdicts
           if v.state in NOT_HEALTHY or "quality" in v.reasons]
    assert bad == []
    judged = [v for v in run.verdicts if v.metrics.get("quality_t") is not None]
    assert len(judged) > 10_000
    max_t = max(v.metrics["quality_t"] for v in judged)
    max_drop = max(v.metrics["quality_drop"] for v in judged)
    print(f"\nclean day with texts: {run.sampler.counters['sampled']} samples, {len(judged)} judged rounds, "  # type: ignore[attr-defined]
          f"max Welch t {max_t:.2f}, max drop {max_drop:.3f}, replay {run.seconds:.1f} s")  # type: ignore[attr-defined]
