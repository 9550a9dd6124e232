"""The worker's stream layer without faust: intake, flushing, snapshots and the Sink contract.

:mod:`pipeline.stream.intake`, :mod:`pipeline.stream.flushing`,
:mod:`pipeline.stream.snapshots` and :mod:`pipeline.stream.checkpoint` driven by fakes of the Kafka consumer, the
producer and the sink (the faust wiring itself is covered by the worker
integration tests).
"""

from __future__ import annotations

import asyncio
import inspect
import time
from dataclasses import dataclass, field, replace
from typing import Any

import msgspec
import pytest

from pipeline.engine import Engine
from pipeline.sinks.clickhouse import ClickHouseSink
from pipeline.sinks.errors import SinkBackpressure, SinkWriteError
from pipeline.sinks.process import ProcessSink
from pipeline.sinks.protocol import Sink
from pipeline.stream.flushing import SinkWriter
from pipeline.stream.intake import Assignment, Intake
from pipeline.engine.batch import BatchProcessor, ProcessedBatch
from pipeline.config import StreamTunables
from pipeline.stream.checkpoint import Checkpoint
from pipeline.stream.snapshots import SnapshotPublisher
from pipeline.stream.worker_state import WorkerState

NOW_MS = int(time.time() * 1000)


def _raw(i: int, **extra: Any) -> bytes:
    return msgspec.json.encode({"event_id": f"e{i}", "ts_ms": NOW_MS - 60_000 + i, "channel": "p/m@paid",
                                "route": "chat", "status": "ok", "latency_ms": 100.0, **extra})


@dataclass
class Msg:
    partition: int
    offset: int
    generation_id: int
    value: bytes | None
    acked: bool = False


@dataclass
class Ev:
    value: bytes | None
    message: Msg


def _events(values: list[bytes], partition: int = 0, first: int = 0, generation: int = 1) -> list[Ev]:
    return [Ev(v, Msg(partition, first + k, generation, v)) for k, v in enumerate(values)]


@dataclass
class Consumer:
    """A ConsumerView fake: one input partition, the given generation and log end."""

    generation_id: int | None = 1
    rebalancing: bool = False
    partitions: list[int] = field(default_factory=lambda: [0])
    end: int = 100
    seeks: list[tuple[int, int]] = field(default_factory=list)

    def assigned_partitions(self) -> list[int]:
        return list(self.partitions)

    def highwater(self, partition: int) -> int | None:
        return self.end

    async def seek(self, partition: int, offset: int) -> None:
        self.seeks.append((partition, offset))


class FakeSink:
    """A Sink that buffers in lists; ``full`` rows make add_* refuse; ``fail`` makes flush raise."""

    def __init__(self, max_rows: int = 1000) -> None:
        self.max_rows = max_rows
        self.buffer: list[tuple[str, Any]] = []
        self.written = {"events": 0, "event_batches": 0, "verdicts": 0}
        self.fail = False

    @property
    def pending_rows(self) -> int:
        return sum(len(rows) for _, rows in self.buffer)

    def _add(self, table: str, rows: list) -> None:
        if self.pending_rows + len(rows) > self.max_rows:
            raise SinkBackpressure(table, self.pending_rows, 0, self.max_rows, 1 << 30)
        self.buffer.append((table, list(rows)))

    def add_events(self, stored: Any) -> None:
        self._add("events", stored)

    def add_event_batches(self, envelopes: Any) -> None:
        self._add("event_batches", envelopes)

    def add_verdicts(self, verdicts: Any) -> None:
        self._add("verdicts", verdicts)

    def add_overrides(self, rows: Any) -> None:
        self._add("overrides", rows)

    def flush(self) -> int:
        if self.fail:
            raise SinkWriteError("down", table="events", rows=self.pending_rows)
        n = 0
        for table, rows in self.buffer:
            self.written[table] += len(rows)
            n += len(rows)
        self.buffer.clear()
        return n


def _worker(sink: Any = None, consumer: Consumer | None = None, records: dict | None = None,
            starts: dict | None = None) -> tuple[WorkerState, Assignment, Intake, SinkWriter, list]:
    state = WorkerState(processor=BatchProcessor(clock_ms=lambda: NOW_MS), sink=sink)
    state.init_sync()
    published: list[ProcessedBatch] = []

    async def load_records() -> dict:
        return records or {}

    async def load_starts(assigned: list[int]) -> dict[int, int]:
        return dict(starts or {p: 0 for p in assigned})

    async def publish(out: ProcessedBatch) -> None:
        published.append(out)

    assignment = Assignment(state, consumer or Consumer(), load_records, load_starts, Engine)
    writer = SinkWriter(state)
    return state, assignment, Intake(state, assignment, publish, writer, chunk_bytes=1 << 20), writer, published


def test_both_sinks_keep_the_sink_protocol() -> None:
    """Without starting ClickHouse: each member is on the class, or set on the instance by ``__init__``."""
    for cls in (ClickHouseSink, ProcessSink):
        init = inspect.getsource(cls.__init__)
        for name in ("add_events", "add_event_batches", "add_verdicts", "add_overrides", "flush", "pending_rows",
                     "max_rows", "written"):
            assert hasattr(cls, name) or f"self.{name} = " in init, (cls, name)
        assert inspect.signature(cls.flush).parameters.keys() == {"self"}
    assert isinstance(FakeSink(), Sink) and not isinstance(object(), Sink)


def test_intake_processes_a_first_batch_and_records_it_for_acking() -> None:
    sink = FakeSink()
    state, assignment, intake, _, published = _worker(sink)
    events = _events([_raw(1), _raw(2, missing_fields=["a"]), b"not json"])
    asyncio.run(intake.handle(events))
    assert state.assignment.generation == 1 and state.assignment.resets == 1 and assignment.current()
    assert [d.reason for out in published for d in out.dead_letters] == ["invalid_json"]
    stored = [row for table, rows in sink.buffer if table == "events" for row in rows]
    assert [(e.event_id, ok, miss) for e, ok, miss in stored] == [("e1", None, None), ("e2", True, ["a"])]
    assert state.checkpoint.ledger.unacked_messages == 3 and state.checkpoint.dirty
    assert all(e.value is None and e.message.value is None for e in events)  # the bytes are freed
    assert state.processor.caught_up == {0: False}  # offset 2 + 1 < log end 100
    assert intake.lag_messages == 97  # offsets 3..99 not yet processed: the take may linger (stream.take)


def test_lag_counts_every_assigned_partition_and_never_below_zero() -> None:
    """Two partitions with log end 100: 0 processed to offset 2 (97 behind), 1 not at all (100 behind);
    then with log ends of 50, partition 0 (read up to 99) counts 0, not -50, and partition 1 counts 50."""
    consumer = Consumer(partitions=[0, 1])
    state, _, intake, _, _ = _worker(FakeSink(), consumer)
    asyncio.run(intake.handle(_events([_raw(1), _raw(2), _raw(3)])))
    assert intake.lag_messages == 97 + 100
    consumer.end = 50
    asyncio.run(intake.handle(_events([_raw(k) for k in range(4, 101)], first=3)))
    assert intake.lag_messages == 50 and state.processor.caught_up == {0: True, 1: False}


def test_intake_drops_old_generations_duplicates_and_seeks_back_over_a_gap() -> None:
    consumer = Consumer()
    state, _, intake, _, _ = _worker(FakeSink(), consumer, starts={0: 10})
    asyncio.run(intake.handle(_events([_raw(1), _raw(2)], first=12)))  # fetched ahead of offset 10
    assert consumer.seeks == [(0, 10)] and state.assignment.dropped_stale_messages == 2 and state.checkpoint.ledger.unacked_messages == 0
    asyncio.run(intake.handle(_events([_raw(3), _raw(4)], first=10) + _events([_raw(5)], first=11, generation=0)))
    assert state.checkpoint.ledger.unacked_messages == 2 and state.assignment.dropped_stale_messages == 3
    asyncio.run(intake.handle(_events([_raw(4)], first=11)))  # already processed
    assert state.checkpoint.ledger.unacked_messages == 2 and state.assignment.dropped_stale_messages == 4


def test_intake_after_revocation_drops_input_until_the_next_generation() -> None:
    consumer = Consumer()
    state, assignment, intake, _, _ = _worker(FakeSink(), consumer)
    asyncio.run(intake.handle(_events([_raw(1)])))
    assignment.revoked()
    assert not assignment.current()
    asyncio.run(intake.handle(_events([_raw(2)], first=1)))
    assert state.assignment.dropped_stale_messages == 1 and state.assignment.resets == 1
    consumer.generation_id = 2
    asyncio.run(intake.handle(_events([_raw(2)], first=0, generation=2)))
    assert state.assignment.resets == 2 and state.checkpoint.ledger.unacked_messages == 1 and assignment.current()


class Recorder:
    """A PipelineMetrics fake: records what is observed (``sink_write_failures_total.inc()`` too)."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []
        self.sink_write_failures_total = self

    def observe_batch(self, processing_s: float, latency_s: float | None, verdicts: Any) -> None:
        self.calls.append(("batch", list(verdicts)))

    def observe_verdicts(self, verdicts: Any) -> None:
        self.calls.append(("verdicts", list(verdicts)))

    def observe_flush(self, seconds: float, rows: int | None) -> None:
        self.calls.append(("flush", rows))

    def inc(self) -> None:
        self.calls.append(("write_failed",))


class Marking:
    """A ControlHook fake: every verdict leaves with an override mark."""

    def apply(self, verdicts: list) -> list:
        return [f"{v}+override" for v in verdicts]


def test_overrides_apply_before_publish_and_store_and_metrics_observe_them() -> None:
    sink = FakeSink()
    state, assignment, plain, writer, published = _worker(sink)
    metrics = Recorder()
    intake = Intake(state, assignment, plain.publish, writer, 1 << 20, control=Marking(), metrics=metrics)
    state.processor.process = lambda values, parts, offs: ProcessedBatch(verdicts=["v1"])  # type: ignore[method-assign]
    asyncio.run(intake.handle(_events([_raw(1)])))
    assert [out.verdicts for out in published] == [["v1+override"]]
    assert [rows for table, rows in sink.buffer if table == "verdicts"] == [["v1+override"]]
    assert metrics.calls == [("batch", ["v1+override"])]
    state.processor.advance_idle = lambda step, now_ms: ["v2"]  # type: ignore[method-assign]
    state.last_batch_wall_s = time.monotonic() - 3600
    asyncio.run(intake.advance_idle(NOW_MS))
    assert published[-1].verdicts == ["v2+override"] and metrics.calls[-1] == ("verdicts", ["v2+override"])
    assert [rows for table, rows in sink.buffer if table == "verdicts"][-1] == ["v2+override"]


def test_writer_metrics_observe_writes_and_count_failures() -> None:
    sink = FakeSink()
    state, _, _, _, _ = _worker(sink)
    metrics = Recorder()
    writer = SinkWriter(state, metrics)
    asyncio.run(writer.store(ProcessedBatch(verdicts=["v"])))  # type: ignore[list-item]
    sink.fail = True
    assert asyncio.run(writer.flush_once()) is False
    sink.fail = False
    assert asyncio.run(writer.flush_once()) is True
    assert metrics.calls == [("write_failed",), ("flush", 1)]


def test_writer_waits_out_backpressure_and_marks_batches_written() -> None:
    sink = FakeSink(max_rows=1)
    state, _, _, writer, _ = _worker(sink)
    state.checkpoint.ledger.add_batch(["m1"])
    batch = ProcessedBatch(stored=[("row", None, None)], verdicts=["v"])  # type: ignore[list-item]

    async def scenario() -> None:
        flusher = asyncio.create_task(writer.run(after_flush=lambda: asyncio.sleep(0)))
        try:
            await writer.store(batch)  # the verdict does not fit until the flusher wrote the row
            assert state.writes.backpressure_waits == 1 and not state.writes.intake_paused
            assert await writer.flush_once()
        finally:
            flusher.cancel()

    asyncio.run(asyncio.wait_for(scenario(), 30))
    assert sink.written == {"events": 1, "event_batches": 0, "verdicts": 1} and state.writes.rows_written == 2
    assert state.checkpoint.ledger.flushed == 1


def test_a_failed_write_keeps_the_rows_and_marks_nothing_written() -> None:
    sink = FakeSink()
    sink.fail = True
    state, _, _, writer, _ = _worker(sink)
    state.checkpoint.ledger.add_batch(["m1"])
    asyncio.run(writer.store(ProcessedBatch(verdicts=["v"])))  # type: ignore[list-item]
    assert asyncio.run(writer.flush_once()) is False
    assert state.writes.sink_failures == 1 and state.writes.sink_down_since is not None and state.checkpoint.ledger.flushed == 0
    sink.fail = False
    assert asyncio.run(writer.flush_once()) is True
    assert state.writes.sink_failures == 0 and state.writes.sink_down_since is None and state.checkpoint.ledger.flushed == 1


def test_snapshot_is_published_after_its_rows_then_acks_the_messages() -> None:
    sink = FakeSink()
    state, assignment, intake, writer, _ = _worker(sink)
    sent: list[list] = []

    async def send(records: list) -> None:
        sent.append(records)

    snapshots = SnapshotPublisher(state, send, lambda m: setattr(m, "acked", True), assignment.current)
    events = _events([_raw(1), _raw(2)])

    async def run() -> None:  # one event loop: the snapshot is encoded in a thread of it (to_thread)
        await intake.handle(events)
        await snapshots.tick()  # captured; its rows are not written yet: not published
        assert sent == [] and state.checkpoint.ledger.pending_snapshot_seq == 1
        assert await writer.flush_once()
        await snapshots.try_save()

    asyncio.run(run())
    assert [key for key, _, _ in sent[0]] == [b"p/m@paid"]
    assert all(e.message.acked for e in events) and state.checkpoint.acked_messages == 2 and state.checkpoint.snapshots_written == 1


def test_snapshots_are_encoded_in_a_thread_off_the_event_loop() -> None:
    """Under the lock the state is only captured (``snapshot_capture``); the encoding runs in a thread."""
    import threading

    state, assignment, intake, writer, _ = _worker(FakeSink())
    encoded_in: list[threading.Thread] = []
    capture = state.processor.snapshot_capture

    def traced(offsets: Any, *slice_: Any, **options: Any) -> Any:
        taken = capture(offsets, *slice_, **options)

        def run() -> Any:
            encoded_in.append(threading.current_thread())
            return taken.encode()

        return replace(taken, encode=run)

    state.processor.snapshot_capture = traced  # type: ignore[method-assign]
    sent: list[list] = []

    async def send(records: list) -> None:
        sent.append(records)

    snapshots = SnapshotPublisher(state, send, lambda m: None, assignment.current)

    async def run() -> None:
        await intake.handle(_events([_raw(1)]))
        await snapshots.capture()
        assert await writer.flush_once()
        await snapshots.try_save()

    asyncio.run(run())
    assert len(sent) == 1 and encoded_in and encoded_in[0] is not threading.main_thread()


def test_a_snapshot_is_captured_in_slices_with_batches_in_between() -> None:
    """Slices of ``capture_slice_channels`` channels, the lock released between them: a batch that came in
    meanwhile is held by the later slices only (their records carry its offset), so only the messages before
    the first slice are acked, and the snapshot waits for the rows of every batch a slice holds."""
    sink = FakeSink()
    state, assignment, intake, writer, _ = _worker(sink)
    sent: list[list] = []

    async def send(records: list) -> None:
        sent.append(records)

    snapshots = SnapshotPublisher(state, send, lambda m: setattr(m, "acked", True), assignment.current,
                                  StreamTunables(capture_slice_channels=2))
    first = _events([_raw(i, channel=f"p/m{i}@paid") for i in range(5)])  # offsets 0..4
    later = _events([_raw(10, channel="p/m0@paid")], first=5)

    async def run() -> None:
        await intake.handle(first)
        capture = asyncio.ensure_future(snapshots.capture())
        await asyncio.sleep(0)  # the first slice (2 channels) is copied; the capture yields the lock
        await intake.handle(later)  # runs between two slices
        await capture
        assert state.checkpoint.ledger.pending_snapshot_seq == 2  # rows of batch 2 must be written: a later slice holds it
        assert await writer.flush_once()
        await snapshots.try_save()

    asyncio.run(run())
    offsets = {key: headers for key, _, headers in sent[0]}
    assert sorted(offsets) == sorted(f"p/m{i}@paid".encode() for i in range(5))
    covered = {key: dict(h)["input_offsets"] for key, h in offsets.items()}
    assert [covered[f"p/m{i}@paid".encode()] for i in range(5)] == [b'{"0":4}'] * 2 + [b'{"0":5}'] * 3
    assert all(e.message.acked for e in first) and not later[0].message.acked and state.checkpoint.ledger.unacked_messages == 1


def test_a_refused_snapshot_acks_nothing_and_is_captured_again() -> None:
    state, assignment, intake, writer, _ = _worker(FakeSink())

    async def refuse(records: list) -> None:
        raise RuntimeError("broker gone")

    snapshots = SnapshotPublisher(state, refuse, lambda m: pytest.fail("acked"), assignment.current)

    async def run() -> None:  # one event loop: the snapshot is encoded in a thread of it (to_thread)
        await intake.handle(_events([_raw(1)]))
        await snapshots.capture()
        await writer.flush_once()
        await snapshots.try_save()

    asyncio.run(run())
    assert state.checkpoint.ledger.pending_snapshot_seq is None and state.checkpoint.dirty and state.checkpoint.acked_messages == 0


def test_later_snapshots_hold_only_changed_channels_and_a_refused_one_hands_them_back() -> None:
    """Capture k also re-publishes channel row ``k - 1`` (the refresh share, ``refresh_every_captures`` > 5).
    Snapshot 1: every channel (new). Snapshot 2, after a batch of m3 only: m3 and m1 (refresh), which acks
    that batch. Snapshot 3 (m4 changed, m2 refresh) is refused: nothing acked, and snapshot 4 (after a batch
    of m0; m3 refresh) holds m0, m2, m3 and m4."""
    state, assignment, intake, writer, _ = _worker(FakeSink())
    sent: list[list[bytes]] = []
    refuse = [False]

    async def send(records: list) -> None:
        if refuse[0]:
            raise RuntimeError("broker gone")
        sent.append(sorted(key for key, _, _ in records))

    snapshots = SnapshotPublisher(state, send, lambda m: setattr(m, "acked", True), assignment.current)
    batches = [_events([_raw(i, channel=f"p/m{i}@paid") for i in range(5)]),
               _events([_raw(10, channel="p/m3@paid")], first=5),
               _events([_raw(11, channel="p/m4@paid"), _raw(12, channel="p/m4@paid")], first=6),
               _events([_raw(13, channel="p/m0@paid")], first=8)]

    async def run() -> None:
        for k, batch in enumerate(batches):
            await intake.handle(batch)
            refuse[0] = k == 2
            await snapshots.capture()
            assert await writer.flush_once()
            await snapshots.try_save()
            if k == 2:
                assert state.checkpoint.ledger.unacked_messages == 2 and not any(e.message.acked for e in batch)

    asyncio.run(run())
    names = lambda *i: [f"p/m{j}@paid".encode() for j in i]  # noqa: E731
    assert sent == [names(0, 1, 2, 3, 4), names(1, 3), names(0, 2, 3, 4)]
    assert all(e.message.acked for b in batches for e in b) and state.checkpoint.ledger.unacked_messages == 0


def test_checkpoint_commit_writes_saves_acks_and_commits() -> None:
    sink = FakeSink()
    state, assignment, intake, writer, _ = _worker(sink)
    commits: list[int] = []

    async def send(records: list) -> None:
        pass

    async def commit() -> None:
        commits.append(1)

    snapshots = SnapshotPublisher(state, send, lambda m: setattr(m, "acked", True), assignment.current)
    events = _events([_raw(1), _raw(2)])
    asyncio.run(intake.handle(events))
    checkpoint = Checkpoint(state, writer, snapshots, commit)
    assert asyncio.run(checkpoint.commit(timeout_s=2.0)) is True
    assert sink.pending_rows == 0 and commits == [1] and all(e.message.acked for e in events)
    assignment.revoked()
    assert asyncio.run(checkpoint.commit(timeout_s=2.0)) is False  # not ours any more


def test_the_flusher_is_kicked_when_input_reaches_its_end_not_per_batch_at_the_end() -> None:
    """A backlog consumed to its end is written at once; a live trickle (every batch ends at the log end) is
    written at the flush interval, not with an insert per batch (issue #34: 4.3 flushes/s at 200 events/s)."""
    consumer = Consumer(end=3)
    state, _, intake, _, _ = _worker(FakeSink(), consumer)
    kick = state.writes.flush_kick
    assert kick is not None
    asyncio.run(intake.handle(_events([_raw(k) for k in range(3)])))  # offsets 0..2 of 3: reached the end
    assert kick.is_set() and intake.at_end
    kick.clear()
    consumer.end = 6
    asyncio.run(intake.handle(_events([_raw(k) for k in range(3, 6)], first=3)))  # a trickle: at the end again
    assert not kick.is_set()
    consumer.end = 10
    asyncio.run(intake.handle(_events([_raw(6)], first=6)))  # fell behind (7..9 still to read)
    assert not kick.is_set() and not intake.at_end
    asyncio.run(intake.handle(_events([_raw(k) for k in range(7, 10)], first=7)))  # caught up again
    assert kick.is_set()
