"""The worker's quality agent (SPEC §4.5): sample, score off the event loop, feed back.

Flow (one worker)::

    main agent (pipeline.stream.app) ── processor.process(batch) ──> ProcessedBatch.stored
         │  hook: QualitySampler.offer(events)  (event-time token bucket per channel)
         ▼
    bounded asyncio.Queue  ── full: the sample is dropped and counted, the stream never waits
         ▼
    scoring task: batches of <= batch_max samples → QualityScorer in a child
    process at low priority (pipeline.quality.process; torch threads capped) → scores
         ├─> Engine.add_quality_scores(...)   under the worker's lock → the ``quality`` detector
         ├─> topic ``<prefix>channel.quality_scores`` (key = channel, JSON, schemas/quality_score.v1.json)
         └─> ClickHouse ``quality_scores`` (with the truncated texts, for labelling later)

Scoring lags event time (seconds live). The detector judges each channel's
latest *scored* 5 minutes and ignores scores more than 10 min of event time
behind the round (:mod:`pipeline.windows.quality`), so a lag delays a
``quality`` verdict instead of thinning or clearing it. In a backlog or a
replay much faster than real time the lag grows, the queue overflows (drops
are counted) and quality verdicts come late; the in-process replay
(:func:`pipeline.engine.replay.replay` with a scorer) scores synchronously and is
exact in event time.

Quality scores are samples, not records: the stream's at-least-once
guarantee covers events and verdicts; a sample still queued when the worker
stops is simply not scored, and after a restart re-read events may be
sampled again (rows deduplicate on ``(channel, ts, event_id, model_version)``).

Model roll without a restart: every ``reload_interval_s`` (30 s) the agent
checks ``models/quality/CURRENT`` (mtime, then content); when it names
another version, that version's head is loaded and verified on a thread
(the embedder is kept), and the next batch is scored with it. A version
that fails to load (checksum, embedding mismatch) is logged and the running
one kept. Scores of two versions are not comparable, so the engine restarts
a channel's quality windows when its scores' version changes: the
``quality`` signal is silent for about an hour (until the new baseline has
``quality_baseline_min_hours``) after a roll. See ``models/quality/README.md``.

Without torch / sentence-transformers (or with no promoted model, or with
``CHANNEL_HEALTH_QUALITY=off``) the worker runs without quality scoring and
says so in one log line.

Configuration: :mod:`pipeline.stream.quality_settings` (environment ``CHANNEL_HEALTH_QUALITY*``).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any, Awaitable, Callable, Iterable, Sequence

import msgspec

from pipeline.quality.sampler import QualitySampler, Sample
from pipeline.stream.quality_settings import (  # noqa: F401  (ENV, load_quality_settings: re-exported)
    ENV,
    QualitySettings,
    load_quality_settings,
    missing_quality_packages,
)

log = logging.getLogger("channel_health.quality")

QUALITY_SCHEMA_VERSION = 1


class QualityScore(msgspec.Struct, omit_defaults=False):
    """One message on the quality topic (``schemas/quality_score.v1.json``).

    ``score``: P(good answer) in [0, 1] from model ``model_version``;
    ``ts_ms``: event time of the scored request; ``scored_at_ms``: wall clock.
    Texts are not published (they go to ClickHouse only).
    """

    event_id: str
    ts_ms: int
    channel: str
    route: str
    score: float
    model_version: str
    scored_at_ms: int
    schema_version: int = QUALITY_SCHEMA_VERSION


class ProcessScorerFactory:
    """``factory(version, previous) -> scorer``: the real model, with caches, in its own process.

    The first call starts the scoring process (:mod:`pipeline.quality.process`:
    nice ``nice``, torch threads capped at ``torch_threads``) and loads the
    embedding model (seconds); later calls (model rolls) load only the
    versioned head in the same process, verified against the embedder.
    :meth:`cancel_load` (from any thread) ends a first load in progress: the
    call then raises :class:`~pipeline.quality.process.LoadCancelled`.
    """

    def __init__(self, settings: QualitySettings) -> None:
        self.settings = settings
        self._cancel = threading.Event()

    def __call__(self, version: str | None, previous: Any) -> Any:
        from pipeline.quality.process import ProcessScorer

        if previous is not None:
            return previous.reload(version)
        s = self.settings
        return ProcessScorer.start(version, threads=s.torch_threads, nice=s.nice, batch=s.batch_max,
                                   models_dir=s.models_dir, cancel=self._cancel)

    def cancel_load(self) -> None:
        """Give up a first load in progress (the worker is stopping); later first loads fail at once."""
        self._cancel.set()


def default_scorer_factory(settings: QualitySettings) -> ProcessScorerFactory:
    """The worker's scorer factory: :class:`ProcessScorerFactory` of ``settings``."""
    return ProcessScorerFactory(settings)


class QualityAgent:
    """Sampling queue + scoring loop + model reload, independent of faust (tested directly).

    ``get_engine()``: the processor's current engine (it is replaced on a
    rebalance); ``get_lock()``: the worker's processor lock (or None before
    the stream started); ``publish(messages)``: async, sends
    ``[(key, value)]`` to the quality topic (None: do not publish); ``sink``:
    an object with ``add_quality_scores(rows)`` (or None); ``scorer_factory``:
    ``(version, previous) -> scorer`` with ``version``, ``score_async`` and
    ``close`` (default: :func:`default_scorer_factory`), and optionally
    ``cancel_load()``, called when the agent is cancelled during a load.
    """

    def __init__(self, settings: QualitySettings, *, get_engine: Callable[[], Any],
                 get_lock: Callable[[], asyncio.Lock | None] = lambda: None,
                 publish: Callable[[list[tuple[bytes, bytes]]], Awaitable[None]] | None = None,
                 sink: Any = None, scorer_factory: Callable[[str | None, Any], Any] | None = None,
                 models_dir: Path | None = None) -> None:
        self.settings = settings
        self.get_engine = get_engine
        self.get_lock = get_lock
        self.publish = publish
        self.sink = sink
        self.factory = scorer_factory or default_scorer_factory(settings)
        from pipeline.quality.artifact import default_models_dir

        self.models_dir = Path(models_dir or settings.models_dir or default_models_dir())
        self.sampler = QualitySampler(settings.sampler_config)
        self.queue: asyncio.Queue[Sample] = asyncio.Queue(maxsize=settings.queue_max)
        self.counters: Counter[str] = Counter()
        self.scorer: Any = None
        self.enabled = True
        self.disabled_reason: str | None = None
        self._current_mtime: int | None = None
        self._warned: set[str] = set()

    # -- the main agent's side (synchronous, cheap, never raises) ----------------------------------
    def offer(self, events: Iterable[Any]) -> int:
        """Sample ``events`` and queue the picks; returns how many were queued."""
        if not self.enabled:
            return 0
        queued = 0
        for s in self.sampler.offer(events):
            try:
                self.queue.put_nowait(s)
                queued += 1
            except asyncio.QueueFull:
                self.counters["queue_full"] += 1
        self.counters["queued"] += queued
        return queued

    def hook(self, processor: Any) -> None:
        """Wrap ``processor.process`` so every processed batch's accepted events are offered."""
        original = processor.process

        def process(*args: Any, **kwargs: Any) -> Any:
            out = original(*args, **kwargs)
            try:
                self.offer(e for e, _parse_ok, _missing in out.stored)
            except Exception as exc:  # a sampling bug must never stop the stream
                self.counters["hook_error"] += 1
                self._warn_once("hook", "quality sampling failed (%r); the stream continues", exc)
            return out

        process.__wrapped__ = original  # type: ignore[attr-defined]
        processor.process = process

    # -- model ------------------------------------------------------------------------------------
    def _current_file(self) -> Path:
        from pipeline.quality.artifact import CURRENT_FILE

        return self.models_dir / CURRENT_FILE

    def _read_current(self) -> str | None:
        try:
            v = self._current_file().read_text().strip()
        except OSError:
            return None
        return v or None

    async def load(self) -> bool:
        """Load the configured (pinned or promoted) model on a thread; False (and disabled) on failure."""
        version = self.settings.model_version
        try:
            self._current_mtime = self._current_file().stat().st_mtime_ns
        except OSError:
            self._current_mtime = None
        started = time.monotonic()
        try:
            self.scorer = await asyncio.to_thread(self.factory, version, None)
        except asyncio.CancelledError:  # the worker stops mid-load: end the load too, or exit would wait for it
            cancel_load = getattr(self.factory, "cancel_load", None)
            if cancel_load is not None:
                cancel_load()
            raise
        except Exception as exc:
            self.disable(f"cannot load the quality model ({type(exc).__name__}: {exc})")
            return False
        log.warning("quality scoring on: model %s, <= 1 sample / %.1f s / channel, loaded in %.1f s",
                    self.scorer.version, self.settings.sample_interval_ms / 1000, time.monotonic() - started)
        return True

    def disable(self, reason: str) -> None:
        """Stop sampling and scoring (one log line); the stream is unaffected."""
        self.enabled = False
        self.disabled_reason = reason
        while not self.queue.empty():
            self.queue.get_nowait()
        log.warning("quality scoring disabled: %s", reason)

    async def check_reload(self) -> bool:
        """Load the version ``CURRENT`` names if it changed; True when a new model is in use."""
        if not self.enabled or self.scorer is None or self.settings.model_version is not None:
            return False
        try:
            mtime = self._current_file().stat().st_mtime_ns
        except OSError:
            return False
        if mtime == self._current_mtime:
            return False
        self._current_mtime = mtime
        version = self._read_current()
        old = self.scorer
        if version is None or version == old.version:
            return False
        try:
            new = await asyncio.to_thread(self.factory, version, old)
        except Exception as exc:
            self.counters["reload_failed"] += 1
            log.error("quality model %s named in %s cannot be loaded (%s: %s); still scoring with %s",
                      version, self._current_file(), type(exc).__name__, exc, old.version)
            return False
        self.scorer = new
        self.counters["reloads"] += 1
        close = getattr(old, "close", None)
        if close is not None:
            close()
        log.warning("quality model %s -> %s loaded without restart; each channel's quality baseline restarts "
                    "with its first %s score (no quality verdicts until it has a full hour)",
                    old.version, new.version, new.version)
        return True

    # -- scoring loop -----------------------------------------------------------------------------
    async def next_batch(self) -> list[Sample]:
        """Wait for one sample, then take up to ``batch_max`` (waiting at most ``batch_wait_s`` more)."""
        loop = asyncio.get_running_loop()
        batch = [await self.queue.get()]
        deadline = loop.time() + self.settings.batch_wait_s
        while len(batch) < self.settings.batch_max:
            try:
                batch.append(self.queue.get_nowait())
                continue
            except asyncio.QueueEmpty:
                pass
            left = deadline - loop.time()
            if left <= 0:
                break
            try:
                batch.append(await asyncio.wait_for(self.queue.get(), left))
            except asyncio.TimeoutError:
                break
        return batch

    async def run(self) -> None:
        """Load the model, then score batches for ever (errors are counted, never raised)."""
        if self.scorer is None and not await self.load():
            return
        while self.enabled:
            batch = await self.next_batch()
            try:
                await self.score_batch(batch)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self.counters["batch_error"] += len(batch)
                self._warn_once("batch", "quality batch failed (%r); continuing", exc)

    async def drain(self) -> int:
        """Score everything queued now (tests, shutdown); returns samples scored."""
        done = 0
        while not self.queue.empty():
            batch = []
            while not self.queue.empty() and len(batch) < self.settings.batch_max:
                batch.append(self.queue.get_nowait())
            await self.score_batch(batch)
            done += len(batch)
        return done

    async def score_batch(self, batch: Sequence[Sample]) -> None:
        """Score ``batch`` off the loop; feed the engine, the topic and the sink."""
        if not batch:
            return
        scorer = self.scorer
        if scorer is None:
            self.counters["no_model"] += len(batch)
            return
        try:
            scores = await scorer.score_async([s.prompt for s in batch], [s.response for s in batch])
        except Exception as exc:
            self.counters["score_error"] += len(batch)
            self._warn_once("score", "quality scoring failed (%r); these samples are dropped", exc)
            return
        version = str(scorer.version)
        values = [float(x) for x in scores]
        self.counters["scored"] += len(batch)
        lock = self.get_lock()
        if lock is not None:
            async with lock:
                self._feed(batch, values, version)
        else:
            self._feed(batch, values, version)
        self._store(batch, values, version)
        await self._publish(batch, values, version)

    def _feed(self, batch: Sequence[Sample], values: list[float], version: str) -> None:
        engine = self.get_engine()
        added = engine.add_quality_scores([s.channel for s in batch], [s.ts_ms for s in batch], values, version)
        self.counters["engine_added"] += added
        if added < len(batch):
            self.counters["engine_not_counted"] += len(batch) - added

    def _store(self, batch: Sequence[Sample], values: list[float], version: str) -> None:
        add = getattr(self.sink, "add_quality_scores", None)
        if add is None:
            return
        from pipeline.sinks.errors import SinkBackpressure
        from pipeline.sinks.rows import now_ms, quality_row

        at = now_ms()
        rows = [quality_row(s.event_id, s.ts_ms, s.channel, s.route, v, version, s.response, s.prompt, at)
                for s, v in zip(batch, values)]
        try:
            add(rows)
            self.counters["stored"] += len(rows)
        except SinkBackpressure:  # samples, not records: drop rather than hold the stream
            self.counters["store_backpressure"] += len(rows)
        except Exception as exc:
            self.counters["store_error"] += len(rows)
            self._warn_once("store", "quality rows not buffered (%r)", exc)

    async def _publish(self, batch: Sequence[Sample], values: list[float], version: str) -> None:
        if self.publish is None:
            return
        from pipeline.sinks.rows import now_ms

        at = now_ms()
        msgs = [(s.channel.encode(), msgspec.json.encode(QualityScore(
            event_id=s.event_id, ts_ms=s.ts_ms, channel=s.channel, route=s.route, score=round(v, 6),
            model_version=version, scored_at_ms=at))) for s, v in zip(batch, values)]
        try:
            await self.publish(msgs)
            self.counters["published"] += len(msgs)
        except Exception as exc:
            self.counters["publish_error"] += len(msgs)
            self._warn_once("publish", "quality scores not published (%r)", exc)

    # -- reporting ----------------------------------------------------------------------------------
    def status(self) -> dict[str, Any]:
        """Counters of the sampler, the agent and the scorer, for logs and tests."""
        scorer = self.scorer
        inner = getattr(scorer, "scorer", scorer)
        return {
            "enabled": self.enabled,
            "model": getattr(scorer, "version", None),
            "queue": self.queue.qsize(),
            "sampler": dict(self.sampler.counters),
            "agent": dict(self.counters),
            "scorer": dict(getattr(inner, "counters", {}) or {}),
            "cache": dict(getattr(scorer, "counters", {}) or {}) if inner is not scorer else {},
        }

    def _warn_once(self, key: str, msg: str, *args: Any) -> None:
        if key not in self._warned:
            self._warned.add(key)
            log.warning(msg, *args)


def install_quality(app: Any, state: Any, settings: Any, *, quality: QualitySettings | None = None,
                    scorer_factory: Callable[[str | None, Any], Any] | None = None) -> QualityAgent | None:
    """Add quality scoring to a worker built by :func:`pipeline.stream.app.build_app`.

    Registers the quality topic, the scoring task, the model-reload and
    status timers, and hooks the sampler into ``state.processor``; the agent
    is also ``state.quality``. Returns None (one log line, nothing
    registered) when quality scoring is off or cannot run here.
    """
    qs = quality or load_quality_settings()
    if not qs.enabled:
        log.warning("quality scoring disabled (%s=off)", ENV)
        return None
    if scorer_factory is None:
        missing = missing_quality_packages()
        if missing:
            log.warning("quality scoring disabled: %s not installed (pip install torch==2.13.0, then "
                        "'channel-health[quality]'); the worker runs without the quality signal",
                        ", ".join(missing))
            return None
        if qs.model_version is None:
            from pipeline.quality.artifact import current_version, default_models_dir

            models_dir = Path(qs.models_dir) if qs.models_dir else default_models_dir()
            if current_version(models_dir) is None:
                log.warning("quality scoring disabled: no promoted quality model (%s missing)",
                            models_dir / "CURRENT")
                return None

    from pipeline.stream.runtime import send_and_wait

    topic = app.topic(settings.topics.quality, key_serializer="raw", value_serializer="raw")

    async def publish(msgs: list[tuple[bytes, bytes]]) -> None:
        await send_and_wait(app.producer, settings.topics.quality, [(k, v, None) for k, v in msgs])

    agent = QualityAgent(qs, get_engine=lambda: state.processor.engine, get_lock=lambda: state.lock,
                         publish=publish, sink=state.sink, scorer_factory=scorer_factory)
    agent.hook(state.processor)
    state.quality = agent

    async def quality_scoring() -> None:
        try:  # a send-only topic is not declared by faust itself
            await topic.maybe_declare()
        except Exception as exc:
            log.warning("quality topic %s not declared (%r); publishing may fail (counted)",
                        settings.topics.quality, exc)
        try:
            await agent.run()
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # never take the worker down for the quality signal
            agent.disable(f"scoring task failed: {exc!r}")

    app.task(quality_scoring)

    if qs.reload_interval_s > 0 and qs.model_version is None:
        async def quality_model_reload() -> None:
            await agent.check_reload()

        app.timer(interval=qs.reload_interval_s)(quality_model_reload)

    async def quality_status() -> None:
        log.info("quality: %s", agent.status())

    app.timer(interval=60.0)(quality_status)
    return agent
