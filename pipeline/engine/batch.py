"""One batch of raw ``gateway.requests`` messages → everything it produces.

Kafka-free and synchronous so it is tested directly; the faust agent in
:mod:`pipeline.stream.app` only moves bytes in and out of it.

Restart exactness: a channel snapshot (:mod:`pipeline.state.snapshot`) is
saved together with the input offsets it covers (per partition, the last
offset whose events are inside it). After a restart or rebalance the
consumer resumes at the committed offset, which may lie *before* what the
snapshot covers; :meth:`BatchProcessor.process` (given ``offsets``) then
keeps such events of a restored channel out of the engine -- they are
already counted in its state -- and only returns them as rows to store
(idempotent). Events after the covered offsets are processed normally, so
windows, baselines, runs, timers and ``seq`` continue exactly.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from itertools import compress
from typing import Callable, Collection, Iterable, Mapping, Sequence

import numpy as np

from pipeline.config import Settings
from pipeline.contracts import RequestEvent, Verdict, encode
from pipeline.engine.core import Engine
from pipeline.engine.capture import Capture, capture
from pipeline.engine.columns import EventFields
from pipeline.ingest.counters import DecodeCounters
from pipeline.ingest.dead_letter import DeadLetter
from pipeline.ingest.decode import Decoder
from pipeline.policy.defaults import PolicyConfig
from pipeline.ingest.dedup import EventIdDedup
from pipeline.ingest.prefix_counts import PrefixCounts
from pipeline.ingest.reasons import TOO_MANY_CHANNELS
from pipeline.sinks.batches import split_stored
from pipeline.state.refusals import RefusalLog


log = logging.getLogger(__name__)


#: A partition that delivered nothing for this long (wall clock) no longer
#: holds the low watermark back (the usual idle-source rule).
PARTITION_IDLE_S = 10.0
#: Default of ``max_clock_skew_ms`` (``CHANNEL_HEALTH_MAX_CLOCK_SKEW``): event time may run this far ahead of the clock.
DEFAULT_CLOCK_SKEW_MS = 5_000
#: In replay mode, this many channels must have reached an event time before the replay's clock does.
REPLAY_CLOCK_QUORUM = 2
#: Duplicates and refused channels are logged at most once per this many seconds (wall clock), with counts.
LOG_EVERY_S = 60.0


@dataclass
class ProcessedBatch:
    """Outputs of one batch.

    ``verdicts`` in publication order; ``dead_letters`` (invalid or late
    input, or of a channel over the limit); the ``request_events`` rows as ``stored`` rows ``(event,
    parse_ok, missing_fields)`` and ``envelopes``: ``(message bytes,
    events)`` of the batch envelopes stored as the message holds them, which
    ClickHouse reads itself; their events are not in ``stored``. The choice
    is :func:`pipeline.sinks.batches.split_stored`'s.
    """

    verdicts: list[Verdict] = field(default_factory=list)
    dead_letters: list[DeadLetter] = field(default_factory=list)
    stored: list[tuple[RequestEvent, bool | None, list[str] | None]] = field(default_factory=list)
    envelopes: list[tuple[bytes, int]] = field(default_factory=list)


class BatchProcessor:
    """Decode → engine → outputs, with counters.

    ``clock_ms`` returns wall-clock UTC epoch ms (used to reject
    timestamps absurdly far from now, and for the clock bound below; windows
    run on event time).
    ``event_clock`` (replay mode, ``CHANNEL_HEALTH_CLOCK=event``): the
    decoder's age bound runs from ``event_time_ms``, the replay's own clock
    (0 before the first event: nothing is too old yet), not from the
    wall clock, so a day from a year ago is processed on its own clock; the
    future bound stays on the wall clock. The replay's clock is the newest
    event time of the channel that is second newest (:data:`REPLAY_CLOCK_QUORUM`
    channels must have reached it; with one channel so far, that channel's):
    one channel stamped far ahead cannot move it.

    Clock bound (SPEC §8): the *clock* is the wall clock, or the replay's clock;
    event time may run ahead of it by ``max_clock_skew_ms`` (> 0,
    ``CHANNEL_HEALTH_MAX_CLOCK_SKEW``). An event stamped later is accepted and
    stored with its own ``ts_ms`` and evaluated in its own channel's rounds, but
    each partition's contribution to the low watermark, and the store's
    watermark (dedup horizon, snapshots), stop at clock + skew, so it moves no
    other channel's rounds. Such events are counted in ``ahead_of_clock`` and
    logged at most once per ``LOG_EVERY_S`` (count, and the newest one's
    channel and ``event_id``). In its own channel, later events more than the
    allowed lateness behind it are late (dead-lettered ``late_event``, the
    usual per-channel lateness contract).

    ``dedup``: the ``event_id`` memory (default: horizon and size of the
    engine's :class:`~pipeline.config.StateLimits`); a re-sent event is
    dropped before the engine and the sink (counted in ``duplicates``, logged
    at most every ``LOG_EVERY_S``), so it is counted and stored once.
    """

    def __init__(self, engine: Engine | None = None, decoder: Decoder | None = None,
                 clock_ms: Callable[[], int] = lambda: int(time.time() * 1000),
                 dedup: EventIdDedup | None = None, *, event_clock: bool = False,
                 max_clock_skew_ms: int = DEFAULT_CLOCK_SKEW_MS):
        if max_clock_skew_ms <= 0:
            raise ValueError(f"max_clock_skew_ms must be > 0, got {max_clock_skew_ms}")
        self.engine = engine or Engine()
        self.decoder = decoder or Decoder(classifier=self.engine.policy.classifier)
        limits = self.engine.limits
        self.dedup = dedup or EventIdDedup(limits.dedup_horizon_ms, limits.dedup_max_ids)
        #: re-sent events dropped (their ``event_id`` seen within the dedup horizon).
        self.duplicates = 0
        #: events dead-lettered ``too_many_channels``.
        self.refused = 0
        #: the same per channel-name prefix (bounded; a flood shows where it comes from).
        self.refused_by_prefix = PrefixCounts()
        self._logged_at = (0.0, 0, 0)  # (monotonic time, duplicates, refused) of the last log line
        self.clock_ms = clock_ms
        self.event_clock = event_clock
        #: The replay's clock (UTC epoch ms; kept across :meth:`reset`); only tracked with ``event_clock``.
        self.event_time_ms = 0
        #: (newest event time, channel) of the channels with the newest events, newest first (replay clock).
        self.leaders: list[tuple[int, str]] = []
        self.max_clock_skew_ms = int(max_clock_skew_ms)
        #: Events stamped more than ``max_clock_skew_ms`` ahead of the clock (kept; see the class doc).
        self.ahead_of_clock = 0
        self._ahead_logged = (0.0, 0)  # (monotonic time, ahead_of_clock) of the last log line
        self.counters = DecodeCounters()
        self.events_in = 0
        self.verdicts_out = 0
        #: channel → snapshot bytes not yet loaded (those of unknown input partition: restored on the
        #: channel's first event, so a worker only takes the channels of its partitions).
        self.pending_snapshots: dict[str, bytes] = {}
        #: channel → input partition its newest events came from (saved with its snapshot, so a restarted
        #: worker restores the channels of its assigned partitions at once; SPEC §3: key = channel).
        self.input_partition: dict[str, int] = {}
        #: partition → (newest event time delivered, monotonic wall time of delivery)
        self.partition_wm: dict[int, tuple[int, float]] = {}
        #: assigned input partition → consumed to its end (see :meth:`set_partition_status`)
        self.caught_up: dict[int, bool] = {}
        self.restored = 0
        #: snapshots refused (state-topic records that break the snapshot contract; those of evicted channels
        #: refused by an engine this processor held before :meth:`reset` included): the channel started fresh.
        self.bad_snapshots = 0
        #: one warning per refused snapshot, bounded (:class:`~pipeline.state.refusals.RefusalLog`)
        self.snapshot_refusals = RefusalLog(log, "snapshot")
        #: channel → input offsets covered by a not-yet-loaded snapshot (``pending_snapshots``).
        self.pending_offsets: dict[str, dict[int, int]] = {}
        #: restored channel → input offsets its restored state covers (partition → last offset).
        self.covered: dict[str, dict[int, int]] = {}
        #: events kept out of the engine because their channel's snapshot already covered them.
        self.skipped_covered = 0
        #: partition → highest input offset any loaded snapshot covers, until input on that partition
        #: has passed it (offsets only grow within an assignment); empty: no event can be covered.
        self.cover_limit: dict[int, int] = {}

    @classmethod
    def for_settings(cls, settings: Settings, policy: PolicyConfig | None = None) -> "BatchProcessor":
        """The worker's processor: an :class:`Engine` with ``policy`` and ``settings.state_limits``, the age
        bound ``settings.max_event_age_ms`` (``CHANNEL_HEALTH_MAX_EVENT_AGE``), and the event clock when
        ``settings.clock == "event"``, and the clock skew ``settings.max_clock_skew_ms``."""
        engine = Engine(policy, settings.state_limits)
        return cls(engine, Decoder(max_age_ms=settings.max_event_age_ms, classifier=engine.policy.classifier),
                   event_clock=settings.clock == "event", max_clock_skew_ms=settings.max_clock_skew_ms)

    def reset(self, engine: Engine) -> None:
        """Start over with ``engine`` (fresh) after a rebalance; counters are kept.

        Drops pending snapshots, restore bookkeeping, partition watermarks and the ``event_id`` memory;
        call :meth:`load_snapshots` afterwards.
        """
        self.bad_snapshots += self.engine.residency.bad_snapshots  # the engine's count goes with it
        self.engine = engine
        # Input after a rebalance is re-read from the committed offsets: rows of the old assignment that
        # were not yet written must be stored again, so the ids of the old assignment are forgotten.
        self.dedup = EventIdDedup(self.dedup.horizon_ms, self.dedup.max_ids)
        self.pending_snapshots = {}
        self.pending_offsets = {}
        self.covered = {}
        self.cover_limit = {}
        self.partition_wm = {}
        self.caught_up = {}
        self.input_partition = {}

    def load_snapshots(self, records: Mapping[str, tuple], assigned: Collection[int] | None = None) -> int:
        """Make channel snapshots available for restore; restore those of the ``assigned`` partitions now.

        ``records``: channel → ``(snapshot bytes, covered input offsets)`` or
        ``(snapshot bytes, covered input offsets, input partition)``: covered offsets
        map partition → last offset included in the snapshot (empty when unknown);
        the input partition is the one the channel's events came from (None when
        unknown, e.g. a snapshot written before workers recorded it).

        A channel whose input partition is in ``assigned`` is restored at once
        (as Kafka Streams restores state before processing), so it is evaluated
        as event time advances even if no event of it ever comes again: that is
        how a channel that went silent across a restart is still reported
        ``no_data``. Any other channel is restored on its first event. Returns
        the number restored now (bad snapshots are counted in ``bad_snapshots``
        and those channels start fresh).
        """
        # Room for every channel that may be restored, at once: restores then copy no ring (rows of
        # channels that never come, e.g. those of another worker's partitions, use no resident memory).
        self.engine.store.reserve(self.engine.store.n_channels + len(self.pending_snapshots) + len(records))
        limit = self.cover_limit
        now: list[str] = []
        for name, record in records.items():
            blob, offsets = record[0], record[1]
            partition = record[2] if len(record) > 2 else None
            self.pending_snapshots[name] = blob
            covered = self.pending_offsets[name] = {int(p): int(o) for p, o in offsets.items()}
            for p, o in covered.items():
                if o > limit.get(p, -1):
                    limit[p] = o
            if partition is not None:
                self.input_partition[name] = int(partition)
                if assigned is not None and partition in assigned:
                    now.append(name)
        before = self.restored
        self._restore(now, hold_idle=True)
        return self.restored - before

    def process(self, raws: Sequence[bytes | None], partitions: Sequence[int] | None = None,
                offsets: Sequence[int] | None = None) -> ProcessedBatch:
        """Process raw message values in arrival order. Never raises on bad input.

        ``partitions`` (same length as ``raws``) names each message's input
        partition; the low watermark handed to the engine is then the
        minimum over partitions that delivered within the last
        ``PARTITION_IDLE_S`` seconds of the newest event time each has
        delivered (partitions drift apart when a backlog is replayed). Without
        it the messages are taken as one stream in event-time order.

        ``offsets`` (same length, with ``partitions``): each message's input
        offset. Events of a restored channel at or before the offset its
        snapshot covers on that partition are not fed to the engine (they are
        in its state already) but still returned in ``stored``.
        """
        out = ProcessedBatch()
        now = self.clock_ms()
        given = partitions is not None and offsets is not None
        track = given and self._may_be_covered(partitions, offsets)  # type: ignore[arg-type]
        if self.event_clock:
            self.decoder.age_clock_ms = self.event_time_ms
        # each message's fields are read right after its decode, while its events are in the CPU's cache
        events, owner, out.dead_letters, envelopes, read = self.decoder.decode_many(raws, now, self.engine.read_fields)
        # the one form the batch travels in from here on (no message with events: read here, empty)
        fields = EventFields.concat(read) if read else self.engine.read_fields(events)
        if self.event_clock and events:
            self.event_time_ms = max(self.event_time_ms, self._note_leaders(fields))
        ceiling = (self.event_time_ms if self.event_clock else now) + self.max_clock_skew_ms
        if events:
            self._note_ahead(events, fields, ceiling)
        self.events_in += len(events)  # decoded, duplicates included
        dup = (self.dedup.filter(events, self.engine.store.watermark_ms, fields.event_id)
               if events else None)
        if dup:
            events, owner, envelopes, fields = self._drop_duplicates(events, owner, envelopes, dup, fields)
        if track:  # events a snapshot covers go to ``stored`` on their own (below): keep their messages as rows
            envelopes = []
        origin: list[tuple[int, int]] = []
        if partitions is not None and events:
            parts = list(map(partitions.__getitem__, owner))
            self._note_partitions(parts, fields, ceiling)
            if track:
                origin = list(zip(parts, map(offsets.__getitem__, owner)))  # type: ignore[union-attr]
        for d in out.dead_letters:
            self.counters.add_dead_letter(d.reason)
        if self.pending_snapshots:
            self._restore_channels(fields.channel)
        if track and self.covered and events:
            keep = self._drop_covered(events, origin, out)
            if len(keep) != len(events):  # a restart's replay: the events its restored state does not hold
                events, fields = list(map(events.__getitem__, keep)), fields.take(np.asarray(keep, np.int64))
        if given and self.cover_limit:
            self._pass_cover_limit(partitions, offsets)  # type: ignore[arg-type]
        late: list[RequestEvent] = []
        store = self.engine.store
        if partitions is None:
            result = self.engine.process(events, fields=fields, max_advance_ms=ceiling)
        else:  # 0: not known yet — channels advance only with their own events
            result = self.engine.process(events, low_watermark_ms=self.low_watermark_ms() or 0, fields=fields)
        if store.watermark_ms is not None and store.watermark_ms > ceiling:
            store.watermark_ms = ceiling  # an event ahead of the clock moves no dedup horizon or snapshot watermark
        out.verdicts.extend(result.verdicts)
        late.extend(result.late)
        if result.refused:
            self._refuse(result.refused, out)
        stored, out.envelopes = split_stored(envelopes, events, owner, result.accepted, result.late, result.refused)
        out.stored.extend(stored)
        for e in late:
            idx = self.engine.channel_rows.get(e.channel)
            newest = int(self.engine.store.last_ts_ms[idx]) if idx is not None else e.ts_ms
            lateness_s = (newest - e.ts_ms) / 1000
            out.dead_letters.append(DeadLetter(
                reason="late_event",
                detail=f"ts_ms is {lateness_s:.0f} s behind the channel's newest event; allowed lateness is "
                       f"{self.engine.policy.allowed_lateness_ms / 1000:.0f} s",
                raw=encode(e), event_id=e.event_id))
            self.counters.add_dead_letter("late_event")
        self.verdicts_out += len(out.verdicts)
        return out

    def _drop_duplicates(self, events: list[RequestEvent], owner: list[int], envelopes: list, dup: list[int],
                         fields: EventFields) -> tuple[list[RequestEvent], list[int], list, EventFields]:
        """Events, owners and fields without the positions ``dup``; envelopes without the messages that held
        one (their other events are then stored as rows)."""
        gone = set(dup)
        keep = [i not in gone for i in range(len(events))]
        if envelopes:
            bad = {owner[i] for i in dup}
            envelopes = [env for env in envelopes if env[0] not in bad]
        self.duplicates += len(dup)
        self._log_bounded()
        fields = fields.take(np.flatnonzero(keep))
        return list(compress(events, keep)), list(compress(owner, keep)), envelopes, fields

    def _refuse(self, refused: list[RequestEvent], out: ProcessedBatch) -> None:
        """Dead-letter events of channels over the engine's channel limit."""
        limits = self.engine.limits
        for e in refused:
            out.dead_letters.append(DeadLetter(
                reason=TOO_MANY_CHANNELS,
                detail=f"channel {e.channel[:100]!r} is new and this worker already holds its limit of "
                       f"{limits.max_channels} channels in memory, none idle for "
                       f"{limits.evict_horizon_ms / 1000:.0f} s to make room, or {limits.held_limit} with the "
                       f"evicted ones (CHANNEL_HEALTH_MAX_CHANNELS, _EVICT_HORIZON_S, _MAX_HELD_CHANNELS)",
                raw=encode(e), event_id=e.event_id))
            self.counters.add_dead_letter(TOO_MANY_CHANNELS)
        self.refused += len(refused)
        self.refused_by_prefix.add([e.channel for e in refused])
        self._log_bounded()

    def _log_bounded(self) -> None:
        """One warning per ``LOG_EVERY_S`` with the duplicates and refusals since the last one."""
        at, dups, refused = self._logged_at
        wall = time.monotonic()
        if wall - at < LOG_EVERY_S:
            return
        top = ", ".join(f"{p!r}: {n}" for p, n in self.refused_by_prefix.top(5))
        log.warning("dropped %d re-sent events (event_id seen within the dedup horizon) and dead-lettered %d "
                    "events of channels over the limit since the last report (totals %d, %d; refused by name "
                    "prefix, top 5: %s)", self.duplicates - dups, self.refused - refused, self.duplicates,
                    self.refused, top or "none")
        self._logged_at = (wall, self.duplicates, self.refused)

    def _note_leaders(self, fields: EventFields) -> int:
        """Update :attr:`leaders` with ``events``; return the replay clock they give (UTC epoch ms): the
        newest event time of the :data:`REPLAY_CLOCK_QUORUM`-th newest channel (of the only ones, if fewer)."""
        ts, names = fields.ts_ms, fields.channel
        best = {c: t for t, c in self.leaders}
        for i in np.argsort(ts, kind="stable")[::-1].tolist():  # newest first: stops after a few channels
            c, t = names[i], int(ts[i])
            if best.get(c, t - 1) < t:
                best[c] = t
            if sum(v >= t for v in best.values()) >= REPLAY_CLOCK_QUORUM:
                break  # older events change none of the newest channels' times
        self.leaders = sorted(((t, c) for c, t in best.items()), reverse=True)[:REPLAY_CLOCK_QUORUM]
        return self.leaders[-1][0]

    def _note_ahead(self, events: list[RequestEvent], fields: EventFields, ceiling_ms: int) -> None:
        """Count the events stamped after ``ceiling_ms`` (clock + skew); log at most once per ``LOG_EVERY_S``."""
        ts = fields.ts_ms
        ahead = np.flatnonzero(ts > ceiling_ms)
        if not ahead.size:
            return
        self.ahead_of_clock += int(ahead.size)
        at, logged = self._ahead_logged
        wall = time.monotonic()
        if logged and wall - at < LOG_EVERY_S:
            return
        i = int(ahead[np.argmax(ts[ahead])])
        by_ms = int(ts[i]) - ceiling_ms + self.max_clock_skew_ms
        log.warning("%d events stamped more than %.0f s ahead of the %s clock since the last report (total %d), "
                    "newest: channel %r event_id %r, %.0f s ahead; kept with their own ts_ms, they move no other "
                    "channel's evaluation clock", self.ahead_of_clock - logged, self.max_clock_skew_ms / 1000,
                    "replay" if self.event_clock else "wall", self.ahead_of_clock, events[i].channel[:100],
                    events[i].event_id[:100], by_ms / 1000)
        self._ahead_logged = (wall, self.ahead_of_clock)

    def _note_partitions(self, parts: list[int], fields: EventFields, ceiling_ms: int) -> None:
        """Per input partition, the newest event time delivered, at most ``ceiling_ms`` (clock + skew; for the
        low watermark), and per channel the partition its events come from (saved with its snapshot).
        ``fields``: the events' fields."""
        wall = time.monotonic()
        distinct = set(parts)
        if len(distinct) == 1:
            newest = {parts[0]: int(fields.ts_ms.max())}
        else:
            ts = fields.ts_ms
            part = np.asarray(parts)
            newest = {p: int(ts[part == p].max()) for p in distinct}
        for p, hi in newest.items():
            hi = min(hi, ceiling_ms)
            prev = self.partition_wm.get(p)
            self.partition_wm[p] = (max(hi, prev[0]) if prev else hi, wall)
        self.input_partition.update(zip(fields.channel, parts))

    def _may_be_covered(self, partitions: Sequence[int], offsets: Sequence[int]) -> bool:
        """Whether a message of this batch is at or below a snapshot's covered offset on its partition
        (one check per message; without such a message no event is looked up per event)."""
        limit = self.cover_limit
        return bool(limit) and any(o <= limit.get(p, -1) for p, o in zip(partitions, offsets))

    def _pass_cover_limit(self, partitions: Sequence[int], offsets: Sequence[int]) -> None:
        """Forget the cover limit of partitions whose input has now passed it."""
        limit = self.cover_limit
        for p, o in zip(partitions, offsets):
            if p in limit and o > limit[p]:
                del limit[p]

    def _drop_covered(self, events: list[RequestEvent], origin: list[tuple[int, int]],
                      out: ProcessedBatch) -> list[int]:
        """Positions of the events not yet in the restored state; the others go straight to ``out.stored``."""
        keep: list[int] = []
        covered = self.covered
        for i, (e, (p, o)) in enumerate(zip(events, origin)):
            cov = covered.get(e.channel)
            if cov is not None and o <= cov.get(p, -1):
                out.stored.append((e, e.parse_ok, e.missing_fields))  # flags as ingest resolved them
                self.skipped_covered += 1
            else:
                keep.append(i)
        return keep

    def _restore_channels(self, names: Iterable[str]) -> None:
        """Restore the pending snapshots of the channels ``names`` the engine does not hold yet."""
        known = self.engine.channel_rows
        self._restore({c for c in set(names) if c not in known})

    def _restore(self, names: Collection[str], hold_idle: bool = False) -> None:
        """Load the pending snapshots of ``names`` into the engine (a bad one: the channel starts fresh).

        ``hold_idle``: a channel that was already idle for the engine's ``evict_idle_ms`` when its
        snapshot was saved is registered as evicted (:func:`~pipeline.state.snapshot.hold_channel`:
        its windows are loaded on its next event), so a restart does not load every idle channel."""
        from pipeline.state.snapshot import SnapshotError, decode_snapshot, hold_channel, import_channel

        idle_ms = self.engine.limits.evict_idle_ms
        for name in names:
            raw = self.pending_snapshots.pop(name, None)
            offsets = self.pending_offsets.pop(name, None)
            if raw is None:
                continue
            try:
                snap = decode_snapshot(raw)
                if snap.channel != name:
                    raise SnapshotError(f"the record of key {name[:100]!r} holds channel {snap.channel[:100]!r}")
                if (hold_idle and idle_ms > 0 and snap.watermark_ms is not None
                        and snap.watermark_ms - snap.last_ts_ms >= idle_ms):
                    hold_channel(self.engine, snap, raw)
                else:
                    import_channel(self.engine, snap)
                self.restored += 1
                if offsets:
                    self.covered[name] = offsets
            except SnapshotError as exc:
                self.bad_snapshots += 1  # start that channel fresh; never crash on a bad snapshot
                self.snapshot_refusals.refuse(name, str(exc))
        self.snapshot_refusals.summary()

    @property
    def refused_snapshots(self) -> int:
        """Snapshots refused so far (:attr:`bad_snapshots` and those of evicted channels the engine refused
        on their return: ``engine.residency.bad_snapshots``); monotonic across :meth:`reset`."""
        return self.bad_snapshots + self.engine.residency.bad_snapshots

    def snapshots(self) -> list[tuple[str, bytes]]:
        """``(channel, snapshot bytes)`` for every channel this worker holds."""
        from pipeline.state.snapshot import export_channel

        evicted = self.engine.residency.evicted
        return [(name, evicted.get(name) or export_channel(self.engine, i))
                for i, name in enumerate(self.engine.store.names)]

    def snapshot_records(self, offsets: Mapping[int, int]) -> list[tuple[str, bytes, dict[int, int], int | None]]:
        """``(channel, snapshot bytes, covered input offsets, input partition)`` for every channel this worker holds.

        ``offsets``: partition → last input offset processed so far. A restored
        channel also covers what its snapshot covered (the replay may not have
        passed it yet). The input partition is the one the channel's newest
        events came from (None if it never had events with a known partition).
        Equal to ``snapshot_capture(offsets)()``.
        """
        return self.snapshot_capture(offsets)()

    channel_count = property(lambda self: len(self.engine.store.names),
                             doc="Channels the engine holds (resident or evicted): positions 0..count - 1.")

    def snapshot_capture(self, offsets: Mapping[int, int], start: int = 0, stop: int | None = None,
                         changed_only: bool = False, refresh_every: int = 0, refresh_phase: int = 0) -> "Capture":
        """Capture the state now; calling the returned :class:`~pipeline.engine.capture.Capture` encodes it
        into :meth:`snapshot_records`' records (see :func:`pipeline.engine.capture.capture`: ``start``/``stop``
        positions in the append-only channel list, ``changed_only`` only channels changed since their last
        capture). The copy is cheap; the encoding reads only it, so it may run in another thread."""
        return capture(self.engine, offsets, self.input_partition, self.covered, start, stop, changed_only,
                       refresh_every, refresh_phase)

    def set_partition_status(self, caught_up: dict[int, bool]) -> None:
        """Record, per assigned input partition, whether it has been consumed to its end."""
        self.caught_up = dict(caught_up)

    def low_watermark_ms(self) -> int | None:
        """Event time up to which all input of this worker has been seen; None while unknown.

        With partition status (:meth:`set_partition_status`): the minimum,
        over partitions that still have a backlog, of the newest event time
        each delivered (None if one of them has delivered nothing yet);
        when every partition is caught up, the newest event time delivered.
        Without it: the minimum over partitions that delivered within the
        last ``PARTITION_IDLE_S`` seconds (the usual idle-source rule).
        """
        if self.caught_up:
            behind = [p for p, done in self.caught_up.items() if not done]
            if behind:
                if any(p not in self.partition_wm for p in behind):
                    return None
                return min(self.partition_wm[p][0] for p in behind)
            return max((ts for ts, _ in self.partition_wm.values()), default=None)
        now = time.monotonic()
        active = [ts for ts, seen in self.partition_wm.values() if now - seen <= PARTITION_IDLE_S]
        if active:
            return min(active)
        return max((ts for ts, _ in self.partition_wm.values()), default=None)

    def advance_idle(self, wall_elapsed_ms: int, now_ms: int | None = None) -> list[Verdict]:
        """Advance event time by ``wall_elapsed_ms`` when no events arrive.

        An idle source would otherwise freeze event time and no channel
        could ever be reported ``no_data``; this is the usual idle-source
        watermark advance. ``now_ms`` (wall clock, UTC epoch ms): event time
        is never advanced past it (events stamped ahead of this clock, e.g.
        a replay into the future or a gateway clock ahead, are not overtaken
        by idle rounds).
        """
        wm = self.engine.low_watermark_ms
        if wm is None or wall_elapsed_ms <= 0:
            return []
        target = wm + wall_elapsed_ms
        if now_ms is not None:
            target = min(target, now_ms)
        if target <= wm:
            return []
        verdicts = self.engine.advance(target)
        self.verdicts_out += len(verdicts)
        return verdicts
