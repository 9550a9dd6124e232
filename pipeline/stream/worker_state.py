"""What the worker's agents, timers and rebalance handlers share (:mod:`pipeline.stream.app`)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from pipeline.stream.delivery import DeliveryLedger
from pipeline.stream.offsets import OffsetGate
from pipeline.engine.batch import BatchProcessor

if TYPE_CHECKING:
    from pipeline.sinks.protocol import Sink


@dataclass
class SinkWrites:
    """The sink's background writes as the worker sees them (kept by
    :class:`~pipeline.stream.flushing.SinkWriter`): health, figures and the flusher's events."""

    #: Failed flushes in a row, and when the outage began (monotonic s; None: writes succeed).
    sink_failures: int = 0
    sink_down_since: float | None = None
    rows_written: int = 0
    peak_pending_rows: int = 0
    backpressure_waits: int = 0
    #: The agent waits for a full sink buffer to drain (takes no input meanwhile).
    intake_paused: bool = False
    #: Set to have the flusher write now; set by the flusher after each successful write.
    flush_kick: asyncio.Event | None = None
    flushed: asyncio.Event | None = None


@dataclass
class CheckpointState:
    """What the commit protocol (:mod:`pipeline.stream.checkpoint`) tracks between its steps."""

    ledger: DeliveryLedger = field(default_factory=DeliveryLedger)
    #: Guards publishing a snapshot + acking (a revocation waits for it).
    snap_lock: asyncio.Lock | None = None
    #: Processor state changed since the last captured snapshot.
    dirty: bool = False
    snapshots_written: int = 0
    acked_messages: int = 0


@dataclass
class AssignmentState:
    """Which consumer generation the processor's state belongs to, and the input admitted in it
    (kept by :class:`~pipeline.stream.intake.Assignment` and :class:`~pipeline.stream.intake.Intake`)."""

    #: Consumer generation the processor's state belongs to (None before the first batch).
    generation: int | None = None
    #: Set on revocation until the next reset: publish no snapshot, ack nothing.
    stale: bool = False
    #: In-order acceptance of input offsets in this generation (set on each reset); its
    #: ``last_offsets`` are the offsets processed so far (what a snapshot covers).
    gate: OffsetGate = field(default_factory=lambda: OffsetGate({}))
    #: ``gate.skipped_starts`` already logged.
    skipped_logged: int = 0
    restored: bool = False
    resets: int = 0
    #: Wall time of the last reset (reading the state topic and restoring the assigned partitions' channels), s.
    reset_s: float = 0.0
    dropped_stale_messages: int = 0


@dataclass
class WorkerState:
    """What the agents share: the processor, the ClickHouse sink (a :class:`~pipeline.sinks.protocol.Sink`,
    or None), the lock guarding the processor, the agent's timings, and three named parts: the sink's
    ``writes``, the ``checkpoint`` bookkeeping and the ``assignment``."""

    processor: BatchProcessor
    sink: "Sink | None" = None
    last_batch_wall_s: float = 0.0
    #: Guards the processor (one batch, snapshot capture or reset at a time).
    lock: asyncio.Lock | None = None
    writes: SinkWrites = field(default_factory=SinkWrites)
    checkpoint: CheckpointState = field(default_factory=CheckpointState)
    assignment: AssignmentState = field(default_factory=AssignmentState)
    #: Wall seconds the agent spent, by cause: ``process`` (decode → engine → outputs), ``publish``
    #: (verdicts and dead letters until Kafka acked them), ``rows`` (building the sink's rows),
    #: ``backpressure`` (waiting for a full sink buffer to drain), ``between`` (from the end of one
    #: take to the next: waiting for input, and faust's work on the next messages).
    wall_s: dict[str, float] = field(default_factory=lambda: dict.fromkeys(
        ("process", "publish", "rows", "backpressure", "between"), 0.0))

    def init_sync(self) -> None:
        """Create the locks and events on the running event loop (first call only)."""
        if self.lock is None:
            self.lock = asyncio.Lock()
            self.checkpoint.snap_lock = asyncio.Lock()
            self.writes.flush_kick = asyncio.Event()
            self.writes.flushed = asyncio.Event()

    def status_line(self) -> str:
        """One line of the worker's figures for the periodic status log."""
        pr = self.processor
        sink = self.sink
        w, ck = self.writes, self.checkpoint
        return (f"generation {self.assignment.generation}, {pr.events_in} events in, {pr.verdicts_out} verdicts out, "
                f"{sink.pending_rows if sink is not None else 0} rows buffered (peak {w.peak_pending_rows}), "
                f"{w.rows_written} rows written, {ck.ledger.unacked_messages} messages unacked, "
                f"{ck.acked_messages} acked, {ck.snapshots_written} snapshots saved, "
                f"sink {'down' if w.sink_down_since is not None else 'ok'}, "
                f"low watermark {pr.low_watermark_ms()}, "
                f"intake {'paused (sink buffer full)' if w.intake_paused else 'open'}; agent time so far (s): "
                + ", ".join(f"{k} {v:.1f}" for k, v in self.wall_s.items()))

    @property
    def unacked(self) -> int:
        """Input messages processed and not yet acked."""
        return self.checkpoint.ledger.unacked_messages


def byte_chunks(messages: list, max_bytes: int) -> list[list]:
    """Split ``messages`` (objects with a ``value`` of bytes, e.g. faust events) into runs of at most ``max_bytes``
    (a single larger message is a run of its own), in order.

    >>> class M:
    ...     def __init__(self, n): self.value = b"x" * n
    >>> [[len(m.value) for m in run] for run in byte_chunks([M(3), M(3), M(5), M(1)], 6)]
    [[3, 3], [5, 1]]
    """
    runs: list[list] = []
    run: list = []
    size = 0
    for m in messages:
        n = len(m.value) if m.value is not None else 0
        if run and size + n > max_bytes:
            runs.append(run)
            run, size = [], 0
        run.append(m)
        size += n
    if run:
        runs.append(run)
    return runs
