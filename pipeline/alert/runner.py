"""The alert process: ``channel.health`` in, notifications out (``channel-health alert``).

:class:`AlertService` is the logic (decode, severity, silences, grouping,
heartbeat) on injected clocks; :func:`run_alerts` feeds it from an aiokafka
consumer and sends what is due through a :class:`~pipeline.alert.delivery.Dispatcher`.

It needs neither the worker nor ClickHouse: only the broker and the webhooks.
Kafka: its own consumer group (``[kafka] group``, default
``channel-health-alert``), ``auto_offset_reset="latest"``, offsets committed
automatically. Restart semantics (issue #35): at start the process reads the compacted
``channel.health`` to its end (:meth:`AlertService.rebuild`): every channel
whose newest verdict is firing is put back in its group and announced again
once (PagerDuty merges the repeat by ``dedup_key``; a chat says "still
firing after an alert-process restart"), so its resolve goes out when it
recovers. Then it resumes from the group's committed offsets (a first start:
from now). A channel that fired and recovered entirely while the process was
down leaves no firing verdict behind and gets no resolve from it.

Bad messages (not JSON, wrong fields) are logged and counted, never fatal.
Sends run in the background, one chain per dedup key so a resolve never
overtakes its alert; on stop, pending sends get ``drain_s`` to finish.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from typing import Any, Callable, Iterable

import msgspec

from pipeline.alert.config import AlertConfig
from pipeline.alert.delivery import Dispatcher
from pipeline.alert.grouping import Grouper, Notification
from pipeline.alert.heartbeat import Heartbeat
from pipeline.alert.severity import outcome, silenced_by
from pipeline.config import Settings
from pipeline.contracts import Verdict, decode_verdict

log = logging.getLogger("channel_health.alert")

#: Longest wait of one fetch (ms): also the tick of group and heartbeat timers.
FETCH_TIMEOUT_MS = 250
#: Pause after a broker error (s).
ERROR_BACKOFF_S = 1.0
#: Longest read of channel.health at start to rebuild the firing channels (s).
REBUILD_TIMEOUT_S = 60.0


class AlertService:
    """Verdicts -> notifications. ``clock``: monotonic seconds (timers); ``wall``: UTC epoch seconds (silences)."""

    def __init__(self, config: AlertConfig, *, clock: Callable[[], float] = time.monotonic,
                 wall: Callable[[], float] = time.time):
        self.config = config
        self.clock, self.wall = clock, wall
        self.grouper = Grouper(config.grouping)
        self.heartbeat = Heartbeat(config.heartbeat_s, clock()) if config.heartbeat_s else None
        self.messages = 0
        self.bad_messages = 0
        self.silenced = 0
        self._pending: list[Notification] = []
        #: channel -> (state, event time ms it began, seq of the newest verdict): the "since" of an alert line.
        self.since: dict[str, tuple[str, int, int]] = {}

    def _track(self, verdict: Verdict) -> bool:
        """Record the verdict's state start; False for a replayed (older) verdict, which is then ignored."""
        old = self.since.get(verdict.channel)
        if old is not None and verdict.seq <= old[2]:
            return False
        start = old[1] if old is not None and old[0] == verdict.state else verdict.ts_ms
        self.since[verdict.channel] = (verdict.state, start, verdict.seq)
        return True

    def rebuild(self, values: Iterable[bytes | None]) -> int:
        """Put back the channels still firing, from ``channel.health`` read to its end (compacted: the newest
        verdict per channel); returns how many. Each is announced once more after ``group_wait``."""
        newest: dict[str, Verdict] = {}
        for value in values:
            if value is None:
                continue
            try:
                v = decode_verdict(value)
            except (msgspec.DecodeError, msgspec.ValidationError):
                self.bad_messages += 1
                continue
            if self._track(v):
                newest[v.channel] = v
        now, n = self.clock(), 0
        for v in newest.values():
            result = outcome(v, self.config.rules)
            if result == "keep" and v.state in ("half_open", "recovering"):  # after a trip: still firing
                result = outcome(msgspec.structs.replace(v, state="open"), self.config.rules)
            if result in ("resolve", "keep") or silenced_by(v, self.config.silences, self.wall()) is not None:
                continue
            self.grouper.observe(v, result, now)
            n += 1
        self.grouper.note_restart()
        return n

    def handle(self, value: bytes | None) -> None:
        """One ``channel.health`` message (a tombstone is ignored). Never raises for bad content."""
        now = self.clock()
        self.messages += 1
        if value is None:
            return
        try:
            verdict = decode_verdict(value)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            self.bad_messages += 1
            log.warning("bad channel.health message (%d so far): %s; value starts %r", self.bad_messages, exc,
                        value[:120])
            return
        if self.heartbeat is not None and (n := self.heartbeat.beat(now)) is not None:
            self._pending.append(n)
        if not self._track(verdict):
            return
        result = outcome(verdict, self.config.rules)
        if result not in ("resolve", "keep"):
            silence = silenced_by(verdict, self.config.silences, self.wall())
            if silence is not None:
                self.silenced += 1
                log.info("channel %s (%s) silenced: %s", verdict.channel, result, silence.comment or "no comment")
                return
        self.grouper.observe(verdict, result, now)

    def due(self, *, flush_all: bool = False) -> list[Notification]:
        """Notifications to send now (heartbeat first); ``flush_all`` skips the group waits (``--once``)."""
        now = self.clock()
        out, self._pending = self._pending, []
        if self.heartbeat is not None and (n := self.heartbeat.check(now)) is not None:
            out.append(n)
        return out + [self._with_since(n) for n in self.grouper.due(now, flush_all=flush_all)]

    def _with_since(self, n: Notification) -> Notification:
        since = tuple((v.channel, self.since[v.channel][1]) for v, _ in n.firing if v.channel in self.since)
        return dataclasses.replace(n, since_ms=since) if since else n


class Sender:
    """Runs dispatches in the background, chained per dedup key; :meth:`drain` waits for them (bounded)."""

    def __init__(self, dispatcher: Dispatcher, metrics: Any = None):
        self.dispatcher = dispatcher
        self.metrics = metrics  # pipeline.metrics.PipelineMetrics or None: alerts_sent_total{route,outcome}
        self._chains: dict[str, asyncio.Task] = {}

    def submit(self, n: Notification) -> None:
        """Queue ``n`` behind the earlier notification of the same key."""
        prev = self._chains.get(n.key)

        async def run() -> None:
            if prev is not None:
                await asyncio.gather(prev, return_exceptions=True)
            try:
                names = await self.dispatcher.dispatch(n)
                log.info("%s %s (%s) delivered to %s", n.kind, n.key, n.severity, ", ".join(names) or "no route")
                for name in names if self.metrics is not None else ():
                    self.metrics.alerts_sent_total.labels(name, "sent").inc()
            except Exception:  # a bug in a formatter must not end the process
                log.exception("sending %s failed", n.key)
                if self.metrics is not None:
                    self.metrics.alerts_sent_total.labels("none", "failed").inc()

        self._chains[n.key] = asyncio.create_task(run(), name=f"alert-{n.key}")

    async def drain(self, timeout_s: float) -> None:
        """Wait up to ``timeout_s`` for queued sends; cancel what is left (logged)."""
        tasks = [t for t in self._chains.values() if not t.done()]
        if not tasks:
            return
        done, pending = await asyncio.wait(tasks, timeout=timeout_s)
        for t in pending:
            t.cancel()
        if pending:
            log.error("%d alert send(s) still pending after %.1f s at stop; cancelled", len(pending), timeout_s)


def consumer_kwargs(settings: Settings, config: AlertConfig) -> dict[str, Any]:
    """aiokafka consumer arguments: own group, latest offsets, auto-commit, the configured security."""
    return {"bootstrap_servers": settings.kafka_bootstrap, "group_id": config.consumer_group,
            "enable_auto_commit": True, "auto_offset_reset": "latest", "client_id": "channel-health-alert",
            **settings.kafka_security.aiokafka_kwargs()}


async def run_alerts(config: AlertConfig, settings: Settings, stop: asyncio.Event, *, once: bool = False,
                     drain_s: float = 10.0, consumer_factory: Callable[..., Any] | None = None) -> AlertService:
    """Consume ``channel.health`` until ``stop`` is set and send alerts; returns the service (its counters).

    ``once``: read until a fetch returns nothing, send every pending group at
    once, and return. Raises ``ValueError`` without a Kafka bootstrap.
    """
    if not settings.kafka_bootstrap:
        raise ValueError("no Kafka bootstrap configured (CHANNEL_HEALTH_KAFKA_BOOTSTRAP)")
    from aiokafka import AIOKafkaConsumer
    from aiokafka.errors import KafkaError

    from pipeline.metrics import start_metrics_server

    service = AlertService(config)
    metrics = start_metrics_server(settings)  # issue #21: /metrics on CHANNEL_HEALTH_METRICS_PORT (unset: none)
    metrics.track("channel_health_alert_verdicts_total", "Messages read from channel.health.",
                  lambda: service.messages, kind="counter")
    metrics.track("channel_health_alert_bad_messages_total", "channel.health messages that were not verdicts.",
                  lambda: service.bad_messages, kind="counter")
    if consumer_factory is None:  # the compacted topic's newest verdicts: channels still firing (issue #35)
        from pipeline.stream.control import read_to_end

        values: list[bytes | None] = []
        try:
            await read_to_end(settings.kafka_bootstrap, settings.topics.health, lambda k, v: values.append(v),
                              settings.kafka_security.aiokafka_kwargs(), REBUILD_TIMEOUT_S)
        except (TimeoutError, KafkaError) as exc:
            log.warning("alert state not rebuilt from %s (%s): channels firing before a restart get no resolve",
                        settings.topics.health, exc)
        firing = service.rebuild(values)
        log.info("alert state rebuilt from %s: %d channel(s) still firing", settings.topics.health, firing)
    consumer = (consumer_factory or AIOKafkaConsumer)(settings.topics.health, **consumer_kwargs(settings, config))
    async with Dispatcher(config) as dispatcher:
        sender = Sender(dispatcher, metrics)
        await consumer.start()
        log.info("alert process reading %s as group %s; routes: %s", settings.topics.health, config.consumer_group,
                 ", ".join(f"{r.name} ({r.format}, >= {r.min_severity})" for r in config.routes))
        assigned = False
        try:
            while not stop.is_set():
                try:
                    batches = await consumer.getmany(timeout_ms=FETCH_TIMEOUT_MS)
                except KafkaError as exc:
                    log.warning("channel.health fetch failed, retrying in %.1f s: %s", ERROR_BACKOFF_S, exc)
                    batches = {}
                    await asyncio.sleep(ERROR_BACKOFF_S)
                for messages in batches.values():
                    for msg in messages:
                        service.handle(msg.value)
                if not assigned and consumer.assignment():
                    assigned = True  # from here on, new verdicts are read (auto_offset_reset="latest")
                    log.info("alert process assigned %d partition(s)", len(consumer.assignment()))
                idle = not any(batches.values()) and assigned
                for n in service.due(flush_all=once and idle):
                    sender.submit(n)
                if once and idle:
                    break
        finally:
            await sender.drain(drain_s)
            await consumer.stop()
            metrics.close()
    return service
