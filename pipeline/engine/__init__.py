"""The detection engine: validated events in, channel-health verdicts out (no Kafka, no ClickHouse).

- :mod:`~pipeline.engine.core`: :class:`Engine` (ingest chunks, evaluate rounds, verdicts) and :class:`BatchResult`;
- :mod:`~pipeline.engine.columns`: events → columns (:class:`~pipeline.engine.columns.EventFields`);
- :mod:`~pipeline.engine.published`: metric values as published in verdicts;
- :mod:`~pipeline.engine.route_shares`, :mod:`~pipeline.engine.quality_scores`,
  :mod:`~pipeline.engine.state_io`, :mod:`~pipeline.engine.residency`: the engine's named parts;
- :mod:`~pipeline.engine.batch`: :class:`~pipeline.engine.batch.BatchProcessor` (raw messages → decode →
  dedup → engine → outputs) and :mod:`~pipeline.engine.capture` (its snapshot captures);
- :mod:`~pipeline.engine.replay`: offline replay of event dicts.
"""

from pipeline.engine.core import BatchResult, Engine

__all__ = ["BatchResult", "Engine"]
