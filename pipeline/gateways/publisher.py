"""A publisher for a gateway's hot path: never blocks the caller, never raises, bounded, drops counted.

:class:`BackgroundPublisher` owns one background thread running its own
asyncio loop with a :class:`~pipeline.kafka.producer.BatchingProducer`. The
gateway's side is :meth:`BackgroundPublisher.offer`: an append to a bounded
in-memory buffer under a lock (microseconds), from any thread or event loop.
Every ``max_delay_ms`` (default 100 ms, the ``BatchingProducer`` default) the
thread takes what is buffered, sends it in batch envelopes keyed by channel
and waits for the broker's acknowledgements, so an event waits at most one
tick plus the round trip, whether or not more events follow.

When Kafka is down or slow the gateway is never slowed: the buffer holds at
most ``max_buffer_events`` events (default 10,000: about 10 s of a gateway at
1,000 requests/s); an event offered to a full buffer is dropped and counted
(``dropped_buffer_full``), and the events of a send that failed (broker
unreachable, timeout, refused) are dropped and counted (``dropped_kafka``).
So a gateway whose Kafka is down loses at most what the buffer holds plus
one tick's sends, and says so in these counters, exported on the process's
default Prometheus registry (where a LiteLLM proxy's ``/metrics`` reads) as
``channel_health_gateway_events_total{outcome="published"|"dropped_buffer_full"|"dropped_kafka"}``
and ``channel_health_gateway_buffered_events``. The thread reconnects with a
backoff of 0.5 s doubling to 10 s.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import threading
import time
import weakref
from typing import Any, Callable, Mapping

from pipeline.kafka.producer import BatchingProducer

__all__ = ["BackgroundPublisher", "DEFAULT_MAX_BUFFER_EVENTS"]

log = logging.getLogger("channel_health.gateway")

#: Default bound of the buffer (events): 10 s of a gateway at 1,000 requests/s.
DEFAULT_MAX_BUFFER_EVENTS = 10_000
#: Reconnect backoff (s): first pause, doubling up to the cap.
_BACKOFF_FIRST_S, _BACKOFF_CAP_S = 0.5, 10.0
#: Most events taken from the buffer per tick (one tick's sends are what a failure can lose beyond the buffer).
_TAKE_PER_TICK = 5_000

_LIVE: "weakref.WeakSet[BackgroundPublisher]" = weakref.WeakSet()
_COLLECTOR_LOCK = threading.Lock()
_COLLECTOR_REGISTERED = False


class BackgroundPublisher:
    """Bounded, non-blocking publisher of request-event dicts to ``topic`` (module docstring).

    ``bootstrap``: ``host:port[,...]``; ``security``: aiokafka keyword arguments
    (:meth:`pipeline.config.KafkaSecurity.aiokafka_kwargs`); ``max_buffer_events`` >= 1;
    ``max_events`` (per envelope, >= 1) and ``max_delay_ms`` (tick, >= 1) as in
    :class:`~pipeline.kafka.producer.BatchingProducer`. ``producer_factory``: builds the
    producer from ``(bootstrap, topic, max_events=, max_delay_ms=, security=)`` (tests).
    The thread starts on the first :meth:`offer`. Raises ``ValueError`` for a bad bound.
    """

    def __init__(self, bootstrap: str, topic: str, *, security: Mapping[str, Any] | None = None,
                 max_buffer_events: int = DEFAULT_MAX_BUFFER_EVENTS, max_events: int = 500,
                 max_delay_ms: int = 100, producer_factory: Callable[..., Any] = BatchingProducer) -> None:
        if max_buffer_events < 1 or max_events < 1 or max_delay_ms < 1:
            raise ValueError("max_buffer_events, max_events and max_delay_ms must be >= 1")
        self.bootstrap, self.topic = bootstrap, topic
        self.max_buffer_events, self.max_events, self.max_delay_s = max_buffer_events, max_events, max_delay_ms / 1000
        self._security = dict(security or {})
        self._factory = producer_factory
        self._buffer: collections.deque[Mapping[str, Any]] = collections.deque()
        self._cond = threading.Condition()
        self._inflight = 0
        self._thread: threading.Thread | None = None
        self._stopping = False
        #: Events acknowledged by the broker.
        self.published = 0
        #: Events dropped because the buffer was full (Kafka down or slower than the gateway).
        self.dropped_buffer_full = 0
        #: Events dropped because their send failed (broker unreachable, timeout, refused).
        self.dropped_kafka = 0
        #: Failed connection attempts and failed sends (each logged at most once a minute).
        self.kafka_errors = 0
        self._last_log_s = 0.0
        _LIVE.add(self)
        _register_collector()

    @property
    def dropped(self) -> int:
        """All dropped events: ``dropped_buffer_full + dropped_kafka``."""
        return self.dropped_buffer_full + self.dropped_kafka

    @property
    def buffered(self) -> int:
        """Events waiting in the buffer now."""
        return len(self._buffer)

    def offer(self, event: Mapping[str, Any]) -> bool:
        """Buffer one event for publishing; never blocks on Kafka, never raises.

        Returns False (and counts ``dropped_buffer_full``) when the buffer is
        full or the publisher is closed.
        """
        with self._cond:
            if self._stopping or len(self._buffer) >= self.max_buffer_events:
                self.dropped_buffer_full += 1
                return False
            self._buffer.append(event)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="channel-health-publisher", daemon=True)
                self._thread.start()
        return True

    def flush(self, timeout_s: float = 10.0) -> bool:
        """Wait until every buffered event was sent (acknowledged or dropped); True if so within ``timeout_s``.

        For tests and shutdown; the gateway's request path never calls it.
        """
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while self._buffer or self._inflight:
                left = deadline - time.monotonic()
                if left <= 0 or self._thread is None:
                    return False
                self._cond.wait(min(left, 0.05))
        return True

    def close(self, timeout_s: float = 5.0) -> None:
        """Flush for up to ``timeout_s``, then stop the thread; later offers are dropped and counted."""
        self.flush(timeout_s)
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(timeout_s)

    # -- the background thread -----------------------------------------------------------------------
    def _run(self) -> None:
        asyncio.run(self._loop())

    def _take(self) -> list[Mapping[str, Any]]:
        with self._cond:
            n = min(len(self._buffer), _TAKE_PER_TICK)
            taken = [self._buffer.popleft() for _ in range(n)]
            self._inflight = n
            return taken

    def _done(self, sent: int, failed: int) -> None:
        with self._cond:
            self.published += sent
            self.dropped_kafka += failed
            self._inflight = 0
            self._cond.notify_all()

    def _error(self, what: str, exc: BaseException) -> None:
        self.kafka_errors += 1
        now = time.monotonic()
        if now - self._last_log_s >= 60:
            self._last_log_s = now
            log.warning("channel-health publisher: %s: %s: %s (events are buffered up to %d, then dropped and "
                        "counted)", what, type(exc).__name__, exc, self.max_buffer_events)

    async def _loop(self) -> None:
        backoff = _BACKOFF_FIRST_S
        while not self._stopping:
            producer = self._factory(self.bootstrap, self.topic, max_events=self.max_events,
                                     max_delay_ms=int(self.max_delay_s * 1000), security=self._security)
            try:
                await producer.__aenter__()
            except Exception as exc:  # broker unreachable: keep buffering (bounded), retry with backoff
                self._error("cannot connect to Kafka", exc)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, _BACKOFF_CAP_S)
                continue
            backoff = _BACKOFF_FIRST_S
            try:
                healthy = await self._send_ticks(producer)
            finally:
                try:
                    await asyncio.wait_for(producer.__aexit__(None, None, None), timeout=5)
                except Exception:  # already broken: nothing more to lose than what was counted
                    pass
            if not healthy:
                await asyncio.sleep(backoff)

    async def _send_ticks(self, producer: Any) -> bool:
        """Send what is buffered every tick; False after a failed send (the caller reconnects)."""
        while not self._stopping:
            batch = self._take()
            if batch:
                try:
                    await producer.send_many(batch)
                    await producer.flush()
                except Exception as exc:
                    self._done(0, len(batch))
                    self._error("send failed", exc)
                    return False
                self._done(len(batch), 0)
            else:
                self._done(0, 0)
            await asyncio.sleep(self.max_delay_s)
        return True


def _register_collector() -> None:
    """Register, once per process, a collector of every live publisher's counters on the default registry."""
    global _COLLECTOR_REGISTERED
    with _COLLECTOR_LOCK:
        if _COLLECTOR_REGISTERED:
            return
        try:
            from prometheus_client import REGISTRY
            from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
        except ImportError:  # pragma: no cover - a core dependency
            return

        class _Collector:
            def describe(self) -> list[Any]:
                return []

            def collect(self) -> Any:
                live = list(_LIVE)
                events = CounterMetricFamily("channel_health_gateway_events", "Request events of this gateway by "
                                             "outcome (published, dropped_buffer_full, dropped_kafka)",
                                             labels=["outcome"])
                for outcome in ("published", "dropped_buffer_full", "dropped_kafka"):
                    events.add_metric([outcome], sum(getattr(p, outcome) for p in live))
                yield events
                yield GaugeMetricFamily("channel_health_gateway_buffered_events",
                                        "Request events waiting in the gateway's bounded buffer",
                                        value=sum(p.buffered for p in live))

        REGISTRY.register(_Collector())  # type: ignore[arg-type]
        _COLLECTOR_REGISTERED = True
