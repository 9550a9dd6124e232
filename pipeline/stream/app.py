"""The faust app: topics and the agent wiring the stages together.

Delivery is at-least-once, restarts are exact, and a ClickHouse outage does
not stop the verdicts:

1. the agent takes batches of unacked messages (:mod:`pipeline.stream.take`;
   faust's plain ``take()`` acks even when the body raised -- a failed insert
   would be skipped for ever);
2. a batch's verdicts and dead letters are sent and acknowledged by Kafka,
   and its rows are put in the sink's bounded buffer (by default a child
   process writes them: :mod:`pipeline.sinks.process`); a background flusher
   writes the buffer to ClickHouse about once a second, retrying with
   backoff (0.5 s doubling to ``flush_backoff_max_s``, 2 s) while ClickHouse is
   down. Verdicts keep flowing meanwhile; only when a buffer is full
   (``SinkBackpressure``; bounds ``CHANNEL_HEALTH_SINK_MAX_ROWS`` /
   ``_MAX_BYTES``) does the agent stop taking input until it drains, so
   memory stays bounded;
3. every ``snapshot_interval_s`` the engine's per-channel state is captured;
   once every row of the batches before it is written, it is published to
   the state topic together with the input offsets it covers, and only then
   are those batches' messages acked (:mod:`pipeline.stream.delivery`). So a
   committed offset always lies at or before both the rows in ClickHouse
   and the saved state. This order is the commit protocol, one class:
   :class:`~pipeline.stream.checkpoint.Checkpoint`.

The timings named here are :class:`~pipeline.config.StreamTunables` (``settings.stream``).

After a crash the worker reloads the snapshots and re-reads the messages
after the committed offsets; events a restored snapshot already holds are
not counted again (:mod:`pipeline.engine.batch`), so windows, baselines,
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

On SIGTERM or SIGINT the worker drains: a last flush, snapshot and commit (``drain_timeout_s``,
:meth:`~pipeline.stream.checkpoint.Checkpoint.commit`),
and exits within ``runtime.STOP_LIMIT_S`` even with the broker gone (``runtime.BoundedStopWorker``).

This module only wires topics, agents and timers, in named parts:
:func:`faust_app` (the app and its consumer options), :class:`KafkaIO` (what
the worker reads from and sends to Kafka besides its input),
:func:`install_agent` (the input agent), :func:`install_timers` (flusher,
snapshots, status line, idle clock) and :func:`install_lifecycle`
(revocation, graceful stop); :func:`build_app` puts them together. The work
is done by classes testable without faust: :class:`~pipeline.stream.intake.Intake`
and :class:`~pipeline.stream.intake.Assignment` (input → processor →
outputs, per consumer generation), :class:`~pipeline.stream.flushing.SinkWriter`
(rows into a :class:`~pipeline.sinks.protocol.Sink` and its background
writes), :class:`~pipeline.stream.snapshots.SnapshotPublisher` (snapshots
and acks) and :class:`~pipeline.stream.checkpoint.Checkpoint` (the commit
protocol).
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from pathlib import Path
from typing import Any, Sequence

import faust
from faust.types import TP

from pipeline.config import Settings, StreamTunables
from pipeline.contracts import encode
from pipeline.engine import Engine
from pipeline.metrics import PipelineMetrics
from pipeline.ingest.dead_letter import raw_budget
from pipeline.policy.defaults import PolicyConfig
from pipeline.sinks.protocol import Sink
from pipeline.stream.checkpoint import Checkpoint
from pipeline.stream.control_agent import install_control
from pipeline.stream.dead_letters import DeadLetterPublisher
from pipeline.stream.flushing import SinkWriter
from pipeline.stream.intake import Assignment, Intake
from pipeline.stream.offsets import start_offsets
from pipeline.stream.take import batches
from pipeline.engine.batch import BatchProcessor, ProcessedBatch
from pipeline.stream.quality_agent import install_quality
from pipeline.stream.runtime import (
    CHUNK_BYTES,
    STREAM_BUFFER_MAX,
    TAKE,
    TAKE_LINGER_LAG,
    BoundedStopWorker,
    cap_fetch_wait,
    disable_read_offset_filter,
    faust_broker_kwargs,
    send_and_wait,
    tune_gc,
)
from pipeline.stream.snapshots import SnapshotPublisher
from pipeline.stream.worker_state import WorkerState

log = logging.getLogger("channel_health.worker")

__all__ = ["build_app", "run_worker", "faust_app", "KafkaIO", "install_agent", "install_timers", "install_lifecycle"]


def _value_bytes(event: Any) -> int:
    """Bytes of a faust event's raw value (the linger's measure in :func:`~pipeline.stream.take.batches`)."""
    value = event.value
    return len(value) if isinstance(value, (bytes, bytearray)) else 0


class FaustConsumer:
    """:class:`~pipeline.stream.intake.ConsumerView` of a faust app's consumer, for the input ``topic``."""

    def __init__(self, app: faust.App, topic: str) -> None:
        self.app = app
        self.topic = topic

    @property
    def generation_id(self) -> int | None:
        return self.app.consumer_generation_id

    @property
    def rebalancing(self) -> bool:
        return bool(self.app.rebalancing)

    def assigned_partitions(self) -> list[int]:
        return sorted(tp.partition for tp in self.app.consumer.assignment() if tp.topic == self.topic)

    def highwater(self, partition: int) -> int | None:
        return self.app.consumer.highwater(TP(self.topic, partition))  # cached from the last fetch response

    async def seek(self, partition: int, offset: int) -> None:
        # seek_wait runs the seek on the consumer's own thread (aiokafka is not thread-safe) and waits for it
        await self.app.consumer.seek_wait({TP(self.topic, partition): offset})

    def lags(self, last_offsets: dict[int, int]) -> dict[tuple[str, int], int]:
        """Messages behind the end of each assigned input partition (the highwater of the last fetch), given
        the last processed offset of each."""
        return {(self.topic, p): max(0, (self.highwater(p) or 0) - 1 - last_offsets.get(p, -1))
                for p in self.assigned_partitions()}


def faust_app(settings: Settings, datadir: str | None = None) -> faust.App:
    """The worker's faust app: in-memory tables, no web server, the broker options of
    :func:`~pipeline.stream.runtime.faust_broker_kwargs`, fetches capped (``cap_fetch_wait``) and faust's
    read-offset filter off (the :class:`~pipeline.stream.offsets.OffsetGate` orders the input instead).
    ``datadir``: faust's directory (None: one per process under the temporary directory)."""
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
    return app


class KafkaIO:
    """What the worker reads from Kafka besides its input (the state topic, committed offsets) and sends to it
    (verdicts, dead letters, snapshots), each send returning once Kafka acknowledged it."""

    def __init__(self, app: faust.App, settings: Settings) -> None:
        self.app = app
        self.settings = settings
        self.topics = settings.topics
        self.dead_letters = DeadLetterPublisher(self.topics.dlq, raw_budget(settings.producer_max_request_bytes))
        self._kafka = settings.kafka_bootstrap or ""
        self._security = settings.kafka_security.aiokafka_kwargs

    async def load_records(self) -> Any:
        """The state topic's latest snapshot record of each channel."""
        from pipeline.stream.state_topic import load_snapshot_records

        return await load_snapshot_records(self._kafka, self.topics.state, self._security())

    async def load_starts(self, assigned: list[int]) -> dict[int, int]:
        """The committed offset of each assigned input partition."""
        return await start_offsets(self._kafka, self.settings.consumer_group, self.topics.requests, assigned,
                                   self._security())

    async def publish(self, out: ProcessedBatch) -> None:
        """Send the batch's verdicts and dead letters; returns once Kafka acknowledged them (a refused dead
        letter is sent again without its copy of the input, then counted as lost: never fatal). Overrides are
        applied before this, by :meth:`Intake.emit`."""
        app = self.app
        await send_and_wait(app.producer, self.topics.health,
                            [(v.channel.encode(), encode(v), None) for v in out.verdicts])
        await self.dead_letters.publish(app.producer, out.dead_letters)  # never raises for a refused dead letter

    async def send_state(self, records: Sequence[tuple[bytes, bytes, Any]]) -> None:
        """Send snapshot records to the state topic; returns once Kafka acknowledged every one."""
        await send_and_wait(self.app.producer, self.topics.state, records)


def install_agent(app: faust.App, requests: Any, state: WorkerState, intake: Intake,
                  tunables: StreamTunables) -> None:
    """The input agent: batches of unacked messages (:func:`~pipeline.stream.take.batches`, never faust's
    acking ``take``) into :meth:`Intake.handle`; waits while more than ``tunables.max_unacked_messages`` are
    unacked; a failure that is not bad input crashes the app (offsets not committed)."""

    def backlog() -> bool:
        """The input is behind its log end by a batch or more: small batches may linger (see take)."""
        return intake.lag_messages >= TAKE_LINGER_LAG

    @app.agent(requests)
    async def process(stream: faust.StreamT) -> None:
        state.init_sync()
        try:
            ended = None
            async for events in batches(stream.noack().events(), TAKE, _value_bytes, backlog):  # not noack_take
                if ended is not None:
                    state.wall_s["between"] += time.perf_counter() - ended
                await intake.handle(events)
                ended = time.perf_counter()
                state.last_batch_wall_s = time.monotonic()
                while state.checkpoint.ledger.unacked_messages > tunables.max_unacked_messages:
                    await asyncio.sleep(0.1)  # acks come with the next saved snapshot
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a bug, not bad input (bad input is dead-lettered): stop loudly
            log.critical("stream agent failed: %r; stopping the worker (offsets not committed)", exc, exc_info=True)
            await app.crash(exc)
            raise


def install_timers(app: faust.App, state: WorkerState, writer: SinkWriter, checkpoint: Checkpoint, intake: Intake,
                   tunables: StreamTunables) -> None:
    """The background loops: the sink's flusher (each write followed by :meth:`Checkpoint.after_write`), the
    snapshot tick and the status line every ``snapshot_interval_s``, the idle clock every ``idle_step_ms``."""

    @app.task
    async def flusher() -> None:
        await writer.run(after_flush=checkpoint.after_write)  # the save runs beside the next writes

    @app.timer(interval=tunables.snapshot_interval_s)
    async def periodic_snapshot() -> None:
        await checkpoint.tick()

    @app.timer(interval=tunables.snapshot_interval_s)
    async def status_log() -> None:
        """One status line (also while the agent waits for a full buffer to drain)."""
        log.info("status: %s", state.status_line())

    @app.timer(interval=tunables.idle_step_ms / 1000)
    async def idle_advance() -> None:
        await intake.advance_idle(now_ms=int(time.time() * 1000))


def install_lifecycle(app: faust.App, assignment: Assignment, checkpoint: Checkpoint) -> None:
    """Rebalance and stop: on revocation no more snapshots or acks; on shutdown the whole commit protocol."""

    @app.on_partitions_revoked.connect
    async def on_revoked(sender: Any, revoked: Any = None, **kwargs: Any) -> None:
        """Another member may own these channels now: stop snapshots and acks until the next reset."""
        assignment.revoked()
        await checkpoint.settle()  # a snapshot already being published lands before the group moves on

    @app.on_before_shutdown.connect
    async def on_shutdown(sender: Any, **kwargs: Any) -> None:
        """Graceful stop: write what is buffered, save a snapshot, ack and commit (bounded time)."""
        await checkpoint.commit()


def build_app(settings: Settings, policy: PolicyConfig | None = None, sink: Sink | None = None,
              datadir: str | None = None, metrics: PipelineMetrics | None = None) -> tuple[faust.App, WorkerState]:
    """Create the faust app, its topics, the agent, the sink flusher and the timers.

    ``sink``: where rows go (:class:`~pipeline.sinks.protocol.Sink`: a
    :class:`~pipeline.sinks.process.ProcessSink` or an in-process
    :class:`~pipeline.sinks.clickhouse.ClickHouseSink`), or None to skip storage. ``metrics``: where to count
    (:mod:`pipeline.metrics`; None: a private, unserved one).
    """
    topics, tunables = settings.topics, settings.stream
    app = faust_app(settings, datadir)
    state = WorkerState(processor=BatchProcessor.for_settings(settings, policy), sink=sink, last_batch_wall_s=time.monotonic())
    requests = app.topic(topics.requests, key_serializer="raw", value_serializer="raw")
    kafka = KafkaIO(app, settings)
    install_quality(app, state, settings)  # SPEC §4.5 sampler + scoring task (no-op without torch)
    # overrides: applied by intake.emit before verdicts are published and stored (the lambdas resolve later)
    control = install_control(app, state, settings, lambda out: intake.emit(out), lambda out: writer.store(out))
    consumer = FaustConsumer(app, topics.requests)

    metrics = metrics or PipelineMetrics()  # issue #21: counts the processor keeps are read at scrape time
    metrics.track_worker(lambda: state.processor, lambda: consumer.lags(state.assignment.gate.last_offsets),
                         lambda: state.sink, lambda: getattr(state, "quality", None))
    metrics.track_control(lambda: control.refused)

    assignment = Assignment(state, consumer, kafka.load_records, kafka.load_starts,
                            lambda: Engine(policy, settings.state_limits))
    writer = SinkWriter(state, metrics, tunables)
    intake = Intake(state, assignment, kafka.publish, writer, CHUNK_BYTES, control=control, metrics=metrics,
                    tunables=tunables)
    snapshots = SnapshotPublisher(state, kafka.send_state, lambda m: m.ack(app.consumer), assignment.current,
                                  tunables)
    checkpoint = Checkpoint(state, writer, snapshots, lambda: app.consumer.commit(), tunables)

    install_agent(app, requests, state, intake, tunables)
    install_timers(app, state, writer, checkpoint, intake, tunables)
    install_lifecycle(app, assignment, checkpoint)
    return app, state


def run_worker(settings: Settings, policy: PolicyConfig | None = None, loglevel: str = "warning") -> None:
    """Run a worker until interrupted (SIGINT/SIGTERM): consumes, detects, publishes, stores (sink: ``open_sink``)."""
    from pipeline.stream.runtime import open_sink_and_topics

    from pipeline.escape import install_log_escaping
    from pipeline.metrics import start_metrics_server

    install_log_escaping()  # every log line of the worker: names cannot break or forge lines (SPEC §8)
    sink = open_sink_and_topics(settings)
    app, _state = build_app(settings, policy, sink, metrics=start_metrics_server(settings))
    tune_gc()
    worker = BoundedStopWorker(app, loglevel=loglevel, quiet=True)
    worker.execute_from_commandline()
