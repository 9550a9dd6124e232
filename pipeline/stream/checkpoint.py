"""The commit protocol of the worker: :class:`Checkpoint` (no faust in here).

An input message is acknowledged only once what it caused is durable, in
this order (the at-least-once rule of :mod:`pipeline.stream.delivery`):

0. its batch's verdicts and dead letters were sent and Kafka acknowledged
   them (:meth:`~pipeline.stream.intake.Intake.handle`, before the batch
   enters the :class:`~pipeline.stream.delivery.DeliveryLedger`);
1. **sink flush**: every ClickHouse row of the batches up to it is written
   (:meth:`~pipeline.stream.flushing.SinkWriter.flush_once`);
2. **snapshot**: channel state covering it was captured
   (:meth:`~pipeline.stream.snapshots.SnapshotPublisher.capture`) and, once
   the rows of step 1 cover the capture, sent to the state topic, the
   producer waiting until Kafka acknowledged every record
   (:meth:`~pipeline.stream.snapshots.SnapshotPublisher.save`);
3. **ack**: only then are the messages the snapshot covers acked (same call);
4. **offset commit**: faust commits acked offsets every
   ``broker_commit_interval`` (1 s, :func:`~pipeline.stream.runtime.faust_broker_kwargs`),
   and :meth:`Checkpoint.commit` commits them at once.

So a committed offset always lies at or before both the rows in ClickHouse
and the saved state. While running, the steps are spread over two loops:
the flusher task writes the rows and then calls :meth:`Checkpoint.after_write`
(the save starts in a task of its own, never holding the next write), and
the snapshot timer calls :meth:`Checkpoint.tick` (capture, then save what
is ready). :meth:`Checkpoint.commit` runs the whole protocol at once within
a time bound: the worker's graceful stop.

Modelled on quix-streams' ``quixstreams/checkpointing/checkpoint.py``
(``Checkpoint.commit``: flush the producer, commit the offsets, flush the
state), with ClickHouse rows in place of its changelog and the state topic's
snapshot published before the offsets move.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, Awaitable, Callable

from pipeline.config import StreamTunables
from pipeline.stream.flushing import SinkWriter
from pipeline.stream.snapshots import SnapshotPublisher
from pipeline.stream.worker_state import WorkerState

log = logging.getLogger("channel_health.worker")


class Checkpoint:
    """Sink flush → snapshot → ack → offset commit (see the module docstring).

    ``state``: the worker's shared state; ``writer``: the sink's rows and
    background writes; ``snapshots``: capture, publish and ack;
    ``commit_offsets``: commits the acked input offsets now (faust:
    ``app.consumer.commit()``); ``tunables``: the drain's time bound
    (:class:`~pipeline.config.StreamTunables`).
    """

    def __init__(self, state: WorkerState, writer: SinkWriter, snapshots: SnapshotPublisher,
                 commit_offsets: Callable[[], Awaitable[Any]], tunables: StreamTunables = StreamTunables()) -> None:
        self.state = state
        self.writer = writer
        self.snapshots = snapshots
        self.commit_offsets = commit_offsets
        self.tunables = tunables

    def after_write(self) -> None:
        """Step 2 after the flusher's successful write: save a snapshot whose rows are written (in a task
        of its own, :meth:`~pipeline.stream.snapshots.SnapshotPublisher.save_soon`); returns at once."""
        self.snapshots.save_soon()

    async def tick(self) -> None:
        """The snapshot timer: capture the changed channels and save what is ready (steps 2 and 3)."""
        await self.snapshots.tick()

    async def settle(self) -> None:
        """Wait for a snapshot being published and acked (a revocation: it lands before the group moves on)."""
        if self.state.checkpoint.snap_lock is not None:
            async with self.state.checkpoint.snap_lock:
                pass

    async def commit(self, timeout_s: float | None = None) -> bool:
        """The whole protocol now: write what is buffered, save a snapshot, ack and commit, within
        ``timeout_s`` (None: ``tunables.drain_timeout_s``).

        Returns True when everything was written, saved and committed; False
        (logged) otherwise, never raises: unacked input is re-read after a
        restart. Does nothing (False) when the state is not the live assignment's.
        """
        state, writer, snapshots = self.state, self.writer, self.snapshots
        if state.lock is None or not snapshots.is_current():
            return False
        deadline = time.monotonic() + (self.tunables.drain_timeout_s if timeout_s is None else timeout_s)
        backoff_s = self.tunables.flush_backoff_min_s

        def left() -> float:
            return max(0.1, deadline - time.monotonic())

        async def flush_and_save() -> None:
            while not await writer.flush_once():
                if time.monotonic() >= deadline:
                    raise TimeoutError("ClickHouse still failing")
                await asyncio.sleep(min(backoff_s, left()))
            await asyncio.wait_for(snapshots.save(), left())

        try:
            await flush_and_save()  # a snapshot captured earlier
            await asyncio.wait_for(snapshots.capture(), left())
            await flush_and_save()
            await self.commit_offsets()
            log.warning("drained: %d rows written, %d messages acked, %d left unacked (re-read on restart)",
                        state.writes.rows_written, state.checkpoint.acked_messages, state.unacked)
            return True
        except Exception as exc:  # never block the shutdown; unacked input is re-read after a restart
            log.warning("drain at shutdown incomplete (%s: %s); unacked input is re-read on restart",
                        type(exc).__name__, exc)
            return False
