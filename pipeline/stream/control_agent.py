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
from typing import Any, Awaitable, Callable

from pipeline.config import Settings
from pipeline.contracts import Verdict
from pipeline.policy.override import Change, OverrideTable
from pipeline.sinks.rows import now_ms
from pipeline.stream.control import ControlReader, apply_record, audit_row, bump_seq

log = logging.getLogger("channel_health.control")


class ControlHook:
    """The worker's override table and the audit rows waiting for the sink."""

    def __init__(self) -> None:
        self.table = OverrideTable()
        self.pending_audit: list[tuple] = []
        #: Verdicts re-published because an override changed.
        self.republished = 0

    def apply(self, verdicts: list[Verdict]) -> list[Verdict]:
        """``verdicts`` with the overrides in force applied (each is recorded: a later override re-publishes it)."""
        apply = self.table.apply
        return [apply(v) for v in verdicts]

    def changes_to_verdicts(self, changes: list[Change], engine: Any) -> list[Verdict]:
        """Re-published verdicts of the channels ``changes`` affect; queues their audit rows."""
        at = now_ms()
        self.pending_audit.extend(audit_row(c, at) for c in changes)
        out = []
        for channel in self.table.affected(changes):
            v = self.table.republish(channel)
            if v is not None:
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
    hook = ControlHook()
    if not settings.kafka_bootstrap:
        return hook

    @app.task
    async def follow_control() -> None:
        from pipeline.stream.processor import ProcessedBatch

        reader = ControlReader(settings.kafka_bootstrap or "", settings.topics.control,
                               settings.kafka_security.aiokafka_kwargs())
        await reader.start()
        try:
            while True:
                records = await reader.poll()
                wall = int(time.time() * 1000)
                if state.lock is None:
                    continue
                async with state.lock:
                    changes: list[Change] = []
                    for rec in records:
                        changes.extend(apply_record(hook.table, rec, wall))
                    changes.extend(hook.table.expire(wall))
                    if not changes:
                        continue
                    for c in changes:
                        o = c.override
                        log.warning("override %s: %s %s by %s (%s), until %d", c.action, o.kind, o.key, o.by,
                                    o.reason, o.expires_ts_ms)
                    out = ProcessedBatch(verdicts=hook.changes_to_verdicts(changes, state.processor.engine))
                    if out.verdicts:
                        await publish(out)
                        await store(out)
                        state.ledger.add_batch([])  # as idle rounds: the rows are tracked, the seq snapshotted
                        state.dirty = True
                    write_audit(hook, state.sink)
        except asyncio.CancelledError:
            raise
        finally:
            await reader.stop()

    return hook


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
