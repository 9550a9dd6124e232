"""Gateway-side publisher: batches request events into envelopes (SPEC §3).

Per-message framework cost dominates a stream worker, so gateways send
``{"events": [...]}`` envelopes: :class:`BatchingProducer` flushes when a
batch reaches ``max_events`` (default 500) or is ``max_delay_ms`` old
(default 100 ms), whichever comes first, keyed by channel so one channel's
events stay in one partition (and in order).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, Iterable, Mapping

import msgspec
from aiokafka import AIOKafkaProducer

_enc = msgspec.json.Encoder()


class BatchingProducer:
    """Async producer of batch envelopes to ``topic``.

    ``bootstrap``: ``host:port[,...]``; ``security``: aiokafka keyword
    arguments (see :meth:`pipeline.config.KafkaSecurity.aiokafka_kwargs`).
    ``max_events`` >= 1; ``max_delay_ms`` >= 0. Use as an async context
    manager; :meth:`send` buffers, :meth:`flush` publishes everything
    buffered and waits for the broker's acknowledgements.
    """

    def __init__(self, bootstrap: str, topic: str, max_events: int = 500, max_delay_ms: int = 100,
                 security: Mapping[str, Any] | None = None, max_event_span_ms: int | None = None):
        if max_events < 1 or max_delay_ms < 0:
            raise ValueError("max_events must be >= 1 and max_delay_ms >= 0")
        if max_event_span_ms is not None and max_event_span_ms < 1:
            raise ValueError("max_event_span_ms must be >= 1")
        #: Replays run faster than wall time: also publish every buffer once event
        #: time has moved this far, so no channel's events wait behind the others'.
        self.max_event_span_ms = max_event_span_ms
        self._span_start_ms: int | None = None
        self.topic = topic
        self.max_events = max_events
        self.max_delay_s = max_delay_ms / 1000
        self._producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=5,
                                          max_request_size=8_000_000, acks="all", **dict(security or {}))
        self._buffers: dict[str, list[Mapping[str, Any]]] = {}
        self._first: dict[str, float] = {}
        self._pending: list[asyncio.Future] = []
        self.events_sent = 0
        self.messages_sent = 0

    async def __aenter__(self) -> "BatchingProducer":
        await self._producer.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        try:
            await self.flush()
        finally:
            await self._producer.stop()

    async def send(self, event: Mapping[str, Any]) -> None:
        """Buffer one event dict (SPEC §3 fields); publishes full or old batches."""
        key = str(event.get("channel", ""))
        if self.max_event_span_ms is not None:
            ts = event.get("ts_ms")
            if isinstance(ts, int):
                if self._span_start_ms is None:
                    self._span_start_ms = ts
                elif ts - self._span_start_ms >= self.max_event_span_ms:
                    for k in list(self._buffers):
                        await self._publish(k)
                    self._span_start_ms = ts
        buf = self._buffers.setdefault(key, [])
        if not buf:
            self._first[key] = time.monotonic()
        buf.append(event)
        if len(buf) >= self.max_events or time.monotonic() - self._first[key] >= self.max_delay_s:
            await self._publish(key)
        if len(self._pending) > 200:
            await self._drain()

    async def send_many(self, events: Iterable[Mapping[str, Any]]) -> None:
        """Buffer many events (see :meth:`send`)."""
        for e in events:
            await self.send(e)

    async def _publish(self, key: str) -> None:
        batch = self._buffers.pop(key, [])
        if not batch:
            return
        self._pending.append(await self._producer.send(self.topic, _enc.encode({"events": batch}), key=key.encode()))
        self.events_sent += len(batch)
        self.messages_sent += 1

    async def _drain(self) -> None:
        pending, self._pending = self._pending, []
        await asyncio.gather(*pending)

    async def flush(self) -> None:
        """Publish all buffers and wait until the broker acknowledged them."""
        for key in list(self._buffers):
            await self._publish(key)
        await self._drain()
