"""The ``channel.control`` topic: override records, their codec and readers (SPEC §7, §8).

A record's key is the override's key (``channel:<name>`` or ``route:<name>``,
so a compacted topic keeps the latest per target) and its value is JSON::

    {"action": "set", "override": {"kind": "open", "channel": "c1", "by": "ana",
     "reason": "vendor incident", "set_ts_ms": ..., "expires_ts_ms": ...}}
    {"action": "clear", "key": "channel:c1", "by": "ana", "reason": "...", "at_ms": ...}

A clear is an explicit record, not a tombstone: the audit needs who cleared
it and Tansu (the dev broker) does not compact anyway. Times are UTC epoch ms
(wall time).

**Signed records** (issue #30 item 4; ``CHANNEL_HEALTH_CONTROL_KEYS``): the
value is an envelope holding the exact bytes of the record above as a string::

    {"action": "signed", "kid": "ana", "hmac": "<64 hex>", "record": "{\"action\":\"set\",...}"}

``hmac`` = HMAC-SHA256(secret of ``kid``, :data:`SIGNING_CONTEXT` + Kafka key +
``b"\\x00"`` + UTF-8 of ``record``), lower-case hex, compared with
``hmac.compare_digest``. The Kafka key is signed too, and must name the
record's own target, so a signed record cannot be replayed under another key
or for another target. With keys configured, unsigned records, unknown key ids
and bad signatures are refused; without keys, records are accepted unsigned
(signatures unchecked) and the reader says so once. The verified ``kid`` is
carried as ``Override.key_id`` / ``ClearRecord.key_id`` into the verdict and
the audit (``by`` stays a display name). A signed record can still be replayed
unchanged under its own key until it expires (it is the same operator's act).

**Bounds** (issue #30 item 2): a value over :data:`MAX_VALUE_BYTES` is refused
before it is parsed; every field is type-checked by msgspec and bounded by
:func:`pipeline.policy.override.validate` (text lengths, timestamps within
``DateTime64(3)``, TTL at most ``CHANNEL_HEALTH_OVERRIDE_MAX_TTL``). A refused
record raises ``ValueError`` (:class:`~pipeline.policy.override.OverrideRefused`
or msgspec's errors, which subclass it); :class:`ControlReader` counts it by
reason and logs the first :data:`LOGGED_PER_REASON` of each reason, never fatal.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import logging
import time
from collections import Counter
from typing import Any, Callable, Mapping, Union

import msgspec
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.errors import KafkaError

from pipeline.config import ControlSettings
from pipeline.policy.override import (MAX_BY_CHARS, MAX_NAME_CHARS, MAX_REASON_CHARS, MAX_TS_MS, Change, Override,
                                      OverrideRefused, OverrideTable, validate)

log = logging.getLogger("channel_health.control")

#: Longest wait of one fetch of the control topic (ms): a new override is seen within it.
CONTROL_FETCH_MS = 200
#: Pause after a broker error while following the control topic (s).
CONTROL_ERROR_BACKOFF_S = 1.0
#: Largest control record value (bytes) that is parsed at all; a bounded record needs < 16 KiB even signed.
MAX_VALUE_BYTES = 32_768
#: Prefix of the signed bytes (a version, so a later format cannot be confused with this one).
SIGNING_CONTEXT = b"channel-health/control/v1\x00"
#: Refused records logged per reason by one reader; the further ones are only counted.
LOGGED_PER_REASON = 3


class SetRecord(msgspec.Struct, tag_field="action", tag="set"):
    """Put ``override`` in force (replacing the one of its key)."""

    override: Override


class ClearRecord(msgspec.Struct, tag_field="action", tag="clear", omit_defaults=True):
    """End the override of ``key`` early; ``by``/``reason`` are audited; ``at_ms`` UTC epoch ms.

    ``key_id``: the verified signing key, set by the decoder (never taken from the record).
    """

    key: str
    by: str
    reason: str
    at_ms: int
    key_id: str = ""


class SignedRecord(msgspec.Struct, tag_field="action", tag="signed"):
    """A signed envelope: ``record`` is the exact JSON text of a set/clear record (see the module doc)."""

    kid: str
    hmac: str
    record: str


ControlRecord = Union[SetRecord, ClearRecord]
_decoder = msgspec.json.Decoder(Union[SetRecord, ClearRecord, SignedRecord])
_inner_decoder = msgspec.json.Decoder(ControlRecord)
_encoder = msgspec.json.Encoder()


def record_key(rec: SetRecord | ClearRecord) -> str:
    """The Kafka key of ``rec``: its override's key (``channel:<name>`` / ``route:<name>``)."""
    return rec.override.key if isinstance(rec, SetRecord) else rec.key


def signature(secret: bytes, key: bytes, record: bytes) -> str:
    """HMAC-SHA256 (lower-case hex) of a record's Kafka ``key`` and value ``record`` bytes under ``secret``."""
    return hmac.new(secret, SIGNING_CONTEXT + key + b"\x00" + record, hashlib.sha256).hexdigest()


def encode_record(rec: SetRecord | ClearRecord, control: ControlSettings | None = None,
                  key_id: str | None = None) -> tuple[bytes, bytes]:
    """``(key, value)`` bytes of a control record, signed with ``key_id`` when ``control`` has keys.

    ``key_id`` defaults to the only key of ``control``. Raises ``ValueError``
    when the override is invalid (:func:`validate`), ``key_id`` is unknown, or
    several keys are configured and none is chosen.
    """
    control = control or ControlSettings()
    if isinstance(rec, SetRecord):
        validate(rec.override, control.max_ttl_ms)
    else:
        _check_clear(rec)
    key = record_key(rec).encode()
    value = _encoder.encode(rec)
    if not control.keys:
        return key, value
    if key_id is None:
        if len(control.keys) > 1:
            ids = ", ".join(k for k, _ in control.keys)
            raise ValueError(f"several control keys are configured: choose one with --key-id ({ids})")
        key_id = control.keys[0][0]
    secret = control.secret(key_id)
    if secret is None:
        raise ValueError(f"unknown control key id {key_id!r} (not in CHANNEL_HEALTH_CONTROL_KEYS)")
    env = SignedRecord(kid=key_id, hmac=signature(secret, key, value), record=value.decode())
    return key, _encoder.encode(env)


def _check_clear(rec: ClearRecord) -> None:
    kind, _, name = rec.key.partition(":")
    if kind not in ("channel", "route") or not 1 <= len(name) <= MAX_NAME_CHARS:
        raise OverrideRefused("malformed", f"a clear names channel:<name> or route:<name> "
                                           f"(at most {MAX_NAME_CHARS} characters)")
    if not rec.by or len(rec.by) > MAX_BY_CHARS or len(rec.reason) > MAX_REASON_CHARS:
        raise OverrideRefused("malformed", f"a clear needs by (1..{MAX_BY_CHARS} characters) and a reason of at "
                                           f"most {MAX_REASON_CHARS}")
    if not 0 <= rec.at_ms <= MAX_TS_MS:
        raise OverrideRefused("malformed", f"at_ms must be 0..{MAX_TS_MS} (UTC epoch ms), got {rec.at_ms}")


def decode_record(value: bytes, key: bytes | None = None,
                  control: ControlSettings | None = None) -> SetRecord | ClearRecord:
    """Decode, authenticate and validate a control record (value bytes, Kafka ``key`` bytes).

    Returns the record with the verified key id set (``""`` when unsigned).
    ``key``: when given it must be the record's own key (it is always part of
    a signature; None is taken as empty). ``control``: keys and the maximum
    TTL (default: no keys, 24 h). Raises ``ValueError``:
    :class:`OverrideRefused` (``code`` says why) or msgspec's decode errors.
    """
    control = control or ControlSettings()
    if len(value) > MAX_VALUE_BYTES:
        raise OverrideRefused("too_large", f"control record of {len(value)} bytes (at most {MAX_VALUE_BYTES})")
    outer = _decoder.decode(value)
    kid = ""
    if isinstance(outer, SignedRecord):
        inner = outer.record.encode("utf-8", "surrogatepass")
        if control.keys:
            secret = control.secret(outer.kid)
            if secret is None:
                raise OverrideRefused("unknown_key", f"signed with unknown key id {outer.kid[:MAX_BY_CHARS]!r}")
            expected = signature(secret, key or b"", inner).encode()
            if not hmac.compare_digest(expected, outer.hmac.encode("utf-8", "replace")):
                raise OverrideRefused("bad_signature", f"bad signature for key id {outer.kid!r}")
            kid = outer.kid
        rec = _inner_decoder.decode(inner)
    elif control.keys:
        raise OverrideRefused("unsigned", "unsigned control record (CHANNEL_HEALTH_CONTROL_KEYS is set)")
    else:
        rec = outer
    if isinstance(rec, SetRecord):
        rec = SetRecord(validate(msgspec.structs.replace(rec.override, key_id=kid), control.max_ttl_ms))
    else:
        rec = msgspec.structs.replace(rec, key_id=kid)
        _check_clear(rec)
    if key is not None and key != record_key(rec).encode():
        raise OverrideRefused("key_mismatch", f"record for {record_key(rec)[:80]!r} under Kafka key {key[:80]!r}")
    return rec


def apply_record(table: OverrideTable, rec: SetRecord | ClearRecord, now_ms: int) -> list[Change]:
    """Apply one decoded record to ``table``; returns the audit changes."""
    if isinstance(rec, SetRecord):
        return table.put(rec.override, now_ms)
    changes = table.clear(rec.key, rec.at_ms)
    # the audit of a clear names who cleared it, why, and the key that signed the clear
    return [Change("clear", msgspec.structs.replace(c.override, by=rec.by, reason=rec.reason, key_id=rec.key_id),
                   c.at_ms) for c in changes]


def audit_row(change: Change, ingested_ms: int) -> tuple:
    """A ``channel_overrides`` row (order :data:`pipeline.sinks.rows.OVERRIDE_COLUMNS`; ``key_id`` last)."""
    o = change.override
    return (o.key, change.action, o.kind, o.channel or "", o.route or "", o.weight, o.by, o.reason,
            o.set_ts_ms, o.expires_ts_ms, change.at_ms, ingested_ms, o.key_id)


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

    ``bootstrap`` / ``security``: as for aiokafka. ``control``: keys and bounds
    (:class:`~pipeline.config.ControlSettings`; default: unsigned, 24 h, 1000).
    ``bad_records`` counts refused records, ``refused`` the same by reason
    (``OverrideRefused.code``; ``malformed`` for msgspec's errors); each reason's
    first :data:`LOGGED_PER_REASON` are logged (one line each, naming the key),
    the rest only counted, so a flood does not flood the log.
    """

    def __init__(self, bootstrap: str, topic: str, security: Mapping[str, Any] | None = None,
                 control: ControlSettings | None = None):
        self.bootstrap, self.topic, self.security = bootstrap, topic, dict(security or {})
        self.control = control or ControlSettings()
        self.bad_records = 0
        self.refused: Counter[str] = Counter()
        self.unsigned_noted = False
        self.consumer: AIOKafkaConsumer | None = None

    def new_table(self) -> OverrideTable:
        """An empty :class:`OverrideTable` with this reader's bounds."""
        return OverrideTable(self.control.max_overrides, self.control.max_ttl_ms)

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

    def refuse(self, exc: ValueError, key: bytes | None, value: bytes | None) -> None:
        """Count the refused record (by reason) and log it if it is among the first of its reason."""
        code = exc.code if isinstance(exc, OverrideRefused) else "malformed"
        self.bad_records += 1
        self.refused[code] += 1
        n = self.refused[code]
        if n <= LOGGED_PER_REASON:
            log.warning("channel.control record refused (%s, %d of this reason so far%s): %s; key %r, %d bytes, "
                        "value starts %r", code, n, ", later ones only counted" if n == LOGGED_PER_REASON else "",
                        str(exc)[:300], (key or b"")[:120], len(value or b""), (value or b"")[:120])

    def decode(self, value: bytes | None, key: bytes | None = None) -> SetRecord | ClearRecord | None:
        """Decoded and authenticated record, or None (counted, logged: :meth:`refuse`) when it is refused."""
        try:
            if value is None:
                raise OverrideRefused("malformed", "null value (control records are never tombstones)")
            rec = decode_record(value, key, self.control)
        except ValueError as exc:  # OverrideRefused and msgspec's DecodeError/ValidationError
            self.refuse(exc, key, value)
            return None
        if not self.control.keys and not self.unsigned_noted:
            self.unsigned_noted = True
            log.warning("channel.control records are not authenticated: CHANNEL_HEALTH_CONTROL_KEYS is unset, so "
                        "anyone who can write the topic can set overrides (set it in production)")
        return rec

    def apply(self, table: OverrideTable, rec: SetRecord | ClearRecord, now_ms: int) -> list[Change]:
        """:func:`apply_record`, with a refusal of the table (TTL from now, the cap) counted and logged."""
        try:
            return apply_record(table, rec, now_ms)
        except OverrideRefused as exc:
            self.refuse(exc, record_key(rec).encode(), None)
            return []

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
                rec = self.decode(msg.value, msg.key)
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
                         timeout_s: float = 10.0, now_ms: int | None = None,
                         control: ControlSettings | None = None) -> OverrideTable:
    """Read ``topic`` to its current end and return the overrides in force at ``now_ms`` (default now).

    Records are verified and bounded as by the worker (``control``, see
    :class:`ControlReader`); refused ones are logged and skipped. Raises
    ``TimeoutError`` when the end is not reached within ``timeout_s``.
    """
    now_ms = int(time.time() * 1000) if now_ms is None else now_ms
    reader = ControlReader(bootstrap, topic, security, control)
    table = reader.new_table()

    def handle(key: bytes | None, value: bytes | None) -> None:
        rec = reader.decode(value, key)
        if rec is not None:
            reader.apply(table, rec, now_ms)

    await read_to_end(bootstrap, topic, handle, security, timeout_s)
    table.expire(now_ms)
    return table
