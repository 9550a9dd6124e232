"""The worker's side of manual overrides: follow ``channel.control``, apply, re-publish, audit, expire.

Wiring in :func:`pipeline.stream.app.build_app`::

    control = install_control(app, state, settings, lambda out: intake.emit(out), lambda out: writer.store(out))
    ...
    intake = Intake(..., control=control)   # Intake.emit: out.verdicts = control.apply(out.verdicts), then publish

:func:`install_control` adds one faust task that reads every partition of the
control topic without a consumer group (each worker needs every override),
polls every :data:`~pipeline.stream.control.CONTROL_FETCH_MS` ms and, under
the worker's lock:

1. applies new records and expires overrides whose TTL passed (wall time);
2. re-publishes the last verdict of every affected channel this worker has
   published, with ``seq`` + 1 (the engine's counter is moved past it), so
   the override reaches ``channel.health`` within about 0.2 s, not at the
   next 30 s round;
3. hands the audit rows (``set``, ``clear``, ``expire``) to the sink
   (``channel_overrides``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, Awaitable, Callable, Mapping

import msgspec

from pipeline.config import ControlSettings, Settings
from pipeline.contracts import Verdict, encode
from pipeline.policy.override import Change, OverrideTable
from pipeline.sinks.rows import now_ms
from pipeline.stream.control import ControlReader, audit_row, bump_seq

log = logging.getLogger("channel_health.control")


#: Room kept in a produce request besides the verdict's value (key, headers, batch framing), bytes.
REQUEST_OVERHEAD_BYTES = 4096


class ControlHook:
    """The worker's override table and the audit rows waiting for the sink.

    ``control``: bounds of the table (:class:`~pipeline.config.ControlSettings`).
    ``max_verdict_bytes`` >= 1: largest encoded verdict that carries an override
    (default: 1 MB producer request less :data:`REQUEST_OVERHEAD_BYTES`); a larger
    one has its override's free text cut (:func:`fit_verdict`).
    """

    def __init__(self, control: ControlSettings | None = None,
                 max_verdict_bytes: int = 1_000_000 - REQUEST_OVERHEAD_BYTES) -> None:
        control = control or ControlSettings()
        self.table = OverrideTable(control.max_overrides, control.max_ttl_ms)
        self.max_verdict_bytes = max_verdict_bytes
        self.pending_audit: list[tuple] = []
        #: Control records refused, by reason code: the worker's :class:`ControlReader`'s own counter
        #: once it runs (exported as ``channel_health_control_refused_total``).
        self.refused: Mapping[str, int] = {}
        #: Verdicts re-published because an override changed.
        self.republished = 0
        #: Verdicts whose override text was cut to fit the producer's message size.
        self.cut_verdicts = 0

    def apply(self, verdicts: list[Verdict]) -> list[Verdict]:
        """``verdicts`` with the overrides in force applied (each is recorded: a later override re-publishes it)."""
        apply = self.table.apply
        return [self._fit(apply(v)) for v in verdicts]

    def _fit(self, v: Verdict) -> Verdict:
        if v.override is msgspec.UNSET:
            return v
        out = fit_verdict(v, self.max_verdict_bytes)
        if out is not v:
            self.cut_verdicts += 1
            if self.cut_verdicts == 1:
                log.error("verdict of %s over %d bytes with its override: override text cut (counted in "
                          "cut_verdicts, logged once)", v.channel[:200], self.max_verdict_bytes)
            self.table.last[v.channel] = out
        return out

    def changes_to_verdicts(self, changes: list[Change], engine: Any) -> list[Verdict]:
        """Re-published verdicts of the channels ``changes`` affect; queues their audit rows."""
        at = now_ms()
        self.pending_audit.extend(audit_row(c, at) for c in changes)
        out = []
        for channel in self.table.affected(changes):
            v = self.table.republish(channel)
            if v is not None:
                v = self._fit(v)
                bump_seq(engine, channel, v.seq)
                out.append(v)
        self.republished += len(out)
        return out


def install_control(app: Any, state: Any, settings: Settings,
                    publish: Callable[[Any], Awaitable[None]], store: Callable[[Any], Awaitable[None]]) -> ControlHook:
    """Add the control task to ``app``; returns the hook whose ``apply`` the publish step calls.

    ``state``: the worker's :class:`~pipeline.stream.worker_state.WorkerState`
    (its ``lock``, ``processor`` and ``sink``). Without a Kafka bootstrap
    nothing is followed (the hook applies nothing).
    """
    hook = ControlHook(settings.control, settings.producer_max_request_bytes - REQUEST_OVERHEAD_BYTES)
    if not settings.kafka_bootstrap:
        return hook

    @app.task
    async def follow_control() -> None:
        from pipeline.engine.batch import ProcessedBatch

        reader = ControlReader(settings.kafka_bootstrap or "", settings.topics.control,
                               settings.kafka_security.aiokafka_kwargs(), settings.control)
        hook.refused = reader.refused  # the same counter, read at every metrics scrape
        await reader.start()
        waiting: list = []  # records read before the worker's lock exists: applied once it does, never dropped
        try:
            while True:
                waiting.extend(await reader.poll())
                wall = int(time.time() * 1000)
                if state.lock is None:
                    continue
                records, waiting = waiting, []
                async with state.lock:
                    changes: list[Change] = []
                    for rec in records:
                        changes.extend(reader.apply(hook.table, rec, wall))
                    changes.extend(hook.table.expire(wall))
                    if not changes:
                        continue
                    for c in changes:
                        o = c.override
                        log.warning("override %s: %s %s by %s (key id %s) (%s), until %d", c.action, o.kind, o.key,
                                    o.by, o.key_id or "none: unsigned", o.reason, o.expires_ts_ms)
                    out = ProcessedBatch(verdicts=hook.changes_to_verdicts(changes, state.processor.engine))
                    if out.verdicts:
                        await publish(out)
                        await store(out)
                        # as idle rounds: the rows are tracked, the seq snapshotted
                        state.checkpoint.ledger.add_batch([])
                        state.checkpoint.dirty = True
                    write_audit(hook, state.sink)
        except asyncio.CancelledError:
            raise
        finally:
            await reader.stop()

    return hook


def fit_verdict(v: Verdict, max_bytes: int) -> Verdict:
    """``v`` itself when its JSON is at most ``max_bytes`` (>= 1) bytes; else ``v`` with its override's free
    text (``by``, ``reason``) cut, and without the override's text at all if that is not enough.

    The last guard behind the decode bounds (:func:`pipeline.policy.override.validate`), which already keep
    an override to a few KB: whatever an override holds, the verdict fits the producer's request.
    """
    size = len(encode(v))
    if size <= max_bytes or v.override is msgspec.UNSET:
        return v
    info = dict(v.override)
    info["by"] = str(info.get("by", ""))[:64]
    info["reason"] = f"(cut: the override made the verdict {size} bytes)"
    out = msgspec.structs.replace(v, override=info)
    if len(encode(out)) <= max_bytes:
        return out
    kept = {k: info[k] for k in ("kind", "expires_ts_ms", "set_ts_ms", "weight", "state") if k in info}
    return msgspec.structs.replace(v, override=kept)


def write_audit(hook: ControlHook, sink: Any) -> None:
    """Hand the queued audit rows to ``sink`` (kept for the next call while its buffer is full)."""
    from pipeline.sinks.errors import SinkBackpressure

    if sink is None or not hook.pending_audit:
        hook.pending_audit.clear()
        return
    try:
        sink.add_overrides(hook.pending_audit)
        hook.pending_audit = []
    except SinkBackpressure:
        log.warning("sink buffer full: %d override audit rows wait for the next change", len(hook.pending_audit))
