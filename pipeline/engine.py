"""The detection engine: validated events in, channel-health verdicts out.

Pure Python + numpy, no Kafka, no ClickHouse: the faust agents
(:mod:`pipeline.stream`) and the tests drive the same object, so a day of
traffic replays in seconds. Per batch:

1. events → columns → :class:`~pipeline.windows.store.WindowStore` (event-time
   rings; events later than ``allowed_lateness_ms`` behind the watermark are
   returned as late, for the dead-letter queue);
2. consecutive-failure runs are checked at once (pre-trip, SPEC §4.2);
3. each time the watermark passes a 30 s boundary, every active channel is
   evaluated: detectors → state machine → per-route shares → verdicts.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Sequence

import numpy as np

from pipeline.contracts import FAILURE_STATUSES, RequestEvent, Verdict
from pipeline.detectors import HARD_DETECTORS, SOFT_DETECTORS, ConsecutiveFailures, Finding, ThresholdArrays
from pipeline.ingest.structure import resolve_structure
from pipeline.policy.defaults import PolicyConfig
from pipeline.policy.routes import bounded_shares
from pipeline.policy.state_machine import HALF_OPEN, NO_DATA, OPEN, RECOVERING, ChannelMachine
from pipeline.windows.store import EventColumns, WindowStore

#: States judged only on traffic since the state was entered.
_SINCE_STATES = (HALF_OPEN, RECOVERING)


@dataclass
class BatchResult:
    """What one :meth:`Engine.process` call produced.

    ``verdicts``: published in order; ``late``: events older than the
    watermark minus the allowed lateness (not counted; dead-letter them);
    ``accepted``: the events counted; ``structure``: per accepted event
    ``(parse_ok, missing_fields)`` as resolved for storage.
    """

    verdicts: list[Verdict] = field(default_factory=list)
    late: list[RequestEvent] = field(default_factory=list)
    accepted: list[RequestEvent] = field(default_factory=list)
    structure: list[tuple[bool | None, list[str] | None]] = field(default_factory=list)


class Engine:
    """Windows + detectors + policy for all channels of one worker.

    ``policy``: thresholds and timings (SPEC §4 defaults). ``state_seq``
    continues verdict ``seq`` numbers after a restore.
    """

    def __init__(self, policy: PolicyConfig | None = None):
        self.policy = policy or PolicyConfig()
        self.store = WindowStore(window_ms=self.policy.window_ms, short_window_ms=self.policy.short_window_ms,
                                 baseline_hours=self.policy.baseline_window_ms // 3_600_000)
        self.machines: list[ChannelMachine] = []
        self.seq: list[int] = []
        self.active: dict[str, np.ndarray] = {d.reason: np.zeros(0, bool) for d in SOFT_DETECTORS}
        self.prev_shares: dict[str, np.ndarray] = {}
        #: route → channel → traffic share after the last round (bounded shifts).
        self.shares_by_route: dict[str, dict[str, float]] = {}
        #: Per channel: the next round boundary (event time, ms; 0 = not yet scheduled).
        self.next_eval = np.zeros(0, np.int64)
        self.low_watermark_ms: int | None = None
        self.last_eval_ms: int | None = None
        self._th: ThresholdArrays | None = None
        self.fail_since_eval = np.zeros(0, np.float64)
        self.late_count = 0

    # -- ingestion ----------------------------------------------------------
    def _columns(self, events: Sequence[RequestEvent],
                 structure: Sequence[tuple[bool | None, list[str] | None]]) -> EventColumns:
        idx = self.store.channel_index
        channel = np.fromiter((idx(e.channel, e.route, e.tier) for e in events), np.int64, len(events))
        status = [e.status for e in events]
        outcome = np.fromiter((1 if s in FAILURE_STATUSES else (0 if s == "ok" else -1) for s in status),
                              np.int8, len(events))
        checked = np.fromiter((s[0] is not None for s in structure), bool, len(events))
        missing = np.fromiter((s[0] is False or bool(s[1]) for s in structure), bool, len(events))
        self._grow(self.store.n_channels)
        return EventColumns(
            channel=channel,
            ts_ms=np.fromiter((e.ts_ms for e in events), np.int64, len(events)),
            outcome=outcome,
            ok=outcome == 0,
            latency_ms=np.fromiter((e.latency_ms for e in events), np.float64, len(events)),
            checked=checked,
            missing=missing,
            rate_limited=np.fromiter((s == "rate_limited" for s in status), bool, len(events)),
        )

    def _grow(self, n: int) -> None:
        while len(self.machines) < n:
            self.machines.append(ChannelMachine())
            self.seq.append(0)
            self._th = None
        for k, arr in self.active.items():
            if arr.shape[0] < n:
                self.active[k] = np.concatenate([arr, np.zeros(n - arr.shape[0], bool)])
        if self.fail_since_eval.shape[0] < n:
            self.fail_since_eval = np.concatenate([self.fail_since_eval, np.zeros(n - self.fail_since_eval.shape[0])])
        if self.next_eval.shape[0] < n:
            self.next_eval = np.concatenate([self.next_eval, np.zeros(n - self.next_eval.shape[0], np.int64)])

    def thresholds(self) -> ThresholdArrays:
        """Per-channel thresholds (rebuilt when channels are added)."""
        if self._th is None or self._th.values["consecutive_failures"].shape[0] != self.store.n_channels:
            per = [self.policy.thresholds(n, t) for n, t in zip(self.store.names, self.store.tiers)]
            self._th = ThresholdArrays.build(per)
        return self._th

    def process(self, events: Sequence[RequestEvent],
                structure: Sequence[tuple[bool | None, list[str] | None]] | None = None,
                low_watermark_ms: int | None = None) -> BatchResult:
        """Ingest a batch of validated events (any order); return verdicts and late events.

        ``structure`` optionally gives ``(parse_ok, missing_fields)`` per
        event; by default it is resolved with
        :func:`pipeline.ingest.structure.resolve_structure`.

        Event time is kept per channel (a channel's events come in order from
        one partition, however far partitions drift apart during a backlog
        replay): a batch is split at 30 s round boundaries and fed in
        event-time order; before a chunk's events are added, each of its
        channels is evaluated at every round boundary up to the chunk, so a
        round sees exactly the channel's events before it. An event is late
        when it is more than ``allowed_lateness_ms`` older than its
        channel's newest event.

        ``low_watermark_ms``: event time up to which *all* input has been
        seen (with Kafka: the minimum over partitions). Channels without
        events are evaluated up to it (that is how ``no_data`` is noticed);
        0 means not known yet (channels advance only with their own events).
        None means the batches form one stream in event-time order, so each
        chunk's start is itself the low watermark.
        """
        result = BatchResult()
        if not events:
            return result
        if structure is None:
            structure = [resolve_structure(e) if e.status == "ok" else (None, None) for e in events]
        step = self.policy.eval_interval_ms
        pairs = list(zip(events, structure))
        if min(e.ts_ms for e in events) // step != max(e.ts_ms for e in events) // step:
            pairs.sort(key=lambda p: p[0].ts_ms)
        start = 0
        while start < len(pairs):
            bucket = pairs[start][0].ts_ms // step
            end = start + 1
            while end < len(pairs) and pairs[end][0].ts_ms // step == bucket:
                end += 1
            if low_watermark_ms is None:
                result.verdicts.extend(self.advance(bucket * step))
            self._process_chunk([p[0] for p in pairs[start:end]], [p[1] for p in pairs[start:end]], result)
            start = end
        if low_watermark_ms:
            result.verdicts.extend(self.advance(low_watermark_ms))
        return result

    def _process_chunk(self, events: list[RequestEvent], structure: list, result: BatchResult) -> None:
        cols = self._columns(events, structure)
        newest = self.store.last_ts_ms[cols.channel]
        late_mask = cols.ts_ms < newest - self.policy.allowed_lateness_ms
        if late_mask.any():
            result.late.extend(e for e, l in zip(events, late_mask) if l)
            self.late_count += int(late_mask.sum())
            keep = ~late_mask
            events = [e for e, k in zip(events, keep) if k]
            structure = [x for x, k in zip(structure, keep) if k]
            cols = cols.take(keep)
            if not events:
                return
        rows = np.unique(cols.channel)
        result.verdicts.extend(self._evaluate_until(rows, int(cols.ts_ms.min())))
        th = self.thresholds().consecutive_failures.copy()
        for c, m in enumerate(self.machines[: th.shape[0]]):
            if m.state == HALF_OPEN:  # SPEC §4: any failure run sends a probing channel back
                th[c] = min(th[c], self.policy.half_open_failure_run)
        late, run_ch, run_max = self.store.add(cols, th)
        crossed = self.store.runs.crossed_at
        if late.any():  # too old for the ring although within lateness: count as late too
            result.late.extend(e for e, l in zip(events, late) if l)
            self.late_count += int(late.sum())
        result.accepted.extend(e for e, l in zip(events, late) if not l)
        result.structure.extend(s for s, l in zip(structure, late) if not l)
        np.add.at(self.fail_since_eval, cols.channel, (cols.outcome == 1).astype(np.float64))
        result.verdicts.extend(self._pretrip(cols, run_ch, crossed, th))

    def _pretrip(self, cols: EventColumns, run_ch: np.ndarray, crossed: np.ndarray,
                 threshold: np.ndarray) -> list[Verdict]:
        """SPEC §4.2: a failure run opens the circuit at the event that completed it."""
        out = []
        for c, idx in zip(run_ch.tolist(), crossed.tolist()):
            if idx < 0:
                continue
            m = self.machines[c]
            if m.state == OPEN:
                continue
            now = int(cols.ts_ms[idx])
            m.add_penalty(self.policy.penalty_per_run, now, self.policy)
            if m.trip(now, ["consecutive_failures"]):
                out.append(self._verdict(c, now, {"consecutive_failures": float(threshold[c]),
                                                  "consecutive_failures_threshold": float(threshold[c])}))
        return out

    # -- evaluation ---------------------------------------------------------
    def advance(self, now_ms: int) -> list[Verdict]:
        """Evaluate every channel at each round boundary <= ``now_ms`` it has not had yet."""
        c = self.store.n_channels
        self.low_watermark_ms = now_ms if self.low_watermark_ms is None else max(self.low_watermark_ms, now_ms)
        if c == 0:
            return []
        return self._evaluate_until(np.arange(c), now_ms)

    def _evaluate_until(self, rows: np.ndarray, now_ms: int) -> list[Verdict]:
        """Rounds for channels ``rows`` at their due boundaries up to ``now_ms``, oldest first."""
        step = self.policy.eval_interval_ms
        ne = self.next_eval[rows]
        unset = ne <= 0
        if unset.any():  # first sight: the first round is the boundary after now
            ne[unset] = (now_ms // step + 1) * step
        # A channel far behind (idle for long): one round just before now is enough to catch up.
        jump = now_ms - ne > self.policy.no_data_after_ms + step
        if jump.any():
            ne[jump] = (now_ms - self.policy.no_data_after_ms) // step * step
        out: list[Verdict] = []
        while rows.size:
            t = int(ne.min())
            if t > now_ms:
                break
            due = ne == t
            out.extend(self.evaluate(t, rows[due]))
            ne[due] += step
        self.next_eval[rows] = ne
        return out

    def evaluate(self, now_ms: int, rows: np.ndarray | None = None) -> list[Verdict]:
        """One evaluation round at event time ``now_ms`` for channels ``rows`` (default: all)."""
        c = self.store.n_channels
        if c == 0:
            return []
        rows = np.arange(c) if rows is None else np.asarray(rows, dtype=np.int64)
        cfg = self.policy
        th_all = self.thresholds()
        th = ThresholdArrays({k: v[rows] for k, v in th_all.values.items()})
        since = np.array([self.machines[i].entered_ms if self.machines[i].state in _SINCE_STATES
                          else np.iinfo(np.int64).min // 2 for i in rows], dtype=np.int64)
        view = self.store.view(now_ms, since_ms=since, rows=rows)
        n = rows.shape[0]
        hard = [d.detect(view, th, np.zeros(n, bool)) for d in HARD_DETECTORS]
        soft = []
        for d in SOFT_DETECTORS:
            f = d.detect(view, th, self.active[d.reason][rows])
            self.active[d.reason][rows] = f.fired
            soft.append(f)
        last_ts = self.store.last_ts_ms[rows]
        changed = np.zeros(n, bool)
        for j, i in enumerate(rows.tolist()):
            m = self.machines[i]
            if m.state == NO_DATA and (now_ms - last_ts[j] >= cfg.no_data_after_ms) and m.reasons == ["no_data"]:
                continue  # idle and already reported
            if m.state not in (OPEN, HALF_OPEN):
                m.add_penalty(cfg.penalty_per_failure * self.fail_since_eval[i], now_ms, cfg)
            h = [f.reason for f in hard if f.fired[j]]
            if m.state == OPEN:
                h = []  # cooldown runs from the first trip; probes judge it later
            s = [f.reason for f in soft if f.fired[j]]
            changed[j] = m.step(now_ms, h, s, view.judged_5m[j], view.failures_5m[j],
                                int(last_ts[j]) if last_ts[j] > 0 else None, cfg,
                                self.policy.thresholds(self.store.names[i], self.store.tiers[i]))
            if m.state == HALF_OPEN and changed[j]:
                self.store.runs.reset(i)
        self.fail_since_eval[rows] = 0.0
        shares = self._route_shares(c)
        self.last_eval_ms = now_ms
        out = []
        for j, i in enumerate(rows.tolist()):
            m = self.machines[i]
            if m.state == NO_DATA and not changed[j]:
                continue
            metrics = {k: v[j] for f in (*hard, *soft) for k, v in f.metrics.items()}
            metrics["route_share"] = shares[i]
            metrics["penalty"] = round(m.penalty, 4)
            out.append(self._verdict(i, now_ms, metrics))
        return out

    def _route_shares(self, c: int) -> np.ndarray:
        shares = np.zeros(c)
        routes: dict[str, list[int]] = {}
        for i, r in enumerate(self.store.routes[:c]):
            routes.setdefault(r, []).append(i)
        for r, idx in routes.items():
            w = np.array([self.machines[i].weight for i in idx])
            s = bounded_shares(w, self.prev_shares.get(r), self.policy.max_share_growth)
            self.prev_shares[r] = s
            self.shares_by_route[r] = {self.store.names[i]: float(x) for i, x in zip(idx, s)}
            shares[idx] = s
        return shares

    def _verdict(self, i: int, now_ms: int, metrics: dict) -> Verdict:
        m = self.machines[i]
        self.seq[i] += 1
        clean = {}
        for k, v in metrics.items():
            v = float(v) if isinstance(v, (np.floating, np.integer, float, int)) else v
            clean[k] = None if isinstance(v, float) and not np.isfinite(v) else (round(v, 4) if isinstance(v, float) else v)
        return Verdict(channel=self.store.names[i], route=self.store.routes[i], state=m.state,  # type: ignore[arg-type]
                       weight=float(m.weight), reasons=list(m.reasons), metrics=clean, ts_ms=now_ms, seq=self.seq[i])

    def route_weights(self) -> dict[str, dict[str, float]]:
        """Current recommended weights: route → channel → weight."""
        out: dict[str, dict[str, float]] = {}
        for i, name in enumerate(self.store.names):
            out.setdefault(self.store.routes[i], {})[name] = self.machines[i].weight
        return out


def replay(events: Iterable[dict], policy: PolicyConfig | None = None, batch_size: int = 500,
           engine: Engine | None = None) -> tuple[Engine, list[Verdict]]:
    """Feed JSON-ready event dicts through an :class:`Engine` (default: a fresh one) in batches.

    ``events`` is consumed lazily, so a generator may read the engine's
    state (e.g. :attr:`Engine.shares_by_route`) to close the routing loop.
    Returns the engine and every verdict in publication order.
    """
    import msgspec

    engine = engine or Engine(policy)
    verdicts: list[Verdict] = []
    batch: list[RequestEvent] = []
    for e in events:
        batch.append(msgspec.convert(e, RequestEvent))
        if len(batch) >= batch_size:
            verdicts.extend(engine.process(batch).verdicts)
            batch = []
    if batch:
        verdicts.extend(engine.process(batch).verdicts)
    return engine, verdicts
