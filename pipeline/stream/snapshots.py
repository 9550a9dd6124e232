"""Channel snapshots to the state topic and the acks they allow: :class:`SnapshotPublisher` (no faust in here).

Every ``snapshot_interval_s`` (:class:`~pipeline.config.StreamTunables`) the state of the
channels changed since their last capture is captured, with a rotating share of the others
so that each channel is re-published at least every ``refresh_every_captures`` captures
(:meth:`SnapshotPublisher.capture`, in slices of channels with the agent's
batches in between; :mod:`pipeline.engine.capture` says why a clean channel's
older record still restores exactly); once every row of the batches before its last slice is
written (:class:`~pipeline.stream.delivery.DeliveryLedger`), it is sent to
the state topic, each channel with the input offsets it covers, and only then
are the messages of the batches before its first slice acked
(:meth:`SnapshotPublisher.save`, started after a write by :meth:`SnapshotPublisher.save_soon`
so that it never holds the flusher). Nothing is saved or
acked while the processor's state does not belong to the live assignment
(``is_current``), nor when a rebalance came in while the snapshot was sent.
Where these steps sit in the commit protocol (sink flush, snapshot, ack,
offset commit) is :mod:`pipeline.stream.checkpoint`.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Awaitable, Callable, Sequence

from pipeline.config import StreamTunables
from pipeline.stream.worker_state import WorkerState

log = logging.getLogger("channel_health.worker")

#: ``(key, value, headers)`` records to send and wait for (``runtime.send_and_wait`` on the state topic).
SendRecords = Callable[[Sequence[tuple[bytes, bytes, Any]]], Awaitable[None]]


async def _encoded(encoders: Sequence[Callable[[], list]]) -> list:
    """The records of every slice, in order, each slice encoded in a worker thread after the one before
    (one encoding thread at a time contends with the event loop for the GIL, not one per slice); raises
    what an encoding raised."""
    out: list = []
    for encode in encoders:
        out.extend(await asyncio.to_thread(encode))
    return out


class SnapshotPublisher:
    """Capture, publish and ack (see the module docstring).

    ``state``: the worker's shared state (``lock`` / ``snap_lock`` set by
    ``state.init_sync()``); ``send``: sends records to the state topic and
    returns once Kafka acknowledged them; ``ack``: acknowledges one input
    message (faust: ``message.ack(consumer)``); ``is_current``: whether the
    processor's state belongs to the live assignment; ``tunables``: the capture's slice size and
    refresh share (:class:`~pipeline.config.StreamTunables`).
    """

    def __init__(self, state: WorkerState, send: SendRecords, ack: Callable[[Any], None],
                 is_current: Callable[[], bool], tunables: StreamTunables = StreamTunables()) -> None:
        self.state = state
        self.tunables = tunables
        self.send = send
        self.ack = ack
        self.is_current = is_current
        self._saving: asyncio.Future | None = None
        self._capture_lock: asyncio.Lock | None = None
        #: Captures started (steps the refresh share) and the slices of the one not yet published.
        self.captures = 0
        self._parts: list = []

    async def capture(self) -> None:
        """Capture the changed channels' state (published once its rows are written), in slices between batches.

        Under the lock the state is only copied, ``tunables.capture_slice_channels``
        channels at a time, and the lock is released between slices, so the
        agent's next batch runs in between instead of after the whole copy
        (1,000 channels: 120-460 ms on the event loop in one piece, which held
        up every verdict each ``snapshot_interval_s``, issue #15). Each record
        carries the input offsets processed when its slice was copied (a restart
        skips exactly what each channel holds); the messages released for acking
        are those of the batches before the first slice, which every slice
        includes. The snapshots are encoded from the copies in a thread
        (``BatchProcessor.snapshot_capture``); :meth:`save` awaits them. A
        rebalance during the capture abandons it (captured again later).

        Only channels flagged changed since their last capture are copied, and
        the refresh share (``tunables.refresh_every_captures``); a capture that is not
        published hands its channels back (:meth:`_release`). The acked batches
        changed only flagged channels, each copied in its slice after them.
        """
        state = self.state
        assert state.lock is not None
        if self._capture_lock is None:
            self._capture_lock = asyncio.Lock()
        async with self._capture_lock:  # one capture at a time (the timer's and a drain's)
            async with state.lock:
                ck = state.checkpoint
                if not ck.dirty or ck.ledger.pending_snapshot_seq is not None or not self.is_current():
                    return
                generation, epoch, covers = state.assignment.generation, ck.ledger.epoch, ck.ledger.added
                state.checkpoint.dirty = False
            parts: list = []  # each slice's Capture (encoded in a thread once all are copied)
            self._parts, phase = parts, self.captures % self.tunables.refresh_every_captures
            self.captures += 1
            try:
                await self._capture_slices(generation, epoch, covers, parts, phase)
            except BaseException:  # cancelled (a drain's timeout) or failed: nothing taken, capture again later
                if state.checkpoint.ledger.pending_snapshot_seq is None:
                    self._release()
                raise

    def _release(self) -> None:
        """The capture in ``_parts`` will not be published: its channels go into the next one."""
        for part in self._parts:
            part.release()
        self._parts = []
        self.state.checkpoint.dirty = True

    async def _capture_slices(self, generation: int | None, epoch: int, covers: int, parts: list,
                              phase: int) -> None:
        """The slices of :meth:`capture`, each under the lock; records the snapshot once all are copied."""
        state = self.state
        assert state.lock is not None
        start = 0
        while True:
            async with state.lock:
                if (state.assignment.generation != generation or state.checkpoint.ledger.epoch != epoch
                        or not self.is_current()):
                    self._release()
                    return
                stop = start + self.tunables.capture_slice_channels
                parts.append(state.processor.snapshot_capture(state.assignment.gate.last_offsets, start, stop,
                                                              changed_only=True,
                                                              refresh_every=self.tunables.refresh_every_captures,
                                                              refresh_phase=phase))
                if stop >= state.processor.channel_count:
                    state.checkpoint.ledger.snapshot_taken((generation, asyncio.ensure_future(_encoded(parts))),
                                                           covers=covers)
                    return
            start = stop
            await asyncio.sleep(0)  # a batch waiting for the lock runs now (asyncio.Lock serves waiters first)

    async def save(self) -> None:
        """Publish the captured snapshot if its rows are written, then ack the messages it covers.

        Raises what ``send`` raises (the snapshot stays pending; :meth:`try_save` handles it).
        """
        from pipeline.stream.state_topic import snapshot_headers

        state = self.state
        assert state.checkpoint.snap_lock is not None
        async with state.checkpoint.snap_lock:
            ready = state.checkpoint.ledger.ready_snapshot()
            if ready is None:
                return
            generation, encoding = ready
            if generation != state.assignment.generation or not self.is_current():
                state.checkpoint.ledger.drop_snapshot()
                self._release()
                return
            epoch = state.checkpoint.ledger.epoch
            records = await encoding  # encoded in a thread since the capture; raises what the encoding raised
            await self.send([(name.encode(), blob, snapshot_headers(offs, part))
                             for name, blob, offs, part in records])
            if epoch != state.checkpoint.ledger.epoch or not self.is_current():
                return  # a rebalance came in between: ack nothing of the old assignment
            self._parts = []  # published: nothing to hand back
            for m in state.checkpoint.ledger.snapshot_saved():
                self.ack(m)
                state.checkpoint.acked_messages += 1
            state.checkpoint.snapshots_written += 1 if records else 0

    def save_soon(self) -> None:
        """Start :meth:`try_save` in a task of its own, unless one is still running; returns at once.

        The flusher calls this after each write: awaiting the save there (the
        encoding, 4.5 MB of records to the state topic for 1,000 channels) held
        its next writes for 2-3 s on the bench, the sink buffer filled and the
        agent stopped taking input (issue #15)."""
        if self._saving is None or self._saving.done():
            self._saving = asyncio.ensure_future(self.try_save())

    async def try_save(self) -> None:
        """:meth:`save`; a refused snapshot is dropped (nothing acked) and a new one captured later."""
        try:
            await self.save()
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # Kafka refused the snapshot: nothing acked, tried again later
            log.warning("saving the state snapshot failed (%s: %s); will retry", type(exc).__name__, exc)
            self.state.checkpoint.ledger.drop_snapshot()
            self._release()  # capture its channels again

    async def tick(self) -> None:
        """The periodic timer: capture a snapshot and publish what is ready."""
        if self.state.lock is None:
            return
        await self.capture()
        await self.try_save()

