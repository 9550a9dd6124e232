"""Input batches → processor → outputs, per consumer generation (no faust in here).

:class:`Assignment` owns the question "does the processor's state belong
to the live assignment?": with each new consumer generation it starts over
(a fresh engine, the state topic's snapshots reloaded, the committed
offsets read back, :meth:`Assignment.reset`). :class:`Intake` takes the
messages of one ``noack_take`` batch: it drops those of an older generation
or out of order (:class:`~pipeline.stream.offsets.OffsetGate`; a partition
whose records arrived ahead of its start is re-read from there), runs the
fresh ones through the :class:`~pipeline.engine.batch.BatchProcessor`
in chunks of at most ``CHUNK_BYTES``, publishes each chunk's verdicts and
dead letters, puts its rows in the sink (:class:`~pipeline.stream.flushing.SinkWriter`)
and records the batch in the delivery ledger (acked after the next snapshot).

The Kafka consumer is seen through :class:`ConsumerView` (the faust adapter
is in :mod:`pipeline.stream.app`), so both classes are driven by fakes in
``tests/unit/test_stream_intake.py``.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Awaitable, Callable, Mapping, Protocol, Sequence

from pipeline.config import StreamTunables
from pipeline.engine import Engine
from pipeline.stream.flushing import SinkWriter
from pipeline.stream.offsets import MAX_SEEKS, OffsetGate
from pipeline.engine.batch import ProcessedBatch
from pipeline.stream.worker_state import WorkerState, byte_chunks

log = logging.getLogger("channel_health.worker")


class ConsumerView(Protocol):
    """What the intake needs of the Kafka consumer, for the input topic only."""

    @property
    def generation_id(self) -> int | None:
        """The consumer group generation of the current assignment."""

    @property
    def rebalancing(self) -> bool:
        """A rebalance is in progress."""

    def assigned_partitions(self) -> list[int]:
        """Input partitions assigned to this member, sorted."""

    def highwater(self, partition: int) -> int | None:
        """Log end offset of ``partition`` as of the last fetch (no broker round trip)."""

    async def seek(self, partition: int, offset: int) -> None:
        """Fetch ``partition`` again from ``offset`` (returns once the seek is done)."""


class Assignment:
    """The processor's state and the live assignment (see the module docstring).

    ``load_records``: reads the state topic, channel → snapshot record
    (:func:`pipeline.stream.state_topic.load_snapshot_records`);
    ``load_starts``: the committed offset of each given input partition
    (:func:`pipeline.stream.offsets.start_offsets`); ``new_engine``: a fresh
    :class:`~pipeline.engine.Engine` with the worker's policy and state limits.
    """

    def __init__(self, state: WorkerState, consumer: ConsumerView,
                 load_records: Callable[[], Awaitable[Mapping[str, tuple]]],
                 load_starts: Callable[[list[int]], Awaitable[dict[int, int]]],
                 new_engine: Callable[[], Engine]) -> None:
        self.state = state
        self.consumer = consumer
        self.load_records = load_records
        self.load_starts = load_starts
        self.new_engine = new_engine

    def current(self) -> bool:
        """The processor's state belongs to the live assignment (snapshots and acks allowed)."""
        state = self.state
        return (state.assignment.generation is not None and not state.assignment.stale
                and state.assignment.generation == self.consumer.generation_id)

    async def reset(self, generation: int | None) -> None:
        """Start over for a new assignment: fresh engine, snapshots reloaded (call under ``state.lock``)."""
        state = self.state
        started = time.monotonic()
        records = await self.load_records()
        assigned = self.consumer.assigned_partitions()
        starts = await self.load_starts(assigned)
        state.assignment.gate = OffsetGate(starts)
        state.assignment.skipped_logged = 0
        state.processor.reset(self.new_engine())
        restored = state.processor.load_snapshots(records, assigned)
        state.checkpoint.ledger.clear()
        state.assignment.generation = generation
        state.assignment.stale = False
        state.checkpoint.dirty = False
        state.assignment.restored = True
        state.assignment.resets += 1
        state.assignment.reset_s = time.monotonic() - started
        log.warning("worker ready (generation %s): %d channel snapshots read, %d of them (the assigned partitions' "
                    "channels) restored, in %.2f s; input partitions %s from offsets %s", generation, len(records),
                    restored, state.assignment.reset_s, assigned, starts)

    async def ensure(self) -> bool:
        """For the timers: reset once a new assignment is complete; True when the state is current
        (under ``state.lock``)."""
        gen = self.consumer.generation_id
        if (self.state.assignment.generation != gen and not self.consumer.rebalancing
                and self.consumer.assigned_partitions()):
            await self.reset(gen)
        return self.current()

    def revoked(self) -> None:
        """Partitions were revoked: another member may own these channels now (no snapshots, no acks)."""
        self.state.assignment.stale = True


class Intake:
    """One taken batch of input messages → processor → verdicts, dead letters and rows.

    ``publish``: sends a batch's verdicts and dead letters and returns once
    Kafka acknowledged them; ``writer``: puts its rows in the sink;
    ``chunk_bytes``: most message bytes per processor call; ``control``: the
    operators' overrides (:class:`~pipeline.stream.control_agent.ControlHook`,
    its ``apply`` runs on every batch's verdicts before they are published and
    stored; None: none); ``metrics``: a :class:`~pipeline.metrics.PipelineMetrics`
    that observes batches and verdicts (None: nothing observed); ``tunables``: the idle clock's timings
    (:class:`~pipeline.config.StreamTunables`).
    """

    def __init__(self, state: WorkerState, assignment: Assignment,
                 publish: Callable[[ProcessedBatch], Awaitable[None]], writer: SinkWriter, chunk_bytes: int,
                 control: Any = None, metrics: Any = None, tunables: StreamTunables = StreamTunables()) -> None:
        self.state = state
        self.assignment = assignment
        self.consumer = assignment.consumer
        self.publish = publish
        self.writer = writer
        self.chunk_bytes = chunk_bytes
        self.control = control
        self.metrics = metrics
        self.tunables = tunables
        #: Messages between the last processed offset and the log end, over the assigned input
        #: partitions, as of the last batch (fetched highwater marks; 0 before the first batch).
        self.lag_messages = 0
        #: Whether the last batch consumed every assigned partition to its end (the flusher is kicked only when
        #: this turns True: a live trickle, at the end after every batch, is written at the flush interval).
        self.at_end = False

    async def emit(self, out: ProcessedBatch) -> None:
        """Publish ``out``: the overrides in force applied to its verdicts first (``out.verdicts`` is
        replaced, so the stored verdict rows carry the override too)."""
        if self.control is not None:
            out.verdicts = self.control.apply(out.verdicts)  # operators' overrides (SPEC §4)
        await self.publish(out)

    async def handle(self, events: Sequence[Any]) -> None:
        """Process one batch of faust events (``.value``, ``.message`` with ``partition``, ``offset``,
        ``generation_id``); takes ``state.lock``."""
        state = self.state
        assert state.lock is not None
        async with state.lock:
            gen = self.consumer.generation_id
            if state.assignment.generation != gen:
                await self.assignment.reset(gen)  # messages of a new assignment: start over from the state topic
                self.at_end = False
            elif state.assignment.stale:
                state.assignment.dropped_stale_messages += len(events)  # revoked, not yet reassigned: delivered again
                return
            fresh = await self._admit(events)
            if not fresh:
                return
            self._update_partition_status()
            for chunk in byte_chunks(fresh, self.chunk_bytes):
                await self._process(chunk)
            # acked once rows are written and a snapshot covers it
            state.checkpoint.ledger.add_batch(e.message for e in fresh)
            state.checkpoint.dirty = True
            caught_up = state.processor.caught_up
            at_end = bool(caught_up) and all(caught_up.values())
            if at_end and not self.at_end:
                # a backlog consumed to its end: write the rows now, not at the next interval. Not per batch while
                # at the end: at a trickle every batch is, and an insert per batch (~20 ms of chDB CPU each, two
                # tables) took the sink process 17 % of a core at 200 events/s (issue #34, paced stage)
                self.writer.kick()
            self.at_end = at_end

    async def _admit(self, events: Sequence[Any]) -> list[Any]:
        """The events to process now, in order; the others are counted as dropped (delivered again)."""
        state = self.state
        fresh = []
        gaps: set[int] = set()
        gate = state.assignment.gate
        for e in events:
            msg = e.message
            current = msg.generation_id == state.assignment.generation
            decision = gate.check(msg.partition, msg.offset) if current else "old"
            if decision == "accept":
                fresh.append(e)
                continue
            state.assignment.dropped_stale_messages += 1  # delivered again (old generation, duplicate or before a seek)
            if decision == "gap":
                gaps.add(msg.partition)
        for p in sorted(gaps):
            await self._seek_back(p)
        while len(gate.skipped_starts) > state.assignment.skipped_logged:
            p, start, first = gate.skipped_starts[state.assignment.skipped_logged]
            state.assignment.skipped_logged += 1
            log.error("input partition %d: no record at committed offset %d after %d seeks; continuing at %d "
                      "(offsets in between are absent from the log, e.g. transaction markers)",
                      p, start, MAX_SEEKS, first)
        return fresh

    async def _process(self, chunk: list[Any]) -> None:
        """One processor call; its outputs published and stored; the messages' bytes freed."""
        state = self.state
        t0 = time.perf_counter()
        out = state.processor.process([e.value for e in chunk], [e.message.partition for e in chunk],
                                      [e.message.offset for e in chunk])
        t1 = time.perf_counter()
        await self.emit(out)
        t2, waited = time.perf_counter(), state.wall_s["backpressure"]
        if self.metrics is not None:
            self.metrics.observe_batch(t1 - t0, t2 - t0, out.verdicts)
        await self.writer.store(out)  # rows leave as one encoded payload: the decoded events die with ``out``
        wall = state.wall_s
        wall["process"] += t1 - t0
        wall["publish"] += t2 - t1
        wall["rows"] += time.perf_counter() - t2 - (wall["backpressure"] - waited)
        for e in chunk:  # never read again (an ack needs only partition and offset): free the bytes
            e.value = e.message.value = None

    async def _seek_back(self, partition: int) -> None:
        """Re-read an unsynced partition from its start offset (see :mod:`pipeline.stream.offsets`)."""
        offset = self.state.assignment.gate.want_seek(partition)
        if offset is None:
            return
        log.warning("input partition %d: records after offset %d arrived before it (fetched before the seek "
                    "of the rebalance); re-reading from %d", partition, offset, offset)
        await self.consumer.seek(partition, offset)

    def _update_partition_status(self) -> None:
        """Tell the processor which input partitions are consumed to their end, and note the lag (each batch:
        it is cheap)."""
        parts = self.consumer.assigned_partitions()
        if not parts:
            return
        last = self.state.assignment.gate.last_offsets
        lag = {p: (self.consumer.highwater(p) or 0) - last.get(p, -1) - 1 for p in parts}
        self.lag_messages = sum(n for n in lag.values() if n > 0)
        self.state.processor.set_partition_status({p: n <= 0 for p, n in lag.items()})

    async def advance_idle(self, now_ms: int) -> None:
        """The idle timer: after ``tunables.idle_advance_after_s`` without input, advance event time by
        ``tunables.idle_step_ms`` (never past ``now_ms``, wall clock UTC epoch ms) and emit what that decides."""
        state = self.state
        if state.lock is None or time.monotonic() - state.last_batch_wall_s < self.tunables.idle_advance_after_s:
            return
        async with state.lock:
            if not await self.assignment.ensure():
                return
            verdicts = state.processor.advance_idle(self.tunables.idle_step_ms, now_ms=now_ms)
            if verdicts:
                out = ProcessedBatch(verdicts=verdicts)
                await self.emit(out)
                if self.metrics is not None:
                    self.metrics.observe_verdicts(out.verdicts)
                await self.writer.store(out)
                state.checkpoint.ledger.add_batch([])
                state.checkpoint.dirty = True
