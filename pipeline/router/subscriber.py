"""Feed a :class:`~pipeline.router.table.HealthTable` from ``channel.health``.

``HealthSubscriber`` is an async context manager. On enter it starts an
aiokafka consumer and a background task; each message is decoded with
:func:`pipeline.contracts.decode_verdict` and handed to the table. A bad
message (not JSON, wrong fields, weight out of range) is logged and counted
in ``bad_messages``; it never stops the loop. A null value (tombstone on a
compacted topic) removes the channel named by the key.

By default there is no consumer group: every router instance reads every
partition from the beginning (``auto_offset_reset="earliest"``), because each
router needs the whole table and the embedded broker does not compact the
topic. With a compacted production topic that replay is one message per
channel. Pass ``group_id`` only to share the work between instances that
need a partial view.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, Callable

import msgspec
from aiokafka import AIOKafkaConsumer
from aiokafka.errors import KafkaError

from pipeline.config import Settings
from pipeline.contracts import Verdict, decode_verdict
from pipeline.router.table import DEFAULT_STALE_AFTER_S, HealthTable, RouteWeights

log = logging.getLogger("channel_health.router")

#: Longest wait of one fetch (ms) and pause after a broker error (s).
FETCH_TIMEOUT_MS = 500
ERROR_BACKOFF_S = 1.0


async def wait_for(predicate: Callable[[], bool], timeout_s: float, poll_s: float = 0.05) -> None:
    """Return once ``predicate()`` is true; poll every ``poll_s`` seconds.

    Raises ``TimeoutError`` when it is still false after ``timeout_s``.
    """
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() >= deadline:
            raise TimeoutError(f"condition not met within {timeout_s} s")
        await asyncio.sleep(poll_s)


class HealthSubscriber:
    """Background consumer of ``settings.topics.health`` feeding ``table``.

    ``stale_after_s``: see :class:`HealthTable`. ``group_id``: Kafka consumer
    group, None (default) to read every partition without a group.
    ``clock``: the table's clock. ``consumer_factory``: builds the consumer
    from keyword arguments (tests; default :class:`AIOKafkaConsumer`).

    Raises ``ValueError`` when ``settings.kafka_bootstrap`` is not set.
    """

    def __init__(self, settings: Settings, stale_after_s: float = DEFAULT_STALE_AFTER_S,
                 group_id: str | None = None, *, clock: Callable[[], float] = time.monotonic,
                 consumer_factory: Callable[..., Any] | None = None,
                 on_verdict: Callable[[Verdict], None] | None = None):
        if not settings.kafka_bootstrap:
            raise ValueError("no Kafka bootstrap configured (CHANNEL_HEALTH_KAFKA_BOOTSTRAP)")
        self.settings = settings
        self.group_id = group_id
        self.table = HealthTable(stale_after_s=stale_after_s, clock=clock)
        #: Messages read / rejected as undecodable or invalid.
        self.messages = 0
        self.bad_messages = 0
        #: The exception that ended the background task, if any.
        self.error: BaseException | None = None
        self._factory = consumer_factory or AIOKafkaConsumer
        #: Called with every accepted verdict (e.g. to print a timeline); must not block.
        self.on_verdict = on_verdict
        self._consumer: Any = None
        self._task: asyncio.Task | None = None

    def consumer_kwargs(self) -> dict[str, Any]:
        """Keyword arguments of the consumer (topic passed separately)."""
        return {
            "bootstrap_servers": self.settings.kafka_bootstrap,
            "group_id": self.group_id,
            "enable_auto_commit": self.group_id is not None,
            "auto_offset_reset": "earliest",
            "client_id": "channel-health-router",
            **self.settings.kafka_security.aiokafka_kwargs(),
        }

    async def __aenter__(self) -> "HealthSubscriber":
        self._consumer = self._factory(self.settings.topics.health, **self.consumer_kwargs())
        await self._consumer.start()
        self._task = asyncio.create_task(self._run(), name="channel-health-subscriber")
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            self._task = None
        if self._consumer is not None:
            await self._consumer.stop()
            self._consumer = None

    def weights(self, route: str) -> RouteWeights:
        """The table's :meth:`HealthTable.weights` (``KeyError`` for an unknown route)."""
        return self.table.weights(route)

    async def wait_for(self, predicate: Callable[[HealthTable], bool], timeout_s: float) -> None:
        """Wait until ``predicate(table)`` is true.

        Raises ``TimeoutError`` after ``timeout_s``, or ``RuntimeError`` if the
        background task has died (instead of waiting out the timeout).
        """

        def ready() -> bool:
            if self.error is not None:
                raise RuntimeError("channel.health subscriber stopped") from self.error
            return predicate(self.table)

        await wait_for(ready, timeout_s)

    def handle(self, key: bytes | None, value: bytes | None) -> bool:
        """Apply one message to the table; returns True if it changed it.

        Never raises for bad content: it is logged and counted instead.
        """
        self.messages += 1
        if value is None:  # tombstone: the channel was removed
            return key is not None and self.table.forget(key.decode("utf-8", "replace"))
        try:
            verdict = decode_verdict(value)
            changed = self.table.update(verdict)
            if changed and self.on_verdict is not None:
                self.on_verdict(verdict)
            return changed
        except (msgspec.DecodeError, msgspec.ValidationError, ValueError) as exc:
            self.bad_messages += 1
            log.warning("bad channel.health message (%d so far): %s; value starts %r",
                        self.bad_messages, exc, value[:120])
            return False

    async def _run(self) -> None:
        try:
            while True:
                try:
                    batches = await self._consumer.getmany(timeout_ms=FETCH_TIMEOUT_MS)
                except KafkaError as exc:
                    log.warning("channel.health fetch failed, retrying in %.1f s: %s", ERROR_BACKOFF_S, exc)
                    await asyncio.sleep(ERROR_BACKOFF_S)
                    continue
                for messages in batches.values():
                    for msg in messages:
                        self.handle(msg.key, msg.value)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # surfaced through .error and wait_for(); the table stays readable
            self.error = exc
            log.exception("channel.health subscriber stopped")
