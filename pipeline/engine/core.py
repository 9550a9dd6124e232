"""The detection engine: validated events in, channel-health verdicts out.

Pure Python + numpy, no Kafka, no ClickHouse: the faust agents
(:mod:`pipeline.stream`) and the tests drive the same object, so a day of
traffic replays in seconds. Event time is kept per channel. Per batch, in
event-time order, split at the 30 s round boundaries:

1. each channel is evaluated at every round boundary it reached before its
   new events are added (detectors → state machine → per-route shares →
   verdicts), so a round sees exactly the events before it;
2. events → columns → :class:`~pipeline.windows.store.WindowStore` (event-time
   rings; an event more than ``allowed_lateness_ms`` older than its channel's
   newest event is returned as late, for the dead-letter queue);
3. consecutive-failure runs are checked at once (pre-trip, SPEC §4.2);
4. channels without events are evaluated up to the low watermark (all input
   seen up to there), which is how ``no_data`` is noticed; ``no_data`` is
   published on the transition, then every ``no_data_heartbeat_ms``.
   A channel whose events keep coming but stamped behind the low watermark
   (a gateway clock running slow) is evaluated on its own event time instead
   (see :meth:`Engine.advance`).

Bounded state (SPEC §8): idle channels are evicted, new ones over the
limit refused (:mod:`pipeline.engine.residency`).

The engine's named parts, each holding its own state: ``routes``
(:class:`~pipeline.engine.route_shares.RouteShares`), ``quality``
(:class:`~pipeline.engine.quality_scores.QualityScores`), ``residency``
(:class:`~pipeline.engine.residency.Residency`), ``state``
(:class:`~pipeline.engine.state_io.StateIO`, per-channel state in and out) and ``classes``
(:class:`~pipeline.engine.error_classes.ErrorClasses`, what an error class does: SPEC §4.1) and
``suspects`` (:class:`~pipeline.engine.suspects.Suspects`: a share moved away on a short failure run).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import compress
from operator import attrgetter
from typing import Callable, Mapping, Sequence, cast

import numpy as np

from pipeline.config import StateLimits
from pipeline.contracts import SUSPECT_METRIC, RequestEvent, Verdict
from pipeline.signals import SIGNALS, Signal, ThresholdArrays
from pipeline.policy.defaults import PolicyConfig, threshold_arrays
from pipeline.policy.reasons import published_reasons
from pipeline.policy.routes import ROUTE_DOWN, ROUTE_PANIC
from pipeline.policy.capacity import OVER_CAPACITY
from pipeline.policy.readmit import success_run_crossing
from pipeline.policy.route_wide import PEER_LATENCY, ROUTE_WIDE
from pipeline.policy.state_machine import HALF_OPEN, HEALTHY, LEARNING_STATES, NO_DATA, OPEN, ChannelMachine
from pipeline.engine.published import clean_value, published_values
from pipeline.engine.columns import EventFields, make_columns, picker, resolve_structure, structure_flags
from pipeline.engine.error_classes import ErrorClasses
from pipeline.engine.quality_scores import QualityScores
from pipeline.engine.residency import Residency
from pipeline.engine.route_shares import RouteShares
from pipeline.engine.state_io import StateIO
from pipeline.engine.suspects import Suspects
from pipeline.signals.consecutive_failures import FailureRuns
from pipeline.windows.store import EventColumns, WindowStore

_STATE = attrgetter("state")
#: A chunk with at least one event per this many registered channels finds its channels and counts its
#: failures with ``np.bincount`` over all channels (O(C)); a smaller one sorts its own (O(n log n)).
DENSE_EVENTS_PER_CHANNEL = 8
#: SPEC §4.1: the advisory reason of a channel with caller-class failures (never a trip).
_CALLER = ("caller_errors",)


@dataclass
class BatchResult:
    """What one :meth:`Engine.process` call produced.

    ``verdicts``: published in order; ``late``: events older than the
    watermark minus the allowed lateness (not counted; dead-letter them);
    ``accepted``: the events counted; ``structure``: per accepted event
    ``(parse_ok, missing_fields)`` as resolved for storage; ``refused``: events
    of new channels over the limit (not counted; dead-letter them).
    """

    verdicts: list[Verdict] = field(default_factory=list)
    late: list[RequestEvent] = field(default_factory=list)
    accepted: list[RequestEvent] = field(default_factory=list)
    structure: list[tuple[bool | None, list[str] | None]] = field(default_factory=list)
    refused: list[RequestEvent] = field(default_factory=list)


class Engine:
    """Windows + detectors + policy for all channels of one worker.

    ``policy``: thresholds and timings (SPEC §4 defaults). ``limits``:
    channel limit and idle eviction (:class:`~pipeline.config.StateLimits`).
    ``signals``: the signals to evaluate (default: the registry,
    :data:`pipeline.signals.registry.SIGNALS`); their counters are added
    to the windows. Per-channel state moves in and out through
    ``state`` (:meth:`StateIO.export_state <pipeline.engine.state_io.StateIO.export_state>` /
    ``import_state``).
    """

    def __init__(self, policy: PolicyConfig | None = None, limits: StateLimits | None = None,
                 signals: Sequence[Signal] = SIGNALS):
        self.policy = policy or PolicyConfig()
        self.limits = limits or StateLimits()
        self.signals = tuple(signals)
        self.hard = tuple(s.detector for s in self.signals if s.kind == "hard")
        self.soft = tuple(s.detector for s in self.signals if s.kind == "soft")
        #: Advisory detectors with the parameter that makes each degrade (None: never), SPEC §4.8.
        self.advisory = tuple((s.detector, s.degrades) for s in self.signals if s.kind == "advisory")
        self.changed = np.zeros(0, bool)  #: per channel: changed since its last captured snapshot (state_io)
        self.store = WindowStore(window_ms=self.policy.window_ms, short_window_ms=self.policy.short_window_ms,
                                 baseline_hours=self.policy.baseline_window_ms // 3_600_000,
                                 counters=tuple(c for s in self.signals for c in s.counters),
                                 windows=tuple(s.windows for s in self.signals if s.windows is not None))
        runs = self.store.extensions.get("consecutive_failures")
        #: The failure runs (pre-trip, SPEC §4.2: checked on every batch; None without the signal).
        self.runs = runs if isinstance(runs, FailureRuns) else None
        self.machines: list[ChannelMachine] = []
        self.seq: list[int] = []
        self.active: dict[str, np.ndarray] = {d.reason: np.zeros(0, bool)
                                              for d in (*self.soft, *(a for a, _ in self.advisory))}
        #: Per channel: the next round boundary (event time, ms; 0 = not yet scheduled).
        self.next_eval = np.zeros(0, np.int64)
        self.low_watermark_ms: int | None = None
        #: Per channel: the low watermark (ms; 0 = unknown) when its newest events were added (see :meth:`advance`).
        self.arrived_at_wm = np.zeros(0, np.int64)
        self._batch_wm = 0  # the low watermark the batch being processed brings (0: none or not known)
        self.last_eval_ms: int | None = None
        self._th: ThresholdArrays | None = None
        self.fail_since_eval = np.zeros(0, np.float64)
        #: Judged requests (success or upstream failure) since the channel's last round: with
        #: ``fail_since_eval`` what :meth:`ChannelMachine.learn` adds to the pre-incident
        #: baseline rate of the half-open probe (issue #18 item 4). In snapshots with it.
        self.judged_since_eval = np.zeros(0, np.float64)
        #: Per channel: its events enter the 24 h baselines (SPEC §4.2): its state at its last round was
        #: healthy or no_data (True for a new channel). Set at rounds only, so that which events learn does
        #: not depend on where batches are cut (a trip between rounds stops learning at the next round).
        #: In snapshots with it (:class:`~pipeline.state.channel_state.RoundState`).
        self.learns = np.ones(0, bool)
        self.late_count = 0
        #: SPEC §4.2 re-admission on evidence: channel row -> its successes in a row while ``open`` with a
        #: peer over its cap (only such channels; in snapshots with it, ``RoundState.ok_run``).
        self.ok_runs: dict[int, int] = {}
        #: The engine's named parts (see the module docstring).
        self.routes = RouteShares(self.store, self.machines, self.policy, self.mark_changed)
        self.quality = QualityScores(self.store, self.mark_changed)
        self.suspects = Suspects(self.store, self.machines, self.routes.capacity, self.policy)
        self._early: np.ndarray | None = None  # per channel: policy.suspect_run (FailureRuns.early)
        #: Verdicts of suspicions ended by an eviction (:meth:`_export_channel`), for the caller's next result;
        #: ``_evict_ms``: the event time evictions happen at (the idle scan's or the admission's).
        self._left: list[Verdict] = []
        self._evict_ms = 0
        self.residency = Residency(self.limits, self.store, self._export_channel, self._load_channel,
                                   self.mark_changed)
        self.state = StateIO(self)
        self.classes = ErrorClasses(self.machines, self.policy,
                                    lambda i: bool(self.residency.resident[i]) if i < self.store.n_channels else False,
                                    self.routes.capacity.share_rose)

    def _export_channel(self, i: int) -> bytes:
        """Snapshot bytes of channel row ``i`` (for :class:`Residency` to evict it). A suspicion of ``i`` ends
        first, with a verdict of its share (:attr:`_left`): an evicted channel has no rounds, so nothing would
        end it, and a router following its share 0 sends it no event to bring it back."""
        from pipeline.state.snapshot import export_channel

        if i in self.suspects.since_ms:
            now = max(self.suspects.began_ms.get(i, 0), self._evict_ms)
            self.suspects.end(i)
            self._left.append(self._verdict(i, now, self._share_metrics(i)))
        return export_channel(self, i)

    def _load_channel(self, raw: bytes) -> None:
        """Import snapshot bytes ``raw`` (an evicted channel coming back); raises ``SnapshotError``."""
        from pipeline.state.snapshot import decode_snapshot, import_channel

        import_channel(self, decode_snapshot(raw))

    @property
    def channel_rows(self) -> Mapping[str, int]:
        """Channel name → row in the engine's per-channel arrays (read-only; channels seen or restored)."""
        return self.store.index

    def mark_changed(self, rows) -> None:
        """Flag channel rows ``rows`` (ints or a bool mask over the registered channels) as changed since
        their last captured snapshot (see :mod:`pipeline.engine.state_io`)."""
        self.changed[rows] = True

    def take_changed(self, start: int = 0, stop: int | None = None, refresh_every: int = 0,
                     refresh_phase: int = 0) -> np.ndarray:
        """Rows in ``start:stop`` (positions in the append-only channel list) flagged changed, and clear
        their flags; with ``refresh_every`` > 0 also the rows ``r`` with ``r % refresh_every == refresh_phase``
        (so that, with the phase stepping once per capture, every channel is captured at least every
        ``refresh_every`` captures however long it stays unchanged). Returns sorted int64 rows.
        Raises ``ValueError`` for ``start < 0`` or ``refresh_every < 0``."""
        if start < 0 or refresh_every < 0:
            raise ValueError(f"start and refresh_every must be >= 0, got {start!r}, {refresh_every!r}")
        c = self.store.n_channels
        stop = c if stop is None else min(stop, c)
        if start >= stop:
            return np.zeros(0, np.int64)
        flags = self.changed[start:stop]
        if refresh_every:
            first = start + (refresh_phase - start) % refresh_every
            flags = flags.copy()
            flags[first - start::refresh_every] = True
        rows = np.flatnonzero(flags) + start
        self.changed[rows] = False
        return rows


    def add_quality_scores(self, channels: Sequence[str], ts_ms: Sequence[int], scores: Sequence[float],
                           model_version: str | None = None) -> int:
        """File quality scores in the windows: :meth:`QualityScores.add
        <pipeline.engine.quality_scores.QualityScores.add>` of ``quality`` (the engine's input port for
        scores, as :meth:`process` is for events)."""
        return self.quality.add(channels, ts_ms, scores, model_version)

    # -- ingestion ----------------------------------------------------------
    def _chunk_columns(self, events: Sequence[RequestEvent], ts: np.ndarray, code: np.ndarray,
                       latency: np.ndarray, checked: np.ndarray, missing: np.ndarray, keys: tuple[list, list, list],
                       optional: dict[str, np.ndarray]) -> EventColumns:
        """``keys``: the chunk's ``(channel, route, tier)`` lists and ``optional`` its optional columns
        (:class:`EventFields`)."""
        channel = self.store.channel_indices(*keys)
        self.grow(self.store.n_channels)
        return make_columns(channel, events, ts, code, latency, checked, missing, optional)

    def grow(self, n: int) -> None:
        """Room for ``n`` channels in the per-channel arrays (new channels: resident and changed)."""
        while len(self.machines) < n:
            self.machines.append(ChannelMachine())
            self.seq.append(0)
            self._th = None
        for k, arr in self.active.items():
            if arr.shape[0] < n:
                self.active[k] = np.concatenate([arr, np.zeros(n - arr.shape[0], bool)])
        if self.fail_since_eval.shape[0] < n:
            self.fail_since_eval = np.concatenate([self.fail_since_eval, np.zeros(n - self.fail_since_eval.shape[0])])
        if self.judged_since_eval.shape[0] < n:  # issue #18 item 4: the probe's baseline rate
            self.judged_since_eval = np.concatenate([self.judged_since_eval,
                                                     np.zeros(n - self.judged_since_eval.shape[0])])
        if self.next_eval.shape[0] < n:
            self.next_eval = np.concatenate([self.next_eval, np.zeros(n - self.next_eval.shape[0], np.int64)])
        if self.learns.shape[0] < n:  # SPEC §4.2: new channels learn
            self.learns = np.concatenate([self.learns, np.ones(n - self.learns.shape[0], bool)])
        if self.arrived_at_wm.shape[0] < n:
            grow = np.zeros(n - self.arrived_at_wm.shape[0], np.int64)
            self.arrived_at_wm = np.concatenate([self.arrived_at_wm, grow])
        self.classes.grow(n)
        if self.changed.shape[0] < n:  # a new channel: resident, and changed since its (no) snapshot
            self.residency.grow(n)
            self.changed = np.concatenate([self.changed, np.ones(n - self.changed.shape[0], bool)])

    def thresholds(self) -> ThresholdArrays:
        """Per-channel thresholds (rebuilt when channels are added)."""
        if self._th is None or self._th.values["consecutive_failures"].shape[0] != self.store.n_channels:
            per = [self.policy.thresholds(n, t) for n, t in zip(self.store.names, self.store.tiers)]
            self._th = threshold_arrays(per)
        return self._th

    def process(self, events: Sequence[RequestEvent],
                structure: Sequence[tuple[bool | None, list[str] | None]] | None = None,
                low_watermark_ms: int | None = None, *, fields: EventFields,
                max_advance_ms: int | None = None) -> BatchResult:
        """Ingest a batch of validated events (any order); return verdicts and late events.

        ``structure`` optionally gives ``(parse_ok, missing_fields)`` per
        event; by default it is read from the events' own fields, as ingest
        resolved them (:func:`pipeline.ingest.structure.resolve_onto`).

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
        chunk's start is itself the low watermark, but never past
        ``max_advance_ms`` when given (the clock plus its allowed skew: a chunk
        stamped beyond it evaluates only its own channels, SPEC §8).

        ``fields`` (required): the events' fields (:meth:`read_fields`, same
        order and length as ``events``), the one form in which the batch
        travels from here on (the stream processor reads them per message
        while the decoder has the events in cache; a replay reads them with
        :meth:`read_fields`). Raises ``ValueError`` when its length differs.
        """
        result = BatchResult()
        if not events:
            return result
        self._batch_wm = low_watermark_ms or 0
        if len(fields) != len(events):
            raise ValueError(f"fields hold {len(fields)} events, the batch {len(events)}")
        if self.residency.evicted or self.store.n_channels + len(events) > self.limits.max_channels:  # else: no look-up
            # event time for making room (issue #34 part 2): the low watermark (it moves with every partition's
            # input, refused channels' too), or in one-stream mode the batch's newest event up to the clock bound
            if low_watermark_ms is None:
                newest = int(fields.ts_ms.max())
                room_ms = newest if max_advance_ms is None else min(newest, max_advance_ms)
            else:
                room_ms = low_watermark_ms
            room_ms = max(room_ms, self.store.watermark_ms or 0)
            self._evict_ms = room_ms
            events, structure, fields = self.residency.admit(events, structure, result.refused, self.channel_rows,
                                                             fields, room_ms)
            if self._left:  # suspicions ended by making room
                result.verdicts.extend(self._left)
                self._left = []
            if not events:
                return result
        n = len(events)
        if structure is None:
            structure, checked, missing = resolve_structure(events, fields.parse_ok)
        else:
            checked, missing = structure_flags(structure)
        step = self.policy.eval_interval_ms
        # from here on only these columns of the fields are read
        ts, code, latency = fields.ts_ms, fields.code, fields.latency_ms
        keys, optional = (fields.channel, fields.route, fields.tier), fields.optional
        bucket = ts // step
        if bucket.min() != bucket.max():
            order = np.argsort(ts, kind="stable")
            ts, code, latency, checked, missing, bucket = (a[order] for a in (ts, code, latency, checked, missing,
                                                                               bucket))
            get = picker(order)
            events = get(events)
            if checked.any():  # else every entry is the same "not checked"
                structure = get(structure)
            keys = (get(keys[0]), get(keys[1]), get(keys[2]))
            optional = {k: v[order] for k, v in optional.items()}
            bounds = [0, *(np.flatnonzero(bucket[1:] != bucket[:-1]) + 1).tolist(), n]
        else:
            bounds = [0, n]  # the slices below copy; a list is only read
            events = events if isinstance(events, list) else list(events)
            structure = structure if isinstance(structure, list) else list(structure)
        for start, end in zip(bounds[:-1], bounds[1:]):
            if low_watermark_ms is None:
                at = int(bucket[start]) * step
                result.verdicts.extend(self.advance(at if max_advance_ms is None else min(at, max_advance_ms)))
            cols = self._chunk_columns(events[start:end], ts[start:end], code[start:end], latency[start:end],
                                       checked[start:end], missing[start:end],
                                       tuple(k[start:end] for k in keys),  # type: ignore[arg-type]
                                       {k: v[start:end] for k, v in optional.items()})
            self._process_chunk(events[start:end], cast(list, structure[start:end]), result, cols)
        if low_watermark_ms:
            result.verdicts.extend(self.advance(low_watermark_ms))
        return result

    def read_fields(self, events: Sequence[RequestEvent]) -> EventFields:
        """:class:`EventFields` of ``events`` for :meth:`process` (with the optional columns this engine's
        windows read, :attr:`WindowStore.optional_columns`)."""
        return EventFields.read(events, self.store.optional_columns)

    n_resident = property(lambda self: self.residency.held(self.store.n_channels),
                          doc="Channels whose windows are in memory.")

    def _process_chunk(self, events: list[RequestEvent], structure: list, result: BatchResult,
                       cols: EventColumns) -> None:
        newest = self.store.last_ts_ms[cols.channel]
        late_mask = cols.ts_ms < newest - self.policy.allowed_lateness_ms
        if late_mask.any():
            result.late.extend(compress(events, late_mask.tolist()))
            self.late_count += int(late_mask.sum())
            keep = ~late_mask
            events = list(compress(events, keep.tolist()))
            structure = list(compress(structure, keep.tolist()))
            cols = cols.take(keep)
            if not events:
                return
        c = self.store.n_channels
        dense = DENSE_EVENTS_PER_CHANNEL * len(cols) >= c  # many channels touched: one bincount, not a sort
        rows = np.flatnonzero(np.bincount(cols.channel, minlength=c)) if dense else np.unique(cols.channel)
        self.changed[rows] = True
        # the low watermark before this batch (the one it brings while none is known yet)
        self.arrived_at_wm[rows] = self._batch_wm if self.low_watermark_ms is None else self.low_watermark_ms
        result.verdicts.extend(self._evaluate_until(rows, int(cols.ts_ms.min())))
        classified = self.classes.note(events, cols, rows)  # SPEC §4.1: caller failures leave the counts here
        th = self.thresholds().consecutive_failures
        machines = self.machines
        states = list(map(_STATE, map(machines.__getitem__, rows.tolist())))
        probing = [i for i, st in zip(rows.tolist(), states) if st == HALF_OPEN] if HALF_OPEN in states else []
        if probing:  # SPEC §4: any failure run sends a probing channel back (only this chunk's rows are read)
            th = th.copy()
            th[probing] = np.minimum(th[probing], self.policy.half_open_failure_run)
        if self.runs is not None:
            self.runs.threshold = th
            if self.policy.suspect_run:
                if self._early is None or self._early.shape != th.shape:
                    self._early = np.full(th.shape, self.policy.suspect_run, th.dtype)
                self.runs.early = self._early
        # SPEC §4.2: the baselines learn from the events of channels healthy (or no_data, i.e. new) at their
        # last round: a trip between rounds stops them at the next round, wherever the batches are cut
        learning = self.learns[rows]
        learn = None if learning.all() else learning[np.searchsorted(rows, cols.channel)]
        late = self.store.add(cols, learn)
        if late.any():  # too old for the ring although within lateness: count as late too
            flags = late.tolist()
            result.late.extend(compress(events, flags))
            self.late_count += int(late.sum())
            kept = [not f for f in flags]
            result.accepted.extend(compress(events, kept))
            result.structure.extend(compress(structure, kept))
        else:
            result.accepted.extend(events)
            result.structure.extend(structure)
        # whole counts in float64: one bincount per array gives the bits of adding 1.0 per event
        for total, counted in ((self.fail_since_eval, cols.outcome == 1), (self.judged_since_eval, cols.outcome >= 0)):
            if dense:
                total[:c] += np.bincount(cols.channel, weights=counted, minlength=c)
            else:
                np.add.at(total, cols.channel, counted.astype(np.float64))
        if classified:  # SPEC §4.1: a dead key, an exhausted quota or a 429 cooldown opens at the event
            for i, now in self.classes.trips(events, cols, classified):
                result.verdicts.append(self._trip_verdict(i, now, {}))
        if self.runs is not None:
            if self.suspects.since_ms or self.suspects.expired or (
                    self.runs.crossed_early.size and self.runs.crossed_early.max() >= 0):
                result.verdicts.extend(self._suspicion(cols))  # first: a suspicion begins before its trip
            trips = self._pretrip(cols, self.runs.groups, self.runs.crossed_at, th)
            result.verdicts.extend(trips)
            if trips and self.suspects.since_ms:
                result.verdicts.extend(self._suspicion_after(trips))
        if self.ok_runs or (self.routes.capacity.max_share and self.policy.readmit_success_run
                            and OPEN in states):
            machines = self.machines  # the open ones now (a run may have tripped one in this chunk)
            result.verdicts.extend(self._readmit(cols, [i for i in rows.tolist()
                                                        if machines[i].state == OPEN or i in self.ok_runs]))

    def _readmit(self, cols: EventColumns, rows: list[int]) -> list[Verdict]:
        """SPEC §4.2 re-admission on evidence (:mod:`pipeline.policy.readmit`): an ``open`` channel of
        ``rows`` (cause "": the §4 detectors) whose route has a peer over its ``max_share`` goes ``half_open``
        at the event that completed a run of ``readmit_success_run`` successes (its events since it opened,
        this chunk's and the earlier ones'); its route's shares are recomputed at once and every channel of
        the route whose share moved gets a verdict. Other channels leave :attr:`ok_runs`."""
        k = self.policy.readmit_success_run
        out: list[Verdict] = []
        for i in rows:
            m = self.machines[i]
            if not k or m.state != OPEN or m.cause or not self.routes.peer_over_cap(i):
                self.ok_runs.pop(i, None)
                continue
            mine = np.flatnonzero((cols.channel == i) & (cols.ts_ms >= m.entered_ms))
            hit, run = success_run_crossing(cols.outcome[mine], self.ok_runs.get(i, 0), k)
            if hit < 0:
                self.ok_runs[i] = run
                continue
            self.ok_runs.pop(i, None)
            now = int(cols.ts_ms[mine[hit]])
            m.readmit(now, self.policy)
            if self.runs is not None:
                self.runs.reset(i)  # only the probe's failures count from here (as entering half_open)
            before = self.routes.shares_by_route.get(self.store.routes[i], {})
            before = dict(before)
            shares = self.routes.readmitted(i, now)
            panic = self.routes.panic_weight
            for j, share in shares.items():
                if j != i and before.get(self.store.names[j]) == share:
                    continue
                metrics: dict = {"route_share": share}
                if (cap := self.routes.capacity.max_share.get(j)) is not None:
                    metrics["max_share"] = round(cap, 4)
                out.append(self._verdict(j, now, metrics, soft_now=self._soft_active(j), weight=panic.get(j),
                                         route_reasons=[ROUTE_PANIC] if j in panic else []))
        return out

    def _suspicion(self, cols: EventColumns) -> list[Verdict]:
        """Suspicion (:mod:`pipeline.engine.suspects`), event by event in arrival order over the channels that
        are suspect or whose failure run reached ``policy.suspect_run`` in this chunk: a channel not suspect
        becomes suspect at an event where its run is at least that long (its verdict publishes
        ``route_share`` 0); a suspect's first success sent at or after the request that made it suspect ends
        it at that event (its verdict publishes its share again); both may happen several times in a chunk,
        and channels of one route are read in the order their events arrived (which one may become suspect
        depends on the others). A suspicion whose channel left service or whose route has no other channel in
        service any more ends at the chunk's first event; with ``suspect_run`` 0 (turned off, e.g. on a
        restart with another policy) every suspicion ends so. Runs before :meth:`_pretrip`: a channel that
        trips in this chunk is read only up to that trip (whose verdict ends a suspicion)."""
        sus, runs, k = self.suspects, self.runs, self.policy.suspect_run
        assert runs is not None
        first_ts = int(cols.ts_ms.min())
        out = self._end_lapsed(sorted(sus.since_ms), lambda c: first_ts, off=not k)
        if not k:
            return out
        tripped = {c: idx for c, idx in zip(runs.groups.tolist(), runs.crossed_at.tolist()) if idx >= 0}
        first = {c: idx for c, idx in zip(runs.groups.tolist(), runs.crossed_early.tolist()) if idx >= 0}
        # channels whose events are read: suspect ones, and those that may become suspect (their state and
        # route do not change before the trips)
        cands = [c for c in sorted(set(first) | set(sus.since_ms) | set(sus.expired))
                 if c in sus.since_ms or c in sus.expired or sus.may_suspect(c)]
        if not cands:
            return out
        picked = np.isin(cols.channel, cands)
        idx = np.flatnonzero(picked & (cols.outcome >= 0))
        ch = cols.channel[idx]
        idx = idx[idx < np.array([tripped.get(c, len(cols)) for c in ch.tolist()], np.int64)] if tripped else idx
        ts = cols.ts_ms[idx]
        # sent at ts - latency, within [0, ts]: a latency past the event's own time (hostile, or a clock) must
        # not put a time no snapshot can hold into the suspicion
        sent = (ts - np.minimum(cols.latency_ms[idx], ts)).tolist()
        run: dict[int, int] = {}  # channel -> run since its first crossing (before it: shorter than k)
        for j, c, o, s_ms, t in zip(idx.tolist(), cols.channel[idx].tolist(), cols.outcome[idx].tolist(), sent,
                                    ts.tolist()):
            if o == 0 and c in sus.since_ms and s_ms >= sus.since_ms[c]:
                sus.end(c)
                out.append(self._verdict(c, t, self._share_metrics(c)))
            if o == 0:
                sus.expired.pop(c, None)  # its run ended: a later run may make it suspect again
            at = first.get(c, -1)
            if at < 0 or j < at:
                continue
            r = run[c] = (run[c] + 1 if o == 1 else 0) if j > at else k
            if r >= k and c not in sus.since_ms and sus.may_suspect(c):
                sus.start(c, s_ms, t)
                out.append(self._verdict(c, t, {"route_share": 0.0}))
        return out

    def _suspicion_after(self, trips: list[Verdict]) -> list[Verdict]:
        """A suspect whose route's last other channel in service just tripped (``trips``: this chunk's trip
        verdicts) is suspect no more, at that trip's event time: its share is published again at once (SPEC
        §4.2: never a dark route by inference)."""
        routes = self.store.routes
        return self._end_lapsed(list(self.suspects.since_ms), lambda c: max(
            (v.ts_ms for v in trips if v.route == routes[c]), default=trips[-1].ts_ms))

    def _end_lapsed(self, rows: list[int], at_ms: Callable[[int], int], off: bool = False) -> list[Verdict]:
        """End the suspicions of ``rows`` that no longer hold (:meth:`Suspects.holds
        <pipeline.engine.suspects.Suspects.holds>`; every one with ``off``): each channel still in service
        publishes its share again at event time ``at_ms(row)``; one that tripped has its trip verdict."""
        out: list[Verdict] = []
        for c in rows:
            if off or not self.suspects.holds(c):
                self.suspects.end(c)
                if self.machines[c].state not in (OPEN, HALF_OPEN):
                    out.append(self._verdict(c, at_ms(c), self._share_metrics(c)))
        return out

    def _share_metrics(self, i: int) -> dict:
        """``route_share`` (its route's last share; none before its route's first round) and ``max_share``
        of channel ``i``, for a verdict between rounds."""
        metrics: dict = {}
        if (share := self.routes.last_share(i)) is not None:
            metrics["route_share"] = share
        if (cap := self.routes.capacity.max_share.get(i)) is not None:
            metrics["max_share"] = round(cap, 4)
        return metrics

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
            if m.trip(now, ["consecutive_failures"], self.policy, m.held_cause()):
                metrics: dict = {"consecutive_failures": float(threshold[c]),
                                 "consecutive_failures_threshold": float(threshold[c])}
                out.append(self._trip_verdict(c, now, metrics))
        return out

    def _trip_verdict(self, i: int, now_ms: int, metrics: dict) -> Verdict:
        """The verdict of channel ``i`` that a trip between rounds (a failure run, or an error class of SPEC
        §4.1) just opened at event time ``now_ms``: when it holds its route's last weight and its cause is no
        hard fault, it keeps the panic floor's weight with reason ``route_panic``
        (:meth:`RouteShares.keep_on_trip <pipeline.engine.route_shares.RouteShares.keep_on_trip>`; SPEC
        §4.2 "never black out a route by inference") and ``metrics`` gains its last ``route_share``."""
        self.suspects.expired.pop(i, None)  # its run tripped it
        wide = self.routes.wide.keep_on_trip(i)  # SPEC §4.2: a route-wide member keeps its weight
        kept = self.routes.keep_on_trip(i) if wide is None else None
        if kept is not None and (share := self.routes.last_share(i)) is not None:
            metrics["route_share"] = share
        reasons = [ROUTE_PANIC] if kept is not None else [ROUTE_WIDE] if wide is not None else []
        return self._verdict(i, now_ms, metrics, soft_now=self._soft_active(i), weight=kept if wide is None else wide,
                             route_reasons=reasons)

    # -- evaluation ---------------------------------------------------------
    def advance(self, now_ms: int) -> list[Verdict]:
        """Evaluate every channel at each round boundary <= ``now_ms`` (the low watermark, event time ms) it
        has not had yet.

        Except a channel that runs on a slow clock: its newest events arrived
        when the low watermark was already more than
        ``allowed_lateness_ms`` past them, and that was less than
        ``no_data_after_ms`` of low watermark ago. Its events still come, so it
        is evaluated on its own event time (the rounds its events reach) and is
        not reported ``no_data``; once nothing of it arrived for
        ``no_data_after_ms`` of low watermark it is evaluated here again.
        """
        c = self.store.n_channels
        self.low_watermark_ms = now_ms if self.low_watermark_ms is None else max(self.low_watermark_ms, now_ms)
        if c == 0:
            return []
        rows = np.arange(c) if not self.residency.evicted else np.flatnonzero(self.residency.resident[:c])
        arrived = self.arrived_at_wm[rows]
        slow = ((arrived - self.store.last_ts_ms[rows] > self.policy.allowed_lateness_ms)
                & (arrived > now_ms - self.policy.no_data_after_ms))
        out = self._evaluate_until(rows[~slow] if slow.any() else rows, now_ms)
        self._evict_ms = now_ms
        self.residency.evict_due(now_ms, self.policy.eval_interval_ms)
        if self._left:  # suspicions ended by the evictions
            out.extend(self._left)
            self._left = []
        return out

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
        """One evaluation round at event time ``now_ms`` for channels ``rows`` (default: all resident)."""
        c = self.store.n_channels
        if c == 0:
            return []
        rows = np.flatnonzero(self.residency.resident[:c]) if rows is None else np.asarray(rows, dtype=np.int64)
        cfg = self.policy
        th_all = self.thresholds()
        th = ThresholdArrays({k: v[rows] for k, v in th_all.values.items()})
        # half_open / recovering: judged on the traffic since the channel left open (issue #18 item 4)
        never = np.iinfo(np.int64).min // 2
        since = np.array([never if (t := self.machines[i].judged_since_ms) is None else t for i in rows],
                         dtype=np.int64)
        if capped := self.routes.capacity.judged_since_ms:  # SPEC §4.2: a capped channel is judged since
            for j, i in enumerate(rows.tolist()):          # its last overloaded round
                if (t := capped.get(i)) is not None and t > since[j]:
                    since[j] = t
        view = self.store.view(now_ms, since_ms=since, rows=rows)
        n = rows.shape[0]
        hard = [d.detect(view, th, np.zeros(n, bool)) for d in self.hard]
        soft = []
        for d in self.soft:
            f = d.detect(view, th, self.active[d.reason][rows])
            self.changed[rows[self.active[d.reason][rows] != f.fired]] = True
            self.active[d.reason][rows] = f.fired
            soft.append(f)
        # advisory findings: published like soft ones; they reach the state machine only where the
        # signal's ``degrades`` parameter is true for the channel (SPEC §4.8 "unless configured")
        advisory, acting = [], []
        for d, key in self.advisory:
            f = d.detect(view, th, self.active[d.reason][rows])
            self.changed[rows[self.active[d.reason][rows] != f.fired]] = True
            self.active[d.reason][rows] = f.fired
            advisory.append(f)
            acting.append(f.fired & (getattr(th, key) > 0) if key is not None else np.zeros(n, bool))
        peer, peer_ratio = self.routes.wide.peer_findings(rows, view, now_ms)  # SPEC §4.2 peer-relative
        last_ts = self.store.last_ts_ms[rows]
        capacity = self.routes.capacity
        changed, stepped = np.zeros(n, bool), np.ones(n, bool)
        for j, i in enumerate(rows.tolist()):
            m = self.machines[i]
            if m.state == NO_DATA and (now_ms - last_ts[j] >= cfg.no_data_after_ms) and m.reasons == ["no_data"]:
                stepped[j] = False
                continue  # idle and already reported
            if m.state not in (OPEN, HALF_OPEN):
                m.add_penalty(cfg.penalty_per_failure * self.fail_since_eval[i], now_ms, cfg)
            h = [f.reason for f in hard if f.fired[j]]
            if m.state == OPEN:
                h = []  # cooldown runs from the first trip; probes judge it later
                if (not m.cause and m.cooldown_ms > cfg.open_cooldown_ms and self.routes.peer_over_cap(i)
                        and not (cfg.readmit_success_run and now_ms - last_ts[j] < cfg.eval_interval_ms)):
                    # SPEC §4.2: no backoff while a peer is over its cap, unless the channel's own traffic
                    # still comes (events in the last round): its answers re-admit it (pipeline.policy.readmit)
                    m.cooldown_ms = cfg.open_cooldown_ms
                if (cfg.probe_on_evidence and self.runs is not None and self.fail_since_eval[i] > 0
                        and view.run[j] >= th.consecutive_failures[j]
                        and not self.classes.rate_limited_since(i, now_ms - cfg.eval_interval_ms)):
                    # SPEC §4.2 probe on evidence (pipeline.policy.readmit): its own traffic still fails, a
                    # trailing run of a trip's length with failures in the last round (no 429 among them: the
                    # probe and SPEC §4.1 judge a rate limit), so a half_open probe would only fail users'
                    # requests: if its cooldown ended, a failed probe (stays open, next cooldown published)
                    m.probe_answered(now_ms, cfg)
            s = [f.reason for f in soft if f.fired[j]] + [f.reason for f, a in zip(advisory, acting) if a[j]]
            if (held := self.routes.last_share(i)) is not None:
                capacity.note_share(i, held)
            fired = bool(h)
            if "error_rate" in h and m.state != HALF_OPEN and capacity.overloaded(
                    i, float(view.judged_1m[j]), float(view.failures_1m[j]), now_ms) is not None:
                h = [x for x in h if x != "error_rate"]  # SPEC §4.2: overload, not breakage: a cap, not open
                s.append(OVER_CAPACITY)
            elif capacity.over_cap(i):
                s.append(OVER_CAPACITY)  # still carrying more than its cap (nobody to take the excess)
            if peer[j]:
                s.append(PEER_LATENCY)
            changed[j] = m.step(now_ms, h, s, view.judged_5m[j], view.failures_5m[j],
                                int(last_ts[j]) if last_ts[j] > 0 else None, cfg,
                                self.policy.thresholds(self.store.names[i], self.store.tiers[i]))
            if m.state == HALF_OPEN and changed[j] and self.runs is not None:
                self.runs.reset(i)
            # issue #18 item 4: healthy/degraded rounds feed the probe's pre-incident baseline
            m.learn(now_ms, self.judged_since_eval[i], self.fail_since_eval[i], cfg)
            capacity.learn(i, not fired, m.state == HEALTHY, float(view.judged_1m[j]), float(view.failures_1m[j]),
                           i in capacity.max_share and self.routes.peer_returning(i))
            self.learns[i] = m.state in LEARNING_STATES
        self.changed[rows[stepped]] = True
        self.fail_since_eval[rows] = 0.0
        self.judged_since_eval[rows] = 0.0
        self.routes.note_outcomes(rows, view.judged_1m, view.failures_1m)
        shares = self.routes.after_round(rows, now_ms)
        panic, down, wide = self.routes.panic_weight, self.routes.down_routes, self.routes.wide.weight
        self.last_eval_ms = now_ms
        out = []
        keys = [k for f in (*hard, *soft, *advisory) for k in f.metrics]
        # per channel, its metric values already rounded (None where not finite): one pass per metric
        values = list(zip(*(published_values(v) for f in (*hard, *soft, *advisory) for v in f.metrics.values())))
        for j, i in enumerate(rows.tolist()):
            m = self.machines[i]
            if m.state == NO_DATA and not changed[j] and not self._heartbeat_due(m, now_ms):
                continue
            metrics = dict(zip(keys, values[j])) if values else {}
            metrics["route_share"] = shares[i]
            metrics["penalty"] = round(m.penalty, 4)
            if peer[j]:
                metrics["peer_p95_ratio"] = clean_value(peer_ratio[j])
            extra, caller = self.classes.metrics(i, now_ms)
            if extra:
                metrics.update(extra)
            if (cap := capacity.max_share.get(i)) is not None:
                metrics["max_share"] = round(cap, 4)  # SPEC §4.2: the learned capacity cap
            # hard findings beside the trip reasons only while open (a probe is judged on its own traffic)
            hard_now = [f.reason for f in hard if f.fired[j]] if m.state == OPEN else ()
            route_reasons = ([ROUTE_PANIC] if i in panic else []) + ([ROUTE_DOWN] if down and
                                                                     self.store.routes[i] in down else [])
            if wide and i in wide:
                route_reasons.append(ROUTE_WIDE)
            soft_now = [f.reason for f in (*soft, *advisory) if f.fired[j]]
            if peer[j] and PEER_LATENCY not in m.reasons:
                soft_now.append(PEER_LATENCY)
            out.append(self._verdict(i, now_ms, metrics, cleaned=True, hard_now=hard_now, soft_now=soft_now,
                                     weight=panic.get(i, wide.get(i)), route_reasons=route_reasons,
                                     advisory=_CALLER if caller else ()))
        return out

    def _heartbeat_due(self, m: ChannelMachine, now_ms: int) -> bool:
        """``no_data`` again at the first round at or after ``entered + k × no_data_heartbeat_ms`` (k >= 1)."""
        hb, since = self.policy.no_data_heartbeat_ms, now_ms - m.entered_ms
        return hb > 0 and since >= hb and since // hb != (since - self.policy.eval_interval_ms) // hb

    def _soft_active(self, i: int) -> list[str]:
        """Soft findings in force for channel ``i`` (as of its last round)."""
        return [r for r, arr in self.active.items() if i < arr.shape[0] and arr[i]]

    def _verdict(self, i: int, now_ms: int, metrics: dict, hard_now: Sequence[str] = (),
                 soft_now: Sequence[str] = (), cleaned: bool = False, weight: float | None = None,
                 route_reasons: Sequence[str] = (), advisory: Sequence[str] = ()) -> Verdict:
        """Channel ``i``'s verdict at ``now_ms``; reasons via :func:`published_reasons`, then ``advisory``
        (e.g. ``caller_errors``, SPEC §4.1), then ``route_reasons`` (SPEC §4.2 ``route_panic``/``route_down``).
        ``cleaned``: ``metrics`` values are published numbers already (:func:`published_values`); a verdict
        outside a round (``cleaned`` False) also carries the error-class metrics (:meth:`ErrorClasses.metrics
        <pipeline.engine.error_classes.ErrorClasses.metrics>`). ``weight``: the weight the route's panic
        floor keeps the channel at (None: its own)."""
        m = self.machines[i]
        self.seq[i] += 1
        self.changed[i] = True
        clean = metrics if cleaned else {k: clean_value(v) for k, v in metrics.items()}
        if self.suspects.since_ms and self.suspects.holds(i, now_ms):  # its traffic goes to its peers meanwhile
            clean = {**clean, "route_share": 0.0, SUSPECT_METRIC: self.policy.suspect_run}
        if not cleaned:
            extra, caller = self.classes.metrics(i, now_ms)
            clean.update(extra)
            advisory = _CALLER if caller else advisory
        reasons = published_reasons(m.state, m.reasons, hard_now, soft_now)
        if advisory:
            reasons += [r for r in advisory if r not in reasons]
        return Verdict(channel=self.store.names[i], route=self.store.routes[i], state=m.state,  # type: ignore[arg-type]
                       weight=float(m.weight if weight is None else weight),
                       reasons=reasons + [r for r in route_reasons if r not in reasons],
                       metrics=cast(dict[str, float | int | str | None], clean), ts_ms=now_ms, seq=self.seq[i])
