"""Offline replay: JSON-ready event dicts through an :class:`~pipeline.engine.Engine`, in batches.

What the acceptance tests, the restart reference and the in-process
scenario runs use: no Kafka, no ClickHouse, exact in event time (quality
scores, when a scorer is given, are computed synchronously).
"""

from __future__ import annotations

from typing import Iterable

from pipeline.contracts import RequestEvent, Verdict
from pipeline.engine.core import Engine
from pipeline.ingest.structure import resolve_onto
from pipeline.policy.defaults import PolicyConfig


def replay(events: Iterable[dict], policy: PolicyConfig | None = None, batch_size: int = 500,
           engine: Engine | None = None, scorer=None, sampler=None) -> tuple[Engine, list[Verdict]]:
    """Feed JSON-ready event dicts through an :class:`Engine` (default: a fresh one) in batches.

    ``events`` is consumed lazily, so a generator may read the engine's
    state (e.g. ``engine.routes.shares_by_route``) to close the routing loop.
    Returns the engine and every verdict in publication order.

    Quality scoring (SPEC §4.5), optional: ``scorer`` is any object with
    ``score(prompts, responses) -> array`` of P(good) and a ``version``
    (e.g. :class:`pipeline.quality.scorer.QualityScorer`, or a
    :class:`pipeline.quality.cache.CachedScorer`). Then ``sampler`` (default:
    a :class:`pipeline.quality.sampler.QualitySampler` with its default
    configuration) picks responses among each batch's accepted events, they
    are scored synchronously, and the scores go to
    :meth:`Engine.add_quality_scores`. Batches are then also cut at every
    evaluation boundary (``eval_interval_ms`` of event time), so each round
    sees the scores of all events before it, as it sees their counts.
    Without a scorer nothing is imported from :mod:`pipeline.quality`.
    """
    import msgspec

    engine = engine or Engine(policy)
    verdicts: list[Verdict] = []
    batch: list[RequestEvent] = []
    if scorer is not None and sampler is None:
        from pipeline.quality.sampler import QualitySampler

        sampler = QualitySampler()
    step = engine.policy.eval_interval_ms
    bucket = None

    def flush(batch: list[RequestEvent]) -> None:
        resolve_onto(batch, engine.policy.classifier)  # what the ingest decoder does: the engine reads the flags
        result = engine.process(batch, fields=engine.read_fields(batch))  # read once, after the flags
        verdicts.extend(result.verdicts)
        if scorer is not None:
            picks = sampler.offer(result.accepted)
            if picks:
                scores = scorer.score([p.prompt for p in picks], [p.response for p in picks])
                engine.add_quality_scores([p.channel for p in picks], [p.ts_ms for p in picks], scores,
                                          getattr(scorer, "version", None))

    for e in events:
        ev = msgspec.convert(e, RequestEvent)
        if scorer is not None:
            b = ev.ts_ms // step
            if batch and b != bucket:
                flush(batch)
                batch = []
            bucket = b
        batch.append(ev)
        if len(batch) >= batch_size:
            flush(batch)
            batch = []
    if batch:
        flush(batch)
    return engine, verdicts
