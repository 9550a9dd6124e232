"""The faust app: topics and the agent wiring the stages together.

Delivery is at-least-once, restarts are exact, and a ClickHouse outage does
not stop the verdicts:

1. the agent takes batches of unacked messages (:mod:`pipeline.stream.intake`;
   faust's plain ``take()`` acks even when the body raised -- a failed insert
   would be skipped for ever);
2. a batch's verdicts and dead letters are sent and acknowledged by Kafka,
   and its rows are put in the sink's bounded buffer (by default a child
   process writes them: :mod:`pipeline.sinks.process`); a background flusher
   writes the buffer to ClickHouse about once a second, retrying with
   backoff (0.5 s doubling to ``FLUSH_BACKOFF_MAX_S``, 2 s) while ClickHouse is
   down. Verdicts keep flowing meanwhile; only when a buffer is full
   (``SinkBackpressure``; bounds ``CHANNEL_HEALTH_SINK_MAX_ROWS`` /
   ``_MAX_BYTES``) does the agent stop taking input until it drains, so
   memory stays bounded;
3. every ``SNAPSHOT_INTERVAL_S`` the engine's per-channel state is captured;
   once every row of the batches before it is written, it is published to
   the state topic together with the input offsets it covers, and only then
   are those batches' messages acked (:mod:`pipeline.stream.delivery`). So a
   committed offset always lies at or before both the rows in ClickHouse
   and the saved state.

After a crash the worker reloads the snapshots and re-reads the messages
after the committed offsets; events a restored snapshot already holds are
not counted again (:mod:`pipeline.stream.processor`), so windows, baselines,
runs, circuit timers and verdict ``seq`` continue exactly. Re-sent verdicts
carry the same ``seq`` (routers ignore them) and re-inserted rows are
deduplicated by ClickHouse (``event_id``, ``(channel, seq)``).

Rebalances: on revocation the worker stops publishing snapshots and acking
(another member may own the channels now); with the next assignment (a new
consumer generation) it starts over from the state topic, since Kafka
resumes every assigned partition at its committed offset. Messages fetched
under an older generation are dropped (they are delivered again), and each
partition's input is taken strictly in order from that committed offset
(:mod:`pipeline.stream.offsets`: faust resumes fetching before it seeks, so
records past the committed offset can arrive first; they are dropped and
read again, never let through ahead of the ones before them).

On SIGTERM or SIGINT the worker drains: a last flush, snapshot and commit (``DRAIN_TIMEOUT_S``),
and exits within ``runtime.STOP_LIMIT_S`` even with the broker gone (``runtime.BoundedStopWorker``).
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from pathlib import Path
from typing import Any

import faust
from faust.types import TP

from pipeline.config import Settings
from pipeline.contracts import encode
from pipeline.engine import Engine
from pipeline.metrics import PipelineMetrics
from pipeline.ingest.dead_letter import raw_budget
from pipeline.policy.defaults import PolicyConfig
from pipeline.sinks.buffer import FLUSH_SHARE
from pipeline.stream.control_agent import install_control
from pipeline.stream.dead_letters import DeadLetterPublisher
from pipeline.stream.intake import batches
from pipeline.stream.offsets import MAX_SEEKS, OffsetGate, start_offsets
from pipeline.stream.processor import BatchProcessor, ProcessedBatch
from pipeline.stream.quality_agent import install_quality
from pipeline.stream.runtime import (
    CHUNK_BYTES,
    STREAM_BUFFER_MAX,
    TAKE_MAX,
    BoundedStopWorker,
    cap_fetch_wait,
    disable_read_offset_filter,
    faust_broker_kwargs,
    send_and_wait,
    tune_gc,
)
from pipeline.stream.worker_state import WorkerState, byte_chunks

log = logging.getLogger("channel_health.worker")

#: Wall-clock idle time after which event time advances on its own (s).
IDLE_ADVANCE_AFTER_S = 10.0
#: How often channel state is snapshotted and input offsets acked (s).
SNAPSHOT_INTERVAL_S = 5.0
#: How often buffered rows are written to ClickHouse (s); sooner once a buffer is a quarter full.
FLUSH_INTERVAL_S = 1.0
#: Retry delays of a failing ClickHouse write (s): first, and the cap of the doubling.
FLUSH_BACKOFF_MIN_S = 0.5
FLUSH_BACKOFF_MAX_S = 2.0
#: Processed but unacked input messages above which the agent waits for acks.
MAX_UNACKED_MESSAGES = 100_000
#: Longest graceful drain on shutdown (s), within the stop limit of the worker (``runtime.STOP_LIMIT_S``).
DRAIN_TIMEOUT_S = 5.0


def build_app(settings: Settings, policy: PolicyConfig | None = None, sink: Any = None,
              datadir: str | None = None, metrics: PipelineMetrics | None = None) -> tuple[faust.App, WorkerState]:
    """Create the faust app, its topics, the agent, the sink flusher and the timers.

    ``sink``: an object with ``add_events(rows)``, ``add_event_batches(envelopes)``,
    ``add_verdicts(verdicts)``, ``flush()`` and ``pending_rows`` (see :mod:`pipeline.sinks.clickhouse`),
    or None to skip storage. ``metrics``: where to count (:mod:`pipeline.metrics`; None: a private, unserved one).
    """
    topics = settings.topics
    if datadir is None:
        import tempfile

        datadir = str(Path(tempfile.gettempdir()) / f"channel-health-faust-{os.getpid()}")
    cap_fetch_wait()
    app = faust.App(
        f"{settings.consumer_group}",
        store="memory://",
        datadir=datadir,
        web_enabled=False,
        topic_partitions=settings.partitions,
        topic_replication_factor=settings.replication_factor,  # faust's own topics (assignor leader)
        consumer_auto_offset_reset="earliest",
        topic_allow_declare=True,
        producer_acks=-1,
        # Unacked messages are simply re-read after a restart (at-least-once);
        # waiting for them at shutdown would only delay the stop.
        stream_wait_empty=False,
        stream_buffer_maxsize=STREAM_BUFFER_MAX,
        **faust_broker_kwargs(settings),
    )
    disable_read_offset_filter(app.consumer)  # the OffsetGate orders and de-duplicates input instead
    state = WorkerState(processor=BatchProcessor.for_settings(settings, policy), sink=sink, last_batch_wall_s=time.monotonic())
    requests = app.topic(topics.requests, key_serializer="raw", value_serializer="raw")
    dead_letters = DeadLetterPublisher(topics.dlq, raw_budget(settings.producer_max_request_bytes))
    install_quality(app, state, settings)  # SPEC §4.5 sampler + scoring task (no-op without torch)
    control = install_control(app, state, settings, lambda out: publish(out), lambda out: store(out))  # overrides

    def consumer_lags() -> dict[tuple[str, int], int]:
        """Messages behind the end of each assigned input partition (the highwater of the last fetch)."""
        return {(tp.topic, tp.partition): max(0, (app.consumer.highwater(tp) or 0) - 1
                                              - state.gate.last_offsets.get(tp.partition, -1))
                for tp in app.consumer.assignment() if tp.topic == topics.requests}

    metrics = metrics or PipelineMetrics()  # issue #21: counts the processor keeps are read at scrape time
    metrics.track_worker(lambda: state.processor, consumer_lags, lambda: state.sink,
                         lambda: getattr(state, "quality", None))

    def init_sync() -> None:
        if state.lock is None:
            state.lock = asyncio.Lock()
            state.snap_lock = asyncio.Lock()
            state.flush_kick = asyncio.Event()
            state.flushed = asyncio.Event()

    def current() -> bool:
        """The processor's state belongs to the live assignment (snapshots and acks allowed)."""
        return (state.generation is not None and not state.stale
                and state.generation == app.consumer_generation_id)

    async def reset(generation: int) -> None:
        """Start over for a new assignment: fresh engine, snapshots reloaded (call under ``lock``)."""
        from pipeline.stream.state_topic import load_snapshot_records

        started = time.monotonic()
        records = await load_snapshot_records(settings.kafka_bootstrap or "", topics.state,
                                              settings.kafka_security.aiokafka_kwargs())
        assigned = sorted(tp.partition for tp in app.consumer.assignment() if tp.topic == topics.requests)
        starts = await start_offsets(settings.kafka_bootstrap or "", settings.consumer_group, topics.requests,
                                     assigned, settings.kafka_security.aiokafka_kwargs())
        state.gate = OffsetGate(starts)
        state.skipped_logged = 0
        state.processor.reset(Engine(policy, settings.state_limits))
        restored = state.processor.load_snapshots(records, assigned)
        state.ledger.clear()
        state.generation = generation
        state.stale = False
        state.dirty = False
        state.restored = True
        state.resets += 1
        state.reset_s = time.monotonic() - started
        log.warning("worker ready (generation %s): %d channel snapshots read, %d of them (the assigned partitions' "
                    "channels) restored, in %.2f s; input partitions %s from offsets %s", generation, len(records),
                    restored, state.reset_s, assigned, starts)

    async def ensure_generation() -> bool:
        """For the timers: reset once a new assignment is complete; True when the state is current (under ``lock``)."""
        gen = app.consumer_generation_id
        if state.generation != gen and not app.rebalancing and app.consumer.assignment():
            await reset(gen)
        return current()

    async def seek_back(partition: int) -> None:
        """Re-read an unsynced partition from its start offset (see :mod:`pipeline.stream.offsets`)."""
        offset = state.gate.want_seek(partition)
        if offset is None:
            return
        log.warning("input partition %d: records after offset %d arrived before it (fetched before the seek "
                    "of the rebalance); re-reading from %d", partition, offset, offset)
        # seek_wait runs the seek on the consumer's own thread (aiokafka is not thread-safe) and waits for it
        await app.consumer.seek_wait({TP(topics.requests, partition): offset})

    def update_partition_status() -> None:
        """Tell the processor which input partitions are consumed to their end (each batch: it is cheap)."""
        tps = [tp for tp in app.consumer.assignment() if tp.topic == topics.requests]
        if not tps:
            return
        # The highwater cached from the last fetch response (no broker round trip under the lock).
        state.processor.set_partition_status({
            tp.partition: state.gate.last_offsets.get(tp.partition, -1) + 1 >= (app.consumer.highwater(tp) or 0) for tp in tps})

    # -- output -------------------------------------------------------------------------
    async def publish(out: ProcessedBatch) -> None:
        """Send the batch's verdicts and dead letters; returns once Kafka acknowledged them (a refused dead
        letter is sent again without its copy of the input, then counted as lost: never fatal)."""
        out.verdicts = control.apply(out.verdicts)  # operators' overrides (SPEC §4), also in the stored rows
        await send_and_wait(app.producer, topics.health, [(v.channel.encode(), encode(v), None) for v in out.verdicts])
        await dead_letters.publish(app.producer, out.dead_letters)  # never raises for a refused dead letter

    async def store(out: ProcessedBatch) -> None:
        """Put the batch's rows in the sink's buffer (written by the flusher).

        Returns once every row is buffered; while a buffer is full
        (``SinkBackpressure``) it waits for the flusher to drain it, so the
        caller takes no more input in the meantime.
        """
        if state.sink is None:
            return
        from pipeline.sinks.errors import SinkBackpressure

        steps = ((state.sink.add_events, out.stored), (state.sink.add_event_batches, out.envelopes),
                 (state.sink.add_verdicts, out.verdicts))
        for add, rows in steps:
            if not rows:
                continue
            while True:
                try:
                    add(rows)
                    break
                except SinkBackpressure as exc:
                    state.backpressure_waits += 1
                    if state.backpressure_waits == 1 or state.backpressure_waits % 50 == 0:
                        log.warning("sink buffer full (%s); not taking input until it drains", exc)
                    await wait_flushed()
            pending = state.sink.pending_rows
            state.peak_pending_rows = max(state.peak_pending_rows, pending)
            if pending * FLUSH_SHARE >= getattr(state.sink, "max_rows", 1 << 62):
                state.flush_kick.set()  # type: ignore[union-attr]
                await asyncio.sleep(0)  # let the flusher start now: the agent may not yield before the buffer is full

    async def wait_flushed() -> None:
        assert state.flushed is not None and state.flush_kick is not None
        state.flushed.clear()
        state.flush_kick.set()
        state.intake_paused = True
        started = time.perf_counter()
        try:
            await state.flushed.wait()
        finally:
            state.intake_paused = False
            state.wall_s["backpressure"] += time.perf_counter() - started

    # -- the stream -------------------------------------------------------------------------
    @app.agent(requests)
    async def process(stream: faust.StreamT) -> None:
        init_sync()
        try:
            ended = None
            async for events in batches(stream.noack().events(), TAKE_MAX):  # not noack_take: see intake
                if ended is not None:
                    state.wall_s["between"] += time.perf_counter() - ended
                await handle(events)
                ended = time.perf_counter()
                state.last_batch_wall_s = time.monotonic()
                while state.ledger.unacked_messages > MAX_UNACKED_MESSAGES:
                    await asyncio.sleep(0.1)  # acks come with the next saved snapshot
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a bug, not bad input (bad input is dead-lettered): stop loudly
            log.critical("stream agent failed: %r; stopping the worker (offsets not committed)", exc, exc_info=True)
            await app.crash(exc)
            raise

    async def handle(events: list) -> None:
        assert state.lock is not None
        async with state.lock:
            gen = app.consumer_generation_id
            if state.generation != gen:
                await reset(gen)  # messages of a new assignment: start over from the state topic
            elif state.stale:
                state.dropped_stale_messages += len(events)  # revoked, not yet reassigned: delivered again
                return
            fresh = []
            gaps: set[int] = set()
            gate = state.gate
            for e in events:
                msg = e.message
                decision = gate.check(msg.partition, msg.offset) if msg.generation_id == state.generation else "old"
                if decision == "accept":
                    fresh.append(e)
                    continue
                state.dropped_stale_messages += 1  # delivered again (old generation, duplicate or before a seek)
                if decision == "gap":
                    gaps.add(msg.partition)
            for p in sorted(gaps):
                await seek_back(p)
            while len(gate.skipped_starts) > state.skipped_logged:
                p, start, first = gate.skipped_starts[state.skipped_logged]
                state.skipped_logged += 1
                log.error("input partition %d: no record at committed offset %d after %d seeks; continuing at %d "
                          "(offsets in between are absent from the log, e.g. transaction markers)",
                          p, start, MAX_SEEKS, first)
            if not fresh:
                return
            update_partition_status()
            for chunk in byte_chunks(fresh, CHUNK_BYTES):
                t0 = time.perf_counter()
                out = state.processor.process([e.value for e in chunk], [e.message.partition for e in chunk],
                                              [e.message.offset for e in chunk])
                t1 = time.perf_counter()
                await publish(out)
                t2, waited = time.perf_counter(), state.wall_s["backpressure"]
                metrics.observe_batch(t1 - t0, t2 - t0, out.verdicts)
                await store(out)  # rows leave as one encoded payload: the decoded events die with ``out``
                wall = state.wall_s
                wall["process"] += t1 - t0
                wall["publish"] += t2 - t1
                wall["rows"] += time.perf_counter() - t2 - (wall["backpressure"] - waited)
                for e in chunk:  # never read again (an ack needs only partition and offset): free the bytes
                    e.value = e.message.value = None
            state.ledger.add_batch(e.message for e in fresh)  # acked once rows are written and a snapshot covers it
            state.dirty = True
            caught_up = state.processor.caught_up
            if caught_up and all(caught_up.values()) and state.flush_kick is not None:
                state.flush_kick.set()  # input consumed to its end: write the rows now, not at the next interval

    # -- ClickHouse writer ----------------------------------------------------------------
    @app.task
    async def flusher() -> None:
        init_sync()
        assert state.flush_kick is not None and state.flushed is not None
        backoff = FLUSH_BACKOFF_MIN_S
        while True:
            try:
                await asyncio.wait_for(state.flush_kick.wait(), FLUSH_INTERVAL_S)
            except asyncio.TimeoutError:
                pass
            state.flush_kick.clear()
            ok = await flush_once()
            if ok:
                backoff = FLUSH_BACKOFF_MIN_S
                await try_save_snapshot()
            else:
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, FLUSH_BACKOFF_MAX_S)

    async def flush_once() -> bool:
        """Write what is buffered; True if everything buffered before the call is written."""
        assert state.flushed is not None
        target = state.ledger.added
        if state.sink is None or state.sink.pending_rows == 0:
            state.ledger.flushed_up_to(target)
            state.flushed.set()
            return True
        pending = state.sink.pending_rows
        state.peak_pending_rows = max(state.peak_pending_rows, pending)
        try:
            started = time.perf_counter()
            written = await asyncio.to_thread(state.sink.flush)
            metrics.observe_flush(time.perf_counter() - started, written)
        except Exception as exc:  # SinkWriteError and transport errors: keep the rows, retry, ack nothing
            metrics.sink_write_failures_total.inc()
            state.sink_failures += 1
            if state.sink_down_since is None:
                state.sink_down_since = time.monotonic()
            if state.sink_failures == 1 or state.sink_failures % 10 == 0:
                log.warning("ClickHouse write failed (%d in a row, %d rows buffered): %s; retrying with backoff, "
                            "verdicts keep flowing, offsets not committed",
                            state.sink_failures, pending, exc)
            return False
        state.rows_written += written
        if state.sink_down_since is not None:
            log.warning("ClickHouse writes recovered after %.1f s (%d failed attempts); %d buffered rows written",
                        time.monotonic() - state.sink_down_since, state.sink_failures, written)
        state.sink_failures = 0
        state.sink_down_since = None
        state.ledger.flushed_up_to(target)
        state.flushed.set()
        return True

    # -- snapshots and acks -------------------------------------------------------------------
    async def capture_snapshot() -> None:
        """Capture every channel's state after the last processed batch (published once its rows are written).

        Under the lock the state is only copied; the snapshots are encoded from
        the copy in a thread (``BatchProcessor.snapshot_capture``), so neither
        the agent nor the event loop waits for the encoding (done on the loop,
        it held up every verdict each ``SNAPSHOT_INTERVAL_S``, issue #15).
        :func:`save_snapshot` awaits it.
        """
        assert state.lock is not None
        async with state.lock:
            if not state.dirty or state.ledger.pending_snapshot_seq is not None or not current():
                return
            encode = state.processor.snapshot_capture(state.gate.last_offsets)
            state.ledger.snapshot_taken((state.generation, asyncio.ensure_future(asyncio.to_thread(encode))))
            state.dirty = False

    async def save_snapshot() -> None:
        """Publish the captured snapshot if its rows are written, then ack the messages it covers."""
        assert state.snap_lock is not None
        from pipeline.stream.state_topic import snapshot_headers

        async with state.snap_lock:
            ready = state.ledger.ready_snapshot()
            if ready is None:
                return
            generation, encoding = ready
            if generation != state.generation or not current():
                state.ledger.drop_snapshot()
                return
            epoch = state.ledger.epoch
            records = await encoding  # encoded in a thread since the capture; raises what the encoding raised
            await send_and_wait(app.producer, topics.state,
                                [(name.encode(), blob, snapshot_headers(offs, part))
                                 for name, blob, offs, part in records])
            if epoch != state.ledger.epoch or not current():
                return  # a rebalance came in between: ack nothing of the old assignment
            for m in state.ledger.snapshot_saved():
                m.ack(app.consumer)
                state.acked_messages += 1
            state.snapshots_written += 1 if records else 0

    async def try_save_snapshot() -> None:
        try:
            await save_snapshot()
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # Kafka refused the snapshot: nothing acked, tried again later
            log.warning("saving the state snapshot failed (%s: %s); will retry", type(exc).__name__, exc)
            state.ledger.drop_snapshot()
            state.dirty = True  # capture a new one

    @app.timer(interval=SNAPSHOT_INTERVAL_S)
    async def periodic_snapshot() -> None:
        if state.lock is None:
            return
        await capture_snapshot()
        await try_save_snapshot()

    @app.timer(interval=SNAPSHOT_INTERVAL_S)
    async def status_log() -> None:
        """One status line (also while the agent waits for a full buffer to drain)."""
        pr = state.processor
        log.info("status: generation %s, %d events in, %d verdicts out, %d rows buffered (peak %d), %d rows written, "
                 "%d messages unacked, %d acked, %d snapshots saved, sink %s, low watermark %s, intake %s; "
                 "agent time so far (s): %s",
                 state.generation, pr.events_in, pr.verdicts_out,
                 state.sink.pending_rows if state.sink is not None else 0, state.peak_pending_rows,
                 state.rows_written, state.ledger.unacked_messages, state.acked_messages, state.snapshots_written,
                 "down" if state.sink_down_since is not None else "ok", pr.low_watermark_ms(),
                 "paused (sink buffer full)" if state.intake_paused else "open",
                 ", ".join(f"{k} {v:.1f}" for k, v in state.wall_s.items()))

    @app.timer(interval=5.0)
    async def idle_advance() -> None:
        if state.lock is None:
            return
        idle = time.monotonic() - state.last_batch_wall_s
        if idle < IDLE_ADVANCE_AFTER_S:
            return
        async with state.lock:
            if not await ensure_generation():
                return
            verdicts = state.processor.advance_idle(5_000, now_ms=int(time.time() * 1000))
            if verdicts:
                out = ProcessedBatch(verdicts=verdicts)
                await publish(out)
                metrics.observe_verdicts(verdicts)
                await store(out)
                state.ledger.add_batch([])
                state.dirty = True

    # -- rebalances and shutdown -------------------------------------------------------------
    @app.on_partitions_revoked.connect
    async def on_revoked(sender: Any, revoked: Any = None, **kwargs: Any) -> None:
        """Another member may own these channels now: stop snapshots and acks until the next reset."""
        state.stale = True
        if state.snap_lock is not None:
            async with state.snap_lock:
                pass  # a snapshot already being published lands before the group moves on

    @app.on_before_shutdown.connect
    async def drain(sender: Any, **kwargs: Any) -> None:
        """Graceful stop: write what is buffered, save a snapshot, ack and commit (bounded time)."""
        if state.lock is None or not current():
            return
        deadline = time.monotonic() + DRAIN_TIMEOUT_S

        def left() -> float:
            return max(0.1, deadline - time.monotonic())

        async def flush_and_save() -> None:
            while not await flush_once():
                if time.monotonic() >= deadline:
                    raise TimeoutError("ClickHouse still failing")
                await asyncio.sleep(min(FLUSH_BACKOFF_MIN_S, left()))
            await asyncio.wait_for(save_snapshot(), left())

        try:
            await flush_and_save()  # a snapshot captured earlier
            await asyncio.wait_for(capture_snapshot(), left())
            await flush_and_save()
            await app.consumer.commit()
            log.warning("drained: %d rows written, %d messages acked, %d left unacked (re-read on restart)",
                        state.rows_written, state.acked_messages, state.ledger.unacked_messages)
        except Exception as exc:  # never block the shutdown; unacked input is re-read after a restart
            log.warning("drain at shutdown incomplete (%s: %s); unacked input is re-read on restart",
                        type(exc).__name__, exc)

    return app, state


def run_worker(settings: Settings, policy: PolicyConfig | None = None, loglevel: str = "warning") -> None:
    """Run a worker until interrupted (SIGINT/SIGTERM): consumes, detects, publishes, stores (sink: ``open_sink``)."""
    from pipeline.stream.runtime import open_sink_and_topics

    from pipeline.metrics import start_metrics_server

    sink = open_sink_and_topics(settings)
    app, _state = build_app(settings, policy, sink, metrics=start_metrics_server(settings))
    tune_gc()
    worker = BoundedStopWorker(app, loglevel=loglevel, quiet=True)
    worker.execute_from_commandline()
