"""Synthetic stored histories for backtest/tune tests and the replay benchmark (issue #22).

:func:`synthetic_events` makes request events with injected faults;
:func:`record` runs them through the engine and stores events and verdicts
with the worker's own sink (:class:`~pipeline.sinks.clickhouse.ClickHouseSink`),
so ClickHouse then holds what a worker would have written for that traffic.
:func:`bench_backtest` measures the backtest's replay speed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Sequence

import numpy as np

from pipeline.contracts import RequestEvent, Verdict
from pipeline.engine import Engine
from pipeline.policy.defaults import PolicyConfig

H = 3_600_000


@dataclass(frozen=True)
class Fault:
    """A fault on ``channel`` during ``[from_ms, to_ms)``: latency times ``latency_factor``, failures at ``error_rate``.

    ``error_rate`` in [0, 1] is the share of requests answering ``error``;
    ``latency_factor`` >= 0 multiplies the median latency.
    """

    channel: str
    from_ms: int
    to_ms: int
    latency_factor: float = 1.0
    error_rate: float = 0.0


def synthetic_events(channels: Sequence[str], start_ms: int, end_ms: int, rate_per_s: float,
                     faults: Iterable[Fault] = (), seed: int = 0, median_ms: float = 200.0,
                     base_error_rate: float = 0.001, tier: str = "paid", route: str = "chat") -> list[RequestEvent]:
    """Events on ``[start_ms, end_ms)`` at ``rate_per_s`` per channel (uniform arrivals), in event-time order.

    Latency: lognormal, median ``median_ms``, sigma 0.3; ``base_error_rate``:
    share of ``error`` answers outside faults. Event ids are
    ``"{channel}-{i}"``. Deterministic for a given ``seed``.
    """
    rng = np.random.default_rng(seed)
    faults = list(faults)
    out: list[RequestEvent] = []
    for c in channels:
        n = int((end_ms - start_ms) / 1000 * rate_per_s)
        ts = np.sort(rng.integers(start_ms, end_ms, n))
        factor = np.ones(n)
        err = np.full(n, base_error_rate)
        for f in faults:
            if f.channel == c:
                inside = (ts >= f.from_ms) & (ts < f.to_ms)
                factor[inside] *= f.latency_factor
                err[inside] = np.maximum(err[inside], f.error_rate)
        lat = rng.lognormal(np.log(median_ms * factor), 0.3)
        failed = rng.random(n) < err
        out.extend(RequestEvent(event_id=f"{c}-{i}", ts_ms=t, channel=c, route=route,
                                status="error" if bad else "ok", latency_ms=x, tier=tier)  # type: ignore[arg-type]
                   for i, (t, x, bad) in enumerate(zip(ts.tolist(), lat.tolist(), failed.tolist())))
    out.sort(key=lambda e: e.ts_ms)
    return out


def record(client: Any, events: Sequence[RequestEvent], policy: PolicyConfig | None = None,
           batch_size: int = 500, flush_every: int = 200_000,
           quality: Sequence[tuple[str, int, float]] = ()) -> list[Verdict]:
    """Run ``events`` (event-time order) through a fresh engine and store events + verdicts like the worker.

    ``quality``: ``(channel, ts_ms, score)`` quality scores (P(good) in
    [0, 1], model version ``"synthetic"``), fed at their event time as
    :func:`pipeline.tools.history.backtest.feed` does and stored in
    ``quality_scores`` (as Float32, the column's type, so a replay reads the
    very numbers the engine saw). Writes through
    :class:`~pipeline.sinks.clickhouse.ClickHouseSink` into ``request_events``,
    ``channel_verdicts`` and ``quality_scores`` (schema must be applied).
    Error classes are resolved with ``policy``'s patterns first, as the worker's decoder does
    (:func:`~pipeline.ingest.error_class.resolve_errors`). Returns the verdicts. Raises the sink's
    errors when a write fails.
    """
    from pipeline.ingest.error_class import resolve_errors
    from pipeline.ingest.structure import resolve_structure
    from pipeline.sinks.clickhouse import ClickHouseSink, quality_row
    from pipeline.tools.history.backtest import ChannelEvents, QualityScores, feed

    engine = Engine(policy)
    resolve_errors(events, engine.policy.classifier)
    sink = ClickHouseSink(client, max_rows=flush_every * 2)
    q = sorted(quality, key=lambda x: x[1])
    scores = QualityScores([c for c, _, _ in q], np.array([t for _, t, _ in q], dtype=np.int64),
                           np.array([x for _, _, x in q], dtype=np.float32).astype(np.float64),
                           ["synthetic"] * len(q)) if q else None
    if scores is not None:
        routes = {e.channel: e.route for e in events}
        sink.add_quality_scores(quality_row(f"{c}-q{i}", t, c, routes.get(c, ""), x, "synthetic", None, None)
                                for i, (c, t, x) in enumerate(zip(scores.channels, scores.ts_ms.tolist(),
                                                                  scores.scores.tolist())))
    chunk = ChannelEvents(list(events), [resolve_structure(e) for e in events], scores)
    verdicts: list[Verdict] = []
    pending = 0
    for result in feed(engine, chunk, batch_size):
        sink.add_events((e, s[0], s[1]) for e, s in zip(result.accepted, result.structure))
        sink.add_verdicts(result.verdicts)
        verdicts.extend(result.verdicts)
        pending += len(result.accepted)
        if pending >= flush_every:
            sink.flush()
            pending = 0
    sink.flush()
    return verdicts


def bench_backtest(client: Any, hours: float = 2.0, channels: int = 100, rate_per_s: float = 1.0,
                   start_ms: int = 1_767_225_600_000) -> dict[str, Any]:
    """Store ``hours`` × ``channels`` of synthetic traffic, backtest it with the default policy, report the speed.

    The issue's figure is 24 h × 100 channels; the default here is a
    reduced form (2 h) so it runs in a minute on a small machine (the replay
    speed per event does not depend on the span). Only events are stored
    (no recorded verdicts). Returns ``events``, ``replay_s``,
    ``replay_cpu_s``, ``events_per_s`` (read from ClickHouse + engine, wall
    clock), ``events_per_cpu_s`` and ``transitions_replayed``.
    Writes into ``client``'s database: use a scratch chDB directory.
    """
    from pipeline.tools.history.backtest import run_backtest

    names = [f"bench/model-{i:03d}" for i in range(channels)]
    end = start_ms + int(hours * H)
    step = H  # generate and store an hour at a time: bounded memory
    for h0 in range(start_ms, end, step):
        _store_events(client, synthetic_events(names, h0, min(end, h0 + step), rate_per_s, seed=h0 // H))
    report = run_backtest(client, PolicyConfig(), start_ms, end)
    out = {k: report[k] for k in ("events", "replay_s", "replay_cpu_s", "events_per_s", "transitions_replayed")}
    out["events_per_cpu_s"] = round(report["events"] / report["replay_cpu_s"]) if report["replay_cpu_s"] else None
    return out


def _store_events(client: Any, events: Sequence[RequestEvent]) -> None:
    from pipeline.sinks.clickhouse import ClickHouseSink

    sink = ClickHouseSink(client, max_rows=len(events) + 1)
    sink.add_events((e, None, None) for e in events)
    sink.flush()
