"""The ``channel.control`` topic: override records, their codec and readers (SPEC §7).

A record's key is the override's key (``channel:<name>`` or ``route:<name>``,
so a compacted topic keeps the latest per target) and its value is JSON::

    {"action": "set", "override": {"kind": "open", "channel": "c1", "by": "ana",
     "reason": "vendor incident", "set_ts_ms": ..., "expires_ts_ms": ...}}
    {"action": "clear", "key": "channel:c1", "by": "ana", "reason": "...", "at_ms": ...}

A clear is an explicit record, not a tombstone: the audit needs who cleared
it and Tansu (the dev broker) does not compact anyway. Times are UTC epoch ms
(wall time). A record that does not decode is logged and counted by the
reader, never fatal (:class:`ControlReader`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, Callable, Mapping, Union

import msgspec
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.errors import KafkaError

from pipeline.policy.override import Change, Override, OverrideTable, validate

log = logging.getLogger("channel_health.control")

#: Longest wait of one fetch of the control topic (ms): a new override is seen within it.
CONTROL_FETCH_MS = 200
#: Pause after a broker error while following the control topic (s).
CONTROL_ERROR_BACKOFF_S = 1.0


class SetRecord(msgspec.Struct, tag_field="action", tag="set"):
    """Put ``override`` in force (replacing the one of its key)."""

    override: Override


class ClearRecord(msgspec.Struct, tag_field="action", tag="clear"):
    """End the override of ``key`` early; ``by``/``reason`` are audited; ``at_ms`` UTC epoch ms."""

    key: str
    by: str
    reason: str
    at_ms: int


ControlRecord = Union[SetRecord, ClearRecord]
_decoder = msgspec.json.Decoder(ControlRecord)
_encoder = msgspec.json.Encoder()


def encode_record(rec: SetRecord | ClearRecord) -> tuple[bytes, bytes]:
    """``(key, value)`` bytes of a control record (the override is validated first: ``ValueError``)."""
    if isinstance(rec, SetRecord):
        validate(rec.override)
        return rec.override.key.encode(), _encoder.encode(rec)
    return rec.key.encode(), _encoder.encode(rec)


def decode_record(value: bytes) -> SetRecord | ClearRecord:
    """Decode and validate a control record; raises ``ValueError`` (or msgspec's subclasses) when bad."""
    rec = _decoder.decode(value)
    if isinstance(rec, SetRecord):
        validate(rec.override)
    return rec


def apply_record(table: OverrideTable, rec: SetRecord | ClearRecord, now_ms: int) -> list[Change]:
    """Apply one decoded record to ``table``; returns the audit changes."""
    if isinstance(rec, SetRecord):
        return table.put(rec.override, now_ms)
    changes = table.clear(rec.key, rec.at_ms)
    # the audit of a clear names who cleared it and why
    return [Change("clear", msgspec.structs.replace(c.override, by=rec.by, reason=rec.reason), c.at_ms)
            for c in changes]


def audit_row(change: Change, ingested_ms: int) -> tuple:
    """A ``channel_overrides`` row (order :data:`pipeline.sinks.rows.OVERRIDE_COLUMNS`)."""
    o = change.override
    return (o.key, change.action, o.kind, o.channel or "", o.route or "", o.weight, o.by, o.reason,
            o.set_ts_ms, o.expires_ts_ms, change.at_ms, ingested_ms)


def bump_seq(engine: Any, channel: str, seq: int) -> None:
    """Make the engine's next ``seq`` of ``channel`` follow ``seq`` (a re-published verdict took it).

    Unknown channels are ignored (the engine never published for them). The channel is flagged changed
    (:meth:`pipeline.engine.Engine.mark_changed`), so the next snapshot carries the new ``seq``.
    """
    names = engine.store.names
    try:
        i = names.index(channel)
    except ValueError:
        return
    engine.seq[i] = max(engine.seq[i], seq)
    engine.mark_changed([i])  # its snapshot must carry the new seq


async def _assign_all(consumer: AIOKafkaConsumer, topic: str) -> list[TopicPartition]:
    parts = consumer.partitions_for_topic(topic)
    if not parts:
        await consumer.topics()
        parts = consumer.partitions_for_topic(topic)
    tps = [TopicPartition(topic, p) for p in sorted(parts or ())]
    if tps:
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
    return tps


class ControlReader:
    """Follows ``topic`` from the beginning without a consumer group (every worker needs every override).

    ``bootstrap`` / ``security``: as for aiokafka. ``bad_records`` counts
    records that did not decode (logged, skipped).
    """

    def __init__(self, bootstrap: str, topic: str, security: Mapping[str, Any] | None = None):
        self.bootstrap, self.topic, self.security = bootstrap, topic, dict(security or {})
        self.bad_records = 0
        self.consumer: AIOKafkaConsumer | None = None

    async def start(self) -> None:
        """Start the consumer and assign every partition of the topic from its beginning."""
        self.consumer = AIOKafkaConsumer(bootstrap_servers=self.bootstrap, enable_auto_commit=False,
                                         auto_offset_reset="earliest", client_id="channel-health-control",
                                         **self.security)
        await self.consumer.start()
        await _assign_all(self.consumer, self.topic)

    async def stop(self) -> None:
        """Stop the consumer (idempotent)."""
        if self.consumer is not None:
            await self.consumer.stop()
            self.consumer = None

    def decode(self, value: bytes | None) -> SetRecord | ClearRecord | None:
        """Decoded record, or None (logged and counted) when it is bad."""
        try:
            if value is None:
                raise ValueError("null value (control records are never tombstones)")
            return decode_record(value)
        except (msgspec.DecodeError, msgspec.ValidationError, ValueError) as exc:
            self.bad_records += 1
            log.warning("bad channel.control record (%d so far), skipped: %s; value starts %r",
                        self.bad_records, exc, (value or b"")[:120])
            return None

    async def poll(self, timeout_ms: int = CONTROL_FETCH_MS) -> list[SetRecord | ClearRecord]:
        """The records that arrived within ``timeout_ms`` (decoded; bad ones skipped); [] after a broker error."""
        assert self.consumer is not None, "start() first"
        if not self.consumer.assignment():
            await _assign_all(self.consumer, self.topic)  # the topic may be created after the start
            if not self.consumer.assignment():
                await asyncio.sleep(timeout_ms / 1000)
                return []
        try:
            batches = await self.consumer.getmany(timeout_ms=timeout_ms)
        except KafkaError as exc:
            log.warning("channel.control fetch failed, retrying in %.1f s: %s", CONTROL_ERROR_BACKOFF_S, exc)
            await asyncio.sleep(CONTROL_ERROR_BACKOFF_S)
            return []
        out = []
        for tp in sorted(batches, key=lambda t: t.partition):
            for msg in batches[tp]:
                rec = self.decode(msg.value)
                if rec is not None:
                    out.append(rec)
        return out


async def read_to_end(bootstrap: str, topic: str, handle: Callable[[bytes | None, bytes | None], None],
                      security: Mapping[str, Any] | None = None, timeout_s: float = 10.0) -> int:
    """Read every partition of ``topic`` from its beginning to its current end; ``handle(key, value)`` each record.

    Returns the records read (0 when the topic does not exist). Raises
    ``TimeoutError`` when the end is not reached within ``timeout_s``.
    """
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, auto_offset_reset="earliest",
                                client_id="channel-health-reader", **dict(security or {}))
    await consumer.start()
    n = 0
    try:
        tps = await _assign_all(consumer, topic)
        end = await consumer.end_offsets(tps) if tps else {}
        deadline = time.monotonic() + timeout_s
        while [tp for tp in tps if await consumer.position(tp) < end[tp]]:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{topic} not read to its end within {timeout_s} s")
            batches = await consumer.getmany(timeout_ms=CONTROL_FETCH_MS)
            for tp in sorted(batches, key=lambda t: t.partition):
                for msg in batches[tp]:
                    n += 1
                    handle(msg.key, msg.value)
    finally:
        await consumer.stop()
    return n


async def read_overrides(bootstrap: str, topic: str, security: Mapping[str, Any] | None = None,
                         timeout_s: float = 10.0, now_ms: int | None = None) -> OverrideTable:
    """Read ``topic`` to its current end and return the overrides in force at ``now_ms`` (default now).

    Bad records are logged and skipped. Raises ``TimeoutError`` when the end
    is not reached within ``timeout_s``.
    """
    now_ms = int(time.time() * 1000) if now_ms is None else now_ms
    table = OverrideTable()
    reader = ControlReader(bootstrap, topic, security)

    def handle(key: bytes | None, value: bytes | None) -> None:
        rec = reader.decode(value)
        if rec is not None:
            apply_record(table, rec, now_ms)

    await read_to_end(bootstrap, topic, handle, security, timeout_s)
    table.expire(now_ms)
    return table
