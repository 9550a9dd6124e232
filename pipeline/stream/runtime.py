"""How the worker process runs: faust options for the broker and the agent, GC tuning, direct sends.

Kept apart from :mod:`pipeline.stream.app` (the topology) so the bare-faust
benchmark and the tests build their apps with exactly the worker's options.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import sys
import threading
from typing import Any, Iterable, Optional

import faust

from pipeline.config import Settings
from pipeline.stream.take import TakeLimits

log = logging.getLogger("channel_health.worker")

#: Bytes per producer batch and partition (faust ``producer_max_batch_size``, default 16,384). aiokafka's
#: ``send`` waits for the broker whenever a partition's batch is full (``MessageAccumulator.add_message``):
#: with 16 KiB a round's 1,000 verdicts (~720 bytes each) waited for ~45 round trips, 0.1 s of the agent's time
#: per round in ``channel-health bench``. 256 KiB holds a round's verdicts of a partition at 4 partitions (~180 KB
#: each); below the producer's 1 MB request limit.
PRODUCER_BATCH_BYTES = 256 * 1024
#: How the agent takes its input (:class:`~pipeline.stream.take.TakeLimits`): at most 2,048 messages
#: or 32 MiB per batch and pending beyond it (32 MiB: about the 256 batch envelopes of ~140 KB a take held
#: before). Under a backlog (:data:`TAKE_LINGER_LAG`) a batch under 512 KiB waits up to 0.25 s for more:
#: ~1,500 single-event messages, where a call of the processor costs a sixth of the per-event time
#: of a 100-message call (docs/THROUGHPUT.md, "Single-event messages").
TAKE = TakeLimits(max_n=2_048, max_bytes=32 * 1024 * 1024, min_bytes=512 * 1024, linger_s=0.25)
#: Messages the input must be behind its log end (over the assigned partitions) for a batch to linger.
TAKE_LINGER_LAG = 2_048
#: Fetched messages faust buffers per agent before it pauses fetching (faust ``stream_buffer_maxsize``,
#: default 4,096: 4,096 batch envelopes of 500 events are ~570 MB held in memory).
STREAM_BUFFER_MAX = 256
#: Raw input bytes decoded at once: a take of up to 32 MiB of batch envelopes is processed in
#: chunks, so at most this much is held as decoded events at a time.
CHUNK_BYTES = 4 * 1024 * 1024
#: Collector thresholds of the worker process (gen0 allocations, gen1, gen2 ratios); CPython default (700, 10, 10).
GC_THRESHOLDS = (50_000, 20, 100)


#: Longest time a fetch waits on the broker for data (ms). faust hard-codes 1,500 ms; the embedded broker
#: (Tansu) holds a waiting fetch that long even when data arrives meanwhile, which added ~0.75 s (p50) to
#: every verdict. A production Kafka answers as soon as data is there, so the value only matters when idle.
FETCH_MAX_WAIT_MS = 100


def cap_fetch_wait(max_wait_ms: int = FETCH_MAX_WAIT_MS) -> None:
    """Make faust's worker consumers wait at most ``max_wait_ms`` per fetch (idempotent, process-wide).

    faust passes ``fetch_max_wait_ms=1500`` to aiokafka without a setting
    (``faust/transport/drivers/aiokafka.py``, ``_create_worker_consumer``);
    this wraps that method and sets aiokafka's ``_fetch_max_wait_ms`` on the
    consumer before it starts (aiokafka reads it in ``start()``). Raises
    ``ValueError`` for a value outside 1..10,000.
    """
    if not 1 <= int(max_wait_ms) <= 10_000:
        raise ValueError(f"fetch max wait must be 1..10000 ms, got {max_wait_ms!r}")
    from faust.transport.drivers import aiokafka as driver

    cls = driver.AIOKafkaConsumerThread
    original = getattr(cls._create_worker_consumer, "__wrapped__", cls._create_worker_consumer)

    def create(self: Any, transport: Any) -> Any:
        consumer = original(self, transport)
        consumer._fetch_max_wait_ms = int(max_wait_ms)
        return consumer

    create.__wrapped__ = original  # type: ignore[attr-defined]
    cls._create_worker_consumer = create


class _UnknownReadOffsets(dict):
    """faust's per-partition "highest offset delivered" map, read as unknown for every partition."""

    def __getitem__(self, tp: Any) -> None:
        return None


def disable_read_offset_filter(consumer: Any) -> None:
    """Stop faust from dropping records below the highest offset it has delivered (call before it starts).

    faust's consumer drops a record whose offset is below the last one it
    delivered on that partition (``Consumer._drain_messages``, ``_read_offset``).
    After a seek back, records that were already fetched before the seek are
    still delivered and move that mark ahead again, so faust then drops the
    re-read records the seek was for. The worker's :class:`~pipeline.stream.offsets.OffsetGate`
    does this job instead (duplicates dropped, order enforced from the
    committed offset), so the filter is switched off: every fetched record
    reaches the agent. ``consumer``: ``app.consumer`` of a faust app.
    """
    consumer._read_offset = _UnknownReadOffsets()


def faust_broker_kwargs(settings: Settings) -> dict[str, Any]:
    """faust.App keyword arguments for the broker, credentials and group timeouts.

    Timeouts are short so that a new or restarted member joins the group in
    seconds and a dead member's partitions move within ~10 s on the embedded
    broker (a join takes about session_timeout / 2 on Tansu; below 1 s the
    group rebalances forever). Session 6 s, heartbeat 0.5 s. Producer batches:
    :data:`PRODUCER_BATCH_BYTES`; largest request: ``settings.producer_max_request_bytes``.
    """
    if not settings.kafka_bootstrap:
        raise ValueError("no Kafka bootstrap configured (CHANNEL_HEALTH_KAFKA_BOOTSTRAP)")
    sec = settings.kafka_security
    kwargs: dict[str, Any] = {
        "broker": [f"kafka://{h.strip()}" for h in settings.kafka_bootstrap.split(",")],
        "broker_session_timeout": 6.0,
        "broker_heartbeat_interval": 0.5,
        "broker_rebalance_timeout": 10.0,
        "broker_commit_every": 1_000,
        "broker_commit_interval": 1.0,
        "producer_max_batch_size": PRODUCER_BATCH_BYTES,
        "producer_max_request_size": settings.producer_max_request_bytes,
    }
    if sec.protocol.startswith("SASL"):
        kwargs["broker_credentials"] = faust.SASLCredentials(
            username=sec.sasl_username or "",
            password=sec.sasl_password.reveal() if sec.sasl_password else "",
            mechanism=sec.sasl_mechanism or "PLAIN",
            ssl_context=sec.aiokafka_kwargs().get("ssl_context") if sec.protocol == "SASL_SSL" else None,
        )
    elif sec.protocol == "SSL":
        kwargs["broker_credentials"] = faust.SSLCredentials(sec.aiokafka_kwargs()["ssl_context"])
    return kwargs


def open_sink_and_topics(settings: Settings) -> Any:
    """The worker's start: open its ClickHouse sink (:func:`pipeline.sinks.process.open_sink`; its errors come
    first), then create the missing topics with their configuration (:func:`pipeline.kafka.topics.ensure`, SPEC
    §7, so the worker runs with automatic topic creation off). Returns the sink; raises as those two."""
    from pipeline.kafka.topics import ensure
    from pipeline.sinks.process import open_sink

    sink = open_sink(settings)
    asyncio.run(ensure(settings))
    return sink


def tune_gc() -> None:
    """Garbage-collector settings of a worker process (call once, after start-up).

    The worker holds ~10^6 long-lived objects (channel state, buffered rows,
    fetched messages); with CPython's default thresholds (700, 10, 10) every
    few thousand allocations walk them. ``GC_THRESHOLDS`` and the start-up
    objects frozen out of the collector's way (``gc.freeze``, Python docs
    "gc") cut 25-35 % CPU per event (docs/THROUGHPUT.md); reference cycles
    are still collected.
    """
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)


#: One record to publish: ``(key, value, headers)``; key and headers may be None.
Record = tuple[Optional[bytes], bytes, Optional[list[tuple[str, bytes]]]]


async def send_and_wait(producer: Any, topic: str, records: Iterable[Record]) -> int:
    """Publish ``records`` to ``topic`` and return their count once Kafka acknowledged every one.

    ``producer``: faust's transport producer (``app.producer``: aiokafka's
    producer behind it, so the partition of a key is Kafka's default murmur2
    partition). Sending bytes through it directly skips faust's ``Topic.send``
    machinery (codecs, channel, sensors), which mattered at a round's 1,000
    verdicts and a snapshot's 1,000 channel records: in ``channel-health
    bench`` the agent's time for 2,000 verdicts (encode, send, acks) fell from
    0.36-0.48 s to 0.10-0.18 s. Raises the first send error (e.g.
    ``KafkaError``) after all sends were handed over.
    """
    futures = [await producer.send(topic, key, value, None, None, headers) for key, value, headers in records]
    if futures:
        await asyncio.gather(*futures)
    return len(futures)


#: Longest stop of a worker process, from the signal to its exit (s): the drain (``drain_timeout_s``) and
#: faust's own shutdown. Below the 10 s within which a stop must be complete (issue #17) and Kubernetes'
#: 30 s grace period.
STOP_LIMIT_S = 8.0
#: Longest wait of faust for its consumer thread to stop (s; mode's ``Service.shutdown_timeout``, 60 s by
#: default). With the broker gone, aiokafka's fetcher re-raises a cancelled fetch in ``consumer.stop()``, the
#: thread never reports that it stopped, and faust waited the whole 60 s (issue #17).
CONSUMER_THREAD_STOP_S = 2.0
#: Exit status of a worker whose stop was cut short at ``STOP_LIMIT_S``: its unacked input is re-read after
#: a restart (at-least-once), but faust's shutdown did not finish.
STOP_CUT_SHORT_EXIT_CODE = 3


def bound_consumer_thread_stop(app: faust.App, timeout_s: float = CONSUMER_THREAD_STOP_S) -> None:
    """Make faust wait at most ``timeout_s`` (> 0) for its consumer thread to stop (see
    :data:`CONSUMER_THREAD_STOP_S`); then it logs the timeout and carries on with its shutdown."""
    if timeout_s <= 0:
        raise ValueError(f"timeout_s must be > 0, got {timeout_s!r}")
    app.consumer._thread.shutdown_timeout = float(timeout_s)


class BoundedStopWorker(faust.Worker):
    """:class:`faust.Worker` whose stop takes at most :data:`STOP_LIMIT_S`, whatever it waits for.

    faust stops on SIGTERM and SIGINT (mode installs the handlers; a second
    signal is ignored). Once a stop begins, a timer thread ends the process
    with :data:`STOP_CUT_SHORT_EXIT_CODE` if it still runs ``STOP_LIMIT_S``
    later: a broker or ClickHouse that stopped answering cannot hold the
    stop (and a terminal or service manager) for faust's 60 s timeouts
    (the consumer thread's own wait is :data:`CONSUMER_THREAD_STOP_S`). The
    sink process ends on its own when this process is gone
    (:mod:`pipeline.parent_death`).
    """

    stop_limit_s: float = STOP_LIMIT_S
    _stop_timer: threading.Timer | None = None

    def __init__(self, app: faust.App, *args: Any, **kwargs: Any) -> None:
        bound_consumer_thread_stop(app)
        super().__init__(app, *args, **kwargs)
        # No terminal spinner: faust's spinner sets the root logger to DEBUG and adds a DEBUG handler
        # (faust/worker.py, ``_setup_spinner_handler``), so every ``log.debug`` of aiokafka, faust and mode
        # (one per verdict sent, per fetch) built a LogRecord that no output showed. A service has no
        # spinner to spin; the root logger keeps the ``loglevel`` given.
        self.spinner = None

    async def on_stop(self) -> None:
        """Arm the stop limit (once), then stop as faust does."""
        if self._stop_timer is None:
            self._stop_timer = threading.Timer(self.stop_limit_s, _cut_stop_short, args=(self.stop_limit_s,))
            self._stop_timer.daemon = True
            self._stop_timer.start()
        await super().on_stop()


def _cut_stop_short(limit_s: float) -> None:
    log.error("the worker did not stop within %.0f s (broker or ClickHouse not answering?); exiting now, "
              "unacked input is re-read after a restart", limit_s)
    for handler in logging.getLogger().handlers:
        try:
            handler.flush()
        except Exception:  # a broken handler: nothing more to save
            pass
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # a closed stream
            pass
    os._exit(STOP_CUT_SHORT_EXIT_CODE)
