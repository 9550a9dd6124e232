"""Rows into the sink and the sink's background writes: :class:`SinkWriter` (no faust in here).

The worker's agent hands every processed batch to :meth:`SinkWriter.store`
(rows into the sink's bounded buffer; while a buffer is full it waits for a
flush, so the agent takes no input meanwhile); :meth:`SinkWriter.run` is the
flusher task: it writes the buffer about every ``flush_interval_s``
(:class:`~pipeline.config.StreamTunables`), sooner
when kicked (a buffer a quarter full, input consumed to its end), retrying a
failed write with backoff while verdicts keep flowing; after each successful
write it tells the delivery ledger which batches' rows are written and calls
``after_flush`` (the next step of the commit protocol, :mod:`pipeline.stream.checkpoint`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, Awaitable, Callable

from pipeline.config import StreamTunables
from pipeline.sinks.buffer import FLUSH_SHARE
from pipeline.sinks.errors import SinkBackpressure
from pipeline.engine.batch import ProcessedBatch
from pipeline.stream.worker_state import WorkerState

log = logging.getLogger("channel_health.worker")



class SinkWriter:
    """Buffering and background writing of the rows of ``state.sink`` (a
    :class:`~pipeline.sinks.protocol.Sink`, or None to store nothing).

    Shares its counters with the worker through ``state``
    (:class:`~pipeline.stream.worker_state.WorkerState`: its ``writes``
    (:class:`~pipeline.stream.worker_state.SinkWrites`), ``wall_s["backpressure"]``
    and ``checkpoint.ledger``); call ``state.init_sync()`` on the event loop first.
    ``metrics``: a :class:`~pipeline.metrics.PipelineMetrics` that observes
    each write and counts failed ones (None: nothing observed). ``tunables``: the flush interval and
    backoff (:class:`~pipeline.config.StreamTunables`).
    """

    def __init__(self, state: WorkerState, metrics: Any = None, tunables: StreamTunables = StreamTunables()) -> None:
        self.state = state
        self.metrics = metrics
        self.tunables = tunables

    def kick(self) -> None:
        """Have the flusher write now instead of at the next interval."""
        if self.state.writes.flush_kick is not None:
            self.state.writes.flush_kick.set()

    async def store(self, out: ProcessedBatch) -> None:
        """Put the batch's rows in the sink's buffer (written by the flusher).

        Returns once every row is buffered; while a buffer is full
        (``SinkBackpressure``) it waits for the flusher to drain it, so the
        caller takes no more input in the meantime.
        """
        state = self.state
        sink = state.sink
        if sink is None:
            return
        steps = ((sink.add_events, out.stored), (sink.add_event_batches, out.envelopes),
                 (sink.add_verdicts, out.verdicts))
        for add, rows in steps:
            if not rows:
                continue
            while True:
                try:
                    add(rows)
                    break
                except SinkBackpressure as exc:
                    state.writes.backpressure_waits += 1
                    if state.writes.backpressure_waits == 1 or state.writes.backpressure_waits % 50 == 0:
                        log.warning("sink buffer full (%s); not taking input until it drains", exc)
                    await self.wait_flushed()
            pending = sink.pending_rows
            state.writes.peak_pending_rows = max(state.writes.peak_pending_rows, pending)
            if pending * FLUSH_SHARE >= sink.max_rows:
                self.kick()
                await asyncio.sleep(0)  # let the flusher start now: the agent may not yield before the buffer is full

    async def wait_flushed(self) -> None:
        """Kick the flusher and wait for its next successful write (intake paused meanwhile)."""
        state = self.state
        assert state.writes.flushed is not None and state.writes.flush_kick is not None
        state.writes.flushed.clear()
        state.writes.flush_kick.set()
        state.writes.intake_paused = True
        started = time.perf_counter()
        try:
            await state.writes.flushed.wait()
        finally:
            state.writes.intake_paused = False
            state.wall_s["backpressure"] += time.perf_counter() - started

    async def flush_once(self) -> bool:
        """Write what is buffered; True if everything buffered before the call is written.

        A failed write (``SinkWriteError``, transport errors) keeps the rows,
        counts the failure and returns False; nothing is marked written.
        """
        state = self.state
        assert state.writes.flushed is not None
        target = state.checkpoint.ledger.added
        sink = state.sink
        if sink is None or sink.pending_rows == 0:
            state.checkpoint.ledger.flushed_up_to(target)
            state.writes.flushed.set()
            return True
        pending = sink.pending_rows
        state.writes.peak_pending_rows = max(state.writes.peak_pending_rows, pending)
        try:
            started = time.perf_counter()
            written = await asyncio.to_thread(sink.flush)
            if self.metrics is not None:
                self.metrics.observe_flush(time.perf_counter() - started, written)
        except Exception as exc:  # SinkWriteError and transport errors: keep the rows, retry, ack nothing
            if self.metrics is not None:
                self.metrics.sink_write_failures_total.inc()
            state.writes.sink_failures += 1
            if state.writes.sink_down_since is None:
                state.writes.sink_down_since = time.monotonic()
            if state.writes.sink_failures == 1 or state.writes.sink_failures % 10 == 0:
                log.warning("ClickHouse write failed (%d in a row, %d rows buffered): %s; retrying with backoff, "
                            "verdicts keep flowing, offsets not committed",
                            state.writes.sink_failures, pending, exc)
            return False
        state.writes.rows_written += written
        if state.writes.sink_down_since is not None:
            log.warning("ClickHouse writes recovered after %.1f s (%d failed attempts); %d buffered rows written",
                        time.monotonic() - state.writes.sink_down_since, state.writes.sink_failures, written)
        state.writes.sink_failures = 0
        state.writes.sink_down_since = None
        state.checkpoint.ledger.flushed_up_to(target)
        state.writes.flushed.set()
        return True

    async def run(self, after_flush: Callable[[], Awaitable[None] | None]) -> None:
        """The flusher: write every ``flush_interval_s`` or when kicked; back off after a failure
        (``flush_backoff_min_s`` doubling to ``flush_backoff_max_s``); ``after_flush`` after each success
        (awaited if it returns an awaitable: the worker's starts the snapshot save in a task of its own,
        so a save never holds the next write).
        Runs until cancelled."""
        state = self.state
        state.init_sync()
        assert state.writes.flush_kick is not None
        tun = self.tunables
        backoff = tun.flush_backoff_min_s
        while True:
            try:
                await asyncio.wait_for(state.writes.flush_kick.wait(), tun.flush_interval_s)
            except asyncio.TimeoutError:
                pass
            state.writes.flush_kick.clear()
            if await self.flush_once():
                backoff = tun.flush_backoff_min_s
                pending = after_flush()
                if pending is not None:
                    await pending
            else:
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, tun.flush_backoff_max_s)
