"""Backtest: replay stored request events through the engine with a candidate policy (issue #22 item 1).

Offline: events are read from ClickHouse (``request_events``, deduplicated with
``FINAL``) in event-time order and fed to a fresh :class:`~pipeline.engine.Engine`
in batches; no Kafka, no age check (the replay takes its own event-time
clock, SPEC §7, so data older than ``CHANNEL_HEALTH_MAX_EVENT_AGE`` works).
The replayed verdicts are compared with the recorded ones
(``channel_verdicts``) on ``[from_ms, to_ms)``.

Warm-up: the engine needs its 24 h latency baseline and the channels' state
before ``from_ms``, so the replay starts ``warmup_ms`` earlier (default: the
policy's baseline window, clipped to the first stored event) and only
verdicts at or after ``from_ms`` are compared. The state at ``from_ms`` (the
last verdict before it) is the start of each channel's transition list, for
recording and replay alike. The replay reproduces the recording exactly
when it starts where the recording's worker started (a warm-up that covers
the first stored event) or once the state has converged (a warm-up longer
than the baseline window and any incident open at its start).

Quality scores (SPEC §4.5) are replayed from ``quality_scores`` at their
events' time (:func:`feed`); the worker's quality agent scores
asynchronously, so a recorded ``quality`` transition can differ by a round.
Not replayed: operator overrides.

Error classes (SPEC §4.1): each stored event's ``error_class`` (what the
worker resolved with its policy's ``[error_classes.<provider>]`` patterns) is
replayed as stored, with ``error_message``, ``retry_after_s`` and ``account``;
a failed event stored without a class (a row written before
``infra/clickhouse/014_error_fields.sql``) is classified from its
``http_status`` / ``error_type`` / message with the candidate policy's
patterns (:func:`replay_chunks`).

Transitions: a verdict whose state differs from the channel's previous
state. Matching (``transitions_matching``): same channel, same new state,
same evaluation round (``ts_ms // eval_interval_ms``; a pre-trip in the
middle of a round counts in the round it happened in).
"""

from __future__ import annotations

import gc
import time
from concurrent.futures import ThreadPoolExecutor
from collections import Counter, defaultdict
from contextlib import contextmanager
from dataclasses import dataclass, field
from itertools import repeat
from operator import itemgetter
from typing import Any, Iterable, Iterator, Sequence

import numpy as np

from pipeline.contracts import RequestEvent
from pipeline.engine import Engine
from pipeline.ingest.error_class import resolve_errors
from pipeline.policy.defaults import PolicyConfig
from pipeline.storage import DATABASE
from pipeline.tools.history.incidents import Incident, list_incidents

#: States that count as a detection (and, on a clean period, as a false verdict); ``no_data`` is neither:
#: it says the channel sent nothing, not that it is unhealthy.
NON_HEALTHY: frozenset[str] = frozenset({"degraded", "open", "half_open", "recovering"})
STATES: tuple[str, ...] = ("healthy", "degraded", "open", "half_open", "recovering", "no_data")

#: Event-time span read from ClickHouse per query (bounds memory; 1 h of 100 channels at 10 req/s is 3.6 M rows).
READ_CHUNK_MS = 3_600_000
#: Events per :meth:`Engine.process` call.
BATCH_EVENTS = 5_000

# Column order = RequestEvent's positional field order up to quota_remaining (see pipeline.contracts), then
# the structure flags, then the error fields (RequestEvent's last four; the five fields between are None).
# http_status / error_type only where no class was stored (rows before 014): what classifies them.
# Read in the table's sorting-key order (ClickHouse reads it in order, 2-3x faster than ORDER BY ts), then
# merged by event time with a stable sort: deterministic (channel, event_id order within one millisecond).
_EVENT_SQL = (
    "SELECT event_id, toUnixTimestamp64Milli(ts), channel, route, status, latency_ms, NULL, NULL,"
    " tier, if(error_class = '' AND status != 'ok', http_status, NULL),"
    " if(error_class = '' AND status != 'ok', error_type, NULL), ttft_ms, max_stream_gap_ms, input_tokens,"
    " output_tokens, cost_usd, quota_remaining, parse_ok, missing_fields,"
    f" error_message, retry_after_s, account, nullIf(error_class, '') FROM {DATABASE}.request_events FINAL"
    " WHERE ts >= fromUnixTimestamp64Milli({{f:Int64}}, 'UTC') AND ts < fromUnixTimestamp64Milli({{t:Int64}}, 'UTC')"
    " {channels} ORDER BY channel, ts, event_id"
)
#: Stored columns not read (NULL above): identification and detail fields no detector reads (SPEC §4);
#: skipping them saves about a fifth of the read time. ``http_status`` / ``error_type`` are read only for
#: a failed event stored without an error class (to classify it).
NOT_READ: tuple[str, ...] = ("gateway_id", "trace_id")
#: RequestEvent fields between ``quota_remaining`` and ``error_message`` (positional None when read).
_BETWEEN = 5
_SCORES_SQL = (
    f"SELECT channel, toUnixTimestamp64Milli(ts), score, model_version FROM {DATABASE}.quality_scores FINAL"
    " WHERE ts >= fromUnixTimestamp64Milli({{f:Int64}}, 'UTC') AND ts < fromUnixTimestamp64Milli({{t:Int64}}, 'UTC')"
    " {channels} ORDER BY channel, ts, event_id, model_version"
)
_NOT_CHECKED: tuple[None, None] = (None, None)


class BacktestError(ValueError):
    """A backtest that cannot run (bad span, no stored events); the message says what to change."""


@dataclass(frozen=True)
class Transition:
    """A state change of one channel at event time ``ts_ms`` (UTC epoch ms), in round ``ts_ms // eval_interval``."""

    channel: str
    ts_ms: int
    from_state: str
    to_state: str
    round: int


@dataclass
class Timeline:
    """One channel's verdict states as ``(ts_ms, state)`` in order, and its state just before the window."""

    start_state: str | None = None
    points: list[tuple[int, str]] = field(default_factory=list)


@dataclass
class QualityScores:
    """Stored quality scores (SPEC §4.5) in event-time order: channel, event time (ms), P(good), model version."""

    channels: list[str]
    ts_ms: np.ndarray
    scores: np.ndarray
    versions: list[str]


@dataclass
class ChannelEvents:
    """Stored events of a span in event-time order with their ``(parse_ok, missing_fields)`` structure,
    and the quality scores of the same span (None: not read)."""

    events: list[RequestEvent]
    structure: list[tuple[bool | None, list[str] | None]]
    quality: QualityScores | None = None


def read_events(client: Any, from_ms: int, to_ms: int, channels: Sequence[str] | None = None,
                chunk_ms: int = READ_CHUNK_MS) -> Iterator[ChannelEvents]:
    """Yield the stored events of ``[from_ms, to_ms)`` in event-time order, one chunk per ``chunk_ms``.

    ``channels``: only these (all when None/empty). Rows are read with
    ``FINAL`` (one row per ``event_id``). The structure check stored with an
    event (``parse_ok``, ``missing_fields``) comes back as the engine's
    ``structure`` tuple, so answers are judged exactly as the worker judged them.
    The columns in :data:`NOT_READ` come back as None; the error fields (``error_message``,
    ``retry_after_s``, ``account``, ``error_class``) as stored. Each chunk carries
    the stored quality scores of its span (``quality``; None when there are none).
    """
    where = "AND channel IN {ch:Array(String)}" if channels else ""
    sql = _EVENT_SQL.format(channels=where)
    score_sql = _SCORES_SQL.format(channels=where)
    start = from_ms
    while start < to_ms:
        end = min(to_ms, start + chunk_ms)
        params: dict[str, Any] = {"f": start, "t": end}
        if channels:
            params["ch"] = list(channels)
        cols = client.query(sql, parameters=params).result_columns
        start = end
        if not cols or not cols[0]:
            continue
        events = list(map(RequestEvent, *cols[:17], *([repeat(None)] * _BETWEEN), *cols[19:23]))
        structure = [_NOT_CHECKED if p is None else (bool(p), list(m)) for p, m in zip(cols[17], cols[18])]
        ts = np.asarray(cols[1], dtype=np.int64)
        if ts.size > 1 and (ts[1:] < ts[:-1]).any():
            pick = itemgetter(*np.argsort(ts, kind="stable").tolist())  # one C call per list
            events = list(pick(events))
            structure = list(pick(structure))
        yield ChannelEvents(events, structure, _scores(client.query(score_sql, parameters=params).result_columns))


def _scores(cols: Sequence[Sequence[Any]]) -> QualityScores | None:
    if not cols or not cols[0]:
        return None
    ts = np.asarray(cols[1], dtype=np.int64)
    order = np.argsort(ts, kind="stable")
    pick = order.tolist()
    return QualityScores([cols[0][i] for i in pick], ts[order], np.asarray(cols[2], dtype=np.float64)[order],
                         [cols[3][i] for i in pick])


def feed(engine: Engine, chunk: ChannelEvents, batch_events: int = BATCH_EVENTS) -> Iterator[Any]:
    """Process one chunk (event-time order); yield each :class:`~pipeline.engine.BatchResult`.

    With quality scores, batches are cut at every evaluation boundary and a
    round's scores (event time before the boundary) are added after its
    events, as :func:`pipeline.engine.replay.replay` does with a scorer: each
    round sees the scores of all events before it. The live worker scores
    asynchronously, so a recorded ``quality`` verdict may come a round later
    than the replayed one.
    """
    ev, st, q = chunk.events, chunk.structure, chunk.quality
    if q is None:
        for i in range(0, len(ev), batch_events):
            batch = ev[i:i + batch_events]
            yield engine.process(batch, st[i:i + batch_events], fields=engine.read_fields(batch))
        return
    step = engine.policy.eval_interval_ms
    bucket = np.fromiter((e.ts_ms for e in ev), np.int64, len(ev)) // step
    cuts = [0, *(np.flatnonzero(bucket[1:] != bucket[:-1]) + 1).tolist(), len(ev)]
    j = 0
    for a, b in zip(cuts[:-1], cuts[1:]):
        for i in range(a, b, batch_events):
            batch = ev[i:min(b, i + batch_events)]
            yield engine.process(batch, st[i:min(b, i + batch_events)], fields=engine.read_fields(batch))
        k = int(np.searchsorted(q.ts_ms, (int(bucket[a]) + 1) * step, "left"))
        _add_scores(engine, q, j, k)
        j = k
    _add_scores(engine, q, j, len(q.channels))


def _add_scores(engine: Engine, q: QualityScores, j: int, k: int) -> None:
    """Scores ``j:k`` of ``q`` into the engine, one call per run of the same model version."""
    while j < k:
        v = q.versions[j]
        e = j + 1
        while e < k and q.versions[e] == v:
            e += 1
        engine.add_quality_scores(q.channels[j:e], q.ts_ms[j:e], q.scores[j:e], v)
        j = e


def stored_span(client: Any, channels: Sequence[str] | None = None) -> tuple[int, int] | None:
    """``(first, last)`` event time (UTC epoch ms) of the stored events, or None when there are none."""
    where = "WHERE channel IN {ch:Array(String)}" if channels else ""
    row = client.query(
        f"SELECT count(), toUnixTimestamp64Milli(min(ts)), toUnixTimestamp64Milli(max(ts))"
        f" FROM {DATABASE}.request_events {where}",
        parameters={"ch": list(channels)} if channels else None,
    ).result_rows[0]
    return None if not row[0] else (int(row[1]), int(row[2]))


def recorded_timelines(client: Any, from_ms: int, to_ms: int,
                       channels: Sequence[str] | None = None) -> dict[str, Timeline]:
    """The recorded verdict states per channel on ``[from_ms, to_ms)``, with the last state before ``from_ms``."""
    where = "AND channel IN {ch:Array(String)}" if channels else ""
    params: dict[str, Any] = {"f": from_ms, "t": to_ms}
    if channels:
        params["ch"] = list(channels)
    out: dict[str, Timeline] = defaultdict(Timeline)
    before = client.query(
        f"SELECT channel, argMax(state, (ts, seq)) FROM {DATABASE}.channel_verdicts FINAL"
        f" WHERE ts < fromUnixTimestamp64Milli({{f:Int64}}, 'UTC') {where} GROUP BY channel",
        parameters=params,
    ).result_rows
    for channel, state in before:
        out[str(channel)].start_state = str(state)
    rows = client.query(
        f"SELECT channel, toUnixTimestamp64Milli(ts), state FROM {DATABASE}.channel_verdicts FINAL"
        " WHERE ts >= fromUnixTimestamp64Milli({f:Int64}, 'UTC') AND ts < fromUnixTimestamp64Milli({t:Int64}, 'UTC')"
        f" {where} ORDER BY channel, ts, seq",
        parameters=params,
    ).result_rows
    for channel, ts, state in rows:
        out[str(channel)].points.append((int(ts), str(state)))
    return dict(out)


def prefetched(chunks: Iterator[ChannelEvents]) -> Iterator[ChannelEvents]:
    """Yield ``chunks`` while the next one is read in a background thread (reading overlaps the replay).

    Only that thread advances ``chunks``; its exceptions are raised here.
    """
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="backtest-read") as pool:
        pending = pool.submit(next, chunks, None)
        while (item := pending.result()) is not None:
            pending = pool.submit(next, chunks, None)
            yield item


@dataclass
class ReplayResult:
    """Replayed timelines on ``[from_ms, to_ms)`` and what the replay cost.

    ``seconds``: wall clock; ``cpu_seconds``: CPU time of this process (all
    threads, chDB's included), which a busy shared machine does not inflate.
    """

    timelines: dict[str, Timeline]
    events: int
    seconds: float
    cpu_seconds: float = 0.0

    @property
    def events_per_s(self) -> float:
        """Replay speed (events read and processed per wall-clock second)."""
        return self.events / self.seconds if self.seconds > 0 else float("inf")


@contextmanager
def collector_paused() -> Iterator[None]:
    """Pause CPython's cyclic garbage collector for the block (restored after, also on error).

    A replay allocates millions of short-lived objects (decoded column values,
    events, verdicts): with the default thresholds the collector walks the
    young objects every 700 allocations and the read's lists every few
    generations, though none of them is in a reference cycle (reference
    counting frees them). Memory stays bounded by the read chunk.
    """
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def replay_chunks(chunks: Iterable[ChannelEvents], policy: PolicyConfig, from_ms: int, to_ms: int,
                  batch_events: int = BATCH_EVENTS) -> ReplayResult:
    """Feed event chunks (event-time order) through a fresh engine; keep the verdicts' states per channel.

    Verdicts before ``from_ms`` only set each channel's start state; verdicts
    at or after ``to_ms`` are dropped. Events are not validated again (they
    were when stored); a failed event without an error class gets one from
    ``policy.classifier`` (module docstring), a stored class is kept.
    """
    engine = Engine(policy)
    out: dict[str, Timeline] = defaultdict(Timeline)
    n = 0
    t0, c0 = time.perf_counter(), time.process_time()
    with collector_paused():
        for chunk in chunks:
            resolve_errors(chunk.events, policy.classifier)
            for result in feed(engine, chunk, batch_events):
                for v in result.verdicts:
                    if v.ts_ms < from_ms:
                        out[v.channel].start_state = v.state
                    elif v.ts_ms < to_ms:
                        out[v.channel].points.append((v.ts_ms, v.state))
            n += len(chunk.events)
    # Rounds due up to the end of the window (channels whose last events came earlier).
    for v in engine.advance(to_ms - 1):
        if from_ms <= v.ts_ms < to_ms:
            out[v.channel].points.append((v.ts_ms, v.state))
    return ReplayResult(dict(out), n, time.perf_counter() - t0, time.process_time() - c0)


def transitions(channel: str, timeline: Timeline, step_ms: int) -> list[Transition]:
    """State changes of one timeline (the first verdict is one when it differs from the start state).

    A channel with no verdict before the window starts ``healthy`` (every channel does).
    """
    out, prev = [], timeline.start_state or "healthy"
    for ts, state in timeline.points:
        if state != prev:
            out.append(Transition(channel, ts, prev, state, ts // step_ms))
            prev = state
    return out


def time_in_states(timeline: Timeline, from_ms: int, to_ms: int) -> dict[str, int]:
    """Milliseconds per state on ``[from_ms, to_ms)``: a state holds from its verdict to the next.

    Before the first verdict the start state holds (nothing is counted for a
    channel with neither).
    """
    out: dict[str, int] = {}
    state, since = timeline.start_state, from_ms
    for ts, s in timeline.points:
        if state is not None and ts > since:
            out[state] = out.get(state, 0) + ts - since
        state, since = s, max(since, ts)
    if state is not None and to_ms > since:
        out[state] = out.get(state, 0) + to_ms - since
    return out


def first_detection(timeline: Timeline, incident: Incident, grace_ms: int) -> int | None:
    """Event time of the first non-healthy verdict in ``[incident.from_ms, incident.to_ms + grace_ms)``, or None."""
    for ts, state in timeline.points:
        if incident.from_ms <= ts < incident.to_ms + grace_ms and state in NON_HEALTHY:
            return ts
    return None


def clean_violations(timeline: Timeline, period: Incident) -> tuple[int, int]:
    """``(non-healthy verdicts, non-healthy ms)`` of a timeline on a clean period."""
    inside = Timeline(start_state=None, points=[])
    prev = timeline.start_state
    for ts, s in timeline.points:
        if ts < period.from_ms:
            prev = s
        elif ts < period.to_ms:
            inside.points.append((ts, s))
    inside.start_state = prev
    verdicts = sum(1 for _, s in inside.points if s in NON_HEALTHY)
    ms = sum(v for k, v in time_in_states(inside, period.from_ms, period.to_ms).items() if k in NON_HEALTHY)
    return verdicts, ms


def compare(recorded: dict[str, Timeline], replayed: dict[str, Timeline], incidents: Sequence[Incident],
            from_ms: int, to_ms: int, step_ms: int, grace_ms: int) -> dict[str, Any]:
    """The backtest report (a JSON-ready dict) of recorded vs replayed timelines.

    Keys: ``transitions_recorded``, ``transitions_replayed``,
    ``transitions_matching``, ``channels`` (per channel: time in each state
    in ms, transition counts, ``gained`` / ``lost`` transitions as
    ``[ts_ms, from, to]``), ``incidents`` (first detection recorded and
    replayed, delay in ms), ``clean_periods`` (non-healthy verdicts and ms).
    """
    report: dict[str, Any] = {"from_ms": from_ms, "to_ms": to_ms, "eval_interval_ms": step_ms}
    totals = Counter()
    channels: dict[str, Any] = {}
    for ch in sorted(set(recorded) | set(replayed)):
        rec = transitions(ch, recorded.get(ch, Timeline()), step_ms)
        rep = transitions(ch, replayed.get(ch, Timeline()), step_ms)
        key = lambda t: (t.to_state, t.round)  # noqa: E731
        rc, pc = Counter(map(key, rec)), Counter(map(key, rep))
        match = sum((rc & pc).values())
        lost_keys, gained_keys = rc - pc, pc - rc
        lost = [[t.ts_ms, t.from_state, t.to_state] for t in rec if lost_keys[key(t)] > 0]
        gained = [[t.ts_ms, t.from_state, t.to_state] for t in rep if gained_keys[key(t)] > 0]
        totals.update(recorded=len(rec), replayed=len(rep), matching=match)
        channels[ch] = {
            "transitions_recorded": len(rec), "transitions_replayed": len(rep), "transitions_matching": match,
            "time_in_state_ms_recorded": time_in_states(recorded.get(ch, Timeline()), from_ms, to_ms),
            "time_in_state_ms_replayed": time_in_states(replayed.get(ch, Timeline()), from_ms, to_ms),
            "gained": gained, "lost": lost,
        }
    report.update(transitions_recorded=totals["recorded"], transitions_replayed=totals["replayed"],
                  transitions_matching=totals["matching"], channels=channels)
    inc, clean = [], []
    for i in incidents:
        rec_tl, rep_tl = recorded.get(i.channel, Timeline()), replayed.get(i.channel, Timeline())
        if i.is_clean:
            rv, rms = clean_violations(rec_tl, i)
            pv, pms = clean_violations(rep_tl, i)
            clean.append({"incident_id": i.incident_id, "channel": i.channel, "from_ms": i.from_ms, "to_ms": i.to_ms,
                          "non_healthy_verdicts_recorded": rv, "non_healthy_ms_recorded": rms,
                          "non_healthy_verdicts_replayed": pv, "non_healthy_ms_replayed": pms})
        else:
            r, p = first_detection(rec_tl, i, grace_ms), first_detection(rep_tl, i, grace_ms)
            inc.append({"incident_id": i.incident_id, "channel": i.channel, "kind": i.kind, "from_ms": i.from_ms,
                        "to_ms": i.to_ms, "detected_recorded_ms": r, "detected_replayed_ms": p,
                        "delay_recorded_ms": None if r is None else r - i.from_ms,
                        "delay_replayed_ms": None if p is None else p - i.from_ms})
    report.update(incidents=inc, clean_periods=clean)
    return report


def run_backtest(client: Any, policy: PolicyConfig, from_ms: int, to_ms: int,
                 channels: Sequence[str] | None = None, warmup_ms: int | None = None,
                 keep_timelines: bool = False) -> dict[str, Any]:
    """Backtest ``policy`` on the stored data of ``[from_ms, to_ms)``; return :func:`compare`'s report.

    ``warmup_ms``: replayed before ``from_ms`` and not compared (default: the
    policy's ``baseline_window_ms``); the replay never starts before the
    first stored event. Reading overlaps the replay (:func:`prefetched`).
    The report adds ``events``, ``replay_s``, ``replay_cpu_s``,
    ``events_per_s`` (wall clock), ``replay_from_ms``; with ``keep_timelines``
    also ``timelines``: ``{"recorded"|"replayed": {channel: Timeline}}`` (not
    JSON-ready; the HTML view draws them, :mod:`.backtest_html`).

    Raises :class:`BacktestError` when ``from_ms >= to_ms`` or no event is
    stored in the span (the message says where it looked).
    """
    if from_ms >= to_ms:
        raise BacktestError(f"--from must be before --to (got {from_ms} >= {to_ms} epoch ms)")
    warm = policy.baseline_window_ms if warmup_ms is None else warmup_ms
    span = stored_span(client, channels)
    if span is None or span[0] >= to_ms or span[1] < from_ms - warm:
        which = f" for channels {', '.join(channels)}" if channels else ""
        raise BacktestError(f"no stored request events{which} between {from_ms - warm} and {to_ms} (epoch ms, "
                            "warm-up included); check --from/--to and CHANNEL_HEALTH_CLICKHOUSE_URL")
    start = max(span[0], from_ms - warm)
    result = replay_chunks(prefetched(read_events(client, start, to_ms, channels)), policy, from_ms, to_ms)
    recorded = recorded_timelines(client, from_ms, to_ms, channels)
    incidents = list_incidents(client, from_ms, to_ms, channels)
    report = compare(recorded, result.timelines, incidents, from_ms, to_ms, policy.eval_interval_ms,
                     grace_ms=policy.window_ms)
    report.update(events=result.events, replay_s=round(result.seconds, 3), replay_cpu_s=round(result.cpu_seconds, 3),
                  events_per_s=round(result.events_per_s), replay_from_ms=start)
    if keep_timelines:
        report["timelines"] = {"recorded": recorded, "replayed": result.timelines}
    return report
