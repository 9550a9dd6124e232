"""The worker's quality agent with a fake model: queue, batches, feedback to the engine, topic and
sink rows, model roll without restart, and a worker that runs without torch."""

from __future__ import annotations

import asyncio
import json
import logging
import os
from pathlib import Path

import jsonschema
import msgspec
import numpy as np
import pytest

from pipeline.config import ConfigError, Settings
from pipeline.engine import Engine
from pipeline.sinks.errors import SinkBackpressure
from pipeline.sinks.rows import MAX_TEXT_CHARS, QUALITY_SCORE_COLUMNS
from pipeline.stream import quality_agent as qa
from pipeline.engine.batch import BatchProcessor

T0 = 1_780_002_000_000 - 1_780_002_000_000 % 3_600_000
SCHEMA = json.loads((Path(__file__).parents[2] / "schemas" / "quality_score.v1.json").read_text())


class FakeScorer:
    def __init__(self, version="v1", fail=False):
        self.version = version
        self.fail = fail
        self.closed = False
        self.batches: list[int] = []

    async def score_async(self, prompts, responses):
        if self.fail:
            raise RuntimeError("boom")
        self.batches.append(len(responses))
        return np.array([0.9 if r.startswith("good") else 0.1 for r in responses])

    def close(self):
        self.closed = True


class ListSink:
    def __init__(self, full=False):
        self.rows: list[tuple] = []
        self.full = full

    def add_quality_scores(self, rows):
        if self.full:
            raise SinkBackpressure("quality_scores", 1, 1, 1, 1)
        self.rows.extend(rows)


def raw_event(i, ch="c1", text="good answer", status="ok", ts=None):
    e = {"event_id": f"{ch}-{i}", "ts_ms": ts if ts is not None else T0 + i * 1_000, "channel": ch, "route": "r",
         "status": status, "latency_ms": 10.0, "response_text": text, "prompt_text": "a question"}
    return msgspec.json.encode(e)


def make(settings=None, **kw):
    proc = BatchProcessor(Engine(), clock_ms=lambda: T0)
    lock = asyncio.Lock()
    sent: list[tuple[bytes, bytes]] = []

    async def publish(msgs):
        sent.extend(msgs)

    made: list[FakeScorer] = []

    def factory(version, previous):
        s = FakeScorer(version or "v1")
        made.append(s)
        return s

    agent = qa.QualityAgent(settings or qa.QualitySettings(sample_interval_ms=2_000, burst=1),
                            get_engine=lambda: proc.engine, get_lock=lambda: lock, publish=publish,
                            sink=kw.get("sink", ListSink()), scorer_factory=kw.get("factory", factory),
                            models_dir=kw.get("models_dir"))
    agent.hook(proc)
    return agent, proc, sent, made


def test_samples_flow_to_engine_topic_and_sink(tmp_path):
    async def main():
        agent, proc, sent, made = make(models_dir=tmp_path)
        assert await agent.load()
        long = "good " + "x" * 5_000
        proc.process([raw_event(i, text=long if i == 0 else "good answer") for i in range(10)])
        proc.process([raw_event(i, ch="c2", text="bad", status="ok") for i in range(4)]
                     + [raw_event(99, status="error")])
        assert agent.queue.qsize() == 5 + 2  # one per 2 s of event time per channel
        assert await agent.drain() == 7
        return agent, proc, sent, made

    agent, proc, sent, made = asyncio.run(main())
    eng = proc.engine
    assert eng.quality.added == 7 and eng.store.extensions["quality"].scores.version[:2] == ["v1", "v1"]
    docs = [json.loads(v) for _, v in sent]
    for d in docs:
        jsonschema.validate(d, SCHEMA)
    assert {(k.decode(), d["score"]) for (k, _), d in zip(sent, docs)} == {("c1", 0.9), ("c2", 0.1)}
    rows = agent.sink.rows
    assert len(rows) == 7 and len(rows[0]) == len(QUALITY_SCORE_COLUMNS)
    row = dict(zip(QUALITY_SCORE_COLUMNS, rows[0]))
    assert row["event_id"] == "c1-0" and row["model_version"] == "v1" and row["prompt_text"] == "a question"
    assert len(row["response_text"]) == MAX_TEXT_CHARS  # truncated text kept for labelling
    st = agent.status()
    assert st["agent"]["scored"] == 7 and st["agent"]["published"] == 7 and st["agent"]["stored"] == 7
    assert st["sampler"]["sampled"] == 7 and st["sampler"]["throttled"] == 7 and st["sampler"]["not_ok"] == 1


def test_full_queue_drops_and_counts_never_blocks():
    async def main():
        agent, proc, _, _ = make(qa.QualitySettings(sample_interval_ms=1, queue_max=3))
        proc.process([raw_event(i) for i in range(10)])
        return agent

    agent = asyncio.run(main())
    assert agent.queue.qsize() == 3 and agent.counters["queue_full"] == 7 and agent.counters["queued"] == 3


def test_failures_are_counted_not_raised(tmp_path, caplog):
    async def main():
        agent, proc, sent, _ = make(qa.QualitySettings(sample_interval_ms=1), sink=ListSink(full=True),
                                    factory=lambda v, p: FakeScorer(fail=True))
        await agent.load()
        proc.process([raw_event(i) for i in range(3)])
        await agent.drain()
        agent.scorer = FakeScorer()
        proc.process([raw_event(i + 10) for i in range(2)])
        await agent.drain()
        return agent, sent

    with caplog.at_level(logging.WARNING, logger="channel_health.quality"):
        agent, sent = asyncio.run(main())
    assert agent.counters["score_error"] == 3 and agent.counters["store_backpressure"] == 2
    assert len(sent) == 2
    assert sum("quality scoring failed" in r.message for r in caplog.records) == 1  # logged once


def test_hook_never_breaks_the_stream():
    async def main():
        agent, proc, _, _ = make()

        def broken(events):
            raise RuntimeError("sampler bug")

        agent.offer = broken  # type: ignore[method-assign]
        out = proc.process([raw_event(1)])
        return agent, out

    agent, out = asyncio.run(main())
    assert len(out.stored) == 1 and agent.counters["hook_error"] == 1


def test_batches_are_bounded_and_loop_runs():
    async def main():
        agent, proc, sent, made = make(qa.QualitySettings(sample_interval_ms=1, batch_max=4, batch_wait_s=0.01))
        task = asyncio.create_task(agent.run())
        await asyncio.sleep(0.05)
        proc.process([raw_event(i) for i in range(10)])
        for _ in range(100):
            if len(sent) == 10:
                break
            await asyncio.sleep(0.01)
        task.cancel()
        return made

    made = asyncio.run(main())
    assert made[0].batches and max(made[0].batches) <= 4 and sum(made[0].batches) == 10


def test_model_roll_without_restart(tmp_path):
    (tmp_path / "CURRENT").write_text("v1\n")

    def factory(version, previous):
        if version == "broken":
            raise ValueError("checksum mismatch")
        return FakeScorer(version or (tmp_path / "CURRENT").read_text().strip())

    async def main():
        agent, proc, _, _ = make(qa.QualitySettings(sample_interval_ms=1), factory=factory, models_dir=tmp_path)
        await agent.load()
        proc.process([raw_event(i) for i in range(3)])
        await agent.drain()
        assert not await agent.check_reload()  # unchanged
        old = agent.scorer
        os.replace(_write(tmp_path / ".tmp", "v2\n"), tmp_path / "CURRENT")
        _bump(tmp_path / "CURRENT")
        assert await agent.check_reload()
        assert agent.scorer.version == "v2" and old.closed
        proc.process([raw_event(i + 10) for i in range(2)])
        await agent.drain()
        os.replace(_write(tmp_path / ".tmp", "broken\n"), tmp_path / "CURRENT")
        _bump(tmp_path / "CURRENT", 2)
        assert not await agent.check_reload()
        assert agent.scorer.version == "v2" and agent.counters["reload_failed"] == 1
        return proc.engine

    eng = asyncio.run(main())
    assert eng.quality.resets == 1 and eng.store.extensions["quality"].scores.version[0] == "v2"
    assert eng.store.extensions["quality"].scores.base.counts[0, :, 0].sum() == 2  # v1 scores cleared


def _write(p: Path, text: str) -> Path:
    p.write_text(text)
    return p


def _bump(p: Path, k: int = 1) -> None:
    st = p.stat()
    os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns + k * 1_000_000_000))


def test_load_failure_disables_with_one_line(caplog):
    def factory(version, previous):
        raise FileNotFoundError("no model")

    async def main():
        agent, proc, _, _ = make(factory=factory)
        ok = await agent.load()
        proc.process([raw_event(1)])
        return agent, ok

    with caplog.at_level(logging.WARNING, logger="channel_health.quality"):
        agent, ok = asyncio.run(main())
    assert not ok and not agent.enabled and agent.queue.qsize() == 0
    assert [r.message for r in caplog.records if r.name == "channel_health.quality" and "disabled" in r.message] == [
        "quality scoring disabled: cannot load the quality model (FileNotFoundError: no model)"]


class BlockingFactory:
    """A scorer factory whose first load blocks until ``cancel_load`` (as the scoring process's model load
    does until it is killed); it records the calls."""

    def __init__(self):
        import threading

        self.entered = threading.Event()
        self.released = threading.Event()
        self.cancels = 0
        self.returned = None

    def __call__(self, version, previous):
        self.entered.set()
        self.released.wait(30)
        self.returned = "cancelled" if self.cancels else "timed out"
        raise RuntimeError(self.returned)

    def cancel_load(self):
        self.cancels += 1
        self.released.set()


def test_cancelling_the_agent_during_a_load_cancels_the_load():
    """A worker stopping while the model loads cancels the scoring task: the load is given up at once
    (``cancel_load``), so the thread running it ends and the worker's exit does not wait for the load."""
    factory = BlockingFactory()

    async def main():
        agent, _, _, _ = make(factory=factory)
        task = asyncio.ensure_future(agent.run())
        assert await asyncio.to_thread(factory.entered.wait, 30)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return agent

    agent = asyncio.run(main())  # returns once the default executor's threads ended: the load thread too
    assert factory.cancels == 1 and factory.returned == "cancelled"
    assert agent.scorer is None and agent.enabled


def test_settings_from_env():
    s = qa.load_quality_settings({"CHANNEL_HEALTH_QUALITY_SAMPLE_INTERVAL_MS": "10000",
                                  "CHANNEL_HEALTH_QUALITY_QUEUE": "50", "CHANNEL_HEALTH_QUALITY_RELOAD_S": "0",
                                  "CHANNEL_HEALTH_QUALITY_MODEL": "v1"})
    assert (s.enabled, s.sample_interval_ms, s.queue_max, s.reload_interval_s, s.model_version) == (
        True, 10_000, 50, 0.0, "v1")
    assert s.sampler_config.interval_ms == 10_000
    assert not qa.load_quality_settings({"CHANNEL_HEALTH_QUALITY": "off"}).enabled
    for bad in ({"CHANNEL_HEALTH_QUALITY": "maybe"}, {"CHANNEL_HEALTH_QUALITY_BATCH": "x"},
                {"CHANNEL_HEALTH_QUALITY_THREADS": "0"}):
        with pytest.raises(ConfigError):
            qa.load_quality_settings(bad)


def _settings() -> Settings:
    return Settings(kafka_bootstrap="127.0.0.1:1", clickhouse_url="chdb:///nonexistent")


def test_worker_builds_with_quality_agent(monkeypatch, tmp_path):
    from pipeline.stream import app as app_module

    monkeypatch.setenv("CHANNEL_HEALTH_QUALITY_RELOAD_S", "30")
    monkeypatch.setattr(qa, "missing_quality_packages", lambda: [])
    monkeypatch.setattr(qa, "default_scorer_factory", lambda s: (lambda v, p: FakeScorer()))
    app, state = app_module.build_app(_settings(), datadir=str(tmp_path))
    agent = state.quality
    assert isinstance(agent, qa.QualityAgent)
    assert state.processor.process.__wrapped__ is not None
    names = {getattr(t, "__name__", "") for t in app._app_tasks}
    assert {"quality_scoring", "quality_model_reload", "quality_status"} <= names
    assert qa.QualitySettings().sample_interval_ms == 2_000


def test_worker_builds_without_torch(monkeypatch, tmp_path, caplog):
    from pipeline.stream import app as app_module

    monkeypatch.setattr(qa, "missing_quality_packages", lambda: ["torch", "sentence_transformers"])
    with caplog.at_level(logging.WARNING, logger="channel_health.quality"):
        app, state = app_module.build_app(_settings(), datadir=str(tmp_path))
    assert getattr(state, "quality", None) is None
    assert not hasattr(state.processor.process, "__wrapped__")
    lines = [r.message for r in caplog.records if r.name == "channel_health.quality"]
    assert len(lines) == 1 and lines[0].startswith("quality scoring disabled: torch, sentence_transformers not installed")
    monkeypatch.setenv("CHANNEL_HEALTH_QUALITY", "off")
    app, state = app_module.build_app(_settings(), datadir=str(tmp_path / "b"))
    assert getattr(state, "quality", None) is None
